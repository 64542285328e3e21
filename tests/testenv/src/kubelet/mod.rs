//! The test kubelet: registers a Node, binds unscheduled Pods to it (no scheduler runs
//! here), and runs each Pod bound to it as a local `valkey-server` process on its own
//! loopback IP, reporting the Pod's status back like a kubelet would.

mod container;
pub(crate) mod ip;
mod liveness;
mod pod;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::watch;

use crate::process::ProcessGuard;
use crate::{Error, KUBERNETES_VERSION, valkey_bin_root};

/// How the test kubelet presents itself.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    /// The Node's name.
    pub node_name: String,
    /// Extra Node labels (e.g. `topology.kubernetes.io/zone`), also matched against
    /// a Pod's `nodeSelector` before binding it.
    pub labels: BTreeMap<String, String>,
    /// Bind Pods that have no `nodeName` yet (the job of the scheduler that is not running).
    pub bind_unscheduled: bool,
    /// Folder with one `<version>/valkey-server` per Valkey version.
    pub valkey_bin_root: PathBuf,
    /// Hand the address of a Pod whose container has stopped for good to the next Pod at
    /// once, as a real CNI may, instead of round-robin (see [`ip`]).
    pub reuse_freed_ips: bool,
    /// How long after a container exits its Pod's status says so. The address is released at
    /// once; a real kubelet's status lags the runtime (its relist and status manager), so the
    /// API shows a stopped Pod as running, at its old address, for a moment. Zero: at once.
    pub exit_reported_after: std::time::Duration,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        Self {
            node_name: "testenv-node".to_string(),
            labels: BTreeMap::new(),
            bind_unscheduled: true,
            valkey_bin_root: valkey_bin_root(),
            reuse_freed_ips: false,
            exit_reported_after: std::time::Duration::ZERO,
        }
    }
}

/// A Pod's local process as the kubelet runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProcess {
    pub namespace: String,
    pub name: String,
    /// The Pod's IP (kept across container restarts; freed when the Pod goes, or once its
    /// container has stopped for good, while its status still shows it).
    pub ip: Ipv4Addr,
    /// Whether the kubelet still holds the address for the Pod.
    pub holds_ip: bool,
    /// The `valkey-server` process id, `None` while the container is not running.
    pub pid: Option<u32>,
    /// The container's output (what `kubectl logs` would show); kept after the Pod goes,
    /// until the kubelet is dropped.
    pub log: PathBuf,
}

/// A Pod's address and process, held until the Pod goes.
#[derive(Debug)]
struct PodSlot {
    namespace: String,
    name: String,
    log: PathBuf,
    ip: Ipv4Addr,
    /// The address, while the Pod may still run: released once its container has stopped
    /// for good.
    lease: Option<ip::IpLease>,
    process: Option<ProcessGuard>,
}

/// What the kubelet's tasks share.
struct Shared {
    client: kube::Client,
    options: KubeletOptions,
    pods_dir: tempfile::TempDir,
    /// Pod uid -> address and process. The kubelet's Drop empties it, killing everything.
    slots: Mutex<HashMap<String, PodSlot>>,
    /// Addresses released by stopped Pods, most recent last ([`KubeletOptions::reuse_freed_ips`]).
    freed: Mutex<Vec<Ipv4Addr>>,
    /// Addresses a test claimed ([`TestKubelet::claim_ip_at_release`]): kept from the next Pod
    /// when released, for the test to take.
    claimed: Mutex<HashSet<Ipv4Addr>>,
    /// Set by the kubelet's Drop; checked under the `slots` lock before adding a slot, so
    /// no Pod worker still running can start a process that outlives the kubelet.
    stopped: AtomicBool,
}

impl Shared {
    fn slots(&self) -> MutexGuard<'_, HashMap<String, PodSlot>> {
        // A poisoned lock only means a panic elsewhere; the map itself stays consistent.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn freed(&self) -> MutexGuard<'_, Vec<Ipv4Addr>> {
        self.freed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn claimed(&self) -> MutexGuard<'_, HashSet<Ipv4Addr>> {
        self.claimed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running test kubelet. Dropping it kills every Pod process it started.
pub struct TestKubelet {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl TestKubelet {
    /// Registers the Node and starts taking Pods.
    pub async fn start(client: kube::Client, options: KubeletOptions) -> Result<Self, Error> {
        register_node(&client, &options).await?;
        let pods_dir = tempfile::Builder::new()
            .prefix("testenv-pods-")
            .tempdir()
            .map_err(Error::io("creating the kubelet's pod folder"))?;
        let shared = Arc::new(Shared {
            client,
            options,
            pods_dir,
            slots: Mutex::new(HashMap::new()),
            freed: Mutex::new(Vec::new()),
            claimed: Mutex::new(HashSet::new()),
            stopped: AtomicBool::new(false),
        });
        let task = tokio::spawn(watch_pods(shared.clone()));
        Ok(Self { shared, task })
    }

    /// The Node this kubelet registered.
    pub fn node_name(&self) -> &str {
        &self.shared.options.node_name
    }

    /// The process and address of a Pod, if the kubelet holds it.
    pub fn pod_process(&self, namespace: &str, name: &str) -> Option<PodProcess> {
        self.pod_processes()
            .into_iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }

    /// Every Pod the kubelet holds an address for.
    pub fn pod_processes(&self) -> Vec<PodProcess> {
        self.shared
            .slots()
            .values()
            .map(|slot| PodProcess {
                namespace: slot.namespace.clone(),
                name: slot.name.clone(),
                ip: slot.ip,
                holds_ip: slot.lease.is_some(),
                pid: slot.process.as_ref().map(ProcessGuard::pid),
                log: slot.log.clone(),
            })
            .collect()
    }
}

impl TestKubelet {
    /// The address of a Pod whose container has stopped for good, leased to the caller once
    /// the kubelet has released it (as a CNI hands it to the next Pod): what a test puts a
    /// stranger at. `None` while the kubelet still holds it, or if another took it first.
    pub fn take_released_ip(&self, namespace: &str, name: &str) -> Option<ip::IpLease> {
        let process = self.pod_process(namespace, name)?;
        if process.holds_ip {
            return None;
        }
        let lease = ip::lease_address(process.ip)?;
        self.shared.claimed().remove(&process.ip);
        Some(lease)
    }

    /// Keeps a running Pod's address from the next Pod once it is released, so that
    /// [`Self::take_released_ip`] gets it for certain (a stranger's test would otherwise race
    /// the cluster's own new Pod for it). Whether the Pod is known.
    pub fn claim_ip_at_release(&self, namespace: &str, name: &str) -> bool {
        let Some(process) = self.pod_process(namespace, name) else {
            return false;
        };
        self.shared.claimed().insert(process.ip);
        true
    }
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        self.task.abort();
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Dropping the slots kills the process groups and frees the addresses.
        self.shared.slots().clear();
    }
}

async fn register_node(client: &kube::Client, options: &KubeletOptions) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = &options.node_name;
    let mut labels = options.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), "amd64".into());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
    }))
    .map_err(|e| Error::Encoding(format!("the Node {name}: {e}")))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {
            nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(&node))
                .await
                .map_err(Error::kube(format!("relabeling Node {name}")))?;
        }
        Err(e) => return Err(Error::kube(format!("creating Node {name}"))(e)),
    }
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let status = json!({"status": {
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "testenv kubelet is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ],
        // As many Pods as the kubelet has addresses for (see `ip`).
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "65024"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "65024"},
        "nodeInfo": {
            "kubeletVersion": KUBERNETES_VERSION, "kubeProxyVersion": KUBERNETES_VERSION,
            "containerRuntimeVersion": "testenv://local-processes",
            "operatingSystem": "linux", "architecture": "amd64",
            "osImage": "testenv", "kernelVersion": "", "machineID": "", "systemUUID": "",
            "bootID": "",
        },
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(Error::kube(format!("reporting Node {name} ready")))?;
    Ok(())
}

/// Watches every Pod: binds unscheduled ones, and hands each Pod bound to this node to a
/// worker task of its own (so one Pod's slow stop never delays another Pod).
async fn watch_pods(shared: Arc<Shared>) {
    let pods: Api<Pod> = Api::all(shared.client.clone());
    let mut workers: HashMap<String, watch::Sender<Option<Pod>>> = HashMap::new();
    let mut events = watcher::watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(pod) | Event::InitApply(pod)) => {
                if pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_none()
                {
                    // Bound on a task of its own, as a scheduler binds many Pods at once: a
                    // fleet creating hundreds of Pods must not wait for each binding in turn.
                    tokio::spawn(bind(shared.clone(), pod));
                } else if is_ours(&shared, &pod) {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    match workers.get(&uid) {
                        Some(worker) if !worker.is_closed() => {
                            let _ = worker.send(Some(pod));
                        }
                        _ => {
                            let (tx, rx) = watch::channel(Some(pod));
                            tokio::spawn(pod::run(shared.clone(), rx));
                            workers.insert(uid, tx);
                        }
                    }
                }
            }
            Ok(Event::Delete(pod)) => {
                let uid = pod.metadata.uid.unwrap_or_default();
                if let Some(worker) = workers.get(&uid) {
                    let _ = worker.send(None);
                }
            }
            Ok(Event::Init | Event::InitDone) => {}
            Err(e) => tracing::warn!(error = %e, "test kubelet: watching Pods"),
        }
        workers.retain(|_, worker| !worker.is_closed());
    }
}

fn is_ours(shared: &Shared, pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&shared.options.node_name)
}

/// Binds an unscheduled Pod to this node if its `nodeSelector` fits the node's labels.
async fn bind(shared: Arc<Shared>, pod: Pod) {
    let options = &shared.options;
    if !options.bind_unscheduled || pod.metadata.deletion_timestamp.is_some() {
        return;
    }
    let selector = pod.spec.as_ref().and_then(|s| s.node_selector.clone());
    let fits = selector.unwrap_or_default().iter().all(|(key, value)| {
        options.labels.get(key) == Some(value)
            || (key == "kubernetes.io/hostname" && value == &options.node_name)
    });
    if !fits {
        return;
    }
    let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
        return;
    };
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "uid": pod.metadata.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": options.node_name},
    });
    let pods: Api<Pod> = Api::namespaced(shared.client.clone(), namespace);
    let bound: Result<serde_json::Value, _> = pods
        .create_subresource("binding", name, &PostParams::default(), &binding)
        .await;
    // A conflict means another kubelet bound it first.
    if let Err(e) = bound {
        tracing::debug!(error = %e, pod = %name, "test kubelet: binding");
    }
}
