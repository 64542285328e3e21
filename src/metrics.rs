//! One Prometheus registry for the whole process; every metric is named and registered here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use prometheus::core::Collector;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    webhook_requests: IntCounterVec,
    webhook_duration: HistogramVec,
    certificate_reloads: IntCounterVec,
    server_refusals: IntCounterVec,
    cluster_shards: IntGaugeVec,
    cluster_shards_up_to_date: IntGaugeVec,
    cluster_outdated_nodes: IntGaugeVec,
    cluster_roll_in_progress: IntGaugeVec,
    cluster_roll_stalled: IntGaugeVec,
    /// The stall reason each cluster's `cluster_roll_stalled` series carries now.
    stall_reasons: Mutex<HashMap<(String, String), &'static str>>,
    failovers: IntCounterVec,
    failover_duration: HistogramVec,
    slot_migrations: IntCounterVec,
    reconcile_duration: HistogramVec,
    reconcile_errors: IntCounterVec,
}

/// What one reconcile saw of a cluster's roll.
pub struct RollProgress {
    pub shards: usize,
    pub shards_up_to_date: usize,
    pub outdated_nodes: usize,
    pub in_progress: bool,
    /// Why the roll is stalled (a bounded `StallReason::kind`), if it is.
    pub stalled: Option<&'static str>,
}

/// Labels of the per-cluster series.
const PER_CLUSTER: [&str; 2] = ["namespace", "cluster"];
const WEBHOOK_BUCKETS: [f64; 11] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];
const FAILOVER_BUCKETS: [f64; 8] = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0];
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

    /// A gauge per cluster.
    fn gauge(&self, name: &str, help: &str) -> Result<IntGaugeVec, prometheus::Error> {
        self.add(IntGaugeVec::new(Opts::new(name, help), &PER_CLUSTER)?)
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
            cluster_shards: add.gauge("cluster_shards", "Shards a ValkeyCluster asks for.")?,
            cluster_shards_up_to_date: add.gauge(
                "cluster_shards_up_to_date",
                "Shards whose every node runs the desired revision.",
            )?,
            cluster_outdated_nodes: add.gauge(
                "cluster_outdated_nodes",
                "Nodes not yet on the desired revision.",
            )?,
            cluster_roll_in_progress: add.gauge(
                "cluster_roll_in_progress",
                "1 while the cluster is being changed (rolled, scaled, healed), else 0.",
            )?,
            cluster_roll_stalled: add.add(IntGaugeVec::new(
                Opts::new(
                    "cluster_roll_stalled",
                    "1 while the cluster's roll is stalled, labelled with the reason's kind.",
                ),
                &["namespace", "cluster", "reason"],
            )?)?,
            stall_reasons: Mutex::new(HashMap::new()),
            failovers: add.counter(
                "failovers_total",
                "Planned failovers completed (roles changed), by cluster; an attempt that did not \
                 take effect counts only in failover_duration_seconds{result=\"failed\"}.",
                &PER_CLUSTER,
            )?,
            failover_duration: add.histogram(
                "failover_duration_seconds",
                "From CLUSTER FAILOVER to the roles having changed.",
                &FAILOVER_BUCKETS,
                &["result"],
            )?,
            slot_migrations: add.counter(
                "slot_migrations_total",
                "Atomic slot migrations, by cluster and result.",
                &["namespace", "cluster", "result"],
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
            registry,
        })
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

    pub fn roll_progress(&self, namespace: &str, cluster: &str, progress: &RollProgress) {
        let labels = [namespace, cluster];
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        // Every cluster's failover counter exists from its first pass, at 0 until one happens,
        // so "no failover" reads as 0 rather than as a missing series.
        let _ = self.failovers.with_label_values(&labels);
        self.cluster_shards
            .with_label_values(&labels)
            .set(count(progress.shards));
        self.cluster_shards_up_to_date
            .with_label_values(&labels)
            .set(count(progress.shards_up_to_date));
        self.cluster_outdated_nodes
            .with_label_values(&labels)
            .set(count(progress.outdated_nodes));
        self.cluster_roll_in_progress
            .with_label_values(&labels)
            .set(i64::from(progress.in_progress));
        self.set_stall(namespace, cluster, progress.stalled);
    }

    /// Drops a deleted cluster's series.
    pub fn forget_cluster(&self, namespace: &str, cluster: &str) {
        let labels = [namespace, cluster];
        for gauge in [
            &self.cluster_shards,
            &self.cluster_shards_up_to_date,
            &self.cluster_outdated_nodes,
            &self.cluster_roll_in_progress,
        ] {
            let _ = gauge.remove_label_values(&labels);
        }
        self.set_stall(namespace, cluster, None);
    }

    /// One `cluster_roll_stalled` series per stalled cluster, carrying its current reason.
    fn set_stall(&self, namespace: &str, cluster: &str, reason: Option<&'static str>) {
        let mut reasons = self.stall_reasons.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_owned(), cluster.to_owned());
        let previous = match reason {
            Some(reason) => reasons.insert(key, reason),
            None => reasons.remove(&key),
        };
        if let Some(previous) = previous.filter(|p| Some(*p) != reason) {
            let _ = self
                .cluster_roll_stalled
                .remove_label_values(&[namespace, cluster, previous]);
        }
        if let Some(reason) = reason {
            self.cluster_roll_stalled
                .with_label_values(&[namespace, cluster, reason])
                .set(1);
        }
    }

    pub fn failover(&self, namespace: &str, cluster: &str, ok: bool, started: Instant) {
        if ok {
            self.failovers
                .with_label_values(&[namespace, cluster])
                .inc();
        }
        self.failover_duration
            .with_label_values(&[if ok { "completed" } else { "failed" }])
            .observe(started.elapsed().as_secs_f64());
    }

    pub fn slot_migration(&self, namespace: &str, cluster: &str, ok: bool) {
        self.slot_migrations
            .with_label_values(&[namespace, cluster, if ok { "completed" } else { "failed" }])
            .inc();
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
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buffer)?;
        String::from_utf8(buffer).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(stalled: Option<&'static str>) -> RollProgress {
        RollProgress {
            shards: 1,
            shards_up_to_date: 0,
            outdated_nodes: 1,
            in_progress: true,
            stalled,
        }
    }

    fn stalled_series(metrics: &Metrics) -> Vec<String> {
        let text = metrics.render().unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("valkey_operator_cluster_roll_stalled{"))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_stall_is_one_series_with_its_current_reason_and_goes_when_the_roll_moves()
    -> Result<(), prometheus::Error> {
        let metrics = Metrics::new()?;
        metrics.roll_progress("ns", "c", &progress(Some("join_overdue")));
        assert_eq!(
            stalled_series(&metrics),
            [
                r#"valkey_operator_cluster_roll_stalled{cluster="c",namespace="ns",reason="join_overdue"} 1"#
            ]
        );
        metrics.roll_progress("ns", "c", &progress(Some("no_primary")));
        let series = stalled_series(&metrics);
        assert_eq!(series.len(), 1, "{series:?}");
        assert!(series[0].contains(r#"reason="no_primary""#), "{series:?}");
        metrics.roll_progress("ns", "c", &progress(None));
        assert!(stalled_series(&metrics).is_empty());
        let text = metrics.render()?;
        assert!(
            text.contains(r#"valkey_operator_failovers_total{cluster="c",namespace="ns"} 0"#),
            "a cluster's failover counter exists at 0 from its first pass:\n{text}"
        );
        Ok(())
    }
}
