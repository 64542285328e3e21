//! One Prometheus registry for the whole process; every metric is named and registered here:
//! the server's own (admission, certificates, refusals, reconciles, leadership) in this file, the
//! per-cluster series of rolls and nodes in [`cluster`].

mod cluster;

use std::time::{Duration, Instant};

use prometheus::core::Collector;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use cluster::{ClusterId, ClusterMetrics};
pub use cluster::{NodeGauges, RollProgress, Timed};

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    webhook_requests: IntCounterVec,
    webhook_duration: HistogramVec,
    certificate_reloads: IntCounterVec,
    server_refusals: IntCounterVec,
    reconcile_duration: HistogramVec,
    reconcile_errors: IntCounterVec,
    leader: IntGauge,
    valkey_commands: IntCounterVec,
    clusters: ClusterMetrics,
}

const WEBHOOK_BUCKETS: [f64; 11] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];
const RECONCILE_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Creates metrics and registers each one as it is created.
struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn add<C: Collector + Clone + 'static>(&self, collector: C) -> Result<C, prometheus::Error> {
        self.0.register(Box::new(collector.clone()))?;
        Ok(collector)
    }

    fn counter(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntCounterVec, prometheus::Error> {
        self.add(IntCounterVec::new(Opts::new(name, help), labels)?)
    }

    fn histogram(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
        labels: &[&str],
    ) -> Result<HistogramVec, prometheus::Error> {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add(HistogramVec::new(opts, labels)?)
    }

    fn gauge(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntGaugeVec, prometheus::Error> {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels)?)
    }
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("valkey_operator".into()), None)?;
        let add = Registrar(&registry);
        Ok(Self {
            webhook_requests: add.counter(
                "webhook_requests_total",
                "Admission requests by kind, operation and result (allowed, warned, denied, invalid).",
                &["kind", "operation", "result"],
            )?,
            webhook_duration: add.histogram(
                "webhook_duration_seconds",
                "Time to answer an admission request, by kind.",
                &WEBHOOK_BUCKETS,
                &["kind"],
            )?,
            certificate_reloads: add.counter(
                "certificate_reloads_total",
                "Serving certificate reloads after the files changed, by result (ok, failed).",
                &["result"],
            )?,
            server_refusals: add.counter(
                "server_refusals_total",
                "Requests and connections the HTTPS server refused to protect itself, by reason \
                 (busy, connections, handshake_timeout, body_timeout, body_too_large, request_timeout).",
                &["reason"],
            )?,
            reconcile_duration: add.histogram(
                "reconcile_duration_seconds",
                "One reconcile of a ValkeyCluster.",
                &RECONCILE_BUCKETS,
                &[],
            )?,
            reconcile_errors: add.counter(
                "reconcile_errors_total",
                "Failed reconciles, by a bounded category.",
                &["category"],
            )?,
            leader: add.add(IntGauge::with_opts(Opts::new(
                "leader",
                "1 while this replica holds the Lease and runs the controller, else 0.",
            ))?)?,
            valkey_commands: add.counter(
                "valkey_commands_total",
                "Commands the operator sent to Valkey nodes, by command (its first two words).",
                &["command"],
            )?,
            clusters: ClusterMetrics::new(&add)?,
            registry,
        }
        .with_zeroes())
    }

    /// Series that exist, at 0, before anything happens: an alert on their increase sees the
    /// first one.
    fn with_zeroes(self) -> Self {
        for result in ["ok", "failed"] {
            let _ = self.certificate_reloads.with_label_values(&[result]);
        }
        self
    }

    pub fn observe_webhook(&self, kind: &str, operation: &str, result: &str, started: Instant) {
        self.webhook_requests
            .with_label_values(&[kind, operation, result])
            .inc();
        self.webhook_duration
            .with_label_values(&[kind])
            .observe(started.elapsed().as_secs_f64());
    }

    /// The server refused a request or connection; `reason` is one of a fixed few.
    pub fn server_refused(&self, reason: &'static str) {
        self.server_refusals.with_label_values(&[reason]).inc();
    }

    pub fn certificate_reloaded(&self, ok: bool) {
        self.certificate_reloads
            .with_label_values(&[if ok { "ok" } else { "failed" }])
            .inc();
    }

    /// This replica started or stopped leading. Stopping drops every per-cluster series: a
    /// replica that does not lead exports none (the leader's are the truth).
    pub fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if !leading {
            self.clusters.forget_all();
        }
    }

    pub fn roll_progress(&self, namespace: &str, cluster: &str, progress: &RollProgress) {
        self.clusters.progress(&id(namespace, cluster), progress);
    }

    /// A pass that stopped before observing the cluster: its step, stall and node series go
    /// (the progress gauges keep their last values).
    pub fn roll_unknown(&self, namespace: &str, cluster: &str) {
        self.clusters.roll_unknown(&id(namespace, cluster));
    }

    /// The Degraded condition just written for a cluster: its reason while it is True.
    pub fn degraded(&self, namespace: &str, cluster: &str, reason: Option<&str>) {
        self.clusters.degraded(&id(namespace, cluster), reason);
    }

    /// Drops a deleted cluster's series.
    pub fn forget_cluster(&self, namespace: &str, cluster: &str) {
        self.clusters.forget(&id(namespace, cluster));
    }

    pub fn failover(&self, namespace: &str, cluster: &str, ok: bool, took: Duration) {
        self.clusters.failover(&id(namespace, cluster), ok, took);
    }

    /// A slot migration ended; a completed one says how many keys its target gained, if known.
    pub fn slot_migration(
        &self,
        namespace: &str,
        cluster: &str,
        ok: bool,
        keys: Option<u64>,
        took: Duration,
    ) {
        self.clusters
            .slot_migration(&id(namespace, cluster), ok, keys, took);
    }

    /// Nodes of a TLS cluster that reloaded their certificate in a pass, and that could not.
    pub fn node_certificate_reloads(&self, namespace: &str, cluster: &str, ok: u64, failed: u64) {
        self.clusters
            .certificate_reloads(&id(namespace, cluster), ok, failed);
    }

    /// A shard finished rolling, or a replica joined.
    pub fn timed(&self, namespace: &str, cluster: &str, what: Timed, took: Duration) {
        self.clusters.timed(&id(namespace, cluster), what, took);
    }

    pub fn reconciled(&self, started: Instant, error_category: Option<&str>) {
        self.reconcile_duration
            .with_label_values(&[] as &[&str])
            .observe(started.elapsed().as_secs_f64());
        if let Some(category) = error_category {
            self.reconcile_errors.with_label_values(&[category]).inc();
        }
    }

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        // Counted where the commands are sent (no metrics handle reaches every client), and
        // brought up to date here.
        for (command, sent) in crate::valkey::commands_sent() {
            let counter = self.valkey_commands.with_label_values(&[&command]);
            counter.inc_by(sent.saturating_sub(counter.get()));
        }
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buffer)?;
        String::from_utf8(buffer).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

fn id(namespace: &str, cluster: &str) -> ClusterId {
    ClusterId {
        namespace: namespace.to_owned(),
        name: cluster.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::roll::{Role, StepWords};

    fn progress(step: &'static str, reason: Option<&'static str>) -> RollProgress {
        RollProgress {
            shards: 1,
            shards_up_to_date: 0,
            outdated_nodes: 1,
            in_progress: true,
            shards_below_replica_target: 0,
            words: StepWords {
                shard: Some(0),
                step,
                reason,
            },
            nodes: vec![
                NodeGauges {
                    name: "c-0-a".into(),
                    shard: 0,
                    role: Role::Primary,
                    lag_bytes: None,
                },
                NodeGauges {
                    name: "c-0-b".into(),
                    shard: 0,
                    role: Role::Replica,
                    lag_bytes: Some(42),
                },
            ],
        }
    }

    fn series(metrics: &Metrics, family: &str) -> Vec<String> {
        let text = metrics.render().unwrap_or_default();
        let prefix = format!("valkey_operator_{family}{{");
        text.lines()
            .filter(|l| l.starts_with(&prefix))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_stall_is_one_series_with_its_current_reason_and_goes_when_the_roll_moves()
    -> Result<(), prometheus::Error> {
        let metrics = Metrics::new()?;
        metrics.roll_progress("ns", "c", &progress("Stalled", Some("JoinOverdue")));
        assert_eq!(
            series(&metrics, "cluster_roll_stalled"),
            [
                r#"valkey_operator_cluster_roll_stalled{cluster="c",namespace="ns",reason="JoinOverdue"} 1"#
            ]
        );
        metrics.roll_progress("ns", "c", &progress("Stalled", Some("NoPrimary")));
        let stalled = series(&metrics, "cluster_roll_stalled");
        assert_eq!(stalled.len(), 1, "{stalled:?}");
        assert!(stalled[0].contains(r#"reason="NoPrimary""#), "{stalled:?}");
        metrics.roll_progress("ns", "c", &progress("Failover", None));
        assert!(series(&metrics, "cluster_roll_stalled").is_empty());
        assert_eq!(
            series(&metrics, "cluster_roll_step"),
            [
                r#"valkey_operator_cluster_roll_step{cluster="c",namespace="ns",reason="",shard="0",step="Failover"} 1"#
            ]
        );
        let text = metrics.render()?;
        assert!(
            text.contains(r#"valkey_operator_failovers_total{cluster="c",namespace="ns"} 0"#),
            "a cluster's failover counter exists at 0 from its first pass:\n{text}"
        );
        Ok(())
    }

    #[test]
    fn node_gauges_follow_the_nodes_and_a_deleted_cluster_leaves_no_series()
    -> Result<(), prometheus::Error> {
        let metrics = Metrics::new()?;
        metrics.roll_progress("ns", "c", &progress("Failover", None));
        metrics.roll_progress("ns", "other", &progress("Converged", None));
        metrics.failover("ns", "c", true, Duration::from_millis(300));
        metrics.slot_migration("ns", "c", true, Some(1500), Duration::from_secs(2));
        metrics.timed("ns", "c", Timed::ShardRoll, Duration::from_secs(12));
        metrics.degraded("ns", "c", Some("RollStalled"));
        assert_eq!(
            series(&metrics, "node_replication_lag_bytes"),
            [
                r#"valkey_operator_node_replication_lag_bytes{cluster="c",namespace="ns",node="c-0-b",shard="0"} 42"#,
                r#"valkey_operator_node_replication_lag_bytes{cluster="other",namespace="ns",node="c-0-b",shard="0"} 42"#
            ]
        );
        let mut fewer = progress("Failover", None);
        fewer.nodes.truncate(1);
        metrics.roll_progress("ns", "c", &fewer);
        let roles = series(&metrics, "node_role");
        assert!(
            !roles
                .iter()
                .any(|l| l.contains(r#"cluster="c""#) && l.contains("c-0-b")),
            "{roles:?}"
        );
        metrics.forget_cluster("ns", "c");
        let text = metrics.render()?;
        let left: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains(r#"cluster="c""#))
            .collect();
        assert!(
            left.is_empty(),
            "series of the deleted cluster remain: {left:?}"
        );
        assert!(text.contains(r#"cluster="other""#), "{text}");
        Ok(())
    }

    /// The metric names a PromQL text uses (a histogram's `_bucket`, `_sum`, `_count` series
    /// are its family's).
    fn names_in(text: &str) -> BTreeSet<String> {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("valkey_operator_"))
            .map(|word| {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| word.strip_suffix(suffix))
                    .filter(|family| family.ends_with("_seconds") || family.ends_with("_keys"));
                family.unwrap_or(word).to_owned()
            })
            .collect()
    }

    #[test]
    fn every_metric_the_charts_alerts_and_dashboard_name_is_registered()
    -> Result<(), prometheus::Error> {
        let metrics = Metrics::new()?;
        // One child in every family, so each one is gathered.
        metrics.leading(true);
        metrics.roll_progress("ns", "c", &progress("Stalled", Some("NoPrimary")));
        metrics.degraded("ns", "c", Some("RollStalled"));
        metrics.failover("ns", "c", true, Duration::from_secs(1));
        metrics.slot_migration("ns", "c", true, Some(1), Duration::from_secs(1));
        metrics.timed("ns", "c", Timed::ShardRoll, Duration::from_secs(1));
        metrics.timed("ns", "c", Timed::ReplicaJoin, Duration::from_secs(1));
        metrics.reconciled(Instant::now(), Some("kubernetes"));
        metrics.node_certificate_reloads("ns", "c", 1, 1);
        let registered: BTreeSet<String> = metrics
            .registry
            .gather()
            .iter()
            .map(|family| family.name().to_owned())
            .collect();
        let alerts = include_str!("../../charts/valkey-operator/files/alerts.yaml");
        let dashboard = include_str!("../../charts/valkey-operator/files/dashboard.json");
        for (file, text) in [("alerts.yaml", alerts), ("dashboard.json", dashboard)] {
            let named = names_in(text);
            assert!(named.len() >= 5, "{file}: {named:?}");
            let unknown: Vec<&String> = named.difference(&registered).collect();
            assert!(
                unknown.is_empty(),
                "{file} names metrics the operator does not export: {unknown:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn every_family_is_in_the_observability_doc_and_valkey_commands_are_counted()
    -> Result<(), prometheus::Error> {
        let metrics = Metrics::new()?;
        metrics.leading(true);
        metrics.roll_progress("ns", "c", &progress("Stalled", Some("NoPrimary")));
        metrics.degraded("ns", "c", Some("RollStalled"));
        metrics.failover("ns", "c", true, Duration::from_secs(1));
        metrics.slot_migration("ns", "c", true, Some(1), Duration::from_secs(1));
        metrics.timed("ns", "c", Timed::ShardRoll, Duration::from_secs(1));
        metrics.timed("ns", "c", Timed::ReplicaJoin, Duration::from_secs(1));
        metrics.reconciled(Instant::now(), Some("kubernetes"));
        metrics.node_certificate_reloads("ns", "c", 1, 1);
        metrics.observe_webhook("ValkeyCluster", "CREATE", "allowed", Instant::now());
        metrics.server_refused("busy");
        crate::valkey::count_sent("CLUSTER NODES");
        let text = metrics.render()?;
        assert!(
            text.lines().any(|l| l
                .starts_with(r#"valkey_operator_valkey_commands_total{command="CLUSTER NODES"} "#)),
            "{text}"
        );
        let doc = include_str!("../../docs/observability.md");
        let undocumented: Vec<String> = metrics
            .registry
            .gather()
            .iter()
            .filter_map(|family| {
                family
                    .name()
                    .strip_prefix("valkey_operator_")
                    .map(String::from)
            })
            .filter(|name| !doc.contains(&format!("| `{name}` |")))
            .collect();
        assert!(
            undocumented.is_empty(),
            "docs/observability.md does not list {undocumented:?}"
        );
        Ok(())
    }

    #[test]
    fn a_replica_that_stops_leading_exports_no_cluster_series() -> Result<(), prometheus::Error> {
        let metrics = Metrics::new()?;
        metrics.leading(true);
        metrics.roll_progress("ns", "c", &progress("Stalled", Some("NoPrimary")));
        metrics.failover("ns", "c", false, Duration::from_secs(10));
        metrics.leading(false);
        let text = metrics.render()?;
        let left: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("cluster="))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(text.contains("valkey_operator_leader 0"), "{text}");
        Ok(())
    }
}
