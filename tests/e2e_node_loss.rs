//! A whole node lost at once, on three real nodes in three zones (issue 48's node loss): its
//! kubelet, containerd and every container killed, and nothing at its addresses answering any
//! more (`testenv::RealNode::lose`), while a stock cluster client writes. The Node and its Pods
//! stay in the API server, as they do when a machine dies.
//!
//! What must hold: the cluster's primaries stand one to a node before the loss (the operator
//! moves them apart: rule 12 of `roll::rules`), so the loss of one node never takes a majority
//! of them and Valkey fails its shard over by itself; the operator then replaces the lost
//! node's Pods on the other nodes, side by side, without waiting for Kubernetes to evict them,
//! and nothing acknowledged is lost outside the second around the loss (asynchronous
//! replication's window).

use std::collections::BTreeSet;
use std::time::Duration;

use harness::eventually;
use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product, ProductOptions, converged};
use tokio::time::Instant;

const NAMESPACE: &str = "lost";
const SHARDS: u32 = 3;

fn fleet() -> String {
    Manifest::new()
        .namespace(NAMESPACE)
        .config("lost", r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#)
        .cluster((NAMESPACE, "orders"), "lost", SHARDS, 1)
        .yaml()
}

/// The cluster's Pods that are not being deleted, with the Node each runs on.
fn pods_and_hosts(product: &Product) -> Vec<(String, String)> {
    product
        .pods_labelled(NAMESPACE, "valkey.gomomento.com/cluster=orders")
        .iter()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
        .map(|pod| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            (
                text(&pod["metadata"]["name"]),
                text(&pod["spec"]["nodeName"]),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_lost_nodes_shard_is_served_again_and_its_pods_replaced_on_the_other_nodes() {
    let mut product = Product::start_with(ProductOptions {
        real_nodes: &["a", "b", "c"],
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(&fleet());
    let created = Instant::now();
    eventually("orders comes up", Duration::from_secs(240), async || {
        converged(&product.cluster(NAMESPACE, "orders"), "9.1.2").then_some(())
    })
    .await;
    // Wherever the scheduler and the first failovers left them, the primaries end one to a
    // node (three nodes, three shards, every shard with a replica elsewhere).
    let spread = eventually(
        "the primaries stand one to a node",
        Duration::from_secs(120),
        async || {
            let hosts = product.primary_hosts(NAMESPACE, "orders", SHARDS).await;
            let distinct: BTreeSet<&String> = hosts.iter().collect();
            let converged = converged(&product.cluster(NAMESPACE, "orders"), "9.1.2");
            match distinct.len() == hosts.len() && converged {
                true => Ok(hosts),
                false => Err(format!("{hosts:?}")),
            }
        },
    )
    .await;
    println!(
        "primaries on {spread:?} {:.1?} after the cluster was applied",
        created.elapsed()
    );

    let lost_node = spread[0].clone();
    let watch = ClusterWatch::start(&product, NAMESPACE, "orders").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lost_at = Instant::now();
    let lost = product
        .real_node_mut(&lost_node)
        .map(|node| node.lose())
        .unwrap_or_else(|| panic!("no real node {lost_node}"))
        .unwrap();
    let whole = eventually(
        "orders whole again on the other nodes",
        Duration::from_secs(180),
        async || {
            let cluster = product.cluster(NAMESPACE, "orders");
            let pods = pods_and_hosts(&product);
            let elsewhere = pods.iter().all(|(_, host)| *host != lost_node);
            match converged(&cluster, "9.1.2") && elsewhere && pods.len() == 6 {
                true => Ok(lost_at.elapsed()),
                false => Err(format!("{cluster:#}\n{pods:?}")),
            }
        },
    )
    .await;
    let (report, lost_writes) = watch
        .finish_losing_only_within(
            &product,
            lost_at - Duration::from_secs(1),
            lost_at + Duration::from_secs(1),
        )
        .await;
    drop(lost);
    if std::env::var_os("SHOW_STEPS").is_some() {
        std::fs::write("/tmp/node-loss-operator.log", product.operator().log()).ok();
    }
    let gap = report.longest_write_gap();
    println!(
        "lost {lost_node} (primary of shard 0): longest write gap {gap:.2?}, whole on the other \
         nodes {whole:.1?} after the loss; {} acknowledged, {lost_writes} lost (all within 1 s \
         of the loss); primary changes per shard {:?}",
        report.log.acked,
        (0..SHARDS as u16)
            .map(|s| report.primary_changes(s, SHARDS as u16))
            .collect::<Vec<_>>()
    );
    // Valkey's own failover (cluster-node-timeout 5 s) serves shard 0 again: a majority of
    // primaries survived the loss.
    assert!(
        gap < Duration::from_secs(15),
        "shard 0 was unserved for {gap:?}"
    );
    assert!(
        whole < Duration::from_secs(90),
        "whole only after {whole:?}"
    );
    assert!(
        report.primary_changes(0, SHARDS as u16) >= 1,
        "shard 0 never failed over"
    );
}
