//! The operator's TLS client against a TLS endpoint. The Valkey binaries here are built without
//! TLS, so a real valkey-server sits behind a TLS-terminating proxy whose certificate is shaped
//! as Momento documents (`orders.team-a.svc.cluster.local` and `*.orders.team-a.svc.cluster.local`)
//! and signed by a test CA: the operator's client talks to the node through it when it trusts
//! that CA and the certificate covers the node's per-Pod name, and refuses a certificate that
//! names only the Service, another cluster's names, another CA, or a CA file with no
//! certificate. A node whose certificate has expired is not silent: the operator says its
//! certificate is not trusted, observes it as untrusted (never taken for dead), and says why.

use std::sync::Arc;
use std::time::Duration;

use harness::eventually;
use harness::valkey::OLD;
use harness::valkey::roller::LocalRuntime;
use harness::valkey::runtime::{NodeRuntime, NodeSpec};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use valkey_operator::cli::certs::write_dev_certificates;
use valkey_operator::execute::Member;
use valkey_operator::execute::observe::observe;
use valkey_operator::roll::Lifecycle;
use valkey_operator::valkey::tls::{ClusterNames, TlsTrust, TlsTrustError};
use valkey_operator::valkey::{NodeAddress, NodeClient, Reach};

const CALL: Duration = Duration::from_secs(2);

/// Accepts TLS on a loopback port and forwards the plaintext to `backend`.
async fn tls_proxy(cert_pem: &[u8], key_pem: &[u8], backend: String) -> String {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key_pem).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, backend) = (acceptor.clone(), backend.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(client).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(&backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_reaches_a_node_over_tls_checking_the_ca_and_the_name() {
    let runtime = LocalRuntime::new(47).unwrap();
    let spec = NodeSpec {
        name: "tls-0".into(),
        shard: 0,
        revision: OLD.into(),
    };
    let node = runtime.start_node(&spec).await.unwrap().to_string();
    eventually("the node to answer", Duration::from_secs(10), async || {
        NodeClient::connect(&node, CALL)
            .await
            .ok()?
            .ping()
            .await
            .ok()
    })
    .await;

    let names = ClusterNames::new("orders", "team-a", "cluster.local");
    let momentos = [names.service().to_owned(), names.wildcard()];
    let ours = tempfile::tempdir().unwrap();
    let certificates = write_dev_certificates(ours.path(), &momentos, &[]).unwrap();
    let theirs = tempfile::tempdir().unwrap();
    let foreign = write_dev_certificates(theirs.path(), &momentos, &[]).unwrap();
    let read = |path: &std::path::Path| std::fs::read(path).unwrap();
    let proxy = tls_proxy(
        &read(&certificates.cert),
        &read(&certificates.key),
        node.clone(),
    )
    .await;
    let ca = read(&certificates.ca_cert);
    let pod_at_proxy = [("127.0.0.1", "orders-0-1eda6")];

    // The cluster's CA, the node's per-Pod name (under the wildcard): commands reach it.
    let mut trust = TlsTrust::new(&ca, names.clone()).unwrap();
    trust.know_pods(pod_at_proxy);
    let client = NodeClient::connect_tls(&proxy, CALL, &trust, None)
        .await
        .unwrap();
    client.ping().await.unwrap();
    assert_eq!(client.server_info().await.unwrap().version, OLD);

    // A certificate without the wildcard does not cover the node's name: refused. Without a
    // Pod at the address, the Service's name is checked, which it carries.
    let narrow_dir = tempfile::tempdir().unwrap();
    let narrow = write_dev_certificates(narrow_dir.path(), &momentos[..1], &[]).unwrap();
    let narrow_proxy = tls_proxy(&read(&narrow.cert), &read(&narrow.key), node).await;
    let mut narrow_trust = TlsTrust::new(&read(&narrow.ca_cert), names.clone()).unwrap();
    NodeClient::connect_tls(&narrow_proxy, CALL, &narrow_trust, None)
        .await
        .unwrap();
    narrow_trust.know_pods(pod_at_proxy);
    let error = NodeClient::connect_tls(&narrow_proxy, CALL, &narrow_trust, None)
        .await
        .err()
        .expect("a certificate that does not name the node was accepted");
    assert!(error.to_string().contains("connect (TLS)"), "{error}");

    // Another cluster's names, or another CA: refused during the handshake.
    let mut elsewhere = TlsTrust::new(
        &ca,
        ClusterNames::new("payments", "team-a", "cluster.local"),
    )
    .unwrap();
    elsewhere.know_pods(pod_at_proxy);
    let error = NodeClient::connect_tls(&proxy, CALL, &elsewhere, None)
        .await
        .err()
        .expect("a certificate for another name was accepted");
    assert!(error.to_string().contains("connect (TLS)"), "{error}");
    let mut stranger = TlsTrust::new(&read(&foreign.ca_cert), names.clone()).unwrap();
    stranger.know_pods(pod_at_proxy);
    assert!(
        NodeClient::connect_tls(&proxy, CALL, &stranger, None)
            .await
            .is_err(),
        "a certificate from another CA was accepted"
    );

    // Plain text gets nothing from the TLS port.
    let plain = NodeClient::connect(&proxy, Duration::from_millis(500)).await;
    assert!(
        match plain {
            Ok(client) => client.ping().await.is_err(),
            Err(_) => true,
        },
        "a plain-text client was answered on the TLS port"
    );

    assert!(matches!(
        TlsTrust::new(b"not a certificate", names),
        Err(TlsTrustError::NoCertificate)
    ));
}

/// A CA and a certificate it signed for `names` (the Service and its wildcard) that expired in
/// 2021: (CA PEM, certificate PEM, key PEM).
fn expired_certificate(names: &ClusterNames) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf =
        CertificateParams::new(vec![names.service().to_owned(), names.wildcard()]).unwrap();
    leaf.not_before = rcgen::date_time_ymd(2020, 1, 1);
    leaf.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf_pem = leaf.signed_by(&leaf_key, &issuer).unwrap().pem();
    (ca_pem, leaf_pem, leaf_key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_said_so_and_is_not_silence() {
    let runtime = LocalRuntime::new(53).unwrap();
    let spec = NodeSpec {
        name: "expired-0".into(),
        shard: 0,
        revision: OLD.into(),
    };
    let node = runtime.start_node(&spec).await.unwrap().to_string();
    let names = ClusterNames::new("orders", "team-a", "cluster.local");
    let (ca, cert, key) = expired_certificate(&names);
    let proxy = tls_proxy(cert.as_bytes(), key.as_bytes(), node).await;
    let mut trust = TlsTrust::new(ca.as_bytes(), names).unwrap();
    trust.know_pods([("127.0.0.1", "orders-0-1eda6")]);

    let error = NodeClient::connect_tls(&proxy, CALL, &trust, None)
        .await
        .err()
        .expect("an expired certificate was accepted");
    assert!(error.is_certificate_refusal(), "{error}");
    assert!(!error.is_silence(), "taken for silence: {error}");
    assert!(error.to_string().contains("expired"), "{error}");

    // Observed as the controller observes it: untrusted and unreadable, never silent.
    let address: std::net::SocketAddr = proxy.parse().unwrap();
    let member = Member {
        name: "orders-0-1eda6".into(),
        shard: 0,
        revision: OLD.into(),
        lifecycle: Lifecycle::Active,
        join_overdue: false,
        address: Some(NodeAddress::new(address.ip(), address.port())),
        id: None,
        closed: false,
        replica_of: None,
        handover_requested: false,
        terminated: false,
        removed: false,
        leaving: false,
        not_started: None,
        location: Default::default(),
        silent: false,
    };
    let reach = Reach {
        tls: Some(trust),
        ..Reach::plain(CALL)
    };
    let observed = observe(&[member], &reach).await;
    assert!(
        observed[0].untrusted && observed[0].unreadable && !observed[0].reachable,
        "{:?}",
        observed[0]
    );
}
