//! One Pod's life on the test kubelet: start its container as a local `valkey-server`,
//! restart it as the restart policy says, judge readiness by a real PING, report the Pod
//! status, and on deletion stop the process gracefully and remove the Pod.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodIP, PodStatus, Secret,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::container::{argv, expand, map_mounts, program, project, valkey_port, valkey_version};
use super::liveness::{self, Liveness};
use super::{PodSlot, Shared, ip};
use crate::process::ProcessGuard;

/// How often a Pod is re-checked when nothing about it changes.
const RESYNC: Duration = Duration::from_millis(500);
/// How often a started but not yet ready server is probed, so Pods turn Ready promptly.
const STARTING_PROBE: Duration = Duration::from_millis(50);
/// The longest a graceful stop waits before SIGKILL.
const MAX_GRACE: Duration = Duration::from_secs(10);
/// Back-off caps, shorter than a real kubelet's five minutes so tests recover quickly.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Where the Pod's one container stands.
enum Phase {
    /// Not running; try again at `retry_at` (`None`: never, e.g. an unsupported spec).
    Waiting {
        reason: String,
        message: String,
        retry_at: Option<Instant>,
    },
    Running {
        started_at: Time,
        port: u16,
    },
    /// Exited and, by the restart policy, stays down.
    Terminated(ContainerStateTerminated),
}

/// What goes wrong while preparing a container; becomes its waiting reason.
struct NotStarted {
    reason: &'static str,
    message: String,
}

struct PodWorker {
    shared: Arc<Shared>,
    namespace: String,
    name: String,
    uid: String,
    dir: PathBuf,
    scheduled_at: Time,
    phase: Phase,
    /// How many times the container was started.
    starts: i32,
    failed_attempts: u32,
    last_termination: Option<ContainerStateTerminated>,
    /// An exit noticed but not reported yet ([`super::KubeletOptions::exit_reported_after`]):
    /// when it is due, and the phase it leads to.
    unreported_exit: Option<(Instant, Phase)>,
    ready: bool,
    ready_changed_at: Time,
    /// When the server was last PINGed for readiness.
    probed_at: Option<Instant>,
    /// The running container's liveness probe and its count of failures.
    liveness: Option<LivenessState>,
    reported: Option<PodStatus>,
}

/// A liveness probe as it runs against one start of the container.
struct LivenessState {
    probe: Liveness,
    started: Instant,
    probed_at: Option<Instant>,
    failures: u32,
    /// Failed for good: SIGTERM was sent; SIGKILL follows at this moment.
    kill_at: Option<Instant>,
}

/// Runs one Pod until it is deleted. `pods` carries the Pod's latest version, or `None`
/// once it is gone from the API.
pub(super) async fn run(shared: Arc<Shared>, mut pods: watch::Receiver<Option<Pod>>) {
    let Some(first) = pods.borrow().clone() else {
        return;
    };
    let mut worker = PodWorker::new(shared, &first);
    loop {
        let latest = pods.borrow_and_update().clone();
        match latest {
            None => {
                worker.stop(MAX_GRACE).await;
                return;
            }
            Some(pod) if pod.metadata.deletion_timestamp.is_some() => {
                worker.terminate(&pod).await;
                return;
            }
            Some(pod) => {
                if !worker.sync(&pod).await {
                    worker.stop(MAX_GRACE).await;
                    return;
                }
            }
        }
        tokio::select! {
            changed = pods.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(worker.next_check()) => {}
        }
    }
}

/// How long a Pod's worker sleeps before it looks again, unless the Pod changes first (a
/// change wakes it at once). A waiting container has nothing to look at before its retry: a
/// fleet of thousands of Pods that never start (the fleet benchmark's memory phase) would
/// otherwise spend this machine's CPU re-checking them twice a second.
fn next_check(phase: &Phase, ready: bool, now: Instant) -> Duration {
    match phase {
        Phase::Running { .. } if !ready => STARTING_PROBE,
        Phase::Running { .. } | Phase::Terminated(_) => RESYNC,
        // Never retried: looked at again only so a failed status report is sent again.
        Phase::Waiting { retry_at: None, .. } => MAX_BACKOFF,
        Phase::Waiting {
            retry_at: Some(at), ..
        } => at.saturating_duration_since(now).min(MAX_BACKOFF),
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

impl PodWorker {
    fn new(shared: Arc<Shared>, pod: &Pod) -> Self {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // Named by uid alone: a unix socket under it (the server's, in its data folder) must
        // fit the 107 bytes of a socket address.
        let dir = shared.pods_dir.path().join(&uid);
        Self {
            shared,
            namespace,
            name,
            uid,
            dir,
            scheduled_at: now(),
            phase: Phase::Waiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
                retry_at: Some(Instant::now()),
            },
            starts: 0,
            failed_attempts: 0,
            last_termination: None,
            unreported_exit: None,
            ready: false,
            ready_changed_at: now(),
            probed_at: None,
            liveness: None,
            reported: None,
        }
    }

    fn api(&self) -> Api<Pod> {
        Api::namespaced(self.shared.client.clone(), &self.namespace)
    }

    /// Brings the process in line with the Pod and reports its status. False when the
    /// Pod no longer exists.
    async fn sync(&mut self, pod: &Pod) -> bool {
        if let Phase::Waiting {
            retry_at: Some(at), ..
        } = &self.phase
            && Instant::now() >= *at
        {
            self.start(pod).await;
        }
        self.check_exit(pod);
        self.check_liveness(pod).await;
        if self
            .unreported_exit
            .as_ref()
            .is_some_and(|(due, _)| Instant::now() >= *due)
            && let Some((_, next)) = self.unreported_exit.take()
        {
            self.phase = next;
        }
        let ready = match &self.phase {
            // A ready server is probed once per its readiness probe's period, as a kubelet
            // does, not at every re-check: a fleet of hundreds of Pods would otherwise spend
            // the machine's CPU on PINGs.
            Phase::Running { .. } if self.ready && !self.probe_due(pod) => true,
            Phase::Running { port, .. } => {
                self.probed_at = Some(Instant::now());
                match self.ip() {
                    Some(ip) => answers_ping(ip, *port).await,
                    None => false,
                }
            }
            _ => false,
        };
        if ready != self.ready {
            self.ready = ready;
            self.ready_changed_at = now();
        }
        self.report(pod).await
    }

    /// Whether the readiness probe's period (its `periodSeconds`, 10 s unset as in a kubelet;
    /// [`RESYNC`] for a container without a probe) has passed since the last probe.
    fn probe_due(&self, pod: &Pod) -> bool {
        let probe = pod
            .spec
            .as_ref()
            .and_then(|spec| spec.containers.first())
            .and_then(|container| container.readiness_probe.as_ref());
        let period = match probe {
            Some(probe) => Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64),
            None => RESYNC,
        };
        self.probed_at.is_none_or(|at| at.elapsed() >= period)
    }

    fn next_check(&self) -> Duration {
        next_check(&self.phase, self.ready, Instant::now())
    }

    /// The Pod's address while the kubelet holds it for the Pod.
    fn ip(&self) -> Option<Ipv4Addr> {
        let slots = self.shared.slots();
        slots
            .get(&self.uid)
            .filter(|s| s.lease.is_some())
            .map(|s| s.ip)
    }

    /// The address the Pod's status shows: its own, kept after it was released.
    fn shown_ip(&self) -> Option<Ipv4Addr> {
        self.shared.slots().get(&self.uid).map(|s| s.ip)
    }

    /// The Pod's container stopped for good: its address goes back to the pool (to the next
    /// Pod at once, with [`super::KubeletOptions::reuse_freed_ips`]).
    fn release_ip(&self) {
        let released = {
            let mut slots = self.shared.slots();
            slots
                .get_mut(&self.uid)
                .and_then(|s| s.lease.take().map(|_| s.ip))
        };
        let reusable = |ip: &Ipv4Addr| {
            self.shared.options.reuse_freed_ips && !self.shared.claimed().contains(ip)
        };
        if let Some(ip) = released.filter(reusable) {
            self.shared.freed().push(ip);
        }
    }

    async fn start(&mut self, pod: &Pod) {
        match self.spawn(pod).await {
            Ok(port) => {
                self.starts += 1;
                self.failed_attempts = 0;
                self.phase = Phase::Running {
                    started_at: now(),
                    port,
                };
            }
            Err(NotStarted { reason, message }) => {
                self.failed_attempts += 1;
                // A kubelet says ErrImagePull first, then ImagePullBackOff while it waits.
                let reason = match reason {
                    "ErrImagePull" if self.failed_attempts > 1 => "ImagePullBackOff",
                    other => other,
                };
                let retry_at = (reason != "Unsupported").then(|| Instant::now() + self.backoff());
                self.phase = Phase::Waiting {
                    reason: reason.to_string(),
                    message,
                    retry_at,
                };
            }
        }
    }

    fn backoff(&self) -> Duration {
        let exponent = self.failed_attempts.max(self.starts as u32).min(5);
        (Duration::from_millis(500) * 2u32.pow(exponent)).min(MAX_BACKOFF)
    }

    /// Starts the container's process; the client port it serves on.
    async fn spawn(&mut self, pod: &Pod) -> Result<u16, NotStarted> {
        let spec = pod.spec.clone().unwrap_or_default();
        let [container] = spec.containers.as_slice() else {
            return Err(NotStarted {
                reason: "Unsupported",
                message: "the test kubelet runs Pods with exactly one container".into(),
            });
        };
        let image = container.image.clone().unwrap_or_default();
        let version = valkey_version(&image).ok_or_else(|| NotStarted {
            reason: "ErrImagePull",
            message: format!(
                "image {image:?} names no Valkey version: the test kubelet runs only \
                 valkey images tagged MAJOR.MINOR.PATCH"
            ),
        })?;
        let server = self
            .shared
            .options
            .valkey_bin_root
            .join(&version)
            .join("valkey-server");
        if !server.is_file() {
            return Err(NotStarted {
                reason: "ErrImagePull",
                message: format!(
                    "pull of {image:?} failed: no valkey-server {version} at {} \
                     (fetch it with hack/fetch-valkey.sh {version})",
                    server.display()
                ),
            });
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| NotStarted {
            reason: "RunContainerError",
            message: format!("creating {}: {e}", self.dir.display()),
        })?;
        let log = self.dir.join(format!("{}.log", container.name));
        let ip = self.lease_ip(&log)?;
        let env = self.container_env(pod, container, ip).await?;
        let mounts = self.prepare_volumes(pod, container).await?;
        let liveness = Liveness::from_probe(container.liveness_probe.as_ref(), &mounts).map_err(
            |message| NotStarted {
                reason: "Unsupported",
                message,
            },
        )?;
        let command: Vec<String> = (container.command.clone().unwrap_or_default().iter())
            .map(|c| expand(c, &env))
            .collect();
        let args: Vec<String> = (container.args.clone().unwrap_or_default().iter())
            .map(|a| expand(a, &env))
            .collect();
        let argv: Vec<String> = argv(&command, &args)
            .iter()
            .map(|a| map_mounts(a, &mounts))
            .collect();
        let port = valkey_port(&argv);

        let Some((first, rest)) = argv.split_first() else {
            return Err(config_error("the container has an empty command".into()));
        };
        let server_dir = server.parent().unwrap_or(Path::new("/"));
        let mut process = Command::new(program(first, &server));
        process
            .args(rest)
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/local/bin:/usr/bin:/bin", server_dir.display()),
            )
            .env("HOME", &self.dir)
            .env("HOSTNAME", &self.name)
            .envs(&env)
            .current_dir(&self.dir);
        let guard = ProcessGuard::spawn(&self.name, process, &log).map_err(|e| NotStarted {
            reason: "RunContainerError",
            message: format!("starting {argv:?}: {e}"),
        })?;
        // If the kubelet stopped meanwhile there is no slot: the guard drops, killing it.
        if let Some(slot) = self.shared.slots().get_mut(&self.uid) {
            slot.process = Some(guard);
        }
        self.liveness = liveness.map(|probe| LivenessState {
            probe,
            started: Instant::now(),
            probed_at: None,
            failures: 0,
            kill_at: None,
        });
        Ok(port)
    }

    /// The Pod's address: leased on first start, kept across container restarts.
    fn lease_ip(&mut self, log: &Path) -> Result<Ipv4Addr, NotStarted> {
        if let Some(ip) = self.ip() {
            return Ok(ip);
        }
        let reused = std::iter::from_fn(|| self.shared.freed().pop()).find_map(ip::lease_address);
        let lease = reused.or_else(ip::lease).ok_or_else(|| NotStarted {
            reason: "ContainerCreating",
            message: "no free loopback address in 127.1.0.0/16".into(),
        })?;
        let ip = lease.ip();
        let mut slots = self.shared.slots();
        if self.shared.stopped.load(Ordering::SeqCst) {
            return Err(NotStarted {
                reason: "ContainerCreating",
                message: "the test kubelet is stopping".into(),
            });
        }
        slots.insert(
            self.uid.clone(),
            PodSlot {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                log: log.to_path_buf(),
                ip,
                lease: Some(lease),
                process: None,
            },
        );
        Ok(ip)
    }

    /// The container's environment, resolved in order as a kubelet does: literal values
    /// expand earlier variables; `fieldRef`, `configMapKeyRef` and `secretKeyRef` are read.
    async fn container_env(
        &self,
        pod: &Pod,
        container: &Container,
        ip: Ipv4Addr,
    ) -> Result<BTreeMap<String, String>, NotStarted> {
        let mut env = BTreeMap::new();
        for var in container.env.clone().unwrap_or_default() {
            let value = match (&var.value, &var.value_from) {
                (Some(value), _) => expand(value, &env),
                (None, Some(from)) => {
                    if let Some(field) = &from.field_ref {
                        field_value(pod, &field.field_path, ip, &self.shared.options.node_name)
                            .ok_or_else(|| {
                                config_error(format!(
                                    "env {}: unsupported fieldRef {}",
                                    var.name, field.field_path
                                ))
                            })?
                    } else if let Some(key) = &from.config_map_key_ref {
                        let data = self.config_map(&key.name).await?;
                        data.get(&key.key).cloned().ok_or_else(|| {
                            config_error(format!("key {} not in ConfigMap {}", key.key, key.name))
                        })?
                    } else if let Some(key) = &from.secret_key_ref {
                        let data = self.secret(&key.name).await?;
                        data.get(&key.key)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .ok_or_else(|| {
                                config_error(format!("key {} not in Secret {}", key.key, key.name))
                            })?
                    } else {
                        return Err(config_error(format!(
                            "env {}: unsupported valueFrom",
                            var.name
                        )));
                    }
                }
                (None, None) => String::new(),
            };
            env.insert(var.name.clone(), value);
        }
        Ok(env)
    }

    async fn config_map(&self, name: &str) -> Result<BTreeMap<String, String>, NotStarted> {
        let api: Api<ConfigMap> = Api::namespaced(self.shared.client.clone(), &self.namespace);
        let config_map = api
            .get(name)
            .await
            .map_err(|e| config_error(format!("ConfigMap {name}: {e}")))?;
        Ok(config_map.data.unwrap_or_default())
    }

    async fn secret(&self, name: &str) -> Result<BTreeMap<String, Vec<u8>>, NotStarted> {
        let api: Api<Secret> = Api::namespaced(self.shared.client.clone(), &self.namespace);
        let secret = api
            .get(name)
            .await
            .map_err(|e| config_error(format!("Secret {name}: {e}")))?;
        let data = secret.data.unwrap_or_default();
        Ok(data.into_iter().map(|(k, ByteString(v))| (k, v)).collect())
    }

    /// Makes a folder per volume (ConfigMap and Secret volumes filled with their keys) and
    /// returns the container's mounts as (mount path, folder).
    async fn prepare_volumes(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<Vec<(String, PathBuf)>, NotStarted> {
        let volumes_dir = self.dir.join("volumes");
        let spec = pod.spec.clone().unwrap_or_default();
        for volume in spec.volumes.unwrap_or_default() {
            let dir = volumes_dir.join(&volume.name);
            let files: BTreeMap<String, Vec<u8>> = if let Some(cm) = &volume.config_map {
                (self.config_map(&cm.name).await?.into_iter())
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect()
            } else if let Some(secret) = &volume.secret {
                let name = secret.secret_name.clone().unwrap_or_default();
                let all = self.secret(&name).await?;
                project(all, secret.items.as_deref())
                    .map_err(|e| config_error(format!("volume {}: {e}", volume.name)))?
            } else {
                BTreeMap::new()
            };
            let mode = volume.secret.as_ref().and_then(|s| s.default_mode);
            write_files(&dir, &files, mode)
                .map_err(|e| config_error(format!("volume {}: {e}", volume.name)))?;
        }
        Ok((container
            .volume_mounts
            .clone()
            .unwrap_or_default()
            .into_iter())
        .map(|mount| {
            let mut host = volumes_dir.join(&mount.name);
            if let Some(sub) = mount.sub_path.filter(|s| !s.is_empty()) {
                host = host.join(sub);
            }
            (mount.mount_path, host)
        })
        .collect())
    }

    /// Runs the liveness probe when due; kills the container (SIGTERM, then SIGKILL after the
    /// probe's grace, else the Pod's, at most [`MAX_GRACE`]) once it has failed
    /// `failureThreshold` times in a row, as a kubelet does.
    async fn check_liveness(&mut self, pod: &Pod) {
        if !matches!(self.phase, Phase::Running { .. }) || self.unreported_exit.is_some() {
            return;
        }
        let Some(state) = self.liveness.as_mut() else {
            return;
        };
        let now = Instant::now();
        if let Some(kill_at) = state.kill_at {
            if now >= kill_at {
                signal(&self.shared, &self.uid, libc::SIGKILL);
            }
            return;
        }
        let due = state
            .probed_at
            .map_or(state.started + state.probe.initial_delay, |at| {
                at + state.probe.period
            });
        if now < due {
            return;
        }
        state.probed_at = Some(now);
        if liveness::answers(&state.probe.target, state.probe.timeout).await {
            state.failures = 0;
            return;
        }
        state.failures += 1;
        tracing::info!(pod = %self.name, failures = state.failures, "test kubelet: liveness probe failed");
        if state.failures >= state.probe.failure_threshold {
            let pod_grace = pod
                .spec
                .as_ref()
                .and_then(|spec| spec.termination_grace_period_seconds)
                .map_or(MAX_GRACE, |s| Duration::from_secs(s.max(0).unsigned_abs()));
            // A kubelet kills a Pod with `restartPolicy: Never` whose only container failed as
            // a whole, with the Pod's grace; the probe's own grace applies to a container it
            // restarts.
            let never =
                pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
            let probe_grace = state.probe.grace.filter(|_| !never);
            let grace = probe_grace.unwrap_or(pod_grace).min(MAX_GRACE);
            state.kill_at = Some(Instant::now() + grace);
            signal(&self.shared, &self.uid, libc::SIGTERM);
        }
    }

    /// Notices an exited process: restarts it later or leaves it down, per restartPolicy.
    fn check_exit(&mut self, pod: &Pod) {
        let Phase::Running { started_at, .. } = &self.phase else {
            return;
        };
        if self.unreported_exit.is_some() {
            return;
        }
        let status = {
            let mut slots = self.shared.slots();
            let Some(process) = slots.get_mut(&self.uid).and_then(|s| s.process.as_mut()) else {
                return;
            };
            match process.try_exit_status() {
                Ok(Some(status)) => status,
                _ => return,
            }
        };
        use std::os::unix::process::ExitStatusExt;
        let exit_code = status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(-1);
        let terminated = ContainerStateTerminated {
            exit_code,
            signal: status.signal(),
            reason: Some(if exit_code == 0 { "Completed" } else { "Error" }.into()),
            started_at: Some(started_at.clone()),
            finished_at: Some(now()),
            ..Default::default()
        };
        if let Some(slot) = self.shared.slots().get_mut(&self.uid) {
            slot.process = None;
        }
        let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.clone());
        let restarts = match policy.as_deref() {
            Some("Never") => false,
            Some("OnFailure") => exit_code != 0,
            _ => true,
        };
        self.last_termination = Some(terminated.clone());
        if !restarts {
            self.release_ip();
        }
        let next = if restarts {
            let delay = self.backoff();
            Phase::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: format!(
                    "back-off {}ms restarting failed container (exit code {exit_code})",
                    delay.as_millis()
                ),
                retry_at: Some(Instant::now() + delay),
            }
        } else {
            Phase::Terminated(terminated)
        };
        let lag = self.shared.options.exit_reported_after;
        if lag.is_zero() {
            self.phase = next;
        } else {
            // The status still says running (not ready: nothing answers the probe now).
            self.unreported_exit = Some((Instant::now() + lag, next));
        }
    }

    /// Patches the Pod status when it changed; false if the Pod is gone.
    async fn report(&mut self, pod: &Pod) -> bool {
        let status = self.status(pod);
        if self.reported.as_ref() == Some(&status) {
            return true;
        }
        let patch = serde_json::json!({ "status": status });
        match self
            .api()
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.reported = Some(status);
                true
            }
            Err(kube::Error::Api(e)) if e.code == 404 => false,
            Err(e) => {
                tracing::warn!(pod = %self.name, error = %e, "test kubelet: reporting status");
                true
            }
        }
    }

    fn status(&self, pod: &Pod) -> PodStatus {
        let container = pod.spec.as_ref().and_then(|s| s.containers.first());
        let (phase, state) = match &self.phase {
            Phase::Waiting {
                reason, message, ..
            } => (
                if self.starts > 0 {
                    "Running"
                } else {
                    "Pending"
                },
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.clone()),
                        message: (!message.is_empty()).then(|| message.clone()),
                    }),
                    ..Default::default()
                },
            ),
            Phase::Running { started_at, .. } => (
                "Running",
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(started_at.clone()),
                    }),
                    ..Default::default()
                },
            ),
            Phase::Terminated(t) => (
                if t.exit_code == 0 {
                    "Succeeded"
                } else {
                    "Failed"
                },
                ContainerState {
                    terminated: Some(t.clone()),
                    ..Default::default()
                },
            ),
        };
        let ready = if self.ready { "True" } else { "False" };
        let not_ready_reason = (!self.ready).then(|| "ContainersNotReady".to_string());
        let condition =
            |type_: &str, status: &str, at: &Time, reason: Option<String>| PodCondition {
                type_: type_.into(),
                status: status.into(),
                last_transition_time: Some(at.clone()),
                reason,
                ..Default::default()
            };
        let ip = self.shown_ip().map(|ip| ip.to_string());
        PodStatus {
            phase: Some(phase.into()),
            host_ip: Some("127.0.0.1".into()),
            pod_ip: ip.clone(),
            pod_ips: ip.map(|ip| vec![PodIP { ip }]),
            start_time: Some(self.scheduled_at.clone()),
            conditions: Some(vec![
                condition("PodScheduled", "True", &self.scheduled_at, None),
                condition("Initialized", "True", &self.scheduled_at, None),
                condition(
                    "ContainersReady",
                    ready,
                    &self.ready_changed_at,
                    not_ready_reason.clone(),
                ),
                condition("Ready", ready, &self.ready_changed_at, not_ready_reason),
            ]),
            container_statuses: container.map(|c| {
                vec![ContainerStatus {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    image_id: String::new(),
                    container_id: self.pid().map(|pid| format!("testenv://{pid}")),
                    ready: self.ready,
                    started: Some(matches!(self.phase, Phase::Running { .. })),
                    restart_count: (self.starts - 1).max(0),
                    state: Some(state),
                    last_state: self.last_termination.clone().map(|t| ContainerState {
                        terminated: Some(t),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    fn pid(&self) -> Option<u32> {
        let slots = self.shared.slots();
        slots
            .get(&self.uid)?
            .process
            .as_ref()
            .map(ProcessGuard::pid)
    }

    /// The Pod is being deleted: stop the process within its grace period, free the
    /// address, and remove the Pod object (what a kubelet's final grace-0 delete does).
    async fn terminate(&mut self, pod: &Pod) {
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(MAX_GRACE)
            .min(MAX_GRACE);
        self.stop(grace).await;
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        if let Err(e) = self.api().delete(&self.name, &params).await {
            tracing::debug!(pod = %self.name, error = %e, "test kubelet: final delete");
        }
    }

    /// Stops the process (SIGTERM, then SIGKILL after `grace`) and frees the address.
    async fn stop(&mut self, grace: Duration) {
        let slot = self.shared.slots().remove(&self.uid);
        if let Some(PodSlot {
            process: Some(process),
            ..
        }) = slot
        {
            let _ = tokio::task::spawn_blocking(move || process.stop(grace)).await;
        }
        // The log stays (for post-mortems) until the kubelet's folder goes; the data goes now.
        let _ = std::fs::remove_dir_all(self.dir.join("volumes"));
    }
}

/// Sends `signal` to the container process of the Pod `uid`, if it runs.
fn signal(shared: &Shared, uid: &str, signal: libc::c_int) {
    if let Some(process) = shared.slots().get(uid).and_then(|s| s.process.as_ref()) {
        process.signal(signal);
    }
}

fn config_error(message: String) -> NotStarted {
    NotStarted {
        reason: "CreateContainerConfigError",
        message,
    }
}

/// The downward-API fields a `fieldRef` may name.
fn field_value(pod: &Pod, path: &str, ip: Ipv4Addr, node: &str) -> Option<String> {
    let meta = &pod.metadata;
    let lookup = |map: &Option<BTreeMap<String, String>>, prefix: &str| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.as_ref()?.get(key).cloned().unwrap_or_default())
    };
    match path {
        "status.podIP" | "status.podIPs" => Some(ip.to_string()),
        "status.hostIP" | "status.hostIPs" => Some("127.0.0.1".into()),
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => Some(node.to_string()),
        "spec.serviceAccountName" => pod.spec.as_ref()?.service_account_name.clone(),
        _ => lookup(&meta.labels, "metadata.labels['")
            .or_else(|| lookup(&meta.annotations, "metadata.annotations['")),
    }
}

/// Writes each file (its path may hold folders) with `mode` when one is given, as a kubelet
/// writes a Secret volume's `defaultMode`.
fn write_files(
    dir: &Path,
    files: &BTreeMap<String, Vec<u8>>,
    mode: Option<i32>,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    for (name, content) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
        if let Some(mode) = mode.and_then(|m| u32::try_from(m).ok()) {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

/// A real readiness check: the server answers PING (`-NOAUTH`, or `-NOPERM` where `default`
/// may log in but not ping, still proves it serves; `-LOADING` does not).
async fn answers_ping(ip: Ipv4Addr, port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect((ip, port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut reply = [0u8; 64];
        let n = stream.read(&mut reply).await.ok()?;
        let reply = &reply[..n];
        let serving: [&[u8]; 3] = [b"+PONG", b"-NOAUTH", b"-NOPERM"];
        Some(serving.iter().any(|answer| reply.starts_with(answer)))
    };
    tokio::time::timeout(Duration::from_millis(500), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(retry_at: Option<Instant>) -> Phase {
        Phase::Waiting {
            reason: "ErrImagePull".into(),
            message: String::new(),
            retry_at,
        }
    }

    #[test]
    fn a_waiting_container_is_looked_at_again_when_its_retry_is_due() {
        let now = Instant::now();
        let in_eight_seconds = waiting(Some(now + Duration::from_secs(8)));
        assert_eq!(
            next_check(&in_eight_seconds, false, now),
            Duration::from_secs(8)
        );
        let overdue = waiting(Some(now - Duration::from_secs(1)));
        assert_eq!(next_check(&overdue, false, now), Duration::ZERO);
        assert_eq!(next_check(&waiting(None), false, now), MAX_BACKOFF);
    }

    #[test]
    fn a_running_container_is_probed_fast_until_ready_then_resynced() {
        let running = Phase::Running {
            started_at: now(),
            port: 6379,
        };
        let at = Instant::now();
        assert_eq!(next_check(&running, false, at), STARTING_PROBE);
        assert_eq!(next_check(&running, true, at), RESYNC);
    }
}
