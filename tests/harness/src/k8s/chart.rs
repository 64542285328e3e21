//! The installed Helm chart as tests use it: the real helm and kubectl against a testenv control
//! plane, the release installed into `valkey-operator`, and the operator binary run as a local
//! process with the chart's identity (a token of its ServiceAccount, so only the chart's RBAC)
//! and the chart's generated certificate, with the chart's webhooks re-pointed at it by URL.
//!
//! No kubelet runs the operator's container image here (there is no container runtime), so the
//! Deployment's pods never start and the chart's Service has no endpoints: that is why the
//! process is local and the webhooks are re-pointed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use testenv::ControlPlane;

use super::tail;
use crate::https::{client_trusting, write_certificates};
use crate::{GROUP, eventually, operator_binary};

pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/valkey-operator");
pub const NAMESPACE: &str = "valkey-operator";
pub const RELEASE: &str = "valkey-operator";

/// Runs a command, feeding `stdin`; returns success and stdout+stderr.
pub fn run(mut command: Command, stdin: Option<&str>) -> (bool, String) {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The real helm, with its own config/cache folders and (optionally) a control plane.
pub struct Helm {
    bin: PathBuf,
    kubeconfig: Option<PathBuf>,
    home: tempfile::TempDir,
}

impl Helm {
    pub fn new(bin_dir: &Path, kubeconfig: Option<&Path>) -> Self {
        Self {
            bin: bin_dir.join("helm"),
            kubeconfig: kubeconfig.map(Path::to_path_buf),
            home: tempfile::tempdir().unwrap(),
        }
    }

    pub fn run(&self, args: &[&str]) -> (bool, String) {
        let mut command = Command::new(&self.bin);
        for (variable, folder) in [
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_DATA_HOME", "data"),
        ] {
            command.env(variable, self.home.path().join(folder));
        }
        if let Some(kubeconfig) = &self.kubeconfig {
            command.arg("--kubeconfig").arg(kubeconfig);
        }
        command.args(args);
        run(command, None)
    }

    pub fn must(&self, args: &[&str]) -> String {
        let (ok, output) = self.run(args);
        assert!(ok, "helm {args:?} failed:\n{output}");
        output
    }
}

pub fn kubectl(plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut command = plane.kubectl();
    command.args(args);
    run(command, stdin)
}

pub fn must(plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, output) = kubectl(plane, args, stdin);
    assert!(ok, "kubectl {args:?} failed:\n{output}");
    output
}

pub fn get_json(plane: &ControlPlane, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["-o", "json"]);
    let output = plane.kubectl().args(&args).output().expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Waits until every CRD applied so far is served.
pub fn wait_crds_established(plane: &ControlPlane) {
    let wait = [
        "wait",
        "--for",
        "condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ];
    must(plane, &wait, None);
}

/// A control plane with the chart's CRDs established and the release namespace created.
pub async fn control_plane_with_crds() -> (ControlPlane, Helm) {
    control_plane_with_crds_from(testenv::ControlPlaneOptions::default()).await
}

/// [`control_plane_with_crds`] on a control plane started with `options`.
pub async fn control_plane_with_crds_from(
    options: testenv::ControlPlaneOptions,
) -> (ControlPlane, Helm) {
    let plane = ControlPlane::start_with(options)
        .await
        .expect("control plane");
    must(
        &plane,
        &[
            "apply",
            "--server-side",
            "-f",
            &format!("{CHART}/crds/crds.yaml"),
        ],
        None,
    );
    wait_crds_established(&plane);
    must(&plane, &["create", "namespace", NAMESPACE], None);
    // The strictest Pod Security Standard: the API server warns about a Deployment whose pods
    // it would refuse.
    must(
        &plane,
        &[
            "label",
            "namespace",
            NAMESPACE,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/warn=restricted",
        ],
        None,
    );
    let helm = Helm::new(plane.bin_dir(), Some(plane.kubeconfig_path()));
    (plane, helm)
}

/// `helm install` with an extra IP in the certificate, so the local operator process can serve
/// the chart's certificate on https://127.0.0.1.
/// Returns helm's output (with the chart's NOTES).
pub fn install(helm: &Helm, extra: &[&str]) -> String {
    let mut args = vec![
        "install",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--set",
        "certificate.extraIpAddresses={127.0.0.1}",
        "--timeout",
        "60s",
    ];
    args.extend(extra);
    let output = helm.must(&args);
    assert!(output.contains("STATUS: deployed"), "{output}");
    output
}

/// A Secret's key, decoded.
pub fn secret_key(plane: &ControlPlane, secret: &str, key: &str) -> String {
    let template = format!("{{{{index .data \"{key}\" | base64decode}}}}");
    must(
        plane,
        &[
            "get",
            "secret",
            secret,
            "-n",
            NAMESPACE,
            "-o",
            &format!("go-template={template}"),
        ],
        None,
    )
}

/// What the operator process needs from the installed chart: its certificate files and a
/// kubeconfig that authenticates as its ServiceAccount (and nothing else).
pub struct ChartIdentity {
    dir: tempfile::TempDir,
}

impl ChartIdentity {
    pub fn from_release(plane: &ControlPlane) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for key in ["ca.crt", "tls.crt", "tls.key"] {
            std::fs::write(
                dir.path().join(key),
                secret_key(plane, "valkey-operator-tls", key),
            )
            .unwrap();
        }
        let token = must(
            plane,
            &["create", "token", RELEASE, "-n", NAMESPACE, "--duration=1h"],
            None,
        );
        let admin: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(plane.kubeconfig_path()).unwrap())
                .unwrap();
        let ca_data = admin["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .expect("the admin kubeconfig's CA");
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "testenv", "cluster": {
                "server": plane.server_url(),
                "certificate-authority-data": ca_data,
            }}],
            "users": [{"name": "valkey-operator", "user": {"token": token.trim()}}],
            "contexts": [{"name": "chart", "context": {"cluster": "testenv", "user": "valkey-operator"}}],
            "current-context": "chart",
        });
        std::fs::write(
            dir.path().join("kubeconfig"),
            serde_yaml_ng::to_string(&kubeconfig).unwrap(),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("metrics-token"),
            metrics_reader_token(plane),
        )
        .unwrap();
        Self { dir }
    }

    /// The admin kubeconfig and development certificates from `valkey-operator certs`, for
    /// tests that are not about RBAC.
    pub fn admin(plane: &ControlPlane) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_certificates(dir.path());
        std::fs::copy(plane.kubeconfig_path(), dir.path().join("kubeconfig")).unwrap();
        Self { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// `kubectl auth can-i` as the chart's ServiceAccount.
    pub fn can_i(&self, plane: &ControlPlane, args: &[&str]) -> bool {
        let mut command = Command::new(plane.bin_dir().join("kubectl"));
        command
            .env("KUBECONFIG", self.path("kubeconfig"))
            .args(["auth", "can-i"])
            .args(args);
        // The answer is on stdout; warnings (e.g. about cluster-scoped kinds) go to stderr.
        let output = command.output().expect("run kubectl auth can-i");
        String::from_utf8_lossy(&output.stdout).trim() == "yes"
    }
}

/// A token of a ServiceAccount bound to the chart's ClusterRole `<release>-metrics-reader`, as
/// a Prometheus would be (the operator serves /metrics to such callers only).
fn metrics_reader_token(plane: &ControlPlane) -> String {
    let reader = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: metrics-reader, namespace: {NAMESPACE}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: metrics-reader}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {RELEASE}-metrics-reader}}\n\
         subjects: [{{kind: ServiceAccount, name: metrics-reader, namespace: {NAMESPACE}}}]\n"
    );
    must(plane, &["apply", "-f", "-"], Some(&reader));
    let args = [
        "create",
        "token",
        "metrics-reader",
        "-n",
        NAMESPACE,
        "--duration=1h",
    ];
    must(plane, &args, None).trim().to_string()
}

/// The operator binary as a local process; killed when dropped, also when the test panics.
pub struct Operator {
    child: Child,
    /// The binary it runs: [`operator_binary`] unless started or restarted with another.
    binary: PathBuf,
    /// `https://127.0.0.1:PORT`, served with the chart's certificate.
    pub url: String,
    log: PathBuf,
    client: reqwest::Client,
    /// Everything after the program name, so [`Operator::kill_and_restart`] starts the same process.
    args: Vec<std::ffi::OsString>,
    kubeconfig: PathBuf,
    /// The bearer token /metrics is read with, if the identity has one.
    metrics_token: Option<String>,
    /// The cgroup (v2) it runs in, for [`Self::cut_from`]: its path under the v2 root, and
    /// its `cgroup.procs`; `None` where none could be made.
    cgroup: Option<(String, PathBuf)>,
}

impl Operator {
    /// Runs in the chart's namespace (its ConfigMap and Lease live there).
    pub fn start(identity: &ChartIdentity, log_name: &str) -> Self {
        Self::start_with(identity, log_name, NAMESPACE, &[])
    }

    pub fn start_in(identity: &ChartIdentity, log_name: &str, namespace: &str) -> Self {
        Self::start_with(identity, log_name, namespace, &[])
    }

    /// With extra `serve` flags, e.g. `--join-timeout-seconds`.
    pub fn start_with(
        identity: &ChartIdentity,
        log_name: &str,
        namespace: &str,
        extra: &[&str],
    ) -> Self {
        Self::start_binary(&operator_binary(), identity, log_name, namespace, extra)
    }

    /// [`Self::start_with`] running `binary` (e.g. a previous release's).
    pub fn start_binary(
        binary: &Path,
        identity: &ChartIdentity,
        log_name: &str,
        namespace: &str,
        extra: &[&str],
    ) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut args: Vec<std::ffi::OsString> = vec![
            "serve".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}").into(),
            "--namespace".into(),
            namespace.into(),
            "--tls-cert".into(),
            identity.path("tls.crt").into(),
            "--tls-key".into(),
            identity.path("tls.key").into(),
        ];
        args.extend(extra.iter().map(Into::into));
        let log = identity.path(log_name);
        let kubeconfig = identity.path("kubeconfig");
        let cgroup = testenv::node::fault::process_cgroup(&format!("vo-op-{port}"));
        let procs = cgroup.as_ref().map(|(_, procs)| procs.as_path());
        let child = spawn_operator(binary, &args, &kubeconfig, &log, procs);
        Self {
            child,
            binary: binary.to_path_buf(),
            url: format!("https://127.0.0.1:{port}"),
            log,
            // Verifies the chart's certificate against the chart's CA, by its 127.0.0.1 SAN.
            client: client_trusting(&identity.path("ca.crt")),
            args,
            kubeconfig,
            metrics_token: std::fs::read_to_string(identity.path("metrics-token")).ok(),
            cgroup,
        }
    }

    /// Cuts this process (and only it: clients and the API server on the same machine still
    /// reach everything) off from `destinations` until the cut is dropped: a partition between
    /// the operator and the nodes' Pods, or between it and its API server.
    pub fn cut_from(
        &self,
        destinations: &[testenv::node::fault::Destination<'_>],
    ) -> Result<testenv::node::fault::ProcessCut, testenv::Error> {
        let Some((cgroup, _)) = &self.cgroup else {
            return Err(testenv::Error::Binaries(
                "the operator runs in no cgroup of its own (no writable cgroup v2 hierarchy)"
                    .into(),
            ));
        };
        testenv::node::fault::ProcessCut::start(cgroup, destinations)
    }

    /// Starts `binary` again with the same flags, log and cgroup.
    fn respawn(&mut self) {
        let procs = self.cgroup.as_ref().map(|(_, procs)| procs.as_path());
        self.child = spawn_operator(&self.binary, &self.args, &self.kubeconfig, &self.log, procs);
    }

    /// Kills the process without warning (SIGKILL: no lease released, no step finished), then
    /// starts it again with the same flags on the same port, appending to the same log.
    pub fn kill_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.respawn();
    }

    /// The process id of the operator now running.
    /// Stops the process (SIGTERM, as a Deployment's rollout does) and starts `binary` in its
    /// place with the same flags, port and log: an upgrade (or a downgrade) of the operator.
    pub fn replace_binary(&mut self, binary: &Path) {
        // SIGTERM, then wait: the old leader releases its Lease and ends its reconciles.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        self.binary = binary.to_path_buf();
        self.respawn();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's resident memory in KiB (`VmRSS` from /proc), while it runs.
    pub fn resident_kib(&self) -> Option<u64> {
        testenv::resident_kib(self.child.id())
    }

    /// The most resident memory the process has held in KiB (`VmHWM`), since it started or
    /// since [`Self::reset_peak_resident`].
    pub fn peak_resident_kib(&self) -> Option<u64> {
        testenv::peak_resident_kib(self.child.id())
    }

    /// Sets the process's peak resident memory back to what it holds now.
    pub fn reset_peak_resident(&self) -> std::io::Result<()> {
        testenv::reset_peak_resident(self.child.id())
    }

    /// CPU time the process has used so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 =
            fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(ticks / clock_ticks_per_second())
    }

    /// The exit status once the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The operator's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let url = format!("{}/metrics", self.url);
        let mut request = self.client.get(url);
        if let Some(token) = &self.metrics_token {
            request = request.bearer_auth(token.trim());
        }
        request.send().await.unwrap().text().await.unwrap()
    }

    /// `/readyz`'s status and body; `None` while nothing answers.
    pub async fn readyz(&self) -> Option<(u16, String)> {
        let response = self
            .client
            .get(format!("{}/readyz", self.url))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.unwrap_or_default()))
    }

    /// Waits for `/readyz` to answer 200; fails at once if the process exits meanwhile.
    pub async fn wait_ready(&mut self, within: Duration) {
        eventually("the operator to be ready", within, async || {
            if let Some(status) = self.exited() {
                panic!("the operator exited ({status}):\n{}", self.log());
            }
            match self.readyz().await {
                Some((200, _)) => Ok(()),
                answer => Err(format!("/readyz: {answer:?}\n{}", tail(&self.log(), 40))),
            }
        })
        .await;
    }
}

/// Starts the operator; in the cgroup whose `cgroup.procs` is `procs`, if given (a shell
/// joins it, then becomes the operator: the pid is the same, and every socket the operator
/// opens belongs to the cgroup; if joining fails, the operator still starts, outside it).
fn spawn_operator(
    binary: &Path,
    args: &[std::ffi::OsString],
    kubeconfig: &Path,
    log: &Path,
    procs: Option<&Path>,
) -> Child {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut command = match procs {
        Some(procs) => {
            let mut joined = Command::new("sh");
            joined
                .args(["-c", r#"echo $$ > "$1"; shift; exec "$@""#, "sh"])
                .arg(procs)
                .arg(binary);
            joined
        }
        None => Command::new(binary),
    };
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("start the operator")
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((_, procs)) = &self.cgroup
            && let Some(dir) = procs.parent()
        {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Points each of the chart's webhooks at `base_url` (same path, same caBundle) instead of the
/// Service, which has no endpoints here. Returns the chart's client configurations, for
/// [`restore_webhooks`].
pub fn repoint_webhooks(plane: &ControlPlane, base_url: &str) -> Vec<Value> {
    let configuration = get_json(plane, &["get", "validatingwebhookconfiguration", RELEASE]);
    let originals: Vec<Value> = configuration["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|webhook| webhook["clientConfig"].clone())
        .collect();
    let repointed = originals
        .iter()
        .map(|client| {
            let path = client["service"]["path"].as_str().expect("a Service path");
            json!({"url": format!("{base_url}{path}"), "caBundle": client["caBundle"]})
        })
        .collect();
    replace_client_configs(plane, repointed);
    originals
}

/// Puts the chart's own client configurations back, so `helm upgrade` patches what it installed
/// (its three-way merge would add the Service beside the test's URL, which the API refuses).
pub fn restore_webhooks(plane: &ControlPlane, originals: Vec<Value>) {
    replace_client_configs(plane, originals);
}

pub fn replace_client_configs(plane: &ControlPlane, client_configs: Vec<Value>) {
    let operations: Vec<Value> = client_configs
        .into_iter()
        .enumerate()
        .map(|(index, client)| {
            json!({"op": "replace", "path": format!("/webhooks/{index}/clientConfig"), "value": client})
        })
        .collect();
    must(
        plane,
        &[
            "patch",
            "validatingwebhookconfiguration",
            RELEASE,
            "--type",
            "json",
            "-p",
            &serde_json::to_string(&operations).unwrap(),
        ],
        None,
    );
}

/// A ValkeyImage of `valkey/valkey:{version}`, as YAML.
pub fn image(name: &str, version: &str) -> String {
    format!(
        "apiVersion: {GROUP}/v1alpha1\nkind: ValkeyImage\nmetadata:\n  name: {name}\nspec:\n  repository: valkey/valkey\n  tag: \"{version}\"\n  version: \"{version}\"\n"
    )
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on Linux when it cannot be read).
fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}
