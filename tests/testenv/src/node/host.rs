//! What a real node takes from the host, and how it is given back: the bridge that leases its
//! subnet, its cgroup root, the containers' processes, the mounts under its folder, the
//! network namespaces of its Pods. Giving back is best effort: it reports nothing and never
//! panics, as it runs in `Drop`, also while a test panics.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::Error;

/// Bridges are named after their subnet's third octet.
pub fn bridge_name(subnet: u8) -> String {
    format!("vo-br{subnet}")
}

/// Creates the first free bridge `vo-brN` (N in 1..=254) with the host's address
/// `198.18.N.1/24`: creating it is the lease (a second caller gets "File exists").
pub fn lease_bridge() -> Result<u8, Error> {
    for subnet in 1..=254u8 {
        let bridge = bridge_name(subnet);
        let created = ip(&["link", "add", &bridge, "type", "bridge"])?;
        if !created {
            continue;
        }
        let address = format!("198.18.{subnet}.1/24");
        if ip(&["addr", "add", &address, "dev", &bridge])? && ip(&["link", "set", &bridge, "up"])? {
            return Ok(subnet);
        }
        release_bridge(subnet);
        return Err(Error::Binaries(format!(
            "could not give bridge {bridge} the address {address}"
        )));
    }
    Err(Error::Binaries(
        "no free bridge vo-br1..vo-br254 for a test node".into(),
    ))
}

pub fn release_bridge(subnet: u8) {
    let _ = ip(&["link", "del", &bridge_name(subnet)]);
}

/// The address an API server binds for Pods to reach, `198.19.M.1` (M in 1..=254): leased by
/// adding it to the loopback interface (a second caller gets "File exists"). It is the first
/// address of that control plane's Service range too, so the `kubernetes` Service's ClusterIP
/// is the API server itself and Pods need no kube-proxy to reach it.
pub fn lease_api_address() -> Result<u8, Error> {
    for block in 1..=254u8 {
        if ip(&[
            "addr",
            "add",
            &format!("{}/32", api_address(block)),
            "dev",
            "lo",
        ])? {
            return Ok(block);
        }
    }
    Err(Error::Binaries(
        "no free address 198.19.1.1..198.19.254.1 for an API server".into(),
    ))
}

/// `198.19.M.1`.
pub fn api_address(block: u8) -> String {
    format!("198.19.{block}.1")
}

pub fn release_api_address(block: u8) {
    let _ = ip(&[
        "addr",
        "del",
        &format!("{}/32", api_address(block)),
        "dev",
        "lo",
    ]);
}

fn ip(args: &[&str]) -> Result<bool, Error> {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .map_err(Error::io(format!("running ip {}", args.join(" "))))
}

/// The cgroup v1 hierarchies mounted on this host (`/sys/fs/cgroup/<controller>`).
fn hierarchies() -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists())
                .collect()
        })
        .unwrap_or_default()
}

/// Every cgroup under `root` in one hierarchy, deepest first.
fn cgroups_under(hierarchy: &Path, root: &str) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&entry.path(), out);
                }
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut out = Vec::new();
    let top = hierarchy.join(root.trim_start_matches('/'));
    if top.is_dir() {
        walk(&top, &mut out);
    }
    out
}

/// SIGKILLs every process in the node's cgroups (its Pods' containers and sandboxes) and
/// every containerd shim serving its containerd (they leave containerd's process group).
pub fn kill_containers(cgroup_root: &str, socket: &Path) {
    for hierarchy in hierarchies() {
        for cgroup in cgroups_under(&hierarchy, cgroup_root) {
            if let Ok(procs) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    kill(pid);
                }
            }
        }
    }
    let needle = socket.display().to_string();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("containerd-shim") && cmdline.contains(&needle) {
                kill(pid);
            }
        }
    }
    // Give the kernel a moment to reap what was killed before cgroups are removed.
    std::thread::sleep(std::time::Duration::from_millis(200));
}

fn kill(pid: i32) {
    // SAFETY: kill(2) has no memory effects; a pid already gone only yields ESRCH.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Unmounts (lazily) every mount point under `folder`, deepest first: the containers' root
/// file systems, the kubelet's Secret volumes, the sandboxes' shared memory.
pub fn unmount_under(folder: &Path) {
    let prefix = folder.display().to_string();
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .filter(|point| point.starts_with(&prefix))
        .map(|point| point.replace("\\040", " "))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let Ok(path) = std::ffi::CString::new(point) else {
            continue;
        };
        // SAFETY: umount2 reads a NUL-terminated path; MNT_DETACH never blocks.
        unsafe {
            libc::umount2(path.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// Deletes the network namespaces (`/run/netns/cni-*`) whose Pod address is in `subnet`:
/// containerd names them, and a node stopped without its Pods being torn down leaves them.
pub fn remove_network_namespaces(subnet: &str) {
    let prefix = subnet.trim_end_matches("0/24");
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("cni-") {
            continue;
        }
        let addresses = Command::new("ip")
            .args(["-n", &name, "-4", "-o", "addr"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        // Only this node's: another node's Pod may be between its namespace's creation
        // and its address, and must not lose it.
        if addresses.contains(&format!("inet {prefix}")) {
            let _ = Command::new("ip")
                .args(["netns", "delete", &name])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Creates the node's cgroup root in every hierarchy (the kubelet refuses a `cgroupRoot`
/// that does not exist).
pub fn create_cgroups(cgroup_root: &str) -> Result<(), Error> {
    for hierarchy in hierarchies() {
        let path = hierarchy.join(cgroup_root.trim_start_matches('/'));
        std::fs::create_dir_all(&path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
    }
    Ok(())
}

/// Removes the node's cgroups in every hierarchy, deepest first.
pub fn remove_cgroups(cgroup_root: &str) {
    for hierarchy in hierarchies() {
        for cgroup in cgroups_under(&hierarchy, cgroup_root) {
            let _ = std::fs::remove_dir(&cgroup);
        }
    }
}
