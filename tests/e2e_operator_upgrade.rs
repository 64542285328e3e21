//! Upgrading the operator under a running cluster: a cluster created by the previous release
//! (the commit before Momento's labels, forced settings and status came in) keeps serving a
//! stock cluster client while the operator is replaced by this build, and is brought to this
//! build's contract in place: its Pods get Momento's labels, its Service selects by them, every
//! node runs `cluster-node-timeout` 5000, and not one Pod is replaced, no primary fails over,
//! no acknowledged write is lost.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::{ClusterWatch, IMAGES, Product, ProductOptions};
use harness::valkey::config_get;
use serde_json::Value;

/// The release upgraded from: main before this contract (its binary is built once from this
/// repository's history by `hack/build-previous-operator.sh`, and cached; `make test` builds it
/// in the background from the same file).
const PREVIOUS: &str = include_str!("../hack/previous-operator.commit").trim_ascii();

const NAMESPACE: &str = "upgrade";

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: upgrade}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: steady}
spec:
  imageRef: valkey-9-0-0
  resources: {cpu: 200m, memory: 256Mi}
  valkey: {save: ""}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: ledger, namespace: upgrade}
spec: {configRef: steady, shards: 2, replicasPerShard: 1}
"#;

fn previous_operator() -> PathBuf {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/hack/build-previous-operator.sh"
    );
    let built = std::process::Command::new(script)
        .arg(PREVIOUS)
        .output()
        .expect("run hack/build-previous-operator.sh");
    assert!(
        built.status.success(),
        "building the previous operator failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&built.stdout).trim())
}

/// Pod name → its uid, of the cluster's Pods.
fn pods(product: &Product) -> BTreeMap<String, String> {
    let selector = "valkey.gomomento.com/cluster=ledger";
    let args = ["get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json"];
    let pods: Value = serde_json::from_str(&product.kubectl(&args)).unwrap();
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let name = p["metadata"]["name"].as_str().unwrap().to_string();
            (name, p["metadata"]["uid"].as_str().unwrap().to_string())
        })
        .collect()
}

/// The Service's selector, as `kubectl` prints it.
fn service_selector(product: &Product) -> String {
    let jsonpath = "jsonpath={.spec.selector}";
    product.kubectl(&["get", "service", "ledger", "-n", NAMESPACE, "-o", jsonpath])
}

#[tokio::test]
async fn an_operator_upgrade_brings_a_running_cluster_to_the_contract_in_place() {
    let previous = previous_operator();
    let mut product = Product::start_with(ProductOptions {
        operator_binary: Some(&previous),
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(OBJECTS);
    product
        .wait_converged(&[(NAMESPACE, "ledger")], "9.0.0", Duration::from_secs(180))
        .await;
    let before = pods(&product);
    assert_eq!(before.len(), 4, "{before:?}");
    let old_selector = service_selector(&product);
    assert!(
        !old_selector.contains("app.kubernetes.io/instance"),
        "{old_selector}"
    );
    for address in product.addresses(NAMESPACE, "ledger").values() {
        let timeout = config_get(address, "cluster-node-timeout").await;
        assert_eq!(timeout.as_deref(), Ok("15000"), "{address}");
    }
    let watch = ClusterWatch::start(&product, NAMESPACE, "ledger").await;

    let upgraded_at = Instant::now();
    product
        .operator_mut()
        .replace_binary(&harness::operator_binary());
    product
        .operator_mut()
        .wait_ready(Duration::from_secs(60))
        .await;
    let momentos = "app.kubernetes.io/name=valkey,app.kubernetes.io/instance=ledger";
    eventually(
        "the running Pods carry Momento's labels and the Service selects by them",
        Duration::from_secs(60),
        async || {
            let args = ["get", "pods", "-n", NAMESPACE, "-l", momentos, "-o", "name"];
            let labelled = product.kubectl(&args).lines().count();
            let selector = service_selector(&product);
            (labelled == 4 && selector.contains("app.kubernetes.io/instance")).then_some(())
        },
    )
    .await;
    eventually(
        "every node runs the forced cluster-node-timeout",
        Duration::from_secs(60),
        async || {
            for address in product.addresses(NAMESPACE, "ledger").values() {
                if config_get(address, "cluster-node-timeout").await.as_deref() != Ok("5000") {
                    return Err(format!("{address} not yet"));
                }
            }
            Ok(())
        },
    )
    .await;
    println!(
        "upgraded: labels, Service selector and cluster-node-timeout in place after {:.1} s",
        upgraded_at.elapsed().as_secs_f64()
    );
    watch.assert_writing().await;
    product
        .wait_converged(&[(NAMESPACE, "ledger")], "9.0.0", Duration::from_secs(60))
        .await;
    let report = watch.finish(&product).await;
    println!(
        "longest gap between acknowledged writes {:.3} s, {} writes acknowledged, none lost",
        report.longest_write_gap().as_secs_f64(),
        report.log.acked
    );
    assert_eq!(pods(&product), before, "no Pod was replaced");
    // Seen from the client across the whole upgrade: no primary changed, no replica missing.
    report.assert_shards(2, 0, 1);
}
