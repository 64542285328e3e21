//! A network partition on real nodes: a node holding one shard's primary of each of two
//! clusters cut off from every other node's Pods for 12 s (`testenv::node::fault::Cut`), while
//! the operator and a stock cluster client per cluster on the host still reach both sides, as a
//! control plane outside the cut would.
//!
//! What Valkey does: the primary on the cut-off side keeps acknowledging writes until it counts
//! itself in the minority (`cluster-node-timeout`, 5 s, and the failure reports after it); the
//! majority promotes its replica; after the heal the old primary follows the new one, and what
//! it took in alone is gone. What the operator must add nothing to: one failover for the cut
//! shard, none for the others, no node retired for being cut off, and no loss outside that
//! window (10 s). With `min-replicas-to-write 1` and `min-replicas-max-lag 2` in the second
//! cluster's config, the cut primary refuses writes (`NOREPLICAS`) once its replica's
//! acknowledgements are 2 s old, and the window narrows to that (5 s); a client that keeps
//! asking it (redis-py's cluster client takes `NOREPLICAS` for an answer, not for a moved slot)
//! waits until the cut heals.

use std::sync::LazyLock;
use std::time::Duration;

use harness::eventually;
use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product, ProductOptions, converged};
use tokio::time::Instant;

const NAMESPACE: &str = "cut";
const SHARDS: u16 = 3;
const CUT_FOR: Duration = Duration::from_secs(12);

/// Two clusters on one config each: `defaults` with Valkey's settings, `bounded` with
/// `min-replicas-to-write 1` and `min-replicas-max-lag 2`.
static FLEET: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace(NAMESPACE)
        .config("defaults", r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#)
        .config(
            "bounded",
            r#"{imageRef: valkey-9-1-2, valkey: {save: "", min-replicas-to-write: "1", min-replicas-max-lag: "2"}}"#,
        )
        .cluster((NAMESPACE, "defaults"), "defaults", u32::from(SHARDS), 1)
        .cluster((NAMESPACE, "bounded"), "bounded", u32::from(SHARDS), 1)
        .yaml()
});

/// The node a Pod runs on.
fn node_of(product: &Product, pod: &str) -> String {
    let pod = harness::k8s::chart::get_json(
        &product.plane,
        &["get", "pod", "-n", NAMESPACE, pod, "-o", "json"],
    );
    pod["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The node of each shard's primary of `cluster`, by shard.
async fn primaries_of(product: &Product, cluster: &str) -> Vec<(u16, String)> {
    let mut primaries = Vec::new();
    for shard in 0..SHARDS {
        let primary = product
            .primary_of(NAMESPACE, cluster, u32::from(shard))
            .await;
        primaries.push((shard, node_of(product, &primary)));
    }
    primaries
}

/// The shard of `cluster` whose primary is on `node`, when it is the only one there.
fn only_primary_on(primaries: &[(u16, String)], node: &str) -> Option<u16> {
    match primaries
        .iter()
        .filter(|(_, n)| n == node)
        .collect::<Vec<_>>()[..]
    {
        [(shard, _)] => Some(*shard),
        _ => None,
    }
}

/// What a cut cost a cluster: its report checked (one failover of `shard`, none of the others,
/// the same nodes as `before`, no loss outside `may_lose` of the cut), and the lost count.
async fn after_the_cut(
    product: &Product,
    (cluster, watch, before): (&str, ClusterWatch, Vec<String>),
    shard: u16,
    (cut_at, may_lose): (Instant, Duration),
) -> String {
    let after = eventually(
        format!("{cluster} whole again after the cut"),
        Duration::from_secs(120),
        async || {
            let state = product.cluster(NAMESPACE, cluster);
            let pods: Vec<String> = product.addresses(NAMESPACE, cluster).into_keys().collect();
            match converged(&state, "9.1.2") && pods.len() == usize::from(SHARDS) * 2 {
                true => Ok(pods),
                false => Err(format!("{state:#}\n{pods:?}")),
            }
        },
    )
    .await;
    assert_eq!(
        after, before,
        "{cluster}: nodes were replaced for having been cut off"
    );
    let (report, lost) = watch
        .finish_losing_only_within(product, cut_at, cut_at + may_lose)
        .await;
    // One failover for the cut shard, none for the others (whose replicas on the cut node were
    // out of reach for a while).
    for other in 0..SHARDS {
        report.assert_shard(other, SHARDS, usize::from(other == shard), 0);
    }
    format!(
        "{cluster}: {} acknowledged, {lost} lost, all within {may_lose:?} of the cut; longest \
         write gap {:.2?}",
        report.log.acked,
        report.longest_write_gap()
    )
}

#[tokio::test]
async fn a_cut_off_primary_loses_only_its_minority_window_which_min_replicas_narrows() {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a", "b", "c"],
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(&FLEET);
    for cluster in ["defaults", "bounded"] {
        eventually(
            format!("{cluster} comes up"),
            Duration::from_secs(240),
            async || converged(&product.cluster(NAMESPACE, cluster), "9.1.2").then_some(()),
        )
        .await;
    }
    // One node's loss must not take a majority of a cluster's primaries: cut one that holds a
    // single primary of each cluster.
    let (defaults, bounded) = (
        primaries_of(&product, "defaults").await,
        primaries_of(&product, "bounded").await,
    );
    let (node, shards) = product
        .real_nodes()
        .iter()
        .find_map(|node| {
            let name = node.name();
            let both = (
                only_primary_on(&defaults, name)?,
                only_primary_on(&bounded, name)?,
            );
            Some((node, both))
        })
        .unwrap_or_else(|| panic!("no node holds one primary of each: {defaults:?} {bounded:?}"));
    let mut watches = Vec::new();
    for cluster in ["defaults", "bounded"] {
        let before: Vec<String> = product.addresses(NAMESPACE, cluster).into_keys().collect();
        let watch = ClusterWatch::start(&product, NAMESPACE, cluster).await;
        watches.push((cluster, watch, before));
    }

    let cut_at = Instant::now();
    let cut = node.cut_off().unwrap();
    tokio::time::sleep(CUT_FOR).await;
    drop(cut);
    let mut watches = watches.into_iter();
    let (Some(first), Some(second)) = (watches.next(), watches.next()) else {
        unreachable!("two watches")
    };
    let defaults =
        after_the_cut(&product, first, shards.0, (cut_at, Duration::from_secs(10))).await;
    let bounded = after_the_cut(&product, second, shards.1, (cut_at, Duration::from_secs(5))).await;
    println!(
        "cut {} off for {CUT_FOR:?}:\n  {defaults}\n  {bounded}",
        node.name()
    );
}
