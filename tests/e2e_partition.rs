//! A network partition on real nodes: the node holding one shard's primary (and no other
//! primary) cut off from every other node's Pods for 30 s (`testenv::node::fault::Cut`), while
//! the operator and a stock cluster client on the host still reach both sides, as a control
//! plane outside the cut would.
//!
//! What Valkey does: the primary on the cut-off side keeps acknowledging writes until it counts
//! itself in the minority (`cluster-node-timeout`, 5 s, and the failure reports after it); the
//! majority promotes its replica; after the heal the old primary follows the new one, and what
//! it took in alone is gone. What the operator must add nothing to: one failover for the cut
//! shard, no failover of the others, no node retired for being cut off, and no loss outside
//! that window (10 s). What it adds after the heal: the primaries, which the failover left two
//! on one node, stand one to a node again (rule 12), by at most one more switchover, of
//! whichever shard leaves them least crowded.
//!
//! With `min-replicas-to-write 1` and `min-replicas-max-lag 1` in the config (the second test),
//! the cut primary refuses writes (`NOREPLICAS`) once its replica's last acknowledgement (sent
//! every second) is 1 s old in Valkey's whole seconds, and the window narrows to that (3 s
//! allowed); a client that keeps asking it (redis-py's cluster client takes `NOREPLICAS` for an
//! answer, not for a moved slot) waits until the cut heals, and writes must come back within
//! 10 s of it (`repl-timeout 10` drops the links the cut left dead). Each test prints when the
//! lost writes were acknowledged, from the cut's start, and what the writer was refused.
//!
//! The third test cuts the operator alone off from the node of a shard's primary for 65 s
//! (`testenv::node::fault::ProcessCut`: its own packets to that node's Pods dropped; clients,
//! the API server and the other nodes still reach them), longer than the operator waits
//! before it takes a silent primary for dead: the primary serves, its peers see it up, so
//! nothing is taken over, the cluster says why it waits, and nothing changes; then from one
//! replica elsewhere for 35 s, which is not replaced either. The fourth cuts
//! it off from its API server for 40 s (past its Lease) and kills a primary's server 5 s in:
//! Valkey fails the shard over; the operator, once back, replaces the dead node.

use std::time::Duration;

use harness::eventually;
use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product, ProductOptions, WatchReport, converged};
use testenv::node::fault::Destination;
use tokio::time::Instant;

const NAMESPACE: &str = "cut";
const SHARDS: u16 = 3;

/// The namespace, a config on 9.1.2 with `settings`, and a 3 × 1 cluster on it.
fn fleet(settings: &str) -> String {
    Manifest::new()
        .namespace(NAMESPACE)
        .config(
            "cut",
            &format!("{{imageRef: valkey-9-1-2, valkey: {settings}}}"),
        )
        .cluster((NAMESPACE, "orders"), "cut", u32::from(SHARDS), 1)
        .yaml()
}

/// The Nodes of orders' primaries, once they stand one to a node.
async fn orders_apart(product: &Product) -> Vec<String> {
    let within = Duration::from_secs(120);
    product
        .primaries_apart(NAMESPACE, "orders", u32::from(SHARDS), "9.1.2", within)
        .await
}

/// The cluster up on three real nodes with its primaries one to a node, and the node of one.
async fn cluster_on_three_nodes(settings: &str) -> (Product, u16, String) {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a", "b", "c"],
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(&fleet(settings));
    eventually("orders comes up", Duration::from_secs(240), async || {
        converged(&product.cluster(NAMESPACE, "orders"), "9.1.2").then_some(())
    })
    .await;
    let hosts = orders_apart(&product).await;
    (product, 0, hosts[0].clone())
}

/// Shard `shard` failed over once (Valkey's), and the cluster's primaries moved at most once
/// more, to stand one to a node again (rule 12 may move any shard for that: whichever leaves
/// them least crowded); the other shards never had fewer than `replicas` replicas.
fn one_failover_and_at_most_one_move_apart(report: &WatchReport, shard: u16, replicas: usize) {
    let moves: Vec<usize> = (0..SHARDS)
        .map(|any| report.primary_changes(any, SHARDS))
        .collect();
    let apart = moves.iter().sum::<usize>().saturating_sub(1);
    assert!(
        moves[usize::from(shard)] >= 1 && apart <= 1,
        "primary changes per shard {moves:?}: shard {shard} once, then at most one move apart"
    );
    for other in (0..SHARDS).filter(|&other| other != shard) {
        report.assert_kept_replicas(other, SHARDS, replicas);
    }
}

/// Cuts the node of a lone primary off for `cut_for` and checks what it cost: one failover of
/// its shard, none of the others, the same nodes before and after, no acknowledged write lost
/// outside `may_lose` of the cut's start.
async fn cut_a_lone_primarys_node(settings: &str, cut_for: Duration, may_lose: Duration) {
    let (product, shard, node) = cluster_on_three_nodes(settings).await;
    let real = product
        .real_nodes()
        .iter()
        .find(|n| n.name() == node)
        .unwrap();
    let before: Vec<String> = product.addresses(NAMESPACE, "orders").into_keys().collect();
    let watch = ClusterWatch::start(&product, NAMESPACE, "orders").await;
    let cut_at = Instant::now();
    let cut = real.cut_off().unwrap();
    tokio::time::sleep(cut_for).await;
    drop(cut);
    let heal_at = Instant::now();
    let after = eventually(
        "orders whole again after the cut",
        Duration::from_secs(120),
        async || {
            let cluster = product.cluster(NAMESPACE, "orders");
            let pods: Vec<String> = product.addresses(NAMESPACE, "orders").into_keys().collect();
            match converged(&cluster, "9.1.2") && pods.len() == usize::from(SHARDS) * 2 {
                true => Ok(pods),
                false => Err(format!("{cluster:#}\n{pods:?}")),
            }
        },
    )
    .await;
    assert_eq!(after, before, "nodes were replaced for having been cut off");
    let healed = Instant::now();
    let spread = orders_apart(&product).await;
    let spread_after = healed.elapsed();
    let (report, lost) = watch
        .finish_losing_only_within(&product, cut_at, cut_at + may_lose)
        .await;
    // The others' replicas on the cut node were out of reach for a while.
    one_failover_and_at_most_one_move_apart(&report, shard, 0);
    println!("primaries apart again ({spread:?}) {spread_after:.1?} after the heal was whole");
    let offsets: Vec<f64> = (report.lost_acknowledged.iter())
        .map(|at| at.saturating_duration_since(cut_at).as_secs_f64())
        .collect();
    let (first, last) = (
        offsets.iter().copied().fold(f64::INFINITY, f64::min),
        offsets.iter().copied().fold(0.0, f64::max),
    );
    println!(
        "cut {node} (primary of shard {shard}) off for {cut_for:?}: {} acknowledged, {lost} lost, \
         acknowledged from {first:.2} s to {last:.2} s after the cut began (allowed: {may_lose:?}); \
         longest write gap {:.2?}",
        report.log.acked,
        report.longest_write_gap()
    );
    let resumed = (report.log.ack_times.iter()).find(|at| **at >= heal_at);
    let resumed = resumed.map(|at| *at - heal_at);
    println!("writes acknowledged again {resumed:.2?} after the heal");
    assert!(
        resumed.is_some_and(|after| after <= Duration::from_secs(10)),
        "writes came back {resumed:?} after the heal; refused: {:?}",
        report
            .log
            .refusals
            .between(cut_at, heal_at, heal_at + Duration::from_secs(60))
    );
    println!(
        "what the writer was told in that gap: {:?}",
        report.refusals_in_longest_gap(cut_at)
    );
}

#[tokio::test]
async fn a_cut_off_primary_loses_only_what_it_took_in_before_it_knew_and_fails_over_once() {
    let (cut_for, may_lose) = (Duration::from_secs(30), Duration::from_secs(10));
    cut_a_lone_primarys_node(r#"{save: ""}"#, cut_for, may_lose).await;
}

#[tokio::test]
async fn min_replicas_to_write_narrows_what_a_cut_off_primary_can_lose() {
    // The strictest bound, and the link timeout it needs (`api::write_bound`): with Valkey's
    // 60 s, links the cut left dead refused writes for up to that long after the heal.
    let bounded = r#"{save: "", min-replicas-to-write: "1", min-replicas-max-lag: "1",
        repl-timeout: "10", repl-ping-replica-period: "1"}"#;
    // Valkey counts the lag in whole seconds and refreshes its count of good replicas once a
    // second: a replica last heard just before the cut may still count for up to 3 s.
    let (cut_for, may_lose) = (Duration::from_secs(30), Duration::from_secs(3));
    cut_a_lone_primarys_node(bounded, cut_for, may_lose).await;
}

/// How long the third test cuts the operator off: past the time it says why it waits.
const CUT_OPERATOR_FOR: Duration = Duration::from_secs(65);
/// How long it then cuts the operator off from one replica: past the silence bound (20 s, up
/// to 10 s after the first observation that finds it silent).
const CUT_FROM_REPLICA_FOR: Duration = Duration::from_secs(35);

/// Cuts the operator off from `network` for `cut_for`; the cluster must stay Ready and its
/// Progressing condition say `says` meanwhile. Returns the message and when it was said.
async fn cut_operator_off(
    product: &Product,
    network: &str,
    cut_for: Duration,
    says: &str,
) -> (String, Duration) {
    let cut = (product.operator())
        .cut_from(&[Destination {
            network,
            tcp_port: None,
        }])
        .unwrap();
    let cut_at = Instant::now();
    let said = eventually(
        format!("the cluster Ready, its Progressing condition saying {says:?}"),
        Duration::from_secs(60),
        async || {
            let cluster = product.cluster(NAMESPACE, "orders");
            let conditions = cluster["status"]["conditions"].as_array().cloned();
            let condition = |type_: &str| {
                (conditions.iter().flatten())
                    .find(|c| c["type"] == type_)
                    .cloned()
                    .unwrap_or_default()
            };
            let progressing = condition("Progressing");
            let message = progressing["message"].as_str().unwrap_or_default();
            // Clients are served all along: the cluster stays Ready.
            let ready = condition("Ready")["status"] == "True";
            match ready && message.contains(says) {
                true => Ok(message.to_string()),
                false => Err(format!("{cluster:#}")),
            }
        },
    )
    .await;
    let said_after = cut_at.elapsed();
    tokio::time::sleep(cut_for.saturating_sub(cut_at.elapsed())).await;
    drop(cut);
    eventually(
        "orders converged after the cut",
        Duration::from_secs(60),
        async || converged(&product.cluster(NAMESPACE, "orders"), "9.1.2").then_some(()),
    )
    .await;
    (said, said_after)
}

#[tokio::test]
async fn the_operator_cut_off_from_a_node_or_a_replica_takes_nothing_over_and_replaces_nothing() {
    let (product, shard, node) = cluster_on_three_nodes(r#"{save: ""}"#).await;
    let real = (product.real_nodes().iter())
        .find(|n| n.name() == node)
        .unwrap();
    let before = product.addresses(NAMESPACE, "orders");
    let watch = ClusterWatch::start(&product, NAMESPACE, "orders").await;
    // First the node of shard 0's primary (and of another shard's replica): past the silence
    // bound, the primary would have been taken for dead.
    let primary_cut = "the operator's path to it is cut, and nothing is taken over";
    let (said, said_after) =
        cut_operator_off(&product, &real.pod_subnet(), CUT_OPERATOR_FOR, primary_cut).await;
    println!(
        "operator cut off from {node} (primary of shard {shard}) for {CUT_OPERATOR_FOR:?}: said \
         so after {said_after:.1?} (\"{said}\")"
    );
    // Then one replica alone, elsewhere: it would have been replaced (a full sync).
    let mut primaries = Vec::new();
    for any in 0..SHARDS {
        primaries.push(product.primary_of(NAMESPACE, "orders", any.into()).await);
    }
    let (replica, address) = (before.iter())
        .find(|(pod, _)| !primaries.contains(pod) && product.host_of(NAMESPACE, pod) != node)
        .expect("a replica on another node");
    let ip = address.split(':').next().unwrap_or_default();
    let replica_cut = "it is not replaced";
    let (said, said_after) = cut_operator_off(
        &product,
        &format!("{ip}/32"),
        CUT_FROM_REPLICA_FOR,
        replica_cut,
    )
    .await;
    println!(
        "operator cut off from {replica} (a replica) for {CUT_FROM_REPLICA_FOR:?}: said so \
         after {said_after:.1?} (\"{said}\")"
    );
    let after = product.addresses(NAMESPACE, "orders");
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "nodes were replaced for the operator's own cut"
    );
    let report = watch.finish(&product).await;
    for any in 0..SHARDS {
        report.assert_shard(any, SHARDS, 0, 1);
    }
    println!(
        "no primary change, no node replaced; {} acknowledged, none lost; longest write gap \
         {:.2?}",
        report.log.acked,
        report.longest_write_gap()
    );
}

/// How long the fourth test cuts the operator off from its API server: past its Lease (it
/// stops leading), and past the silence bound of the node it cannot replace meanwhile.
const CUT_API_FOR: Duration = Duration::from_secs(40);

#[tokio::test]
async fn the_operator_cut_off_from_its_api_server_heals_a_killed_primary_once_back() {
    let (product, shard, _) = cluster_on_three_nodes(r#"{save: ""}"#).await;
    let watch = ClusterWatch::start(&product, NAMESPACE, "orders").await;
    // Where the operator reaches it (on real nodes, an address the kubelets reach too).
    let (address, port) = product.api_server_endpoint().unwrap();
    let cut = product
        .operator()
        .cut_from(&[Destination {
            network: &address,
            tcp_port: Some(port),
        }])
        .unwrap();
    let cut_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Valkey fails the shard over by itself; the operator, cut off, can neither see the Pod
    // fail nor make its replacement until the cut heals.
    let primary = product.primary_of(NAMESPACE, "orders", 0).await;
    let (_, pid) = product.try_container(NAMESPACE, &primary).unwrap();
    let killed = harness::signal(pid, "-KILL");
    tokio::time::sleep(CUT_API_FOR.saturating_sub(cut_at.elapsed())).await;
    drop(cut);
    let healed = Instant::now();
    eventually(
        "orders whole again once the operator is back",
        Duration::from_secs(120),
        async || {
            let cluster = product.cluster(NAMESPACE, "orders");
            let pods: Vec<String> = product.addresses(NAMESPACE, "orders").into_keys().collect();
            let whole = converged(&cluster, "9.1.2")
                && pods.len() == usize::from(SHARDS) * 2
                && !pods.contains(&primary);
            match whole {
                true => Ok(()),
                false => Err(format!("{cluster:#}\n{pods:?}")),
            }
        },
    )
    .await;
    let whole_after = healed.elapsed();
    // Asynchronous replication: the last moment's writes before the kill may be gone.
    let window = Duration::from_secs(1);
    let (report, lost) = watch
        .finish_losing_only_within(&product, killed - window, killed + window)
        .await;
    one_failover_and_at_most_one_move_apart(&report, shard, 1);
    println!(
        "operator cut off from its API server for {CUT_API_FOR:?}, shard {shard}'s primary \
         killed 5 s in: whole {whole_after:.1?} after the cut healed; {} acknowledged, {lost} \
         lost (inside the kill's second); longest write gap {:.2?}",
        report.log.acked,
        report.longest_write_gap()
    );
}
