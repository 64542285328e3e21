//! The admission server as the admission tests and benchmark use it: development certificates
//! from the real `certs` subcommand, the real HTTPS server on a loopback port, a TLS client that
//! verifies against the generated CA, and AdmissionReview bodies shaped as the API server sends
//! them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::oneshot;
use valkey_operator::admission::Policy;
use valkey_operator::api::ClusterKey;
use valkey_operator::api::{ValkeyConfigSpec, ValkeyImageSpec};
use valkey_operator::fleet::Fleet;
use valkey_operator::fleet::caches::Readiness;
use valkey_operator::metrics::Metrics;
use valkey_operator::server::limits::ServerLimits;
use valkey_operator::server::metrics_access::MetricsAccess;
use valkey_operator::server::tls::{self, CertificatePaths};
use valkey_operator::server::{self, AppState, ListenOptions};

use crate::{GROUP, operator_binary};

/// An approved image of `version` (`valkey/valkey:<version>`).
pub fn image_spec(version: &str) -> ValkeyImageSpec {
    ValkeyImageSpec {
        repository: "valkey/valkey".into(),
        tag: version.into(),
        version: version.into(),
    }
}

/// The fleet the admission tests and benchmarks start from: images `valkey-9-0-0` and
/// `valkey-9-1-2`, the config `standard` on 9.0.0 and `large` inheriting from it, and
/// `clusters` as (namespace, name, config).
pub fn standard_fleet<'a>(
    clusters: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
) -> Fleet {
    let mut fleet = Fleet::default();
    fleet.upsert_image("valkey-9-0-0", image_spec("9.0.0"));
    fleet.upsert_image("valkey-9-1-2", image_spec("9.1.2"));
    fleet.upsert_config(
        "standard",
        ValkeyConfigSpec {
            image_ref: Some("valkey-9-0-0".into()),
            ..Default::default()
        },
    );
    fleet.upsert_config(
        "large",
        ValkeyConfigSpec {
            base_ref: Some("standard".into()),
            ..Default::default()
        },
    );
    for (namespace, name, config) in clusters {
        fleet.upsert_cluster(ClusterKey::new(namespace, name), config);
    }
    fleet
}

/// Runs `valkey-operator certs` for localhost and 127.0.0.1 into `dir`.
pub fn write_certificates(dir: &Path) {
    let status = Command::new(operator_binary())
        .args(["certs", "--dns", "localhost", "--ip", "127.0.0.1", "--out"])
        .arg(dir)
        .status()
        .expect("run valkey-operator certs");
    assert!(status.success(), "valkey-operator certs failed");
}

/// A running server and a client that trusts its CA.
pub struct TestServer {
    pub base_url: String,
    pub port: u16,
    pub client: reqwest::Client,
    pub certificates: PathBuf,
    pub metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    /// A server whose caches count as synced.
    pub async fn start(
        dir: &Path,
        fleet: Fleet,
        policy: Policy,
        reload_interval: Duration,
    ) -> Self {
        Self::start_with(dir, fleet, policy, reload_interval, Readiness::synced()).await
    }

    /// A synced server with other limits than the product's defaults.
    pub async fn start_limited(
        dir: &Path,
        fleet: Fleet,
        policy: Policy,
        limits: ServerLimits,
    ) -> Self {
        Self::start_server(
            dir,
            fleet,
            policy,
            Duration::from_secs(60),
            Readiness::synced(),
            limits,
            None,
        )
        .await
    }

    /// [`Self::start_limited`], asking callers for a client certificate signed by `client_ca`
    /// (`serve --webhook-client-ca`).
    pub async fn start_certified(
        dir: &Path,
        fleet: Fleet,
        policy: Policy,
        limits: ServerLimits,
        client_ca: PathBuf,
    ) -> Self {
        let (reload, readiness) = (Duration::from_secs(60), Readiness::synced());
        let ca = Some(client_ca);
        Self::start_server(dir, fleet, policy, reload, readiness, limits, ca).await
    }

    pub async fn start_with(
        dir: &Path,
        fleet: Fleet,
        policy: Policy,
        reload_interval: Duration,
        readiness: Readiness,
    ) -> Self {
        let limits = ServerLimits::default();
        Self::start_server(dir, fleet, policy, reload_interval, readiness, limits, None).await
    }

    async fn start_server(
        dir: &Path,
        fleet: Fleet,
        policy: Policy,
        reload_interval: Duration,
        readiness: Readiness,
        limits: ServerLimits,
        client_ca: Option<PathBuf>,
    ) -> Self {
        tls::install_crypto_provider();
        write_certificates(dir);
        let metrics = Arc::new(Metrics::new().unwrap());
        let state = AppState {
            fleet: Arc::new(RwLock::new(fleet)),
            readiness: Arc::new(readiness),
            metrics: metrics.clone(),
            policy: Arc::new(policy),
            limits: limits.clone(),
            metrics_access: MetricsAccess::Open,
            certified_callers: client_ca.is_some(),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = oneshot::channel();
        let options = ListenOptions {
            certificate: CertificatePaths {
                cert: dir.join("tls.crt"),
                key: dir.join("tls.key"),
                client_ca,
            },
            reload_interval,
            limits,
        };
        let task = tokio::spawn(server::serve_https(
            listener,
            server::router(state),
            options,
            metrics.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            base_url: format!("https://localhost:{port}"),
            port,
            client: client_trusting(&dir.join("ca.crt")),
            certificates: dir.to_path_buf(),
            metrics,
            stop: Some(stop),
            task,
        }
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = tokio::time::timeout(Duration::from_secs(15), &mut self.task).await;
        result
            .expect("server stops")
            .expect("server task")
            .expect("server ran cleanly");
    }

    /// POSTs `body` to `path`; returns the status and the body text.
    pub async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, String) {
        let response = self
            .client
            .post(format!("{}{path}", self.base_url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }

    /// POSTs an AdmissionReview and returns its `response`.
    pub async fn review(&self, path: &str, review: &Value) -> Value {
        let (status, body) = self.post(path, serde_json::to_vec(review).unwrap()).await;
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        answer["response"].clone()
    }
}

/// A reqwest client (HTTP/1.1 keep-alive) that verifies the server against `ca`. Idle
/// connections are dropped after 5 s: the server closes a connection that sends no request
/// head for 10 s (its header-read timeout), and reusing one just as it closes fails the request.
pub fn client_trusting(ca: &Path) -> reqwest::Client {
    client_builder(ca).build().unwrap()
}

/// [`client_trusting`], connecting from `local` (another loopback address is another peer to
/// the server's per-peer limits, as the API server is another host than an abuser).
pub fn client_trusting_from(ca: &Path, local: std::net::IpAddr) -> reqwest::Client {
    client_builder(ca).local_address(local).build().unwrap()
}

fn client_builder(ca: &Path) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .use_preconfigured_tls(rustls_client_config(ca))
        .timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(5))
}

pub fn rustls_client_config(ca: &Path) -> rustls::ClientConfig {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// The plural resource name of a kind.
pub fn resource_of(kind: &str) -> String {
    format!("{}s", kind.to_ascii_lowercase())
}

/// An AdmissionReview as kube-apiserver sends it.
pub fn admission_review(
    kind: &str,
    operation: &str,
    name: &str,
    namespace: Option<&str>,
    object: Option<Value>,
    old_object: Option<Value>,
) -> Value {
    let gvk = json!({"group": GROUP, "version": "v1alpha1", "kind": kind});
    let gvr = json!({"group": GROUP, "version": "v1alpha1", "resource": resource_of(kind)});
    let options_kind = match operation {
        "CREATE" => "CreateOptions",
        "DELETE" => "DeleteOptions",
        _ => "UpdateOptions",
    };
    let mut request = json!({
        "uid": format!("uid-{name}-{operation}"),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": name,
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
        "object": object,
        "oldObject": old_object,
        "dryRun": false,
        "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"},
    });
    if let Some(namespace) = namespace {
        request["namespace"] = json!(namespace);
    }
    json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
}

/// A stored object as the API server serializes it (with metadata it fills in).
pub fn object(kind: &str, name: &str, namespace: Option<&str>, spec: Value) -> Value {
    let mut metadata = json!({
        "name": name,
        "uid": format!("{name}-uid"),
        "resourceVersion": "1",
        "generation": 1,
        "creationTimestamp": "2026-11-29T00:00:00Z",
        "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": format!("{GROUP}/v1alpha1")}],
    });
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    json!({"apiVersion": format!("{GROUP}/v1alpha1"), "kind": kind, "metadata": metadata, "spec": spec})
}
