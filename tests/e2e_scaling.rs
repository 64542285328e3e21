//! Scaling end to end, as docs/operating.md describes it: `kubectl patch` of `shards` and
//! `replicasPerShard` on a live cluster with a writer on it. Shards are added and removed with
//! atomic slot migration, replicas joined and retired, no primary fails over, and no
//! acknowledged write is lost. Then `kubectl delete` of the cluster retires all of it.

use std::sync::LazyLock;
use std::time::Duration;

use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product};
use harness::valkey::wait_for_layout;
use harness::{eventually, metric};

static CLUSTER: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("growth")
        .config("elastic", r#"{imageRef: valkey-9-0-0, valkey: {save: ""}}"#)
        .cluster(("growth", "feed"), "elastic", 2, 1)
        .yaml()
});

/// Patches the cluster's spec, waits until it has converged on it, and checks the layout Valkey
/// itself reports: (replicas, slots) per shard.
async fn scale_to(product: &Product, patch: &str, expected: &[(usize, u32)]) {
    product.patch("valkeycluster/feed", Some("growth"), patch);
    product
        .wait_converged(&[("growth", "feed")], "9.0.0", Duration::from_secs(240))
        .await;
    let addresses: Vec<String> = product.addresses("growth", "feed").into_values().collect();
    let nodes = expected
        .iter()
        .map(|(replicas, _)| 1 + replicas)
        .sum::<usize>();
    assert_eq!(addresses.len(), nodes, "after {patch}: {addresses:?}");
    wait_for_layout(&addresses, expected).await;
    let status = product.cluster("growth", "feed")["status"].clone();
    assert_eq!(
        status["shards"].as_array().map(Vec::len),
        Some(expected.len()),
        "{status}"
    );
}

#[tokio::test]
async fn scaling_shards_and_replicas_with_kubectl_patch_loses_no_write() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&CLUSTER);
    product
        .wait_converged(&[("growth", "feed")], "9.0.0", Duration::from_secs(180))
        .await;
    let watch = ClusterWatch::start(&product, "growth", "feed").await;

    scale_to(
        &product,
        r#"{"spec": {"shards": 3}}"#,
        &[(1, 5461), (1, 5461), (1, 5462)],
    )
    .await;
    watch.assert_writing().await;
    let metrics = product.operator().metrics().await;
    let completed = [
        ("cluster", "feed"),
        ("namespace", "growth"),
        ("result", "completed"),
    ];
    assert!(
        metric(
            &metrics,
            "valkey_operator_slot_migrations_total",
            &completed
        )
        .is_some_and(|n| n > 0.0),
        "{metrics}"
    );
    scale_to(
        &product,
        r#"{"spec": {"replicasPerShard": 2}}"#,
        &[(2, 5461), (2, 5461), (2, 5462)],
    )
    .await;
    watch.assert_writing().await;
    scale_to(
        &product,
        r#"{"spec": {"shards": 2}}"#,
        &[(2, 8192), (2, 8192)],
    )
    .await;
    watch.assert_writing().await;
    scale_to(
        &product,
        r#"{"spec": {"replicasPerShard": 1}}"#,
        &[(1, 8192), (1, 8192)],
    )
    .await;

    watch.finish(&product).await;
    // Scaling moves slots and joins or retires replicas; it never fails a primary over.
    product.assert_failovers("growth", "feed", 0).await;

    // Deleting the cluster: the operator's finalizer retires every node, then lets it go.
    let finalizers = product.cluster("growth", "feed")["metadata"]["finalizers"].to_string();
    assert!(
        finalizers.contains("valkey.gomomento.com/retire-nodes"),
        "{finalizers}"
    );
    product.kubectl(&[
        "delete",
        "valkeycluster",
        "feed",
        "-n",
        "growth",
        "--timeout=60s",
    ]);
    eventually(
        "the deleted cluster's nodes go",
        Duration::from_secs(60),
        async || {
            let p = &product;
            let left = p.kubectl(&["get", "valkeynodes,pods", "-n", "growth", "-o", "name"]);
            let running = p
                .kubelet()
                .pod_processes()
                .iter()
                .filter(|process| process.namespace == "growth")
                .count();
            if left.trim().is_empty() && running == 0 {
                Ok(())
            } else {
                Err(format!("{left}\n{running} valkey-server processes"))
            }
        },
    )
    .await;
}
