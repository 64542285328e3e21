//! One Prometheus registry for the whole process; every metric is named and registered here.

use std::time::Instant;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    webhook_requests: IntCounterVec,
    webhook_duration: HistogramVec,
    certificate_reloads: IntCounterVec,
    cluster_shards: IntGaugeVec,
    cluster_shards_up_to_date: IntGaugeVec,
    cluster_outdated_nodes: IntGaugeVec,
    cluster_roll_in_progress: IntGaugeVec,
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
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("valkey_operator".into()), None)?;
        let webhook_requests = IntCounterVec::new(
            Opts::new(
                "webhook_requests_total",
                "Admission requests by kind, operation and result (allowed, warned, denied, invalid).",
            ),
            &["kind", "operation", "result"],
        )?;
        let webhook_duration = HistogramVec::new(
            HistogramOpts::new(
                "webhook_duration_seconds",
                "Time to answer an admission request, by kind.",
            )
            .buckets(vec![
                0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
            ]),
            &["kind"],
        )?;
        let certificate_reloads = IntCounterVec::new(
            Opts::new(
                "certificate_reloads_total",
                "Serving certificate reloads after the files changed, by result (ok, failed).",
            ),
            &["result"],
        )?;
        let per_cluster = ["namespace", "cluster"];
        let gauge = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &per_cluster);
        let cluster_shards = gauge("cluster_shards", "Shards a ValkeyCluster asks for.")?;
        let cluster_shards_up_to_date = gauge(
            "cluster_shards_up_to_date",
            "Shards whose every node runs the desired revision.",
        )?;
        let cluster_outdated_nodes = gauge(
            "cluster_outdated_nodes",
            "Nodes not yet on the desired revision.",
        )?;
        let cluster_roll_in_progress = gauge(
            "cluster_roll_in_progress",
            "1 while the cluster is being changed (rolled, scaled, healed), else 0.",
        )?;
        let failovers = IntCounterVec::new(
            Opts::new("failovers_total", "Planned failovers issued, by cluster."),
            &per_cluster,
        )?;
        let failover_duration = HistogramVec::new(
            HistogramOpts::new(
                "failover_duration_seconds",
                "From CLUSTER FAILOVER to the roles having changed.",
            )
            .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]),
            &["result"],
        )?;
        let slot_migrations = IntCounterVec::new(
            Opts::new(
                "slot_migrations_total",
                "Atomic slot migrations, by cluster and result.",
            ),
            &["namespace", "cluster", "result"],
        )?;
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "reconcile_duration_seconds",
                "One reconcile of a ValkeyCluster.",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            &[],
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "reconcile_errors_total",
                "Failed reconciles, by a bounded category.",
            ),
            &["category"],
        )?;
        for collector in [
            Box::new(webhook_requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(webhook_duration.clone()),
            Box::new(certificate_reloads.clone()),
            Box::new(cluster_shards.clone()),
            Box::new(cluster_shards_up_to_date.clone()),
            Box::new(cluster_outdated_nodes.clone()),
            Box::new(cluster_roll_in_progress.clone()),
            Box::new(failovers.clone()),
            Box::new(failover_duration.clone()),
            Box::new(slot_migrations.clone()),
            Box::new(reconcile_duration.clone()),
            Box::new(reconcile_errors.clone()),
        ] {
            registry.register(collector)?;
        }
        Ok(Self {
            registry,
            webhook_requests,
            webhook_duration,
            certificate_reloads,
            cluster_shards,
            cluster_shards_up_to_date,
            cluster_outdated_nodes,
            cluster_roll_in_progress,
            failovers,
            failover_duration,
            slot_migrations,
            reconcile_duration,
            reconcile_errors,
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

    pub fn certificate_reloaded(&self, ok: bool) {
        self.certificate_reloads
            .with_label_values(&[if ok { "ok" } else { "failed" }])
            .inc();
    }

    pub fn roll_progress(&self, namespace: &str, cluster: &str, progress: &RollProgress) {
        let labels = [namespace, cluster];
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
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
    }

    pub fn failover(&self, namespace: &str, cluster: &str, ok: bool, started: Instant) {
        self.failovers
            .with_label_values(&[namespace, cluster])
            .inc();
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
