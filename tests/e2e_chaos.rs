//! Faults, end to end on the real control plane and real Valkey, one after another on one
//! cluster (2 shards × 1 replica), each under a cluster-aware writer that counts acknowledged
//! writes and an outside sampler of the topology:
//!
//! - a primary's server killed (SIGKILL): its Pod is never restarted in place (it would come
//!   back as an empty primary and its replica would discard its data); Valkey fails the shard
//!   over and the operator replaces the node. Lost: at most the writes acknowledged in the last
//!   moment before the kill (asynchronous replication), never the shard's data set;
//! - an Eviction of a primary's Pod (the policy/v1 API, as `kubectl drain` sends it): deferred
//!   with 429 until the operator has handed the shard over (a planned failover) and replaced
//!   the node, which it then retires itself (the retry finds the Pod gone). Nothing lost, a
//!   write gap under 1 s;
//! - an Eviction of a replica's Pod: deferred until a replacement has joined, no primary
//!   change;
//! - a primary's Pod deleted by hand: its server stopped for good, so taken over at once;
//! - a primary's server paused (SIGSTOP) past the node timeout but not as long as its liveness
//!   probe takes to fail, then resumed: not taken over (it may come back), nothing lost;
//! - the operator killed (SIGKILL) at a planned failover and restarted: one failover a shard;
//! - a primary's server killed in the middle of a roll: taken over, and the roll finishes;
//! - a roll whose failover of a shard was recorded and never took effect, three times (as when
//!   the operator dies between recording and issuing it): it stalls with the reason, and a
//!   person's annotation resumes it with one failover.
//!
//! Each prints one row of figures: lost writes, longest write gap, time until the cluster is
//! whole again, primary changes per shard.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product, condition_field, converged};
use harness::valkey::{Sampler, Writer, layout, lost_writes, primary_changes};
use harness::{eventually, signal};
use tokio::time::Instant;
use valkey_operator::api::annotations::{RETRY_FAILOVERS, ROLLOUT_PAUSED};
use valkey_operator::roll::{MAX_FAILOVER_ATTEMPTS, slots::bootstrap_range};

const NAMESPACE: &str = "chaos";
const CLUSTER: &str = "ledger";
const SHARDS: u32 = 2;

/// The asynchronous replication window: writes a primary acknowledged this shortly before it
/// died may not have reached its replica. Nothing acknowledged earlier (or later) may be lost.
const REPLICATION_WINDOW: Duration = Duration::from_millis(100);

/// The cluster under fault: the operator's forced 5 s node timeout decides how fast Valkey
/// fails a primary over.
static OBJECTS: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("chaos")
        .config("ledger-config", "{imageRef: valkey-9-0-0}")
        .cluster(("chaos", "ledger"), "ledger-config", 2, 1)
        .yaml()
});

/// What one fault cost, as printed.
struct Row {
    fault: &'static str,
    acked: u64,
    lost: Vec<u64>,
    /// How long before the fault the earliest lost write was acknowledged.
    lost_window: Duration,
    /// Lost writes acknowledged outside the replication window: more than
    /// [`REPLICATION_WINDOW`] before the fault, or after it.
    lost_outside_window: usize,
    longest_gap: Duration,
    whole_after: Duration,
    primary_changes: Vec<usize>,
}

impl Row {
    fn print(&self) {
        println!(
            "chaos | {:<28} | acked {:>6} | lost {:>3} (earliest acknowledged {:>5.3} s before the fault) | longest write gap {:>6.3} s | whole again after {:>5.1} s | primary changes per shard {:?}",
            self.fault,
            self.acked,
            self.lost.len(),
            self.lost_window.as_secs_f64(),
            self.longest_gap.as_secs_f64(),
            self.whole_after.as_secs_f64(),
            self.primary_changes,
        );
    }
}

async fn primary_of(product: &Product, shard: u32) -> String {
    product.primary_of(NAMESPACE, CLUSTER, shard).await
}

async fn replica_of(product: &Product, shard: u32) -> String {
    product.replica_of(NAMESPACE, CLUSTER, shard).await
}

/// Whole again: `victim`'s Pod gone (if the fault removes it), every shard a primary and one
/// replica with its share of the slots, every node seeing all slots served, and the cluster
/// converged.
async fn whole_again(product: &Product, victim: Option<&str>, version: &str) {
    eventually(
        format!("{victim:?} replaced (if named) and the cluster whole again"),
        Duration::from_secs(180),
        async || {
            let pods = product.addresses(NAMESPACE, CLUSTER);
            if victim.is_some_and(|v| pods.contains_key(v)) || pods.len() != 4 {
                return Err(format!("Pods: {pods:?}"));
            }
            let addresses: Vec<String> = pods.into_values().collect();
            let seen = layout(&addresses).await;
            if seen != [(1, 8192), (1, 8192)] {
                return Err(format!("(replicas, slots) per shard: {seen:?}"));
            }
            let status = product.cluster(NAMESPACE, CLUSTER);
            if !converged(&status, version) {
                return Err(format!("status: {:#}", status["status"]));
            }
            Ok(())
        },
    )
    .await;
}

/// Runs `fault` under a writer and a sampler, waits until the cluster is whole again (without
/// `victim`'s Pod, when the fault removes one), and measures. `fault` returns the moment it
/// struck (after any preparation of its own).
async fn measure<F: AsyncFnOnce() -> Instant>(
    product: &Product,
    fault_name: &'static str,
    victim: Option<&str>,
    version: &str,
    fault: F,
) -> Row {
    product.grant_writer(NAMESPACE, CLUSTER).await;
    let seeds: Vec<String> = product
        .addresses(NAMESPACE, CLUSTER)
        .into_values()
        .collect();
    let writer = Writer::start(seeds.clone());
    writer.assert_progressing().await;
    let sampler = Sampler::start(seeds);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let at = Instant::now();
    let struck = fault().await;
    whole_again(product, victim, version).await;
    let whole_after = at.elapsed();
    writer.assert_progressing().await;
    let log = writer.stop().await;
    let samples = sampler.stop().await;
    let seeds: Vec<String> = product
        .addresses(NAMESPACE, CLUSTER)
        .into_values()
        .collect();
    let lost = lost_writes(&seeds, log.acked).await;
    let lost_at: Vec<Instant> = lost.iter().map(|&i| log.ack_times[i as usize]).collect();
    let earliest_lost = lost_at.iter().min().copied().unwrap_or(struck);
    let row = Row {
        fault: fault_name,
        acked: log.acked,
        lost_window: struck.saturating_duration_since(earliest_lost),
        lost_outside_window: lost_at
            .iter()
            .filter(|&&t| t > struck || struck.saturating_duration_since(t) > REPLICATION_WINDOW)
            .count(),
        lost,
        longest_gap: log.longest_gap(at, *log.ack_times.last().unwrap()),
        whole_after,
        primary_changes: (0..SHARDS)
            .map(|shard| primary_changes(&samples, bootstrap_range(shard, SHARDS).start))
            .collect(),
    };
    row.print();
    row
}

/// Evicts `pod` through the policy/v1 Eviction API, as `kubectl drain` does: retried on
/// 429 (every 200 ms here, 5 s in kubectl), done once allowed or once the Pod is gone (the
/// operator retired its node itself). Returns the refusals' messages. (kubectl, since kube's
/// client retries a 429 by itself and would hide the refusals.)
async fn evict(product: &Product, pod: &str) -> Vec<String> {
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction");
    let eviction = format!(
        r#"{{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {{"name": "{pod}", "namespace": "{NAMESPACE}"}}}}"#
    );
    let mut refusals = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ok, output) =
            product.try_kubectl(&["create", "--raw", &path, "-f", "-"], Some(&eviction));
        if ok || output.contains("NotFound") {
            return refusals;
        }
        assert!(
            output.contains("TooManyRequests") || output.contains("429"),
            "evicting {pod}: {output}; refused before: {refusals:?}"
        );
        assert!(Instant::now() < deadline, "still refused: {refusals:?}");
        refusals.push(output);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn faults_lose_nothing_a_replica_held_and_heal() {
    let mut product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&OBJECTS);
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.0.0", Duration::from_secs(180))
        .await;
    let mut rows = BTreeMap::new();

    // SIGKILL of a primary's server: never restarted in place, the replica keeps the data.
    let victim = primary_of(&product, 0).await;
    let pid = product.server_pid(NAMESPACE, &victim);
    let row = measure(
        &product,
        "SIGKILL of a primary",
        Some(&victim),
        "9.0.0",
        async || signal(pid, "-KILL"),
    )
    .await;
    assert_eq!(
        row.lost_outside_window,
        0,
        "writes lost beyond the replication window: {} lost, the earliest acknowledged {:?} before the kill",
        row.lost.len(),
        row.lost_window
    );
    assert_eq!(row.primary_changes, [1, 0]);
    let phase = product.kubectl(&[
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "--field-selector",
        "status.phase=Failed",
        "-o",
        "name",
    ]);
    assert!(
        !phase.contains(&victim),
        "the killed node's Pod is retired with it: {phase}"
    );
    rows.insert(1, row);

    // An Eviction of a primary's Pod: deferred until the shard is handed over, then allowed.
    let victim = primary_of(&product, 1).await;
    let mut refusals = Vec::new();
    let row = measure(
        &product,
        "Eviction of a primary's Pod",
        Some(&victim),
        "9.0.0",
        async || {
            let at = Instant::now();
            refusals = evict(&product, &victim).await;
            at
        },
    )
    .await;
    assert!(
        refusals
            .first()
            .is_some_and(|m| m.contains("handing the shard over to a replica first")),
        "the first eviction is deferred for a handover: {refusals:?}"
    );
    assert!(row.lost.is_empty(), "{} writes lost", row.lost.len());
    assert!(
        row.longest_gap < Duration::from_secs(1),
        "write gap {:?}",
        row.longest_gap
    );
    assert_eq!(row.primary_changes, [0, 1]);
    rows.insert(2, row);

    // An Eviction of a replica's Pod: deferred until a replacement has joined the shard.
    let victim = replica_of(&product, 0).await;
    let mut refusals = Vec::new();
    let row = measure(
        &product,
        "Eviction of a replica's Pod",
        Some(&victim),
        "9.0.0",
        async || {
            let at = Instant::now();
            refusals = evict(&product, &victim).await;
            at
        },
    )
    .await;
    assert!(
        refusals
            .first()
            .is_some_and(|m| m.contains("replacing it first")),
        "the replica's eviction waits for its replacement: {refusals:?}"
    );
    assert!(row.lost.is_empty(), "{} writes lost", row.lost.len());
    assert_eq!(row.primary_changes, [0, 0]);
    rows.insert(3, row);

    // A primary's Pod deleted by hand: its server stops for good, so it is taken over at once.
    let victim = primary_of(&product, 0).await;
    let row = measure(
        &product,
        "A primary's Pod deleted",
        Some(&victim),
        "9.0.0",
        async || {
            let at = Instant::now();
            product.kubectl(&["delete", "pod", &victim, "-n", NAMESPACE, "--wait=false"]);
            at
        },
    )
    .await;
    assert!(row.lost.is_empty(), "{} writes lost", row.lost.len());
    assert_eq!(row.primary_changes, [1, 0]);
    rows.insert(4, row);

    // A primary's server paused (SIGSTOP) past the 5 s node timeout, then resumed before its
    // liveness probe can fail three times (8 s at the soonest): its Pod still runs, so it may
    // come back and is not taken over; with two shards Valkey cannot fail it over either (no
    // majority of primaries), so the shard's writes wait, and resume. A longer hang is killed
    // by the probe (e2e_momento_contract).
    let victim = primary_of(&product, 1).await;
    let pid = product.server_pid(NAMESPACE, &victim);
    let row = measure(
        &product,
        "SIGSTOP of a primary, 6 s",
        None,
        "9.0.0",
        async || {
            let at = signal(pid, "-STOP");
            tokio::time::sleep(Duration::from_secs(6)).await;
            signal(pid, "-CONT");
            at
        },
    )
    .await;
    assert!(row.lost.is_empty(), "{} writes lost", row.lost.len());
    assert_eq!(
        row.primary_changes,
        [0, 0],
        "a paused primary is not replaced"
    );
    let pods = product.addresses(NAMESPACE, CLUSTER);
    assert!(
        pods.contains_key(&victim),
        "the paused node stays: {pods:?}"
    );
    rows.insert(5, row);

    // A failover recorded and never taking effect (as when the operator dies between recording
    // and issuing it, three times): the roll stalls with the reason and resumes, with one
    // failover, once a person annotates the cluster. Recorded here before the roll reaches it:
    // the config's rollout is paused while the record is written (a roll of this cluster
    // takes a few seconds, less than the test needs to read the new revision and write).
    let watch = ClusterWatch::start(&product, NAMESPACE, CLUSTER).await;
    let before = product.cluster(NAMESPACE, CLUSTER)["status"]["desiredRevision"].clone();
    let config = "valkeyconfig/ledger-config";
    product.kubectl(&["annotate", config, &format!("{ROLLOUT_PAUSED}=true")]);
    product.patch(config, None, r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#);
    let revision = eventually("the roll's revision", Duration::from_secs(30), async || {
        let now = product.cluster(NAMESPACE, CLUSTER)["status"]["desiredRevision"].clone();
        (now != before)
            .then(|| now.as_str().map(String::from))
            .flatten()
    })
    .await;
    let memory = format!(
        r#"{{"status": {{"roll": {{"revision": "{revision}", "failedOverShards": [0], "failoverAttempts": [{{"shard": 0, "attempts": {MAX_FAILOVER_ATTEMPTS}}}]}}}}}}"#
    );
    product.kubectl(&[
        "patch",
        "valkeycluster",
        CLUSTER,
        "-n",
        NAMESPACE,
        "--subresource=status",
        "--type=merge",
        "-p",
        &memory,
    ]);
    let cluster = product.cluster(NAMESPACE, CLUSTER);
    assert_eq!(
        cluster["status"]["outdatedNodes"],
        SHARDS * 2,
        "the paused roll has not started"
    );
    product.kubectl(&["annotate", config, &format!("{ROLLOUT_PAUSED}-")]);
    let stalled = eventually(
        "the roll to stall on shard 0",
        Duration::from_secs(120),
        async || {
            let cluster = product.cluster(NAMESPACE, CLUSTER);
            let message = condition_field(&cluster, "Degraded", "message")?;
            message
                .contains("did not complete in 3 attempts")
                .then_some(message)
        },
    )
    .await;
    assert!(stalled.contains(RETRY_FAILOVERS), "{stalled}");
    watch.assert_writing().await;
    product.kubectl(&[
        "annotate",
        "valkeycluster",
        CLUSTER,
        "-n",
        NAMESPACE,
        &format!("{RETRY_FAILOVERS}={revision}"),
    ]);
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.1.2", Duration::from_secs(180))
        .await;
    let report = watch.finish(&product).await;
    report.assert_shards(SHARDS as u16, 1, 0);
    let cluster = product.cluster(NAMESPACE, CLUSTER);
    assert!(
        cluster["metadata"]["annotations"][RETRY_FAILOVERS].is_null(),
        "the annotation acts once and goes"
    );
    println!(
        "chaos | a failover stalled after {MAX_FAILOVER_ATTEMPTS} attempts, resumed by annotation: longest write gap {:.3} s",
        report.longest_write_gap().as_secs_f64()
    );

    // The operator killed (SIGKILL) right after it logs a planned failover, so around the
    // moment it records and issues it, then started again: each shard fails over once.
    let watch = ClusterWatch::start(&product, NAMESPACE, CLUSTER).await;
    let planned_before = product.operator().log().matches("fail over shard ").count();
    product.patch(
        "valkeyconfig/ledger-config",
        None,
        r#"{"spec": {"imageRef": "valkey-9-0-0"}}"#,
    );
    eventually("a planned failover", Duration::from_secs(120), async || {
        let planned = product.operator().log().matches("fail over shard ").count();
        (planned > planned_before).then_some(())
    })
    .await;
    product.operator_mut().kill_and_restart();
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.0.0", Duration::from_secs(180))
        .await;
    let report = watch.finish(&product).await;
    report.assert_shards(SHARDS as u16, 1, 0);
    let roll = &product.cluster(NAMESPACE, CLUSTER)["status"]["roll"];
    println!(
        "chaos | operator killed at a planned failover: each shard failed over once, longest write gap {:.3} s, roll memory {roll}",
        report.longest_write_gap().as_secs_f64()
    );

    // SIGKILL of a primary in the middle of a roll: shard 0 rolls first, so shard 1's primary
    // and replica are both outdated when the primary dies. The replica takes over at once, then
    // the roll goes on: shard 1 changes primary twice (the takeover, then its one planned
    // failover), shard 0 once.
    let victim = primary_of(&product, 1).await;
    let pid = product.server_pid(NAMESPACE, &victim);
    let row = measure(
        &product,
        "SIGKILL of a primary mid-roll",
        Some(&victim),
        "9.1.2",
        async || {
            product.patch(
                "valkeyconfig/ledger-config",
                None,
                r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
            );
            eventually("the roll to start", Duration::from_secs(60), async || {
                let cluster = product.cluster(NAMESPACE, CLUSTER);
                (condition_field(&cluster, "Progressing", "status").as_deref() == Some("True"))
                    .then_some(())
            })
            .await;
            signal(pid, "-KILL")
        },
    )
    .await;
    assert_eq!(
        row.lost_outside_window,
        0,
        "writes lost beyond the replication window: {} lost, the earliest acknowledged {:?} before the kill",
        row.lost.len(),
        row.lost_window
    );
    assert_eq!(row.primary_changes, [1, 2]);
    rows.insert(6, row);

    println!("chaos | {} faults, one row each above", rows.len());
}
