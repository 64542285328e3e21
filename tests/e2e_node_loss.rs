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
//!
//! The second test is what keeping primaries apart prevents: with `primarySpread: Disabled` and a
//! switchover putting two of the three primaries on one node, that node's loss takes Valkey's
//! majority, no failover happens by itself, and the shards wait for the operator's takeover.

use std::time::Duration;

use harness::eventually;
use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product, ProductOptions, WatchReport, converged};
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

/// [`fleet`] with the primaries left wherever failovers put them.
fn fleet_not_spread() -> String {
    let config = Manifest::new()
        .namespace(NAMESPACE)
        .config("lost", r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#)
        .yaml();
    format!(
        "{config}---\napiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyCluster\n\
         metadata: {{name: orders, namespace: {NAMESPACE}}}\nspec: {{configRef: lost, \
         shards: {SHARDS}, replicasPerShard: 1, placement: {{primarySpread: Disabled}}}}\n"
    )
}

/// Three real nodes in three zones, `fleet` applied, the cluster converged; when it was applied.
async fn cluster_on_three_nodes(fleet: &str) -> (Product, Instant) {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a", "b", "c"],
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(fleet);
    let applied = Instant::now();
    eventually("orders comes up", Duration::from_secs(240), async || {
        converged(&product.cluster(NAMESPACE, "orders"), "9.1.2").then_some(())
    })
    .await;
    (product, applied)
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

/// Loses `node` under a writer, waits (at most `within_secs`) until the cluster is whole on the
/// other nodes, and checks that nothing acknowledged outside the second around the loss was
/// lost: the writer's report, the writes lost within that second, and how long after the loss
/// the cluster was whole.
async fn lose_under_a_writer(
    product: &mut Product,
    node: &str,
    within_secs: u64,
) -> (WatchReport, usize, Duration) {
    let watch = ClusterWatch::start(product, NAMESPACE, "orders").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lost_at = Instant::now();
    let lost = product
        .real_node_mut(node)
        .map(|real| real.lose())
        .unwrap_or_else(|| panic!("no real node {node}"))
        .unwrap();
    let product = &*product;
    let whole = eventually(
        "orders whole again on the other nodes",
        Duration::from_secs(within_secs),
        async || {
            let cluster = product.cluster(NAMESPACE, "orders");
            let pods = pods_and_hosts(product);
            let elsewhere = pods.iter().all(|(_, host)| host != node);
            match converged(&cluster, "9.1.2") && elsewhere && pods.len() == 6 {
                true => Ok(lost_at.elapsed()),
                false => Err(format!("{cluster:#}\n{pods:?}")),
            }
        },
    )
    .await;
    let (report, lost_writes) = watch
        .finish_losing_only_within(
            product,
            lost_at - Duration::from_secs(1),
            lost_at + Duration::from_secs(1),
        )
        .await;
    drop(lost);
    (report, lost_writes, whole)
}

#[tokio::test]
async fn a_lost_nodes_shard_is_served_again_and_its_pods_replaced_on_the_other_nodes() {
    let (mut product, applied) = cluster_on_three_nodes(&fleet()).await;
    // Wherever the scheduler and the first failovers left them, the primaries end one to a
    // node (three nodes, three shards, every shard with a replica elsewhere).
    let spread = product
        .primaries_apart(
            NAMESPACE,
            "orders",
            SHARDS,
            "9.1.2",
            Duration::from_secs(120),
        )
        .await;
    println!(
        "primaries on {spread:?} {:.1?} after the cluster was applied",
        applied.elapsed()
    );

    let lost_node = spread[0].clone();
    let (report, lost_writes, whole) = lose_under_a_writer(&mut product, &lost_node, 180).await;
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

#[tokio::test]
async fn a_lost_node_holding_two_primaries_waits_for_the_operators_takeover() {
    let (mut product, _) = cluster_on_three_nodes(&fleet_not_spread()).await;
    // A node holding shard `i`'s primary and a replica of another shard `j`: `j` is switched
    // over onto that replica, by name, so the node holds two of the three primaries.
    let hosts = product.primary_hosts(NAMESPACE, "orders", SHARDS).await;
    let pods = pods_and_hosts(&product);
    let (node, j, replica) = hosts
        .iter()
        .find_map(|node| {
            (0..SHARDS).find_map(|j| {
                let prefix = format!("orders-{j}-");
                let replica = pods.iter().find(|(pod, host)| {
                    pod.starts_with(&prefix) && host == node && hosts[j as usize] != *node
                })?;
                Some((node.clone(), j, replica.0.clone()))
            })
        })
        .unwrap_or_else(|| panic!("no node holds a primary and another shard's replica: {pods:?}"));
    let (asked, said) = product.plugin(&[
        "switchover",
        "orders",
        "--shard",
        &j.to_string(),
        "--to",
        &replica,
        "-n",
        NAMESPACE,
    ]);
    assert!(asked, "{said}");
    let crowded = eventually(
        "two primaries on one node",
        Duration::from_secs(90),
        async || {
            let hosts = product.primary_hosts(NAMESPACE, "orders", SHARDS).await;
            let on_node: Vec<u32> = (0..SHARDS).filter(|s| hosts[*s as usize] == node).collect();
            let converged = converged(&product.cluster(NAMESPACE, "orders"), "9.1.2");
            match on_node.len() == 2 && converged {
                true => Ok(on_node),
                false => Err(format!("{hosts:?}")),
            }
        },
    )
    .await;

    let (report, lost_writes, whole) = lose_under_a_writer(&mut product, &node, 240).await;
    let gap = report.longest_write_gap();
    let changes: Vec<usize> = (0..SHARDS as u16)
        .map(|s| report.primary_changes(s, SHARDS as u16))
        .collect();
    println!(
        "lost {node} (primaries of shards {crowded:?}, spread off): longest write gap \
         {gap:.2?}, whole on the other nodes {whole:.1?} after the loss; {} acknowledged, \
         {lost_writes} lost (all within 1 s of the loss); primary changes per shard {changes:?}",
        report.log.acked,
    );
    // No majority survived, so Valkey failed nothing over: the operator took both shards
    // over once they had been silent for its bound (20 s), and every write waited for it.
    for shard in &crowded {
        assert!(changes[*shard as usize] >= 1, "shard {shard}: {changes:?}");
    }
    assert!(
        gap > Duration::from_secs(15) && gap < Duration::from_secs(90),
        "served again only by the operator's takeover: {gap:?}"
    );
}
