//! A real node on this machine: a kubelet built from the same Kubernetes module as the API
//! server, its own containerd (Debian's, with runc) and the CNI reference plugins, all in a
//! network namespace of the node's own, Pods in theirs on the node's bridge of 198.18.N.0/24
//! (RFC 2544's benchmarking range: neither private nor public) that the host routes to. What the test kubelet only imitates
//! happens here for real: the image's user and file modes, the read-only root, probes,
//! SIGTERM and grace periods, evictions, addresses handed out again.
//!
//! Each node is a folder (containerd's root and state, the kubelet's root, the CNI config and
//! address leases, the image archives), a network namespace `vo-nodeN` whose creation is the
//! lease on the subnet (two tests never pick the same one) holding the bridge `vo-brN` and a
//! link to the host, and a cgroup root of its own. Its own namespace gives each node its own
//! iptables, so each can run a firewall of its own. Dropping the
//! node kills every container it ran and removes all of it.

pub mod fault;
pub mod firewall;
pub mod from_pod;
pub(crate) mod host;
pub mod image;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::process::ProcessGuard;
use crate::{ControlPlane, Error, valkey_bin_root};
use image::ImageSpec;

/// The first address block of the Pod networks; node N gets 198.18.N.0/24.
const POD_NETWORK_PREFIX: &str = "198.18";

/// How a node presents itself.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The Node's name.
    pub name: String,
    /// Its `topology.kubernetes.io/zone` label, if any.
    pub zone: Option<String>,
    /// How long to wait for the Node to turn Ready.
    pub ready_timeout: Duration,
    /// Images to import besides the sandbox's and the Valkey ones (the operator's).
    pub images: Vec<ImageSpec>,
}

impl NodeOptions {
    pub fn named(name: &str) -> Self {
        Self {
            name: name.into(),
            zone: None,
            ready_timeout: Duration::from_secs(120),
            images: Vec::new(),
        }
    }
}

/// One node per zone listed, named `node-<zone>`, or `node-<zone>-<n>` for a zone listed
/// again (`a,b,c,a`: node-a, node-b, node-c, node-a-2).
pub fn nodes_in_zones<S: AsRef<str>>(zones: &[S]) -> Vec<NodeOptions> {
    let mut seen: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    zones
        .iter()
        .map(|zone| {
            let zone = zone.as_ref();
            let count = seen.entry(zone).or_default();
            *count += 1;
            let name = match *count {
                1 => format!("node-{zone}"),
                n => format!("node-{zone}-{n}"),
            };
            NodeOptions {
                zone: Some(zone.to_string()),
                ..NodeOptions::named(&name)
            }
        })
        .collect()
}

/// A running node. Dropping it stops its Pods' containers, the kubelet and containerd, and
/// removes its bridge, mounts, cgroups and folder.
#[derive(Debug)]
pub struct RealNode {
    name: String,
    subnet: u8,
    /// What it was started with, to start it again after a loss ([`RealNode::restart`]).
    options: NodeOptions,
    kubelet: Option<ProcessGuard>,
    containerd: Option<ProcessGuard>,
    // Declared last: removed after the processes using it are gone (see `Drop`).
    dir: tempfile::TempDir,
}

impl RealNode {
    /// Starts containerd and a kubelet registered with `plane`, loads the Valkey images of
    /// every fetched version and the sandbox image, and waits until the Node is Ready.
    pub async fn start(plane: &ControlPlane, options: NodeOptions) -> Result<Self, Error> {
        let cni_bin = tokio::task::spawn_blocking(cni_bin_dir)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        let dir = tempfile::Builder::new()
            .prefix("testenv-node-")
            .tempdir()
            .map_err(Error::io("creating a node folder"))?;
        let subnet = host::lease_node_network()?;
        let mut node = RealNode {
            name: options.name.clone(),
            subnet,
            options: options.clone(),
            kubelet: None,
            containerd: None,
            dir,
        };
        host::create_cgroups(&node.cgroup_root())?;
        node.write_cni_config()?;
        node.start_containerd(&cni_bin).await?;
        node.load_images(&options.images)?;
        node.start_kubelet(plane, &options)?;
        node.wait_ready(plane, options.ready_timeout).await?;
        Ok(node)
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's address on its bridge (the Pods' gateway, the kubelet's), `198.18.N.1`.
    pub fn address(&self) -> String {
        format!("{POD_NETWORK_PREFIX}.{}.1", self.subnet)
    }

    /// The Pod network of this node, `198.18.N.0/24`.
    pub fn pod_subnet(&self) -> String {
        format!("{POD_NETWORK_PREFIX}.{}.0/24", self.subnet)
    }

    /// Cuts this node's Pods off from every other node's until the [`fault::Cut`] is dropped.
    pub fn cut_off(&self) -> Result<fault::Cut, Error> {
        self.cut_one_way(fault::Direction::Both)
    }

    /// [`Self::cut_off`] in one `direction` only (or both).
    pub fn cut_one_way(&self, direction: fault::Direction) -> Result<fault::Cut, Error> {
        fault::Cut::start(self.subnet, &self.pod_subnet(), direction)
    }

    /// Congests this node's link (at most `rate`, a `tc` rate such as `256kbit`, each way)
    /// until the [`fault::Congested`] is dropped.
    pub fn congest(&self, rate: &str) -> Result<fault::Congested, Error> {
        fault::Congested::start(self.subnet, rate)
    }

    /// Loses the node at once, as a machine whose power fails: nothing of it answers again
    /// (its addresses drop every packet until the [`fault::Lost`] is dropped), then its
    /// kubelet, containerd, shims and containers are killed. The Node object and its Pods stay
    /// in the API server, as they do when a real machine dies, for Kubernetes to notice.
    pub fn lose(&mut self) -> Result<fault::Lost, Error> {
        let lost = fault::Lost::start(
            self.subnet,
            &self.pod_subnet(),
            &host::node_link_address(self.subnet),
        )?;
        drop(self.kubelet.take());
        drop(self.containerd.take());
        host::kill_containers(&self.cgroup_root(), &self.socket());
        Ok(lost)
    }

    /// Starts a lost node again, as a machine that comes back after its power failed (drop its
    /// [`fault::Lost`] first): what a reboot clears goes (its processes, mounts, Pod network
    /// namespaces, containerd's state folder), what is on disk stays (images, the kubelet's
    /// folder, the address leases); then containerd and the kubelet start, and the Node must
    /// turn Ready again. The kubelet then finds its Pods in the API server as it left them.
    pub async fn restart(&mut self, plane: &ControlPlane) -> Result<(), Error> {
        drop(self.kubelet.take());
        drop(self.containerd.take());
        host::kill_containers(&self.cgroup_root(), &self.socket());
        host::unmount_under(self.dir.path());
        host::remove_network_namespaces(&self.pod_subnet());
        let state = self.dir().join("containerd/state");
        if state.exists() {
            std::fs::remove_dir_all(&state)
                .map_err(Error::io(format!("clearing {}", state.display())))?;
        }
        let cni_bin = tokio::task::spawn_blocking(cni_bin_dir)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        let options = self.options.clone();
        self.start_containerd(&cni_bin).await?;
        self.start_kubelet(plane, &options)?;
        self.wait_ready(plane, options.ready_timeout).await
    }

    /// The node's folder (logs: `containerd.log`, `kubelet.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn bridge(&self) -> String {
        host::bridge_name(self.subnet)
    }

    /// `program` run in this node's network namespace.
    pub(crate) fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        host::in_node_network(self.subnet, program)
    }

    fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    /// The cgroup every Pod of this node lives under (the kubelet's `cgroupRoot`), apart
    /// from any other node's.
    fn cgroup_root(&self) -> String {
        format!("/valkey-testenv-{}", self.subnet)
    }

    /// `ctr` pointed at this node's containerd, in the namespace the kubelet uses.
    pub fn ctr(&self) -> Command {
        let mut command = Command::new("ctr");
        command
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io"]);
        command
    }

    /// The host pid of a running container (`containerID` of a Pod's status, without its
    /// `containerd://` prefix), from `ctr tasks ls`.
    pub fn task_pid(&self, container_id: &str) -> Option<u32> {
        let output = self.ctr().args(["tasks", "ls"]).output().ok()?;
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .find(|line| line.starts_with(container_id))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|pid| pid.parse().ok())
    }

    /// Resident memory of this node's kubelet and containerd, in KiB (what a node costs
    /// beside its Pods).
    pub fn resident_kib(&self) -> u64 {
        [&self.kubelet, &self.containerd]
            .into_iter()
            .flatten()
            .filter_map(|process| crate::process::resident_kib(process.pid()))
            .sum()
    }

    /// The bridge plugin on this node's bridge, addresses from host-local; Pods route
    /// through the node's address on the bridge.
    fn write_cni_config(&self) -> Result<(), Error> {
        let conf_dir = self.dir().join("cni");
        std::fs::create_dir_all(&conf_dir).map_err(Error::io("creating the CNI config folder"))?;
        let config = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "valkey-testenv",
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge(),
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": self.pod_subnet(), "gateway": self.address()}]],
                    // The default route through the node: other nodes' Pods are behind the
                    // host (isGateway only gives the bridge its address).
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": self.dir().join("cni-leases"),
                },
            }],
        });
        let path = conf_dir.join("10-bridge.conflist");
        std::fs::write(&path, config.to_string())
            .map_err(Error::io(format!("writing {}", path.display())))?;
        Ok(())
    }

    async fn start_containerd(&mut self, cni_bin: &Path) -> Result<(), Error> {
        let dir = self.dir().to_path_buf();
        // Processes here lack CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below the
        // caller's, so containerd must not ask it to (`restrict_oom_score_adj`).
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
"#,
            root = dir.join("containerd/root").display(),
            state = dir.join("containerd/state").display(),
            socket = self.socket().display(),
            pause = image::PAUSE_IMAGE,
            cni_bin = cni_bin.display(),
            cni_conf = dir.join("cni").display(),
        );
        let path = dir.join("containerd.toml");
        std::fs::write(&path, config).map_err(Error::io(format!("writing {}", path.display())))?;
        let mut command = self.command("containerd");
        command.arg("--config").arg(&path);
        let guard = ProcessGuard::spawn("containerd", command, &dir.join("containerd.log"))
            .map_err(Error::io("starting containerd"))?;
        self.containerd = Some(guard);
        let started = Instant::now();
        loop {
            let answered = self
                .ctr()
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success());
            if answered {
                return Ok(());
            }
            if let Some(process) = self.containerd.as_mut()
                && let Ok(Some(status)) = process.try_exit_status()
            {
                return Err(Error::Exited {
                    name: "containerd".into(),
                    status,
                    log_tail: process.log_tail(30),
                });
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err(Error::NotReady {
                    what: "containerd".into(),
                    waited_secs: 30,
                    last_error: crate::process::log_tail(&dir.join("containerd.log"), 30),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The sandbox image, one Valkey image per fetched version and `more`, imported into
    /// containerd.
    fn load_images(&self, more: &[ImageSpec]) -> Result<(), Error> {
        let mut images = vec![ImageSpec::pause()];
        images.extend_from_slice(more);
        let root = valkey_bin_root();
        let versions =
            std::fs::read_dir(&root).map_err(Error::io(format!("listing {}", root.display())))?;
        for version in versions.flatten() {
            let server = version.path().join("valkey-server");
            if server.is_file() {
                let name = version.file_name().to_string_lossy().into_owned();
                images.push(ImageSpec::valkey(&name, &server, Path::new(VALKEY_CLI)));
            }
        }
        let folder = self.dir().join("images");
        std::fs::create_dir_all(&folder).map_err(Error::io("creating the image folder"))?;
        for (index, spec) in images.iter().enumerate() {
            let archive = folder.join(format!("{index}.tar"));
            spec.write_archive(&archive)?;
            let output = self
                .ctr()
                .args(["images", "import"])
                .arg(&archive)
                .output()
                .map_err(Error::io("running ctr images import"))?;
            if !output.status.success() {
                return Err(Error::Binaries(format!(
                    "ctr images import {}: {}",
                    spec.reference,
                    String::from_utf8_lossy(&output.stderr)
                )));
            }
        }
        Ok(())
    }

    fn start_kubelet(&mut self, plane: &ControlPlane, options: &NodeOptions) -> Result<(), Error> {
        let dir = self.dir().to_path_buf();
        let config = serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            // This machine has cgroup v1, which kubelet 1.35 refuses unless told.
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root(),
            "address": self.address(),
            "port": 10250,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "containerRuntimeEndpoint": format!("unix://{}", self.socket().display()),
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true},
                "x509": {"clientCAFile": plane.ca_cert()},
            },
            "authorization": {"mode": "Webhook"},
            "failSwapOn": false,
            "resolvConf": "",
            // A test machine's disk is shared with everything else: evict on memory only.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100,
            "serializeImagePulls": false,
            "nodeStatusUpdateFrequency": "2s",
            // Nothing here relies on iptables; a firewall's are the only rules in the node.
            "makeIPTablesUtilChains": false,
            // Its own: a kubelet removes every Pod log folder of a Pod it does not run, so
            // nodes sharing /var/log/pods deleted each other's logs (`kubectl logs` failed).
            "podLogsDir": dir.join("pod-logs"),
        });
        let path = dir.join("kubelet.yaml");
        std::fs::write(&path, config.to_string())
            .map_err(Error::io(format!("writing {}", path.display())))?;
        let mut labels = String::from("valkey-testenv/real-node=true");
        if let Some(zone) = &options.zone {
            labels.push_str(&format!(",topology.kubernetes.io/zone={zone}"));
        }
        let mut command = self.command(plane.bin_dir().join("kubelet"));
        command
            .arg(format!("--config={}", path.display()))
            .arg(format!(
                "--kubeconfig={}",
                plane.kubeconfig_path().display()
            ))
            .arg(format!("--hostname-override={}", self.name))
            .arg(format!("--node-ip={}", self.address()))
            .arg(format!("--root-dir={}", dir.join("kubelet").display()))
            .arg(format!("--cert-dir={}", dir.join("kubelet-pki").display()))
            .arg(format!("--node-labels={labels}"))
            .arg("--v=1");
        let guard = ProcessGuard::spawn("kubelet", command, &dir.join("kubelet.log"))
            .map_err(Error::io("starting the kubelet"))?;
        self.kubelet = Some(guard);
        Ok(())
    }

    async fn wait_ready(&mut self, plane: &ControlPlane, timeout: Duration) -> Result<(), Error> {
        let nodes: Api<Node> = Api::all(plane.client().await?);
        let started = Instant::now();
        let mut last = String::from("not registered");
        while started.elapsed() < timeout {
            if let Some(process) = self.kubelet.as_mut()
                && let Ok(Some(status)) = process.try_exit_status()
            {
                return Err(Error::Exited {
                    name: "kubelet".into(),
                    status,
                    log_tail: process.log_tail(30),
                });
            }
            if let Ok(Some(node)) = nodes.get_opt(&self.name).await {
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == "Ready");
                match ready {
                    Some(c) if c.status == "True" => return Ok(()),
                    Some(c) => {
                        last = format!("Ready={}: {}", c.status, c.message.unwrap_or_default())
                    }
                    None => last = "no Ready condition yet".into(),
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(Error::NotReady {
            what: format!("node {}", self.name),
            waited_secs: timeout.as_secs(),
            last_error: format!(
                "{last}; kubelet log tail:\n{}",
                crate::process::log_tail(&self.dir().join("kubelet.log"), 30)
            ),
        })
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        drop(self.kubelet.take());
        host::kill_containers(&self.cgroup_root(), &self.socket());
        drop(self.containerd.take());
        host::unmount_under(self.dir.path());
        host::remove_network_namespaces(&self.pod_subnet());
        host::remove_cgroups(&self.cgroup_root());
        host::release_node_network(self.subnet);
    }
}

/// The folder of the CNI plugins: what `hack/install-node-packages.sh` prints (it installs
/// containerd, runc and the plugins on first use).
/// The `valkey-cli` the test Valkey images carry: Debian's `redis-cli`, which
/// `hack/install-node-packages.sh` installs (see there why).
const VALKEY_CLI: &str = "/usr/bin/redis-cli";

pub fn cni_bin_dir() -> Result<PathBuf, Error> {
    crate::folder_from_script("hack/install-node-packages.sh")
}
