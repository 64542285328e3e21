//! Where a shard's roll spends its time on real nodes (not a test: it prints figures).
//!
//! The guide's 3 × 1 cluster on 9.0.0, on three real nodes (kubelet, containerd, runc) in zones
//! a, b and c with its primaries one to a node, is rolled to 9.1.2 under a cluster writer. Each
//! planned step is in the operator's own log with its time; from those this prints, shard by
//! shard:
//!
//! - **Pod start**: a new node planned (`join a new replica`) → its server answering (the
//!   operator meets it into the cluster): scheduling, the container's start, the server's;
//! - **join**: answering → `activate`, in two parts: **sync** (answering → the first pass
//!   that waits only for every primary to list it: made a replica, its full sync done) and
//!   **gossip** (that pass → `activate`: Valkey's gossip spreading the new replica);
//! - **failover**: the shard's `fail over` (or a `switch ... over` that stands primaries apart
//!   again) planned → the next step planned (the failover done);
//! - **retire**: an old node's `retire` planned → the next step planned;
//! - **between**: the rest of the shard's time (passes, waits for the next step's turn);
//!
//! then the shard's whole roll (its first step planned → its last step done), the roll's, and
//! the longest write gap and acknowledged writes.
//!
//! Run: `cargo bench --bench roll_phases` (root: real nodes need network namespaces, cgroups and
//! iptables).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::{ClusterWatch, IMAGES, Product, ProductOptions, converged};

const NAMESPACE: &str = "shop";
const CLUSTER: &str = "carts";
const SHARDS: u32 = 3;

/// One planned step (or a meeting) of the cluster's, from the operator's log.
#[derive(Clone, Debug)]
struct Event {
    /// Seconds since midnight (UTC), as the log stamps it.
    at: f64,
    /// The step's words (`step=` field), or `meeting <node>`.
    what: String,
}

/// The phases of one shard's roll, in seconds.
#[derive(Default, Debug)]
struct Phases {
    pod_start: f64,
    join: f64,
    /// The part of `join` until only gossip was waited for.
    sync: f64,
    failover: f64,
    retire: f64,
    whole: f64,
}

impl Phases {
    fn between(&self) -> f64 {
        (self.whole - self.pod_start - self.join - self.failover - self.retire).max(0.0)
    }
}

/// Seconds since midnight of a log line's RFC 3339 stamp (`2026-12-07T18:20:01.123456Z ...`).
fn stamp(line: &str) -> Option<f64> {
    let time = line.get(11..26)?;
    let mut parts = time.split(':');
    let hours: f64 = parts.next()?.parse().ok()?;
    let minutes: f64 = parts.next()?.parse().ok()?;
    let seconds: f64 = parts.next()?.parse().ok()?;
    Some(hours * 3600.0 + minutes * 60.0 + seconds)
}

/// The cluster's planned steps and meetings in `log` (ANSI colours stripped), in order.
fn events(log: &str) -> Vec<Event> {
    let plain = harness::strip_ansi(log);
    let cluster = format!("cluster={CLUSTER} ");
    let mut events = Vec::new();
    for line in plain.lines().filter(|l| l.contains(&cluster)) {
        let Some(at) = stamp(line) else { continue };
        if let Some((_, step)) = line.split_once(" step=") {
            events.push(Event {
                at,
                what: step.trim().to_string(),
            });
        } else if line.contains("meeting the cluster")
            && let Some((_, rest)) = line.split_once(" node=")
        {
            let node = rest.split_whitespace().next().unwrap_or_default();
            events.push(Event {
                at,
                what: format!("meeting {node}"),
            });
        }
    }
    events
}

/// The time of the first event after `index` that is a different step (the end of a step
/// that blocks its pass: a failover, a retirement).
fn next_step_after(events: &[Event], index: usize) -> Option<f64> {
    let what = &events[index].what;
    events[index + 1..]
        .iter()
        .find(|e| !e.what.starts_with("meeting") && e.what != *what)
        .map(|e| e.at)
}

/// The roll's own failover, or a switchover that stands the primaries apart again after it.
fn is_failover(what: &str) -> bool {
    what.starts_with("fail over") || what.starts_with("switch shard")
}

/// The joiner of shard `shard` a pass waits for only because not every primary lists it yet
/// (`wait: <node> is joining shard <shard>: not every primary lists it ...`).
fn only_gossip_waited_for(what: &str, shard: u32) -> Option<&str> {
    let rest = what.strip_prefix("wait: ")?;
    let (node, blocker) = rest.split_once(&format!(" is joining shard {shard}: "))?;
    blocker
        .starts_with("not every primary lists it")
        .then_some(node)
}

/// The phases of shard `shard`'s roll among `events`.
fn phases_of(events: &[Event], shard: u32) -> Phases {
    let prefix = format!("{CLUSTER}-{shard}-");
    let of_shard = |what: &str| {
        what.contains(&format!("shard {shard}")) || what.contains(&format!("meeting {prefix}"))
    };
    let mut phases = Phases::default();
    let mut first: Option<f64> = None;
    let mut last: Option<f64> = None;
    let mut planned_join: Option<f64> = None;
    let mut met: BTreeMap<String, f64> = BTreeMap::new();
    // When each joiner's passes began to wait only for gossip.
    let mut gossip_since: BTreeMap<String, f64> = BTreeMap::new();
    for (index, event) in events.iter().enumerate() {
        if let Some(joiner) = only_gossip_waited_for(&event.what, shard) {
            gossip_since.entry(joiner.to_owned()).or_insert(event.at);
        }
        if !of_shard(&event.what) || event.what.starts_with("wait:") {
            continue;
        }
        let what = event.what.as_str();
        first.get_or_insert(event.at);
        last = Some(event.at);
        if what.starts_with("join a new") {
            planned_join = Some(event.at);
        } else if let Some(node) = what.strip_prefix("meeting ") {
            if let Some(planned) = planned_join.take() {
                phases.pod_start += event.at - planned;
                met.insert(node.to_string(), event.at);
            }
        } else if let Some(rest) = what.strip_prefix("activate ") {
            let node = rest.split_whitespace().next().unwrap_or_default();
            if let Some(answered) = met.remove(node) {
                phases.join += event.at - answered;
                let synced = gossip_since.get(node).copied().unwrap_or(event.at);
                phases.sync += synced.clamp(answered, event.at) - answered;
            }
        } else if is_failover(what) || what.starts_with("retire ") {
            let done = next_step_after(events, index).unwrap_or(event.at);
            last = Some(done);
            match is_failover(what) {
                true => phases.failover += done - event.at,
                false => phases.retire += done - event.at,
            }
        }
    }
    phases.whole = match (first, last) {
        (Some(first), Some(last)) => last - first,
        _ => 0.0,
    };
    phases
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a", "b", "c"],
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(&format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {{name: standard}}
spec: {{imageRef: valkey-9-0-0, valkey: {{save: ""}}}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {{name: {CLUSTER}, namespace: {NAMESPACE}}}
spec: {{configRef: standard, shards: {SHARDS}, replicasPerShard: 1}}
"#
    ));
    let within = Duration::from_secs(240);
    product
        .primaries_apart(NAMESPACE, CLUSTER, SHARDS, "9.0.0", within)
        .await;
    println!(
        "roll phases | shard | Pod start | join (sync + gossip) | failover | retire | between | whole"
    );
    let watch = ClusterWatch::start(&product, NAMESPACE, CLUSTER).await;
    let log_before = product.operator().log().len();
    let patched = Instant::now();
    product.patch(
        "valkeyconfig/standard",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    eventually("the roll", Duration::from_secs(300), async || {
        converged(&product.cluster(NAMESPACE, CLUSTER), "9.1.2").then_some(())
    })
    .await;
    let rolled = patched.elapsed();
    let report = watch.finish(&product).await;
    let log = product.operator().log();
    let events = events(log.get(log_before..).unwrap_or_default());
    for shard in 0..SHARDS {
        let p = phases_of(&events, shard);
        println!(
            "roll phases | {shard} | {:.2} s | {:.2} s ({:.2} + {:.2}) | {:.2} s | {:.2} s | {:.2} s \
             | {:.2} s",
            p.pod_start,
            p.join,
            p.sync,
            p.join - p.sync,
            p.failover,
            p.retire,
            p.between(),
            p.whole
        );
    }
    println!(
        "roll phases | the roll to 9.1.2: {rolled:.1?} ({:.1} s a shard); {} acknowledged, none \
         lost; longest write gap {:.2?}",
        rolled.as_secs_f64() / f64::from(SHARDS),
        report.log.acked,
        report.longest_write_gap()
    );
}
