//! The data plane locked down, end to end on the real control plane (with its PodSecurity
//! admission) and real valkey-server Pods:
//! - a cluster in a namespace that enforces the `restricted` Pod Security Standard becomes
//!   Active (a Pod without the hardening is refused there, so the enforcement is live);
//! - each cluster gets a NetworkPolicy, owned by it and accepted by the API server, with the bus
//!   port only from its own Pods and the client port from its namespace, the operator and
//!   `spec.network.allowedClients`; a person's policy of the same name is left alone, said in
//!   an event, and the cluster runs anyway;
//! - nobody but the operator writes a ValkeyNode: a create with a forged ownerReference and a
//!   change of a node's image are refused, while labels stay writable;
//! - a TLS cluster waits, `Degraded` (`TlsUnavailable`), until its Secret exists, then its Pods
//!   mount the Secret read-only and serve TLS only.

use std::time::Duration;

use harness::eventually;
use harness::k8s::{IMAGES, Product, condition_field};
use serde_json::Value;

const NAMESPACE: &str = "locked";

const FLEET: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: locked
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: locked-config}
spec: {imageRef: valkey-9-0-0, valkey: {save: ""}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: vault, namespace: locked}
spec:
  configRef: locked-config
  shards: 2
  replicasPerShard: 1
  network:
    allowedClients:
    - namespaceSelector: {matchLabels: {team: web}}
      podSelector: {matchLabels: {app: checkout}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ledger, namespace: locked}
spec: {podSelector: {matchLabels: {app: ledger-ui}}, policyTypes: [Ingress]}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: ledger, namespace: locked}
spec: {configRef: locked-config, shards: 1, replicasPerShard: 0}
"#;

/// A Pod as most charts wrote them before Pod Security: root, no seccomp, every capability.
const UNHARDENED_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: unhardened, namespace: locked}
spec:
  containers:
  - {name: valkey, image: "valkey/valkey:9.0.0"}
"#;

fn json(product: &Product, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&product.kubectl(&all)).unwrap()
}

#[tokio::test]
async fn a_cluster_runs_restricted_behind_its_network_policy_and_only_the_operator_writes_nodes() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(FLEET);

    // The namespace really enforces `restricted`.
    let (created, said) = product.try_kubectl(&["apply", "-f", "-"], Some(UNHARDENED_POD));
    assert!(!created, "an unhardened Pod was admitted: {said}");
    assert!(said.contains("violates PodSecurity"), "{said}");

    // `ledger` meets a NetworkPolicy of its name that a person made: it runs anyway, the
    // policy is left as it was, and an event says why the cluster has none of its own.
    product
        .wait_converged(
            &[(NAMESPACE, "vault"), (NAMESPACE, "ledger")],
            "9.0.0",
            Duration::from_secs(180),
        )
        .await;
    let theirs = json(
        &product,
        &["get", "networkpolicy", "ledger", "-n", NAMESPACE],
    );
    assert!(theirs["metadata"]["ownerReferences"].is_null(), "{theirs}");
    assert_eq!(
        theirs["spec"]["podSelector"]["matchLabels"]["app"],
        "ledger-ui"
    );
    let events = product.kubectl(&["get", "events", "-n", NAMESPACE]);
    assert!(
        events.contains("NameConflict") && events.contains("NetworkPolicy"),
        "{events}"
    );
    let pods = json(&product, &["get", "pods", "-n", NAMESPACE]);
    let pods = pods["items"].as_array().unwrap();
    assert_eq!(pods.len(), 5);
    for pod in pods {
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false, "{pod}");
        assert_eq!(
            pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
            true
        );
    }

    // The NetworkPolicy, as stored by the API server.
    let policy = json(
        &product,
        &["get", "networkpolicy", "vault", "-n", NAMESPACE],
    );
    let cluster = product.cluster(NAMESPACE, "vault");
    assert_eq!(
        policy["metadata"]["ownerReferences"][0]["uid"],
        cluster["metadata"]["uid"]
    );
    let spec = &policy["spec"];
    assert_eq!(
        spec["podSelector"]["matchLabels"]["valkey.gomomento.com/cluster"],
        "vault"
    );
    assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress"]));
    let bus = &spec["ingress"][0];
    assert_eq!(bus["ports"][0]["port"], 16379);
    assert_eq!(bus["from"].as_array().unwrap().len(), 1);
    assert!(bus["from"][0]["namespaceSelector"].is_null());
    let clients = &spec["ingress"][1];
    assert_eq!(clients["ports"][0]["port"], 6379);
    let from = clients["from"].as_array().unwrap();
    assert_eq!(from.len(), 3, "{clients}");
    assert_eq!(
        from[1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        harness::k8s::chart::NAMESPACE
    );
    assert_eq!(from[2]["namespaceSelector"]["matchLabels"]["team"], "web");
    assert_eq!(from[2]["podSelector"]["matchLabels"]["app"], "checkout");

    // A ValkeyNode with a forged ownerReference, written by someone else, is refused.
    let uid = cluster["metadata"]["uid"].as_str().unwrap();
    let forged = format!(
        r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyNode
metadata:
  name: vault-0-f0f0f
  namespace: locked
  ownerReferences:
  - {{apiVersion: valkey.gomomento.com/v1alpha1, kind: ValkeyCluster, name: vault, uid: "{uid}", controller: true}}
spec: {{cluster: vault, shard: 0, image: "evil/miner:9.0.0", version: "9.0.0", revision: "x"}}
"#
    );
    let (created, said) = product.try_kubectl(&["apply", "-f", "-"], Some(&forged));
    assert!(!created, "a forged ValkeyNode was created: {said}");
    assert!(said.contains("written only by the operator"), "{said}");

    // Nor can a node's image be changed; its labels can.
    let nodes = json(&product, &["get", "valkeynodes", "-n", NAMESPACE]);
    let node = nodes["items"][0]["metadata"]["name"].as_str().unwrap();
    let (patched, said) = product.try_kubectl(
        &[
            "patch",
            "valkeynode",
            node,
            "-n",
            NAMESPACE,
            "--type",
            "merge",
            "-p",
            r#"{"spec": {"image": "evil/miner:9.0.0"}}"#,
        ],
        None,
    );
    assert!(!patched, "a node's image was changed: {said}");
    assert!(
        said.contains("spec is immutable") || said.contains("written only by the operator"),
        "{said}"
    );
    product.kubectl(&["label", "valkeynode", node, "-n", NAMESPACE, "audited=yes"]);
    product.assert_failovers(NAMESPACE, "vault", 0).await;

    tls_cluster_waits_for_its_secret_then_mounts_it(&product).await;
}

/// A TLS cluster touches nothing until its Secret passes Momento's checks, each failure
/// `Invalid` with Momento's message verbatim; once fixed in place, its Pods mount the Secret,
/// serve TLS only and announce their per-Pod DNS names. (The Valkey binaries here have no TLS,
/// so the Pod is checked as stored.)
async fn tls_cluster_waits_for_its_secret_then_mounts_it(product: &Product) {
    product.apply(
        r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: secure, namespace: locked}
spec: {configRef: locked-config, shards: 1, replicasPerShard: 0, tls: {secretRef: secure-tls}}
"#,
    );
    let invalid_with = async |expected: &str| {
        let waiting = eventually(expected, Duration::from_secs(30), async || {
            let cluster = product.cluster(NAMESPACE, "secure");
            let message = condition_field(&cluster, "Degraded", "message");
            (message.as_deref() == Some(expected)).then_some(cluster)
        })
        .await;
        let reason = condition_field(&waiting, "Degraded", "reason");
        assert_eq!(reason.as_deref(), Some("TlsUnavailable"), "{waiting}");
        // Momento's contract: `Invalid`, and the same sentence in `status.message`.
        assert_eq!(waiting["status"]["state"], "Invalid", "{waiting}");
        assert_eq!(waiting["status"]["message"], expected, "{waiting}");
    };
    invalid_with(r#"TLS Secret "secure-tls" not found in namespace "locked""#).await;
    let selector = "valkey.gomomento.com/cluster=secure";
    let pods = json(product, &["get", "pods", "-n", NAMESPACE, "-l", selector]);
    assert_eq!(pods["items"].as_array().unwrap().len(), 0, "{pods}");

    let dir = tempfile::tempdir().unwrap();
    let service = "secure.locked.svc.cluster.local";
    let certificates = |folder: &str, names: &[String]| {
        let path = dir.path().join(folder);
        valkey_operator::cli::certs::write_dev_certificates(&path, names, &[]).unwrap()
    };
    let narrow = certificates("narrow", &[service.to_string()]);
    let good = certificates("good", &[service.to_string(), format!("*.{service}")]);
    let secret = |files: &[(&str, &std::path::Path)]| {
        let _ = product.try_kubectl(
            &[
                "delete",
                "secret",
                "secure-tls",
                "-n",
                NAMESPACE,
                "--ignore-not-found",
            ],
            None,
        );
        let mut args: Vec<String> = ["create", "secret", "generic", "secure-tls", "-n", NAMESPACE]
            .map(String::from)
            .to_vec();
        args.extend(
            files
                .iter()
                .map(|(key, path)| format!("--from-file={key}={}", path.display())),
        );
        product.kubectl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    };
    secret(&[("tls.crt", &narrow.cert), ("tls.key", &narrow.key)]);
    invalid_with(r#"TLS Secret "secure-tls" missing required key "ca.crt""#).await;
    secret(&[
        ("tls.crt", &narrow.cert),
        ("tls.key", &narrow.key),
        ("ca.crt", &narrow.ca_cert),
    ]);
    invalid_with(
        r#"TLS cert in Secret "secure-tls" missing SAN "*.secure.locked.svc.cluster.local""#,
    )
    .await;
    let pods = json(product, &["get", "pods", "-n", NAMESPACE, "-l", selector]);
    assert_eq!(pods["items"].as_array().unwrap().len(), 0, "{pods}");

    // Fixed in place, shaped as Momento's certificates are.
    secret(&[
        ("tls.crt", &good.cert),
        ("tls.key", &good.key),
        ("ca.crt", &good.ca_cert),
    ]);
    let pod = eventually(
        "a Pod of the TLS cluster",
        Duration::from_secs(30),
        async || {
            let pods = json(product, &["get", "pods", "-n", NAMESPACE, "-l", selector]);
            pods["items"].as_array()?.first().cloned()
        },
    )
    .await;
    eventually(
        "the fixed cluster is Creating again, the Secret no longer in its message",
        Duration::from_secs(30),
        async || {
            let status = product.cluster(NAMESPACE, "secure")["status"].clone();
            let message = status["message"].as_str().unwrap_or_default();
            (status["state"] == "Creating" && !message.contains("secure-tls")).then_some(())
        },
    )
    .await;
    // The node announces the per-Pod name the wildcard covers, and prefers it in redirects;
    // the name resolves through the headless Service `secure` (hostname and subdomain).
    let name = pod["metadata"]["name"].as_str().unwrap();
    let args = pod["spec"]["containers"][0]["args"].to_string();
    let announced = format!(r#""--cluster-announce-hostname","{name}.{service}""#);
    assert!(args.contains(&announced), "{announced}: {args}");
    assert!(
        args.contains(r#""--cluster-preferred-endpoint-type","hostname""#),
        "{args}"
    );
    assert_eq!(pod["spec"]["hostname"], name);
    assert_eq!(pod["spec"]["subdomain"], "secure");
    let headless = json(product, &["get", "service", "secure", "-n", NAMESPACE]);
    assert_eq!(headless["spec"]["clusterIP"], "None", "{headless}");
    let args = pod["spec"]["containers"][0]["args"].to_string();
    for expected in [
        r#""--port","0""#,
        r#""--tls-port","6379""#,
        r#""--tls-ca-cert-file","/etc/valkey/tls/ca.crt""#,
        r#""--tls-replication","yes""#,
        r#""--tls-cluster","yes""#,
    ] {
        assert!(args.contains(expected), "{expected}: {args}");
    }
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    let tls = volumes.iter().find(|v| v["name"] == "tls").unwrap();
    assert_eq!(tls["secret"]["secretName"], "secure-tls");
    assert_eq!(tls["secret"]["defaultMode"], 0o440);
    let mounts = pod["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap();
    let mount = mounts.iter().find(|m| m["name"] == "tls").unwrap();
    assert_eq!(mount["mountPath"], "/etc/valkey/tls");
    assert_eq!(mount["readOnly"], true);
}
