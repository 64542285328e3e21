//! The data plane locked down, end to end on the real control plane (with its PodSecurity
//! admission) and real valkey-server Pods:
//! - a cluster in a namespace that enforces the `restricted` Pod Security Standard becomes
//!   Active (a Pod without the hardening is refused there, so the enforcement is live);
//! - each cluster gets a NetworkPolicy, owned by it and accepted by the API server, with the bus
//!   port only from its own Pods and the client port from its namespace, the operator and
//!   `spec.network.allowedClients`;
//! - nobody but the operator writes a ValkeyNode: a create with a forged ownerReference and a
//!   change of a node's image are refused, while labels stay writable.

// Test code reports failures by panicking; the house rules against it are for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use harness::k8s::{IMAGES, Product};
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

    product
        .wait_converged(&[(NAMESPACE, "vault")], "9.0.0", Duration::from_secs(180))
        .await;
    let pods = json(&product, &["get", "pods", "-n", NAMESPACE]);
    let pods = pods["items"].as_array().unwrap();
    assert_eq!(pods.len(), 4);
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
}
