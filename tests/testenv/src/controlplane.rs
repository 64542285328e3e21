//! The launcher: etcd + kube-apiserver + kube-controller-manager on loopback, with a fresh
//! data directory and PKI per launch, in the spirit of controller-runtime's envtest. For real
//! nodes (each in a network namespace of its own) and their Pods (an operator installed in the
//! cluster), the API server binds a leased address of 198.19.0.0/16 instead, which is also its
//! `kubernetes` Service's ClusterIP (see [`ControlPlaneOptions::reachable_from_pods`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::certs::Pki;
use crate::process::{ProcessGuard, free_port};
use crate::{Error, k8s_bin_dir};

/// Controllers run by kube-controller-manager: ownerReference garbage collection, namespace
/// deletion, the `default` ServiceAccount every namespace needs before Pods can be created, and
/// the disruption controller, without which no PodDisruptionBudget has a status and every
/// Eviction is refused (a real cluster runs it; drains depend on it), and the resource quota
/// controller, without which a ResourceQuota never counts what a namespace uses.
/// The environment variable that turns on the API server's audit log (see
/// [`ControlPlane::audit_flags`]).
pub const AUDIT_LOG_VAR: &str = "TESTENV_AUDIT_LOG";

const CONTROLLERS: &str = "garbage-collector-controller,namespace-controller,serviceaccount-controller,disruption-controller,resourcequota-controller";

/// How to launch the control plane.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// Folder with the binaries; `None` asks [`k8s_bin_dir`].
    pub bin_dir: Option<PathBuf>,
    /// How long to wait for `/readyz`.
    pub ready_timeout: Duration,
    /// Bind the API server where real nodes and their Pods reach it (needs root; real nodes
    /// need it): `198.19.M.1:443`,
    /// M leased per control plane. Its Service range is `198.19.M.0/24`, so the `kubernetes`
    /// Service's ClusterIP, which the kubelet gives every Pod as `KUBERNETES_SERVICE_HOST`, is
    /// that same address: in-cluster clients reach the API server without kube-proxy. Webhooks
    /// behind a Service are called at the Service's endpoints (`--enable-aggregator-routing`),
    /// as no DNS here resolves Service names.
    pub reachable_from_pods: bool,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            bin_dir: None,
            ready_timeout: Duration::from_secs(90),
            reachable_from_pods: false,
        }
    }
}

/// A running control plane. Dropping it kills every process it started and removes its
/// data directory.
#[derive(Debug)]
pub struct ControlPlane {
    processes: Vec<ProcessGuard>,
    server_url: String,
    kubeconfig: PathBuf,
    ca_cert: PathBuf,
    bin_dir: PathBuf,
    /// The leased block M of `198.19.M.1`, when reachable from Pods.
    api_block: Option<u8>,
    // Declared last: removed only after the processes using it are gone.
    data_dir: tempfile::TempDir,
}

/// Start-ups tried when a port found free was taken before our server bound it (a free port
/// is found by binding and closing it, so a test starting beside this one may take it first).
const START_ATTEMPTS: usize = 3;

impl ControlPlane {
    /// Starts a control plane with default options and waits until it is ready.
    pub async fn start() -> Result<Self, Error> {
        Self::start_with(ControlPlaneOptions::default()).await
    }

    /// Starts a control plane and waits until kube-apiserver answers `/readyz`.
    pub async fn start_with(options: ControlPlaneOptions) -> Result<Self, Error> {
        let bin_dir = match options.bin_dir {
            Some(dir) => dir,
            None => tokio::task::spawn_blocking(k8s_bin_dir)
                .await
                .map_err(|e| Error::Binaries(e.to_string()))??,
        };
        let data_dir = tempfile::Builder::new()
            .prefix("testenv-")
            .tempdir()
            .map_err(Error::io("creating the control plane data directory"))?;
        let dir = data_dir.path().to_path_buf();
        let api_block = if options.reachable_from_pods {
            Some(crate::node::host::lease_api_address()?)
        } else {
            None
        };
        let address = api_block.map(crate::node::host::api_address);
        let pki = match Pki::generate(
            &dir,
            &[address.clone().unwrap_or(DEFAULT_SERVICE_IP.into())],
        ) {
            Ok(pki) => pki,
            Err(error) => {
                if let Some(block) = api_block {
                    crate::node::host::release_api_address(block);
                }
                return Err(error);
            }
        };

        let mut control_plane = ControlPlane {
            processes: Vec::new(),
            server_url: String::new(),
            kubeconfig: dir.join("kubeconfig"),
            ca_cert: pki.ca_cert.clone(),
            bin_dir,
            api_block,
            data_dir,
        };

        let mut attempt = 1;
        loop {
            match control_plane
                .start_servers(&pki, options.ready_timeout)
                .await
            {
                Err(error) if attempt < START_ATTEMPTS && error.is_port_taken() => {
                    control_plane.clear_for_another_start()?;
                    attempt += 1;
                }
                result => break result?,
            }
        }
        control_plane.spawn_controller_manager()?;
        Ok(control_plane)
    }

    /// etcd and the API server on ports found free, until `/readyz` answers.
    async fn start_servers(&mut self, pki: &Pki, ready_timeout: Duration) -> Result<(), Error> {
        let etcd_url = self.spawn_etcd()?;
        let listen = match self.api_block {
            Some(block) => Listen::ForPods(block),
            None => Listen::Loopback(free_port().map_err(Error::io("finding a free port"))?),
        };
        self.server_url = format!("https://{}", listen.socket());
        self.spawn_apiserver(pki, &etcd_url, &listen)?;
        write_kubeconfig(&self.kubeconfig, &self.server_url, pki)?;
        self.wait_ready(ready_timeout).await
    }

    /// Stops the servers of a failed start and drops etcd's data: an etcd started again on the
    /// data of one that had other ports would keep its old member address.
    fn clear_for_another_start(&mut self) -> Result<(), Error> {
        self.stop();
        match std::fs::remove_dir_all(self.data_dir().join("etcd")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io("clearing etcd's data for another start")(e))
            }
            _ => Ok(()),
        }
    }

    /// The CA of the client certificate the API server presents to every webhook it calls
    /// (what `valkey-operator serve --webhook-client-ca` is given).
    pub fn webhook_client_ca(&self) -> PathBuf {
        self.data_dir().join("webhook-client-ca.crt")
    }

    /// An AdmissionConfiguration that makes the API server present its webhook client
    /// certificate to every webhook (a kubeconfig user named `*`), as a cluster operator
    /// configures it with `--admission-control-config-file`.
    fn admission_flags(&self, pki: &Pki) -> Result<Vec<String>, Error> {
        let kubeconfig = self.data_dir().join("webhook-client.kubeconfig");
        let users = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "users": [{"name": "*", "user": {
                "client-certificate": pki.webhook_client_cert,
                "client-key": pki.webhook_client_key,
            }}],
        });
        let yaml = serde_yaml_ng::to_string(&users)
            .map_err(|e| Error::Encoding(format!("the webhook client kubeconfig: {e}")))?;
        std::fs::write(&kubeconfig, yaml)
            .map_err(Error::io(format!("writing {}", kubeconfig.display())))?;
        let webhook = |plugin: &str| {
            serde_json::json!({"name": plugin, "configuration": {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "WebhookAdmissionConfiguration",
                "kubeConfigFile": kubeconfig,
            }})
        };
        let config = serde_json::json!({
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [webhook("ValidatingAdmissionWebhook"), webhook("MutatingAdmissionWebhook")],
        });
        let path = self.data_dir().join("admission.yaml");
        let yaml = serde_yaml_ng::to_string(&config)
            .map_err(|e| Error::Encoding(format!("the admission configuration: {e}")))?;
        std::fs::write(&path, yaml).map_err(Error::io(format!("writing {}", path.display())))?;
        Ok(vec![format!(
            "--admission-control-config-file={}",
            path.display()
        )])
    }

    /// Stops every process, in reverse start order: controllers, the API server, then etcd.
    fn stop(&mut self) {
        while let Some(process) = self.processes.pop() {
            drop(process);
        }
    }

    /// The admin kubeconfig (client certificate in group `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The CA that signed the API server's certificate and every client certificate (the
    /// admin's, and the one the API server presents to kubelets).
    pub fn ca_cert(&self) -> &Path {
        &self.ca_cert
    }

    /// Starts what real nodes need beside the API server: kube-scheduler (the test kubelet
    /// binds Pods itself); the node lifecycle controller, which lifts the `not-ready` taint a
    /// new Node is created with and taints a node that stops reporting (the test kubelet's
    /// Node would be tainted by it, so it runs only here); the EndpointSlice controller, by
    /// which a Service's endpoints (a webhook's) are found; the publisher of the
    /// `kube-root-ca.crt` ConfigMap, without which no ServiceAccount token volume mounts; and
    /// the Deployment and ReplicaSet controllers, which run a chart's Deployment.
    pub fn start_node_controllers(&mut self) -> Result<(), Error> {
        let kubeconfig = format!("--kubeconfig={}", self.kubeconfig.display());
        self.spawn(
            "kube-scheduler",
            vec![
                kubeconfig.clone(),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ],
        )?;
        self.spawn_named(
            "kube-controller-manager",
            "node-lifecycle-controller",
            vec![
                kubeconfig,
                "--controllers=node-lifecycle-controller,endpointslice-controller,\
                 root-ca-certificate-publisher-controller,deployment-controller,\
                 replicaset-controller"
                    .into(),
                format!("--root-ca-file={}", self.ca_cert.display()),
                "--leader-elect=false".into(),
                "--use-service-account-credentials=false".into(),
                "--secure-port=0".into(),
            ],
        )
    }

    /// The API server's URL, `https://127.0.0.1:PORT`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The folder of the binaries, including `kubectl` and `helm`.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The data directory: PKI, etcd data, and one `*.log` per process.
    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    /// Process ids of what this control plane runs, by name.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.processes
            .iter()
            .map(|p| (p.name().to_string(), p.pid()))
            .collect()
    }

    /// An admin client for the API server.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// The real `kubectl` from the bin folder, pointed at this control plane.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(self.bin_dir.join("kubectl"));
        command.env("KUBECONFIG", &self.kubeconfig);
        command
    }

    fn spawn(&mut self, name: &str, args: Vec<String>) -> Result<(), Error> {
        self.spawn_named(name, name, args)
    }

    /// Runs the binary `binary` as the process `name` (its log: `name.log`).
    fn spawn_named(&mut self, binary: &str, name: &str, args: Vec<String>) -> Result<(), Error> {
        let mut command = Command::new(self.bin_dir.join(binary));
        command.args(args);
        let log = self.data_dir().join(format!("{name}.log"));
        let guard = ProcessGuard::spawn(name, command, &log).map_err(Error::io(format!(
            "starting {}",
            self.bin_dir.join(binary).display()
        )))?;
        self.processes.push(guard);
        Ok(())
    }

    fn spawn_etcd(&mut self) -> Result<String, Error> {
        let client_url = format!("http://127.0.0.1:{}", port()?);
        let peer_url = format!("http://127.0.0.1:{}", port()?);
        let data = self.data_dir().join("etcd");
        self.spawn(
            "etcd",
            vec![
                format!("--data-dir={}", data.display()),
                "--name=testenv".into(),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=testenv={peer_url}"),
                // Test data is thrown away: skip the disk flushes that slow every write.
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;
        Ok(client_url)
    }

    /// With `TESTENV_AUDIT_LOG` set to a path, the API server writes an audit event (metadata
    /// only: who, verb, resource) for every request there, one JSON line each: what a
    /// benchmark reads to tell which client made the API server's requests.
    fn audit_flags(&self) -> Result<Vec<String>, Error> {
        let Some(log) = std::env::var_os(AUDIT_LOG_VAR).filter(|v| !v.is_empty()) else {
            return Ok(Vec::new());
        };
        let policy = self.data_dir().join("audit-policy.yaml");
        let rules = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
                     rules:\n- level: Metadata\n";
        std::fs::write(&policy, rules)
            .map_err(Error::io(format!("writing {}", policy.display())))?;
        Ok(vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", std::path::Path::new(&log).display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=batch".into(),
        ])
    }

    fn spawn_apiserver(&mut self, pki: &Pki, etcd_url: &str, listen: &Listen) -> Result<(), Error> {
        let cert_dir = self.data_dir().join("apiserver");
        let audit = self.audit_flags()?;
        let admission = self.admission_flags(pki)?;
        self.spawn(
            "kube-apiserver",
            [
                audit,
                admission,
                listen.flags(),
                vec![
                    format!("--etcd-servers={etcd_url}"),
                    format!("--cert-dir={}", cert_dir.display()),
                    format!("--tls-cert-file={}", pki.serving_cert.display()),
                    format!("--tls-private-key-file={}", pki.serving_key.display()),
                    format!("--client-ca-file={}", pki.ca_cert.display()),
                    // What it presents to a kubelet (logs, exec): the admin's certificate,
                    // which a real node's kubelet authorizes through this API server.
                    format!("--kubelet-client-certificate={}", pki.admin_cert.display()),
                    format!("--kubelet-client-key={}", pki.admin_key.display()),
                    // Nodes are reached at their address: no DNS here knows their names.
                    "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
                    "--authorization-mode=RBAC".into(),
                    format!(
                        "--service-account-key-file={}",
                        pki.service_account_public_key.display()
                    ),
                    format!(
                        "--service-account-signing-key-file={}",
                        pki.service_account_key.display()
                    ),
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                    "--allow-privileged=true".into(),
                ],
            ]
            .concat(),
        )
    }

    fn spawn_controller_manager(&mut self) -> Result<(), Error> {
        let kubeconfig = self.kubeconfig.display().to_string();
        self.spawn(
            "kube-controller-manager",
            vec![
                format!("--kubeconfig={kubeconfig}"),
                format!("--controllers={CONTROLLERS}"),
                "--leader-elect=false".into(),
                "--use-service-account-credentials=false".into(),
                // No metrics/health endpoint needed: 0 disables serving.
                "--secure-port=0".into(),
            ],
        )
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), Error> {
        let client = self.client().await?;
        let started = Instant::now();
        let mut last_error = String::from("no answer yet");
        while started.elapsed() < timeout {
            self.check_alive()?;
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Encoding(format!("the /readyz request: {e}")))?;
            match client.request_text(request).await {
                Ok(_) => return Ok(()),
                Err(e) => last_error = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::NotReady {
            what: format!("kube-apiserver at {}", self.server_url),
            waited_secs: timeout.as_secs(),
            last_error: format!(
                "{last_error}; log tail:\n{}",
                self.processes
                    .iter()
                    .map(|p| format!("== {}\n{}", p.name(), p.log_tail(15)))
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        })
    }

    /// Fails if any process of the control plane has exited.
    pub fn check_alive(&mut self) -> Result<(), Error> {
        for process in &mut self.processes {
            if let Ok(Some(status)) = process.try_exit_status() {
                return Err(Error::Exited {
                    name: process.name().to_string(),
                    status,
                    log_tail: process.log_tail(30),
                });
            }
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
        if let Some(block) = self.api_block {
            crate::node::host::release_api_address(block);
        }
    }
}

/// The ClusterIP of `kubernetes` on a control plane not reachable from Pods (its Service
/// range is `198.19.0.0/24`, an address nothing routes to: no test sends traffic there).
const DEFAULT_SERVICE_IP: &str = "198.19.0.1";

/// Where the API server listens.
enum Listen {
    /// `127.0.0.1:PORT`.
    Loopback(u16),
    /// `198.19.M.1:443`, the first address of its Service range `198.19.M.0/24`.
    ForPods(u8),
}

impl Listen {
    fn socket(&self) -> String {
        match self {
            Listen::Loopback(port) => format!("127.0.0.1:{port}"),
            Listen::ForPods(block) => format!("{}:443", crate::node::host::api_address(*block)),
        }
    }

    fn flags(&self) -> Vec<String> {
        match self {
            Listen::Loopback(port) => vec![
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                "--service-cluster-ip-range=198.19.0.0/24".into(),
            ],
            Listen::ForPods(block) => {
                let address = crate::node::host::api_address(*block);
                vec![
                    format!("--bind-address={address}"),
                    format!("--advertise-address={address}"),
                    "--secure-port=443".into(),
                    format!("--service-cluster-ip-range=198.19.{block}.0/24"),
                    "--enable-aggregator-routing=true".into(),
                ]
            }
        }
    }
}

/// An admin client built from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, Error> {
    // kube's rustls setup needs a process-wide crypto provider; ring is the workspace's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    kube::Client::try_from(config).map_err(Error::kube("building a client"))
}

fn port() -> Result<u16, Error> {
    free_port().map_err(Error::io("finding a free port"))
}

fn write_kubeconfig(path: &Path, server: &str, pki: &Pki) -> Result<(), Error> {
    let data = |file: &Path| -> Result<String, Error> {
        let bytes =
            std::fs::read(file).map_err(Error::io(format!("reading {}", file.display())))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testenv", "cluster": {
            "server": server,
            "certificate-authority-data": data(&pki.ca_cert)?,
        }}],
        "users": [{"name": "testenv-admin", "user": {
            "client-certificate-data": data(&pki.admin_cert)?,
            "client-key-data": data(&pki.admin_key)?,
        }}],
        "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": "testenv-admin"}}],
        "current-context": "testenv",
    });
    let yaml = serde_yaml_ng::to_string(&kubeconfig)
        .map_err(|e| Error::Encoding(format!("the kubeconfig: {e}")))?;
    std::fs::write(path, yaml).map_err(Error::io(format!("writing {}", path.display())))
}
