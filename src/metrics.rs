//! One Prometheus registry for the whole process; every metric is named and registered here.

use std::time::Instant;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    webhook_requests: IntCounterVec,
    webhook_duration: HistogramVec,
    certificate_reloads: IntCounterVec,
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
        registry.register(Box::new(webhook_requests.clone()))?;
        registry.register(Box::new(webhook_duration.clone()))?;
        registry.register(Box::new(certificate_reloads.clone()))?;
        Ok(Self {
            registry,
            webhook_requests,
            webhook_duration,
            certificate_reloads,
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

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buffer = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buffer)?;
        String::from_utf8(buffer).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}
