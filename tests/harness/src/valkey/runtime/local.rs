//! The local node runtime: every node is a `valkey-server` process bound to its own loopback
//! address `127.0.<subnet>.<n>` on the standard ports 6379/16379, announcing that address to
//! the cluster, as a pod would. Processes run in their own process group and are killed (with
//! any fork children, e.g. a sync in progress) when stopped or when the runtime is dropped,
//! also during a panic.

use std::collections::HashMap;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use super::{NodeRuntime, NodeSpec, RuntimeError};

use valkey_operator::valkey::{CLIENT_PORT as VALKEY_PORT, NodeAddress};

/// Settings every local node starts with: fast full syncs (diskless, no delay), no
/// persistence, a short node timeout so Valkey's own failover of a dead primary is quick, and
/// no automatic replica migration (the planner places replicas).
const DEFAULT_SETTINGS: &[(&str, &str)] = &[
    ("save", ""),
    ("appendonly", "no"),
    ("repl-diskless-sync", "yes"),
    ("repl-diskless-sync-delay", "0"),
    ("cluster-node-timeout", "2000"),
    ("cluster-allow-replica-migration", "no"),
    ("cluster-replica-validity-factor", "0"),
    ("protected-mode", "no"),
];

/// The folder holding `<version>/valkey-server`: `$VALKEY_BIN_ROOT`, else
/// `$HOME/.cache/valkey-operator/valkey` (where `hack/fetch-valkey.sh` puts them).
pub fn valkey_bin_root() -> PathBuf {
    if let Some(root) = std::env::var_os("VALKEY_BIN_ROOT") {
        return PathBuf::from(root);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    Path::new(&home).join(".cache/valkey-operator/valkey")
}

/// Where node folders go: memory-backed `/dev/shm` when there is one, because Valkey fsyncs
/// its cluster config file and a busy disk was seen to stall a node's start for over 10 s;
/// otherwise the system's temporary folder.
fn scratch_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

struct LocalNode {
    child: Child,
    address: NodeAddress,
}

struct State {
    next_host: u8,
    nodes: HashMap<String, LocalNode>,
}

/// Runs nodes as local processes in `127.0.<subnet>.0/24`. Give each test its own subnet so
/// tests can run in parallel.
pub struct LocalRuntime {
    subnet: u8,
    bin_root: PathBuf,
    work_dir: PathBuf,
    settings: Vec<(String, String)>,
    state: Mutex<State>,
}

impl LocalRuntime {
    /// A runtime for `127.0.<subnet>.2` upwards, keeping node folders under a fresh scratch
    /// folder (removed on drop).
    pub fn new(subnet: u8) -> Result<Self, RuntimeError> {
        let work_dir = scratch_root().join(format!("valkey-local-{}-{subnet}", std::process::id()));
        // A leftover folder from an earlier run of this process id is stale.
        let _ = fs::remove_dir_all(&work_dir);
        fs::create_dir_all(&work_dir).map_err(|source| RuntimeError::Io {
            node: work_dir.display().to_string(),
            action: "create the work folder",
            source,
        })?;
        Ok(Self {
            subnet,
            bin_root: valkey_bin_root(),
            work_dir,
            settings: DEFAULT_SETTINGS
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            state: Mutex::new(State {
                next_host: 2,
                nodes: HashMap::new(),
            }),
        })
    }

    /// Override or add a setting passed to every node started from now on.
    pub fn with_setting(mut self, key: &str, value: &str) -> Self {
        self.settings.retain(|(k, _)| k != key);
        self.settings.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The scratch folder of this runtime's nodes: a test's own files beside them (an
    /// `include`d file, say) go when the runtime does.
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// Path of the engine binary for a revision (an engine version).
    pub fn binary(&self, revision: &str) -> PathBuf {
        self.bin_root.join(revision).join("valkey-server")
    }

    /// The address of a running node.
    pub fn address(&self, name: &str) -> Option<NodeAddress> {
        self.lock().nodes.get(name).map(|node| node.address)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start(&self, spec: &NodeSpec) -> Result<NodeAddress, RuntimeError> {
        let binary = self.binary(&spec.revision);
        if !binary.is_file() {
            return Err(RuntimeError::MissingBinary {
                node: spec.name.clone(),
                revision: spec.revision.clone(),
                path: binary,
            });
        }
        let mut state = self.lock();
        if state.nodes.contains_key(&spec.name) {
            return Err(RuntimeError::AlreadyRunning {
                node: spec.name.clone(),
            });
        }
        if state.next_host == u8::MAX {
            return Err(RuntimeError::AddressesExhausted {
                node: spec.name.clone(),
                subnet: self.subnet,
            });
        }
        let ip = std::net::Ipv4Addr::new(127, 0, self.subnet, state.next_host);
        let address = NodeAddress::new(ip.into(), VALKEY_PORT);
        let ip = ip.to_string();
        let dir = self.work_dir.join(&spec.name);
        let io = |action| {
            let node = spec.name.clone();
            move |source| RuntimeError::Io {
                node,
                action,
                source,
            }
        };
        fs::create_dir_all(&dir).map_err(io("create the node folder"))?;
        let log = fs::File::create(dir.join("valkey.log")).map_err(io("create the log"))?;
        let log_err = log.try_clone().map_err(io("open the log"))?;
        let mut command = Command::new(&binary);
        command
            .args(["--bind", &ip, "--port", &VALKEY_PORT.to_string()])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-announce-ip", &ip])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(&dir);
        for (key, value) in &self.settings {
            command.arg(format!("--{key}")).arg(value);
        }
        let child = command
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .spawn()
            .map_err(io("start valkey-server"))?;
        state.next_host += 1;
        state
            .nodes
            .insert(spec.name.clone(), LocalNode { child, address });
        Ok(address)
    }

    fn stop(&self, name: &str) -> Result<(), RuntimeError> {
        let node = self
            .lock()
            .nodes
            .remove(name)
            .ok_or_else(|| RuntimeError::UnknownNode {
                node: name.to_owned(),
            })?;
        kill_group(node);
        Ok(())
    }
}

/// Kill the node's whole process group and reap it.
fn kill_group(mut node: LocalNode) {
    if let Ok(pgid) = i32::try_from(node.child.id()) {
        // SAFETY: killpg only sends a signal; the group id is our own child's, which we
        // started as a group leader and have not reaped yet, so it cannot have been reused.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
    let _ = node.child.kill();
    let _ = node.child.wait();
}

impl NodeRuntime for LocalRuntime {
    async fn start_node(&self, spec: &NodeSpec) -> Result<NodeAddress, RuntimeError> {
        self.start(spec)
    }

    async fn stop_node(&self, name: &str) -> Result<(), RuntimeError> {
        self.stop(name)
    }
}

impl Drop for LocalRuntime {
    fn drop(&mut self) {
        let nodes: Vec<LocalNode> = self.lock().nodes.drain().map(|(_, node)| node).collect();
        for node in nodes {
            kill_group(node);
        }
        if std::thread::panicking() {
            // Keep the node logs of a failing test for whoever investigates.
            eprintln!("valkey node folders kept in {}", self.work_dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.work_dir);
        }
    }
}
