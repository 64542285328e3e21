//! The per-cluster series: what a roll looks like from Prometheus (its progress, its current
//! step, its disruption figures) and each node's role and replication lag.
//!
//! Labels are bounded: `namespace` and `cluster` everywhere, `shard` and `node` only on the
//! per-node gauges, `result` on the timed steps, and the step's words ([`StepWords`]) on
//! `cluster_roll_step`. Never a node name on a histogram. Every series of a cluster goes when
//! the cluster is deleted ([`ClusterMetrics::forget`]), and all of them when this replica stops
//! leading ([`ClusterMetrics::forget_all`]): only the leader knows the clusters now.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec};

use super::Registrar;
use crate::roll::{Role, StepWords};

/// What one reconcile saw of a cluster's roll.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RollProgress {
    pub shards: usize,
    pub shards_up_to_date: usize,
    pub outdated_nodes: usize,
    pub in_progress: bool,
    /// Shards with fewer in-sync replicas than the spec asks for.
    pub shards_below_replica_target: usize,
    /// The step this pass planned.
    pub words: StepWords,
    /// Every reachable node's role and, for a replica, how far it is behind.
    pub nodes: Vec<NodeGauges>,
}

/// One reachable node, for `node_role` and `node_replication_lag_bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGauges {
    pub name: String,
    pub shard: u32,
    pub role: Role,
    /// For a replica: bytes of the primary's replication stream it has not yet applied.
    pub lag_bytes: Option<u64>,
}

/// A timed step of a roll, for its histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timed {
    /// A shard, from the first step on it to its last node being up to date.
    ShardRoll,
    /// A new replica, from its creation to it being synced and active (its full sync included).
    ReplicaJoin,
}

pub(super) const PER_CLUSTER: [&str; 2] = ["namespace", "cluster"];
const WITH_RESULT: [&str; 3] = ["namespace", "cluster", "result"];
const RESULTS: [&str; 2] = ["completed", "failed"];
const FAILOVER_BUCKETS: [f64; 8] = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];
const SHARD_ROLL_BUCKETS: [f64; 10] = [
    5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
];
const JOIN_BUCKETS: [f64; 10] = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0];
const MIGRATION_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0];
const KEYS_BUCKETS: [f64; 8] = [0.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7];

/// The per-cluster families.
pub(super) struct ClusterMetrics {
    shape: Shape,
    counts: Counts,
    durations: Durations,
    labelled: Labelled,
}

/// The gauges of a cluster's shape and roll.
struct Shape {
    shards: IntGaugeVec,
    shards_up_to_date: IntGaugeVec,
    outdated_nodes: IntGaugeVec,
    roll_in_progress: IntGaugeVec,
    below_replica_target: IntGaugeVec,
}

/// The counters of what the controller did to a cluster.
struct Counts {
    failovers: IntCounterVec,
    slot_migrations: IntCounterVec,
    certificate_reloads: IntCounterVec,
}

/// The histograms of how long a cluster's steps took, and of the keys a migration moved.
struct Durations {
    failover_duration: HistogramVec,
    shard_roll_duration: HistogramVec,
    replica_join_duration: HistogramVec,
    migration_duration: HistogramVec,
    migration_keys: HistogramVec,
}

/// The families whose label values change (a step, a reason, a role): each cluster's old series is replaced, not left behind.
struct Labelled {
    roll_step: Replaced,
    roll_stalled: Replaced,
    degraded: Replaced,
    node_role: Replaced,
    node_lag: Replaced,
}

impl ClusterMetrics {
    pub(super) fn new(add: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(Self {
            shape: Shape::new(add)?,
            counts: Counts::new(add)?,
            durations: Durations::new(add)?,
            labelled: Labelled::new(add)?,
        })
    }

    pub(super) fn progress(&self, id: &ClusterId, progress: &RollProgress) {
        let labels = id.labels();
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        // Every cluster's failover counter exists from its first pass, at 0 until one happens,
        // so "no failover" reads as 0 rather than as a missing series.
        let _ = self.counts.failovers.with_label_values(&labels);
        let values = [
            progress.shards,
            progress.shards_up_to_date,
            progress.outdated_nodes,
            usize::from(progress.in_progress),
            progress.shards_below_replica_target,
        ];
        for (gauge, value) in self.gauges().into_iter().zip(values) {
            gauge.with_label_values(&labels).set(count(value));
        }
        let words = progress.words;
        let shard = words.shard.map(|s| s.to_string()).unwrap_or_default();
        let reason = words.reason.unwrap_or_default();
        self.labelled
            .roll_step
            .replace(id, vec![(id.with(&[&shard, words.step, reason]), 1)]);
        let stalled = (words.step == "Stalled").then(|| (id.with(&[reason]), 1));
        self.labelled
            .roll_stalled
            .replace(id, stalled.into_iter().collect());
        self.labelled
            .node_role
            .replace(id, node_rows(id, &progress.nodes, true));
        self.labelled
            .node_lag
            .replace(id, node_rows(id, &progress.nodes, false));
    }

    pub(super) fn roll_unknown(&self, id: &ClusterId) {
        for replaced in [
            &self.labelled.roll_step,
            &self.labelled.roll_stalled,
            &self.labelled.node_role,
            &self.labelled.node_lag,
        ] {
            replaced.replace(id, Vec::new());
        }
    }

    /// The cluster's Degraded condition as just written: its reason while it is True.
    pub(super) fn degraded(&self, id: &ClusterId, reason: Option<&str>) {
        let row = reason.map(|reason| (id.with(&[reason]), 1));
        self.labelled
            .degraded
            .replace(id, row.into_iter().collect());
    }

    pub(super) fn failover(&self, id: &ClusterId, ok: bool, took: Duration) {
        if ok {
            self.counts.failovers.with_label_values(&id.labels()).inc();
        }
        self.durations
            .failover_duration
            .with_label_values(&id.with(&[result(ok)]))
            .observe(took.as_secs_f64());
    }

    pub(super) fn slot_migration(
        &self,
        id: &ClusterId,
        ok: bool,
        keys: Option<u64>,
        took: Duration,
    ) {
        let labels = id.with(&[result(ok)]);
        self.counts.slot_migrations.with_label_values(&labels).inc();
        self.durations
            .migration_duration
            .with_label_values(&labels)
            .observe(took.as_secs_f64());
        if let Some(keys) = keys.filter(|_| ok) {
            self.durations
                .migration_keys
                .with_label_values(&id.labels())
                .observe(keys as f64);
        }
    }

    pub(super) fn certificate_reloads(&self, id: &ClusterId, ok: u64, failed: u64) {
        for (outcome, count) in [(true, ok), (false, failed)] {
            let labels = id.with(&[result(outcome)]);
            // Both results exist once a reload was tried, so the first failure is an increase.
            self.counts
                .certificate_reloads
                .with_label_values(&labels)
                .inc_by(count);
        }
    }

    pub(super) fn timed(&self, id: &ClusterId, what: Timed, took: Duration) {
        let histogram = match what {
            Timed::ShardRoll => &self.durations.shard_roll_duration,
            Timed::ReplicaJoin => &self.durations.replica_join_duration,
        };
        histogram
            .with_label_values(&id.labels())
            .observe(took.as_secs_f64());
    }

    /// Drops every series of a deleted cluster.
    pub(super) fn forget(&self, id: &ClusterId) {
        let labels = id.labels();
        for gauge in self.gauges() {
            let _ = gauge.remove_label_values(&labels);
        }
        let _ = self.counts.failovers.remove_label_values(&labels);
        for histogram in [
            &self.durations.shard_roll_duration,
            &self.durations.replica_join_duration,
            &self.durations.migration_keys,
        ] {
            let _ = histogram.remove_label_values(&labels);
        }
        for outcome in RESULTS {
            let with_result = id.with(&[outcome]);
            let _ = self
                .counts
                .slot_migrations
                .remove_label_values(&with_result);
            let _ = self
                .counts
                .certificate_reloads
                .remove_label_values(&with_result);
            let _ = self
                .durations
                .failover_duration
                .remove_label_values(&with_result);
            let _ = self
                .durations
                .migration_duration
                .remove_label_values(&with_result);
        }
        for replaced in self.replaced() {
            replaced.replace(id, Vec::new());
        }
    }

    /// Drops every per-cluster series: this replica no longer leads, so it knows no cluster.
    pub(super) fn forget_all(&self) {
        for gauge in self.gauges() {
            gauge.reset();
        }
        self.counts.failovers.reset();
        self.counts.slot_migrations.reset();
        self.counts.certificate_reloads.reset();
        for histogram in [
            &self.durations.failover_duration,
            &self.durations.shard_roll_duration,
            &self.durations.replica_join_duration,
            &self.durations.migration_duration,
            &self.durations.migration_keys,
        ] {
            histogram.reset();
        }
        for replaced in self.replaced() {
            replaced.clear();
        }
    }

    /// The progress gauges labelled by namespace and cluster alone, in [`Self::progress`]'s order.
    fn gauges(&self) -> [&IntGaugeVec; 5] {
        [
            &self.shape.shards,
            &self.shape.shards_up_to_date,
            &self.shape.outdated_nodes,
            &self.shape.roll_in_progress,
            &self.shape.below_replica_target,
        ]
    }

    fn replaced(&self) -> [&Replaced; 5] {
        [
            &self.labelled.roll_step,
            &self.labelled.roll_stalled,
            &self.labelled.degraded,
            &self.labelled.node_role,
            &self.labelled.node_lag,
        ]
    }
}

impl Shape {
    fn new(add: &Registrar) -> Result<Self, prometheus::Error> {
        let gauge = |name, help| add.gauge(name, help, &PER_CLUSTER);
        Ok(Self {
            shards: gauge("cluster_shards", "Shards a ValkeyCluster asks for.")?,
            shards_up_to_date: gauge(
                "cluster_shards_up_to_date",
                "Shards whose every node runs the desired revision.",
            )?,
            outdated_nodes: gauge(
                "cluster_outdated_nodes",
                "Nodes not yet on the desired revision.",
            )?,
            roll_in_progress: gauge(
                "cluster_roll_in_progress",
                "1 while the cluster is being changed (rolled, scaled, healed), else 0.",
            )?,
            below_replica_target: gauge(
                "cluster_shards_below_replica_target",
                "Shards with fewer in-sync replicas than spec.replicasPerShard.",
            )?,
        })
    }
}

impl Counts {
    fn new(add: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(Self {
            failovers: add.counter(
                "failovers_total",
                "Planned failovers completed (roles changed), by cluster; an attempt that did not \
                 take effect counts only in failover_duration_seconds{result=\"failed\"}.",
                &PER_CLUSTER,
            )?,
            slot_migrations: add.counter(
                "slot_migrations_total",
                "Slot migrations (atomic, or key by key where a node runs 9.0), by cluster and result.",
                &WITH_RESULT,
            )?,
            certificate_reloads: add.counter(
                "node_certificate_reloads_total",
                "Nodes of a TLS cluster told to reload their certificate after its Secret \
                 changed (CONFIG SET tls-cert-file), by result (completed, failed).",
                &WITH_RESULT,
            )?,
        })
    }
}

impl Durations {
    fn new(add: &Registrar) -> Result<Self, prometheus::Error> {
        Ok(Self {
            failover_duration: add.histogram(
                "failover_duration_seconds",
                "From CLUSTER FAILOVER to the roles having changed (the clients' write pause is \
                 at most this).",
                &FAILOVER_BUCKETS,
                &WITH_RESULT,
            )?,
            shard_roll_duration: add.histogram(
                "shard_roll_duration_seconds",
                "One shard's roll: from the first step on it to its every node being up to date.",
                &SHARD_ROLL_BUCKETS,
                &PER_CLUSTER,
            )?,
            replica_join_duration: add.histogram(
                "replica_join_duration_seconds",
                "A new replica, from its creation to being synced and active (its full sync \
                 included).",
                &JOIN_BUCKETS,
                &PER_CLUSTER,
            )?,
            migration_duration: add.histogram(
                "slot_migration_duration_seconds",
                "One slot-migration step: CLUSTER MIGRATESLOTS until its job ends (with the \
                 target's key counts read before and after), or the key-by-key move of its slots.",
                &MIGRATION_BUCKETS,
                &WITH_RESULT,
            )?,
            migration_keys: add.histogram(
                "slot_migration_keys",
                "Keys the target primary gained during one completed slot migration (its INFO \
                 keyspace count after less before: writes to its own slots meanwhile count too).",
                &KEYS_BUCKETS,
                &PER_CLUSTER,
            )?,
        })
    }
}

impl Labelled {
    fn new(add: &Registrar) -> Result<Self, prometheus::Error> {
        let replaced = |name, help, labels: &[&str]| -> Result<Replaced, prometheus::Error> {
            Ok(Replaced::new(add.gauge(name, help, labels)?))
        };
        Ok(Self {
            roll_step: replaced(
                "cluster_roll_step",
                "1 for the step the cluster's last pass planned, labelled with the words the \
                 Progressing condition and events use (shard, step, reason).",
                &["namespace", "cluster", "shard", "step", "reason"],
            )?,
            roll_stalled: replaced(
                "cluster_roll_stalled",
                "1 while the cluster's roll is stalled, labelled with the reason's kind.",
                &["namespace", "cluster", "reason"],
            )?,
            degraded: replaced(
                "cluster_degraded",
                "1 while the cluster's Degraded condition is True, labelled with its reason.",
                &["namespace", "cluster", "reason"],
            )?,
            node_role: replaced(
                "node_role",
                "1 for each reachable node, labelled with its role (primary, replica).",
                &["namespace", "cluster", "shard", "node", "role"],
            )?,
            node_lag: replaced(
                "node_replication_lag_bytes",
                "Bytes of its primary's replication stream a replica has not applied yet.",
                &["namespace", "cluster", "shard", "node"],
            )?,
        })
    }
}

fn result(ok: bool) -> &'static str {
    RESULTS[usize::from(!ok)]
}

/// `node_role` rows (`roles`) or `node_replication_lag_bytes` rows (replicas only).
fn node_rows(id: &ClusterId, nodes: &[NodeGauges], roles: bool) -> Vec<(Vec<String>, i64)> {
    nodes
        .iter()
        .filter_map(|node| {
            let shard = node.shard.to_string();
            if roles {
                let role = match node.role {
                    Role::Primary => "primary",
                    Role::Replica => "replica",
                };
                return Some((id.with(&[&shard, &node.name, role]), 1));
            }
            let lag = i64::try_from(node.lag_bytes?).unwrap_or(i64::MAX);
            Some((id.with(&[&shard, &node.name]), lag))
        })
        .collect()
}

/// A cluster's identity in the labels: its namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ClusterId {
    pub namespace: String,
    pub name: String,
}

impl ClusterId {
    fn labels(&self) -> [&str; 2] {
        [&self.namespace, &self.name]
    }

    /// The cluster's labels followed by `more`.
    fn with(&self, more: &[&str]) -> Vec<String> {
        [self.namespace.as_str(), self.name.as_str()]
            .iter()
            .chain(more)
            .map(|s| (*s).to_owned())
            .collect()
    }
}

/// A gauge family whose label values change from pass to pass (a cluster's nodes, its step, the
/// reason it is stalled): each pass sets the cluster's whole set of series, and the ones it no
/// longer has are removed, so a retired node or a passed reason leaves nothing behind.
struct Replaced {
    family: IntGaugeVec,
    exported: Mutex<HashMap<ClusterId, Vec<Vec<String>>>>,
}

impl Replaced {
    fn new(family: IntGaugeVec) -> Self {
        Self {
            family,
            exported: Mutex::new(HashMap::new()),
        }
    }

    fn replace(&self, id: &ClusterId, rows: Vec<(Vec<String>, i64)>) {
        let mut exported = self.exported.lock().unwrap_or_else(|p| p.into_inner());
        let now: Vec<Vec<String>> = rows.iter().map(|(labels, _)| labels.clone()).collect();
        let before = match now.is_empty() {
            true => exported.remove(id),
            false => exported.insert(id.clone(), now.clone()),
        };
        for gone in before
            .unwrap_or_default()
            .iter()
            .filter(|l| !now.contains(l))
        {
            let _ = self.family.remove_label_values(&as_strs(gone));
        }
        for (labels, value) in &rows {
            self.family.with_label_values(&as_strs(labels)).set(*value);
        }
    }

    fn clear(&self) {
        let mut exported = self.exported.lock().unwrap_or_else(|p| p.into_inner());
        exported.clear();
        self.family.reset();
    }
}

fn as_strs(labels: &[String]) -> Vec<&str> {
    labels.iter().map(String::as_str).collect()
}
