//! Heal paths that used to wait for a person, end to end under a cluster-aware writer:
//!
//! - a primary killed while its only replica is paused for 5 s: the takeover waits for the
//!   replica (which holds every slot's data) instead of serving the slots again empty, and the
//!   shard is served again once it answers;
//! - a primary killed while a new replica of its shard is joining (the joiner paused for a while,
//!   then resumed): the shard is taken over by its synced replica at once, the joiner follows the
//!   new primary once it runs again, and the dead node is retired;
//! - a primary of a 2-shard cluster (where Valkey's own failover can never win a majority of
//!   primaries) paused for good: taken over while still paused, once silent past the operator's
//!   bound, and replaced.
//!
//! Each shard of the first two is served again within 10 s of the kill and whole again (every replica it should
//! have, dead nodes retired) without a person. Writes are asynchronously replicated: what the
//! primary acknowledged after its replicas last had it may be lost with it. That window is
//! [`REPLICATION_WINDOW`] before the kill when a synced replica takes over, and the whole pause
//! when the only replica was paused (the primary went on acknowledging writes nobody copied).
//! Nothing acknowledged outside it is lost.

use std::sync::LazyLock;
use std::time::Duration;

use harness::k8s::manifest::Manifest;
use harness::k8s::{IMAGES, Product, converged};
use harness::valkey::{Writer, lost_writes, try_layout};
use harness::{eventually, signal};
use serde_json::Value;
use tokio::time::Instant;

const NAMESPACE: &str = "heal";
const CLUSTER: &str = "cart";
const REPLICATION_WINDOW: Duration = Duration::from_millis(100);
/// How soon a shard must be served again after its primary is killed.
const SERVED_WITHIN: Duration = Duration::from_secs(10);

static OBJECTS: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("heal")
        .config(
            "heal-config",
            r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#,
        )
        .cluster(("heal", "cart"), "heal-config", 3, 1)
        .yaml()
});

/// (replicas, slots) of each of three shards, sorted.
fn three_shards(replicas: usize) -> [(usize, u32); 3] {
    [(replicas, 5461), (replicas, 5461), (replicas, 5462)]
}

/// Waits until `cluster` shows `expected` (replicas, slots) per shard, sorted, its Pods are
/// exactly those nodes (no dead one left), and it has converged.
async fn whole(
    product: &Product,
    (namespace, cluster): (&str, &str),
    expected: &[(usize, u32)],
    since: Instant,
) -> Duration {
    eventually(
        "the cluster whole again",
        Duration::from_secs(240),
        async || {
            let pods = product.addresses(namespace, cluster);
            let nodes: usize = expected.iter().map(|(replicas, _)| 1 + replicas).sum();
            if pods.len() != nodes {
                return Err(format!("Pods: {pods:?}"));
            }
            let addresses: Vec<String> = pods.into_values().collect();
            let seen = try_layout(&addresses)
                .await
                .map_err(|e| format!("layout: {e}"))?;
            if seen != expected {
                return Err(format!("(replicas, slots) per shard: {seen:?}"));
            }
            let status = product.cluster(namespace, cluster);
            if !converged(&status, "9.1.2") {
                return Err(format!("status: {:#}", status["status"]));
            }
            Ok(())
        },
    )
    .await;
    since.elapsed()
}

/// How long after `killed` shard `shard` of `cluster` had a primary again other than `victim`.
async fn served_again(
    product: &Product,
    (namespace, cluster): (&str, &str),
    shard: u32,
    victim: &str,
    killed: Instant,
) -> Duration {
    eventually(
        format!("shard {shard} served again"),
        Duration::from_secs(120),
        async || {
            let addresses = product.addresses(namespace, cluster);
            let prefix = format!("{cluster}-{shard}-");
            for (name, address) in addresses {
                if !name.starts_with(&prefix) || name == victim {
                    continue;
                }
                let Ok(client) =
                    harness::valkey::logins::admin(&address, Duration::from_secs(1)).await
                else {
                    continue;
                };
                let primary = client
                    .replication_info()
                    .await
                    .is_ok_and(|r| r.role == valkey_operator::roll::Role::Primary);
                let owns = client
                    .cluster_nodes()
                    .await
                    .is_ok_and(|nodes| nodes.iter().any(|n| n.myself && !n.slots.is_empty()));
                if primary && owns {
                    return Some(killed.elapsed());
                }
            }
            None
        },
    )
    .await
}

/// A Joining node of `shard` whose server runs: its name and pid.
async fn joiner(product: &Product, shard: u32) -> (String, u32) {
    eventually(
        format!("a new node joining shard {shard}"),
        Duration::from_secs(60),
        async || {
            let nodes: Value = serde_json::from_str(&product.kubectl(&[
                "get",
                "valkeynodes",
                "-n",
                NAMESPACE,
                "-o",
                "json",
            ]))
            .ok()?;
            let joining = nodes["items"].as_array()?.iter().find_map(|n| {
                let lifecycle = n["status"]["lifecycle"].as_str()?;
                (n["spec"]["shard"] == shard && lifecycle == "Joining")
                    .then(|| n["metadata"]["name"].as_str().map(String::from))?
            })?;
            let pid = product.kubelet().pod_process(NAMESPACE, &joining)?.pid?;
            Some((joining, pid))
        },
    )
    .await
}

/// The writes lost, and how many of them were acknowledged outside every `[from - window, to]`
/// of `windows`.
async fn losses(
    product: &Product,
    (namespace, cluster): (&str, &str),
    log: &harness::valkey::WriterLog,
    windows: &[(Instant, Instant)],
) -> (usize, usize) {
    let seeds: Vec<String> = product
        .addresses(namespace, cluster)
        .into_values()
        .collect();
    let lost = lost_writes(&seeds, log.acked).await;
    let within = |t: Instant| {
        windows
            .iter()
            .any(|&(from, to)| t <= to && t + REPLICATION_WINDOW >= from)
    };
    let outside = lost
        .iter()
        .filter(|&&i| !within(log.ack_times[i as usize]))
        .count();
    (lost.len(), outside)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_primaries_are_taken_over_whatever_their_replicas_are_doing() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&OBJECTS);
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.1.2", Duration::from_secs(180))
        .await;
    product.grant_writer(NAMESPACE, CLUSTER).await;
    let seeds: Vec<String> = product
        .addresses(NAMESPACE, CLUSTER)
        .into_values()
        .collect();
    let writer = Writer::start(seeds);
    writer.assert_progressing().await;

    // 1. Shard 1's only replica paused for 5 s; its primary killed meanwhile.
    let replica = product.replica_of(NAMESPACE, CLUSTER, 1).await;
    let victim = product.primary_of(NAMESPACE, CLUSTER, 1).await;
    let replica_pid = product.server_pid(NAMESPACE, &replica);
    let paused = signal(replica_pid, "-STOP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = signal(product.server_pid(NAMESPACE, &victim), "-KILL");
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(paused.elapsed())).await;
    signal(replica_pid, "-CONT");
    let served = served_again(&product, (NAMESPACE, CLUSTER), 1, &victim, killed).await;
    let whole_after = whole(&product, (NAMESPACE, CLUSTER), &three_shards(1), killed).await;
    let events = product.kubectl(&["get", "events", "-n", NAMESPACE]);
    assert!(
        !events.contains("served again, empty"),
        "the shard was given up as empty: {events}"
    );
    println!(
        "primary killed while its only replica was paused 5 s: served again after {:.1} s, whole again after {:.1} s",
        served.as_secs_f64(),
        whole_after.as_secs_f64()
    );
    assert!(served <= SERVED_WITHIN, "served again after {served:?}");
    writer.assert_progressing().await;
    let replica_window = (paused, killed);

    // 2. One more replica a shard: shard 0's joiner paused, shard 0's primary killed, the
    //    joiner resumed a while later.
    product.patch(
        &format!("valkeycluster/{CLUSTER}"),
        Some(NAMESPACE),
        r#"{"spec": {"replicasPerShard": 2}}"#,
    );
    let (joining, joiner_pid) = joiner(&product, 0).await;
    signal(joiner_pid, "-STOP");
    let victim = product.primary_of(NAMESPACE, CLUSTER, 0).await;
    let killed = signal(product.server_pid(NAMESPACE, &victim), "-KILL");
    let served = served_again(&product, (NAMESPACE, CLUSTER), 0, &victim, killed).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    // Paused longer than its liveness probe allows, the joiner may have been killed already;
    // the shard must be made whole either way.
    let joiner_outcome = if stopped(joiner_pid) {
        signal(joiner_pid, "-CONT");
        "resumed"
    } else {
        "killed by its liveness probe"
    };
    let whole_after = whole(&product, (NAMESPACE, CLUSTER), &three_shards(2), killed).await;
    println!(
        "primary killed while {joining} was joining its shard (paused 15 s, then {joiner_outcome}): served again after {:.1} s, whole again after {:.1} s",
        served.as_secs_f64(),
        whole_after.as_secs_f64()
    );
    assert!(served <= SERVED_WITHIN, "served again after {served:?}");
    let pods = product.addresses(NAMESPACE, CLUSTER);
    assert!(
        !pods.contains_key(&victim),
        "the dead primary was not retired: {pods:?}"
    );

    let log = writer.stop().await;
    let windows = [replica_window, (killed, killed)];
    let (lost, outside) = losses(&product, (NAMESPACE, CLUSTER), &log, &windows).await;
    println!(
        "heal | {} acknowledged, {lost} lost, {outside} of them outside the windows (shard 1's replica paused; {:?} before each kill)",
        log.acked, REPLICATION_WINDOW
    );
    assert_eq!(
        outside, 0,
        "acknowledged writes lost outside the replication windows"
    );
}

static HUNG_OBJECTS: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("heal-hung")
        .config(
            "heal-hung-config",
            r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#,
        )
        .cluster(("heal-hung", "till"), "heal-hung-config", 2, 1)
        .yaml()
});

/// Whether process `pid` runs: neither stopped (`T`), a zombie, nor gone (its liveness probe
/// may have had it killed).
fn running(pid: u32) -> bool {
    process_state(pid).is_some_and(|state| !matches!(state, 'T' | 't' | 'Z' | 'X'))
}

/// Whether process `pid` exists and is stopped (`T`), so that `SIGCONT` would resume it.
fn stopped(pid: u32) -> bool {
    process_state(pid).is_some_and(|state| matches!(state, 'T' | 't'))
}

/// The state letter of process `pid` from `/proc`, or `None` once it is gone.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_is_taken_over_where_valkey_cannot_fail_it_over() {
    let cluster = ("heal-hung", "till");
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&HUNG_OBJECTS);
    product
        .wait_converged(&[cluster], "9.1.2", Duration::from_secs(180))
        .await;
    product.grant_writer(cluster.0, cluster.1).await;
    let seeds: Vec<String> = product
        .addresses(cluster.0, cluster.1)
        .into_values()
        .collect();
    let writer = Writer::start(seeds);
    writer.assert_progressing().await;

    // Shard 0's primary stopped (SIGSTOP) and left stopped: its Pod runs, its server never
    // answers. With two shards, no Valkey failover can win a majority.
    let victim = product.primary_of(cluster.0, cluster.1, 0).await;
    let pid = product.server_pid(cluster.0, &victim);
    let paused = signal(pid, "-STOP");
    let served = served_again(&product, cluster, 0, &victim, paused).await;
    assert!(
        !running(pid),
        "the primary was resumed before its shard was taken over"
    );
    let whole_after = whole(&product, cluster, &[(1, 8192), (1, 8192)], paused).await;
    let pods = product.addresses(cluster.0, cluster.1);
    assert!(
        !pods.contains_key(&victim),
        "the hung primary was not replaced: {pods:?}"
    );
    println!(
        "hung primary of a 2-shard cluster (cluster-node-timeout 5 s, silence bound 20 s): served again after {:.1} s, whole again after {:.1} s",
        served.as_secs_f64(),
        whole_after.as_secs_f64()
    );
    // If it still runs (its Pod is being deleted), let it go.
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status();
    writer.assert_progressing().await;

    let log = writer.stop().await;
    let (lost, outside) = losses(&product, cluster, &log, &[(paused, paused)]).await;
    println!(
        "hung | {} acknowledged, {lost} lost, {outside} of them outside {:?} before the pause",
        log.acked, REPLICATION_WINDOW
    );
    assert_eq!(
        outside, 0,
        "acknowledged writes lost outside the replication window"
    );
}
