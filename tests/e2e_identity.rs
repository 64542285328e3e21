//! The operator acts only on the node it means, end to end, with a kubelet that behaves like a
//! real one where it matters here: it hands a stopped Pod's address to the next Pod at once,
//! and its status reports a container's exit a few seconds late (so the API shows a dead Pod
//! running, at its old address, while another server already answers there).
//!
//! - A replica's server killed and its address taken at once by a stranger valkey-server in
//!   cluster mode with no password: the stranger receives no login (no `AUTH` at all), never
//!   learns a node of the cluster, no ValkeyNode records its id; `Degraded` says
//!   `StrangerAtAddress` with an event; the cluster heals with nothing lost.
//! - A replica's server killed with no stranger: its replacement gets the freed address at once,
//!   while the dead Pod's status still shows it. The operator, logged in there, finds the new
//!   node's id, not the dead one's: it never takes the one for the other.
//! - A primary's Pod relabelled by hand (the labels the operator's watch selects by removed): it
//!   is still the node's Pod (owned by its ValkeyNode), no takeover, the labels come back.
//! - A handover request dated in the future is dated now (it would otherwise never expire).

use std::sync::LazyLock;
use std::time::Duration;

use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product, ProductOptions, condition_field, converged};
use harness::valkey::stranger::Stranger;
use harness::valkey::{Sampler, layout, primary_changes};
use harness::{eventually, signal};
use k8s_openapi::jiff::Timestamp;
use testenv::KubeletOptions;
use tokio::time::Instant;
use valkey_operator::api::annotations::HANDOVER_REQUESTED;
use valkey_operator::roll::slots::bootstrap_range;

const NAMESPACE: &str = "identity";
const CLUSTER: &str = "vault";
/// How late the kubelet reports a container's exit.
const STATUS_LAG: Duration = Duration::from_secs(8);

static OBJECTS: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("identity")
        .config("identity-config", "{imageRef: valkey-9-0-0}")
        .cluster(("identity", "vault"), "identity-config", 2, 1)
        .yaml()
});

/// Whole again: 4 Pods, each shard a primary with one replica and its half of the slots, and
/// the cluster converged; how long that took.
async fn whole_again(product: &Product, since: Instant) -> Duration {
    eventually(
        "the cluster whole again",
        Duration::from_secs(180),
        async || {
            let pods = product.addresses(NAMESPACE, CLUSTER);
            if pods.len() != 4 {
                return Err(format!("Pods: {pods:?}"));
            }
            let addresses: Vec<String> = pods.into_values().collect();
            let seen = layout(&addresses).await;
            if seen != [(1, 8192), (1, 8192)] {
                return Err(format!("(replicas, slots) per shard: {seen:?}"));
            }
            let status = product.cluster(NAMESPACE, CLUSTER);
            if !converged(&status, "9.0.0") {
                return Err(format!("status: {:#}", status["status"]));
            }
            Ok(())
        },
    )
    .await;
    since.elapsed()
}

/// The recorded node ids of the cluster's ValkeyNodes: each distinct, none `forbidden`.
fn assert_ids(product: &Product, forbidden: &str) {
    let ids = product.node_ids(NAMESPACE, CLUSTER);
    let recorded: Vec<&String> = ids.values().flatten().collect();
    assert!(
        !recorded.iter().any(|id| *id == forbidden),
        "a ValkeyNode recorded the stranger's id: {ids:?}"
    );
    let mut distinct = recorded.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        recorded.len(),
        "two nodes share an id: {ids:?}"
    );
}

fn cluster_events(product: &Product) -> String {
    product.kubectl(&["get", "events", "-n", NAMESPACE])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_acts_only_on_the_node_it_means() {
    let kubelet = KubeletOptions {
        reuse_freed_ips: true,
        exit_reported_after: STATUS_LAG,
        ..Default::default()
    };
    let product = Product::start_with(ProductOptions {
        kubelet,
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(&OBJECTS);
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.0.0", Duration::from_secs(180))
        .await;

    // 1. A stranger at a dead replica's address.
    let watch = ClusterWatch::start(&product, NAMESPACE, CLUSTER).await;
    let victim = product.replica_of(NAMESPACE, CLUSTER, 0).await;
    let pid = product.server_pid(NAMESPACE, &victim);
    assert!(product.kubelet().claim_ip_at_release(NAMESPACE, &victim));
    let struck = signal(pid, "-KILL");
    let lease = eventually(
        "the kubelet to release the dead Pod's address",
        Duration::from_secs(10),
        async || product.kubelet().take_released_ip(NAMESPACE, &victim),
    )
    .await;
    let stranger = Stranger::start(lease, "9.0.0").await;
    let stranger_id = stranger.id().await;
    println!(
        "stranger at {} ({:.2} s after the kill), id {stranger_id}",
        stranger.address(),
        struck.elapsed().as_secs_f64()
    );
    let mut said_so = false;
    let healed = eventually(
        "the cluster whole again, the stranger left alone",
        Duration::from_secs(180),
        async || {
            let seen = stranger.seen().await;
            assert_eq!(
                seen.auth_commands, 0,
                "the stranger received a login: {seen:?}"
            );
            assert_eq!(
                seen.known_nodes, 1,
                "the stranger learnt the cluster: {seen:?}"
            );
            assert_ids(&product, &stranger_id);
            let status = product.cluster(NAMESPACE, CLUSTER);
            said_so |= condition_field(&status, "Degraded", "reason").as_deref()
                == Some("StrangerAtAddress");
            let pods = product.addresses(NAMESPACE, CLUSTER);
            let whole =
                !pods.contains_key(&victim) && pods.len() == 4 && converged(&status, "9.0.0");
            whole.then_some(seen)
        },
    )
    .await;
    let whole_after = whole_again(&product, struck).await;
    let seen = stranger.seen().await;
    assert_eq!(seen.auth_commands, 0, "{seen:?}");
    assert_eq!(seen.auth_refused, 0, "{seen:?}");
    assert_eq!(seen.known_nodes, 1, "{seen:?}");
    assert!(said_so, "Degraded never said StrangerAtAddress");
    let events = cluster_events(&product);
    assert!(events.contains("StrangerAtAddress"), "{events}");
    assert_ids(&product, &stranger_id);
    println!(
        "stranger | connections it accepted {} (from the operator's probes and the tests' reads) | AUTH received {} | nodes it knows {} | whole again after {:.1} s",
        healed.connections,
        seen.auth_commands,
        seen.known_nodes,
        whole_after.as_secs_f64()
    );
    drop(stranger);

    // 2. The dead replica's address handed to its own replacement at once.
    let victim = product.replica_of(NAMESPACE, CLUSTER, 1).await;
    let old_ip = product.addresses(NAMESPACE, CLUSTER)[&victim].clone();
    let pid = product.server_pid(NAMESPACE, &victim);
    let struck = signal(pid, "-KILL");
    let reused = eventually(
        "a new Pod of the cluster at the dead one's address",
        Duration::from_secs(60),
        async || {
            let pods = product.addresses(NAMESPACE, CLUSTER);
            pods.iter()
                .find(|(name, address)| **name != victim && **address == old_ip)
                .map(|(name, _)| name.clone())
        },
    )
    .await;
    // While the dead Pod's status still shows the address, the operator logs in there and
    // finds the new node, not the dead one: it says so rather than take one for the other.
    eventually(
        "Degraded to say another node answers at the dead one's address",
        STATUS_LAG,
        async || {
            let status = product.cluster(NAMESPACE, CLUSTER);
            let message = condition_field(&status, "Degraded", "message").unwrap_or_default();
            (condition_field(&status, "Degraded", "reason").as_deref() == Some("StrangerAtAddress")
                && message.contains(&victim))
            .then_some(())
        },
    )
    .await;
    println!(
        "{reused} took {victim}'s address {old_ip} {:.2} s after the kill",
        struck.elapsed().as_secs_f64()
    );
    let whole_after = whole_again(&product, struck).await;
    assert_ids(&product, "none");
    println!(
        "address reused by the cluster's own new node: whole again after {:.1} s",
        whole_after.as_secs_f64()
    );
    let report = watch.finish(&product).await;
    println!(
        "identity faults: {} acknowledged writes, none lost, longest write gap {:.3} s",
        report.log.acked,
        report.longest_write_gap().as_secs_f64()
    );

    // 3. A primary's Pod relabelled: still its node's Pod; no takeover; the labels come back.
    let seeds: Vec<String> = product
        .addresses(NAMESPACE, CLUSTER)
        .into_values()
        .collect();
    let sampler = Sampler::start(seeds);
    let primary = product.primary_of(NAMESPACE, CLUSTER, 0).await;
    product.kubectl(&[
        "label",
        "pod",
        &primary,
        "-n",
        NAMESPACE,
        "app.kubernetes.io/managed-by-",
        "valkey.gomomento.com/cluster-",
    ]);
    let relabelled = Instant::now();
    eventually("the labels put back", Duration::from_secs(30), async || {
        let pod = product.kubectl(&["get", "pod", &primary, "-n", NAMESPACE, "-o", "json"]);
        let pod: serde_json::Value = serde_json::from_str(&pod).unwrap();
        let labels = &pod["metadata"]["labels"];
        (labels["app.kubernetes.io/managed-by"] == "valkey-operator"
            && labels["valkey.gomomento.com/cluster"] == CLUSTER)
            .then_some(())
    })
    .await;
    println!(
        "relabelled primary: labels back after {:.1} s",
        relabelled.elapsed().as_secs_f64()
    );
    // Long enough for a takeover to have happened had the Pod been taken for gone (it took
    // about 25 s when it was).
    tokio::time::sleep(Duration::from_secs(30)).await;
    let samples = sampler.stop().await;
    for shard in 0..2 {
        let slot = bootstrap_range(shard, 2).start;
        assert_eq!(
            primary_changes(&samples, slot),
            0,
            "shard {shard} changed primary after a relabel"
        );
    }
    let events = cluster_events(&product);
    assert!(!events.contains("TakeOver"), "{events}");
    assert_eq!(product.primary_of(NAMESPACE, CLUSTER, 0).await, primary);

    // 4. A handover request dated in the future counts as now, and is written as now.
    let replica = product.replica_of(NAMESPACE, CLUSTER, 1).await;
    product.kubectl(&[
        "annotate",
        "valkeynode",
        &replica,
        "-n",
        NAMESPACE,
        &format!("{HANDOVER_REQUESTED}=2100-01-01T00:00:00Z"),
    ]);
    let dated = eventually(
        "the request dated now",
        Duration::from_secs(30),
        async || {
            let node =
                product.kubectl(&["get", "valkeynode", &replica, "-n", NAMESPACE, "-o", "json"]);
            let node: serde_json::Value = serde_json::from_str(&node).unwrap();
            let at: Timestamp = node["metadata"]["annotations"][HANDOVER_REQUESTED]
                .as_str()?
                .parse()
                .ok()?;
            (at.as_second() < 4_000_000_000).then_some(at)
        },
    )
    .await;
    let off = Timestamp::now().duration_since(dated).as_secs().abs();
    assert!(off < 30, "dated {dated}, {off} s from now");
}
