//! What a real node takes from the host, and how it is given back: the network namespace that
//! leases its subnet (with its bridge and its link to the host), its cgroup root, the
//! containers' processes, the mounts under its folder, the network namespaces of its Pods.
//! Giving back is best effort: it reports nothing and never panics, as it runs in `Drop`, also
//! while a test panics.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::Error;

/// A node's network namespace, `vo-nodeN`, named after its subnet's third octet.
pub fn namespace_name(subnet: u8) -> String {
    format!("vo-node{subnet}")
}

/// The node's bridge, `vo-brN`, inside its namespace.
pub fn bridge_name(subnet: u8) -> String {
    format!("vo-br{subnet}")
}

/// The host's end of the link to node N, `vo-hN`.
pub(crate) fn host_link(subnet: u8) -> String {
    format!("vo-h{subnet}")
}

/// The host's address on its link to node N, `198.19.0.N`: the source of everything the host
/// sends the node (the API server, an operator or client on the host).
fn host_address(subnet: u8) -> String {
    format!("198.19.0.{subnet}")
}

/// The node's end of that link, `198.19.255.N`.
pub(crate) fn node_link_address(subnet: u8) -> String {
    format!("198.19.255.{subnet}")
}

/// Creates the first free network namespace `vo-nodeN` (N in 1..=254; creating it is the lease
/// on the subnet: a second caller gets "File exists") and wires it: a link to the host, the
/// bridge `vo-brN` with the node's address `198.18.N.1/24`, and the host's route to the Pods.
pub fn lease_node_network() -> Result<u8, Error> {
    for subnet in 1..=254u8 {
        let namespace = namespace_name(subnet);
        if !ip(&["netns", "add", &namespace])? {
            if !abandoned(&namespace) {
                continue;
            }
            release_node_network(subnet);
            if !ip(&["netns", "add", &namespace])? {
                continue;
            }
        }
        return match wire(subnet) {
            Ok(()) => Ok(subnet),
            Err(error) => {
                release_node_network(subnet);
                Err(error)
            }
        };
    }
    Err(Error::Binaries(
        "no free network namespace vo-node1..vo-node254 for a test node".into(),
    ))
}

/// The host reaches the Pods through the node, and the node reaches everything else (the API
/// server, other nodes' Pods) through the host. The host's address is local in the node too,
/// routed back to the host: to the node's firewall, the host is the node itself, as it was
/// when every node lived in the host's namespace (kube-router lets its node's own packets in),
/// so an operator or client on the host is let in as a process on the node would be.
fn wire(subnet: u8) -> Result<(), Error> {
    let namespace = namespace_name(subnet);
    let (link, bridge) = (host_link(subnet), bridge_name(subnet));
    let (host, node) = (host_address(subnet), node_link_address(subnet));
    let pods = format!("198.18.{subnet}.0/24");
    let node_address = format!("198.18.{subnet}.1/24");
    // Set, not left to the kernel: a bridge without an address of its own takes the lowest of
    // its ports', so each Pod that goes can change the gateway's MAC under every other Pod,
    // whose replies then go nowhere until their ARP entries expire (up to 30 s and more; the
    // real-node nemesis lost primaries to it). CNI's bridge plugin and kubenet set it too.
    let bridge_mac = format!("02:76:6f:00:00:{subnet:02x}");
    let on_host: [&[&str]; 4] = [
        &[
            "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &namespace,
        ],
        &[
            "addr",
            "add",
            &format!("{host}/32"),
            "peer",
            &format!("{node}/32"),
            "dev",
            &link,
        ],
        &["link", "set", &link, "up"],
        &[
            "route", "add", &pods, "via", &node, "dev", &link, "src", &host,
        ],
    ];
    let in_node: [&[&str]; 13] = [
        &["link", "set", "lo", "up"],
        &[
            "addr",
            "add",
            &format!("{node}/32"),
            "peer",
            &format!("{host}/32"),
            "dev",
            "eth0",
        ],
        &["link", "set", "eth0", "up"],
        &["route", "add", "default", "via", &host],
        &["link", "add", &bridge, "type", "bridge"],
        &["link", "set", &bridge, "address", &bridge_mac],
        &["addr", "add", &node_address, "dev", &bridge],
        &["link", "set", &bridge, "up"],
        // The host's address, local here, and a table of its own that routes it to the host,
        // looked up before the local table.
        &["addr", "add", &format!("{host}/32"), "dev", "lo"],
        &[
            "route",
            "add",
            &format!("{host}/32"),
            "dev",
            "eth0",
            "table",
            "100",
        ],
        &[
            "rule",
            "add",
            "pref",
            "10",
            "to",
            &format!("{host}/32"),
            "lookup",
            "100",
        ],
        &["rule", "add", "pref", "20", "lookup", "local"],
        &["rule", "del", "pref", "0", "lookup", "local"],
    ];
    for args in on_host {
        must_ip(args)?;
    }
    for args in in_node {
        let mut all = vec!["-n", namespace.as_str()];
        all.extend_from_slice(args);
        must_ip(&all)?;
    }
    // Connection tracking from the start, as on any node whose kube-proxy or CNI uses it: the
    // kernel tracks a namespace's connections only once a rule there asks for it, and a
    // firewall started later would take the replies of connections made before it (a Pod's
    // watch on the API server) for new ones, and refuse them. This rule asks, and does nothing.
    run_checked(
        in_node_network(subnet, "iptables"),
        &[
            "-w",
            "-t",
            "mangle",
            "-A",
            "PREROUTING",
            "-m",
            "conntrack",
            "--ctstate",
            "INVALID",
            "-j",
            "RETURN",
        ],
    )?;
    // Forwarding between the bridge and the link; the host's packets come in with a source
    // that is local here (accept_local) and are not checked against the reverse path.
    let sysctl = in_node_network(subnet, "sysctl");
    run_checked(
        sysctl,
        &[
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.eth0.rp_filter=0",
            "net.ipv4.conf.eth0.accept_local=1",
            "net.bridge.bridge-nf-call-iptables=1",
        ],
    )
}

/// A node's namespace that a killed test left behind (its `Drop` never ran): no process in it
/// for an hour since it was made. A live node always has its kubelet and containerd there.
fn abandoned(namespace: &str) -> bool {
    let made = std::fs::metadata(format!("/run/netns/{namespace}")).and_then(|m| m.modified());
    let old = made.is_ok_and(|made| {
        made.elapsed()
            .is_ok_and(|age| age > std::time::Duration::from_secs(3600))
    });
    let empty = Command::new("ip")
        .args(["netns", "pids", namespace])
        .output()
        .is_ok_and(|out| out.status.success() && out.stdout.is_empty());
    old && empty
}

/// Removes node N's link (and so the host's route) and its namespace (and so its bridge, once
/// no process is left in it); best effort.
pub fn release_node_network(subnet: u8) {
    let _ = ip(&["link", "del", &host_link(subnet)]);
    let _ = ip(&["netns", "del", &namespace_name(subnet)]);
}

/// `program` run in node N's network namespace (and nothing else's: the kubelet and containerd
/// must share the host's mounts, so `nsenter --net`, not `ip netns exec`).
pub fn in_node_network(subnet: u8, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net=/run/netns/{}", namespace_name(subnet)))
        .arg("--")
        .arg(program);
    command
}

fn must_ip(args: &[&str]) -> Result<(), Error> {
    run_checked(Command::new("ip"), args)
}

fn run_checked(mut command: Command, args: &[&str]) -> Result<(), Error> {
    let output = command
        .args(args)
        .output()
        .map_err(Error::io(format!("running {:?}", command.get_program())))?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::Binaries(format!(
        "{} {}: {}",
        command.get_program().to_string_lossy(),
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    )))
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
