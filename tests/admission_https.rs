//! The real admission server over real HTTPS on a loopback port: certificates from the `certs`
//! subcommand, a client that verifies the CA, AdmissionReviews shaped as the API server sends
//! them, certificate reload without a restart, and clean answers to malformed bodies.

use std::time::Duration;

use harness::https::{
    TestServer, admission_review, object, rustls_client_config, standard_fleet, write_certificates,
};
use harness::{eventually, metric};
use serde_json::{Value, json};
use valkey_operator::admission::Policy;
use valkey_operator::fleet::Fleet;

fn image_spec(version: &str) -> Value {
    json!({"repository": "valkey/valkey", "tag": version, "version": version})
}

/// The API server's review of creating a ValkeyImage.
fn create_image(name: &str, version: &str) -> Value {
    let image = object("ValkeyImage", name, None, image_spec(version));
    admission_review("ValkeyImage", "CREATE", name, None, Some(image), None)
}

/// `standard` on 9.0.0, inherited by `large`; clusters on both.
fn fleet() -> Fleet {
    standard_fleet([
        ("team-a", "orders", "standard"),
        ("team-b", "sessions", "large"),
    ])
}

async fn start(dir: &tempfile::TempDir) -> TestServer {
    TestServer::start(
        dir.path(),
        fleet(),
        Policy::default(),
        Duration::from_millis(200),
    )
    .await
}

#[tokio::test]
async fn the_floor_is_enforced_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir).await;

    let old = create_image("valkey-8-1-4", "8.1.4");
    let response = server.review("/validate/valkeyimages", &old).await;
    assert_eq!(response["uid"], "uid-valkey-8-1-4-CREATE");
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("spec.version 8.1.4 is below the Valkey 9 floor (9.0.0)"),
        "{message}"
    );

    let good = create_image("valkey-9-1-2", "9.1.2");
    let response = server.review("/validate/valkeyimages", &good).await;
    assert_eq!(response["allowed"], true);
    assert!(response.get("warnings").is_none());
    server.stop().await;
}

#[tokio::test]
async fn a_shared_config_image_change_answers_with_fleet_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir).await;
    let old = object(
        "ValkeyConfig",
        "standard",
        None,
        json!({"imageRef": "valkey-9-0-0"}),
    );
    let new = object(
        "ValkeyConfig",
        "standard",
        None,
        json!({"imageRef": "valkey-9-1-2"}),
    );
    let review = admission_review(
        "ValkeyConfig",
        "UPDATE",
        "standard",
        None,
        Some(new),
        Some(old),
    );
    let response = server.review("/validate/valkeyconfigs", &review).await;
    assert_eq!(response["allowed"], true);
    let warnings: Vec<&str> = response["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(
        warnings[0].contains("rolls 2 ValkeyClusters at once: team-a/orders and team-b/sessions"),
        "{warnings:?}"
    );
    assert!(warnings.iter().any(|w| w.contains("nothing staggers them")));

    // A new cluster on the inheriting config resolves (large → standard) and is allowed.
    let cluster = object(
        "ValkeyCluster",
        "feed",
        Some("team-c"),
        json!({"configRef": "large", "shards": 3, "replicasPerShard": 1}),
    );
    let review = admission_review(
        "ValkeyCluster",
        "CREATE",
        "feed",
        Some("team-c"),
        Some(cluster),
        None,
    );
    let response = server.review("/validate/valkeyclusters", &review).await;
    assert_eq!(response["allowed"], true, "{response}");
    server.stop().await;
}

#[tokio::test]
async fn malformed_requests_get_clean_answers() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir).await;
    let path = "/validate/valkeyconfigs";

    let (status, body) = server.post(path, "this is not json").await;
    assert_eq!(status, 400);
    assert!(body.starts_with("the body is not JSON"), "{body}");

    let (status, body) = server
        .post(path, r#"{"kind": "Pod", "apiVersion": "v1"}"#)
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("not an AdmissionReview"), "{body}");

    let (status, body) = server
        .post(
            path,
            r#"{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}"#,
        )
        .await;
    assert_eq!(
        (status, body.as_str()),
        (400, "the AdmissionReview carries no request\n")
    );

    let (status, body) = server.post(path, vec![b' '; 5 * 1024 * 1024]).await;
    assert_eq!(status, 413);
    assert!(body.contains("at most 4 MiB"), "{body}");

    // Wrong kind for the endpoint: a denial that says which endpoint this is.
    let wrong_kind = create_image("x", "9.0.0");
    let response = server.review(path, &wrong_kind).await;
    assert_eq!(response["allowed"], false);
    assert!(response["status"]["message"].as_str().unwrap().contains("this endpoint validates valkey.gomomento.com ValkeyConfig, but the request is for valkey.gomomento.com/v1alpha1 ValkeyImage"));

    // An object that does not match the schema, and a create without an object.
    let bad = admission_review(
        "ValkeyConfig",
        "CREATE",
        "x",
        None,
        Some(
            json!({"apiVersion": "valkey.gomomento.com/v1alpha1", "kind": "ValkeyConfig", "metadata": {"name": "x"}, "spec": {"valkey": {"maxmemory": 5}}}),
        ),
        None,
    );
    let response = server.review(path, &bad).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("the ValkeyConfig does not match its schema: invalid type: integer `5`"),
        "{response}"
    );
    let empty = admission_review("ValkeyConfig", "CREATE", "x", None, None, None);
    let response = server.review(path, &empty).await;
    assert_eq!(
        response["status"]["message"],
        "the request carries no ValkeyConfig object"
    );

    // The server is still healthy, and counted what it saw.
    let (status, body) = server.post("/healthz", "").await;
    assert_eq!(status, 405, "{body}");
    let metrics = server
        .client
        .get(format!("{}/metrics", server.base_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let requests = |operation, result| {
        let labels = [
            ("kind", "ValkeyConfig"),
            ("operation", operation),
            ("result", result),
        ];
        metric(&metrics, "valkey_operator_webhook_requests_total", &labels)
    };
    assert_eq!(requests("unknown", "invalid"), Some(3.0), "{metrics}");
    // The oversized body never reached the webhook: the server's gate refused it.
    let refused = metric(
        &metrics,
        "valkey_operator_server_refusals_total",
        &[("reason", "body_too_large")],
    );
    assert_eq!(refused, Some(1.0), "{metrics}");
    assert_eq!(requests("CREATE", "denied"), Some(3.0), "{metrics}");
    server.stop().await;
}

#[tokio::test]
async fn health_and_readiness_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir).await;
    for path in ["/healthz", "/readyz"] {
        let response = server
            .client
            .get(format!("{}{path}", server.base_url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(response.text().await.unwrap(), "ok\n");
    }
    server.stop().await;
}

#[tokio::test]
async fn before_the_caches_sync_it_is_not_ready_and_admits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(
        dir.path(),
        fleet(),
        Policy::default(),
        Duration::from_millis(200),
        valkey_operator::fleet::caches::Readiness::default(),
    )
    .await;
    let response = server
        .client
        .get(format!("{}/readyz", server.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.text().await.unwrap(),
        "waiting for caches to sync: valkeyimages, valkeyconfigs, valkeyroles, valkeyclusters, valkeynamespacepolicies\n"
    );
    let image = create_image("valkey-9-1-2", "9.1.2");
    let response = server.review("/validate/valkeyimages", &image).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("has not synced its caches")
    );
    server.stop().await;
}

/// The leaf certificate the server presents to a fresh TLS handshake.
async fn served_certificate(port: u16, ca: &std::path::Path) -> Vec<u8> {
    let config = std::sync::Arc::new(rustls_client_config(ca));
    let connector = tokio_rustls::TlsConnector::from(config);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .expect("handshake verifies against the CA");
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn certificate_file(dir: &std::path::Path) -> Vec<u8> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::from_pem_file(dir.join("tls.crt"))
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn replaced_certificate_files_are_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir).await;
    let ca = dir.path().join("ca.crt");
    let first = served_certificate(server.port, &ca).await;
    assert_eq!(first, certificate_file(dir.path()));

    // Reissue (same CA, new key and certificate) and wait for the server to pick it up.
    write_certificates(dir.path());
    let second = certificate_file(dir.path());
    assert_ne!(first, second);
    eventually(
        "the new certificate to be served",
        Duration::from_secs(10),
        async || served_certificate(server.port, &ca).await == second,
    )
    .await;

    // A broken replacement is refused and the last good certificate stays.
    std::fs::write(
        dir.path().join("tls.crt"),
        "-----BEGIN CERTIFICATE-----\nnot base64\n",
    )
    .unwrap();
    eventually(
        "the broken files to be noticed",
        Duration::from_secs(10),
        async || {
            let metrics = server.metrics.render().unwrap();
            let failed = [("result", "failed")];
            match metric(
                &metrics,
                "valkey_operator_certificate_reloads_total",
                &failed,
            ) {
                Some(1.0) => Ok(()),
                _ => Err(metrics),
            }
        },
    )
    .await;
    assert_eq!(served_certificate(server.port, &ca).await, second);
    let response = server
        .client
        .get(format!("{}/healthz", server.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    server.stop().await;
}

/// The probes' own listener answers while strangers hold every connection the HTTPS port
/// allows: the kubelet never restarts the operator for a flood.
#[tokio::test]
async fn the_probes_listener_answers_while_the_https_port_is_full() {
    use std::sync::{Arc, RwLock};
    use valkey_operator::cli::supervise::Health;
    use valkey_operator::fleet::caches::Readiness;
    use valkey_operator::server::limits::ServerLimits;
    use valkey_operator::server::metrics_access::MetricsAccess;
    use valkey_operator::server::{self, AppState};

    let dir = tempfile::tempdir().unwrap();
    let limits = ServerLimits {
        max_connections: 4,
        handshake_timeout: Duration::from_secs(60),
        ..ServerLimits::default()
    };
    let https = TestServer::start_limited(dir.path(), fleet(), Policy::default(), limits).await;
    let state = AppState {
        fleet: Arc::new(RwLock::new(fleet())),
        readiness: Arc::new(Readiness::synced()),
        metrics: https.metrics.clone(),
        policy: Arc::new(Policy::default()),
        limits: ServerLimits::default(),
        metrics_access: MetricsAccess::Open,
        certified_callers: false,
    };
    let probes = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let probes_port = probes.local_addr().unwrap().port();
    let app = server::health_router(state, Arc::new(Health::default()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve_health(probes, app, async move {
        let _ = stopped.await;
    }));

    // Four strangers connect and say nothing: the HTTPS port has no room left.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(
            tokio::net::TcpStream::connect(("127.0.0.1", https.port))
                .await
                .unwrap(),
        );
    }
    let refused = https
        .client
        .get(format!("{}/healthz", https.base_url))
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "the HTTPS port still had room: {refused:?}"
    );
    for path in ["/healthz", "/readyz"] {
        let answer = plain_get(probes_port, path).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        assert!(answer.ends_with("\r\n\r\nok\n"), "{path}: {answer}");
    }
    // The probes' listener serves nothing else.
    let other = plain_get(probes_port, "/metrics").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    drop(held);
    let _ = stop.send(());
    https.stop().await;
}

/// `GET path` over plain HTTP/1.1 on a loopback port: the whole answer.
async fn plain_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    let read = stream.read_to_string(&mut answer);
    tokio::time::timeout(Duration::from_secs(3), read)
        .await
        .unwrap()
        .unwrap();
    answer
}

/// A server that asks callers for the API server's client certificate keeps places for it:
/// strangers that hold every other place, and more, cannot shut a certified caller out.
#[tokio::test]
async fn strangers_cannot_take_the_places_kept_for_the_api_servers_certificate() {
    use std::sync::Arc;
    use tokio_rustls::rustls;
    use valkey_operator::server::limits::ServerLimits;

    let dir = tempfile::tempdir().unwrap();
    let (client_ca, client) = client_certificate(dir.path());
    let limits = ServerLimits {
        max_connections: 6,
        reserved_for_certified: 2,
        handshake_timeout: Duration::from_secs(60),
        ..ServerLimits::default()
    };
    let server =
        TestServer::start_certified(dir.path(), fleet(), Policy::default(), limits, client_ca)
            .await;
    let port = server.port;

    // Four strangers take every place but the two kept, and say nothing.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
        );
    }
    let trust = rustls_client_config(&dir.path().join("ca.crt"));
    // A fifth, without a certificate, gets through the handshake on a kept place, and no answer.
    let stranger = healthz_over_tls(port, Arc::new(trust)).await;
    assert!(!stranger.starts_with("HTTP/1.1 200"), "{stranger}");
    // The API server's certificate is answered, twice at once.
    let certified = Arc::new(with_identity(&dir.path().join("ca.crt"), &client));
    let (first, second) = tokio::join!(
        healthz_over_tls(port, certified.clone()),
        healthz_over_tls(port, certified.clone())
    );
    for answer in [first, second] {
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let text = server.metrics.render().unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("reason=\"reserved\"") && !l.ends_with(" 0")),
        "{text}"
    );
    drop(held);
    server.stop().await;

    fn client_certificate(dir: &std::path::Path) -> (std::path::PathBuf, (String, String)) {
        use rcgen::{
            BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
            KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let path = dir.join("webhook-client-ca.crt");
        std::fs::write(&path, ca_cert.pem()).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["kube-apiserver".to_owned()]).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).unwrap();
        (path, (cert.pem(), key.serialize_pem()))
    }

    fn with_identity(ca: &std::path::Path, identity: &(String, String)) -> rustls::ClientConfig {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let chain = vec![CertificateDer::from_pem_slice(identity.0.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(identity.1.as_bytes()).unwrap();
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap()
    }
}

/// `GET /healthz` over TLS to `localhost:port` with `config`: the whole answer, or what
/// went wrong.
async fn healthz_over_tls(
    port: u16,
    config: std::sync::Arc<tokio_rustls::rustls::ClientConfig>,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost")
            .map_err(std::io::Error::other)?;
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        let request = "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        tls.write_all(request.as_bytes()).await?;
        let mut answer = String::new();
        tls.read_to_string(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(Duration::from_secs(5), exchange).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => format!("failed: {error}"),
        Err(_) => "failed: no answer within 5 s".to_owned(),
    }
}
