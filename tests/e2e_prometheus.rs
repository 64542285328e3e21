//! Roll progress through a real Prometheus: the operator scraped over HTTPS as the chart's
//! ServiceMonitor says (its path, scheme, server name and CA), with the chart's alert rules
//! loaded, queried with PromQL during the guide's upgrade of a 2 × 1 cluster with a writer on
//! it, then a scale-out that migrates slots holding keys. Shards up to date rise to the shard
//! count, outdated nodes fall to 0, failovers are counted per cluster, nothing stalls; the
//! disruption histograms and node gauges carry the roll; the step's words in the metric's
//! labels are the ones in the Progressing condition and the events; every query of the chart's
//! dashboard parses and returns series; every metric an alert names exists; and a deleted
//! cluster leaves no series behind.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

use harness::k8s::chart::{CHART, NAMESPACE as OPERATOR_NAMESPACE, RELEASE};
use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Operator, Product, condition_field};
use harness::prometheus::{Prometheus, ScrapeTarget};
use harness::{REPO, eventually};
use serde::Deserialize;
use serde_json::Value;

const NAMESPACE: &str = "shop";
const CLUSTER: &str = "cart";
const OF_CART: &str = r#"namespace="shop", cluster="cart""#;

static FLEET: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("shop")
        .config(
            "shop-config",
            r#"{imageRef: valkey-9-0-0, valkey: {save: ""}}"#,
        )
        .cluster(("shop", "cart"), "shop-config", 2, 1)
        .yaml()
});

/// The chart rendered with its ServiceMonitor and PrometheusRule on.
fn rendered_chart(product: &Product) -> Vec<Value> {
    let yaml = product.helm.must(&[
        "template",
        RELEASE,
        CHART,
        "--namespace",
        OPERATOR_NAMESPACE,
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
    ]);
    serde_yaml_ng::Deserializer::from_str(&yaml)
        .map(|document| Value::deserialize(document).unwrap())
        .filter(|document| !document.is_null())
        .collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects.iter().find(|o| o["kind"] == kind).unwrap()
}

/// One value, which must exist.
async fn value(prometheus: &Prometheus, promql: &str) -> f64 {
    prometheus
        .scalar(promql)
        .await
        .unwrap_or_else(|| panic!("{promql} returned no series"))
}

/// What the sampler saw during the roll, every second.
#[derive(Default)]
struct RollSamples {
    up_to_date: Vec<f64>,
    outdated: Vec<f64>,
    stalled: Vec<f64>,
    /// `cluster_roll_step` as words: `shard 1, Failover`, `shard 0, Wait (Joining)`.
    step_words: BTreeSet<String>,
    /// The Progressing condition's messages.
    progressing: BTreeSet<String>,
}

impl RollSamples {
    async fn take(&mut self, prometheus: &Prometheus, product: &Product) {
        let up = prometheus
            .scalar(&format!(
                "valkey_operator_cluster_shards_up_to_date{{{OF_CART}}}"
            ))
            .await;
        let outdated = prometheus
            .scalar(&format!(
                "valkey_operator_cluster_outdated_nodes{{{OF_CART}}}"
            ))
            .await;
        let stalled = prometheus
            .scalar(&format!(
                "count(valkey_operator_cluster_roll_stalled{{{OF_CART}}}) or vector(0)"
            ))
            .await;
        self.up_to_date.extend(up);
        self.outdated.extend(outdated);
        self.stalled.extend(stalled);
        let steps = prometheus
            .query(&format!("valkey_operator_cluster_roll_step{{{OF_CART}}}"))
            .await
            .unwrap();
        for series in steps {
            let shard = series.label("shard");
            let mut words = match shard {
                "" => series.label("step").to_owned(),
                shard => format!("shard {shard}, {}", series.label("step")),
            };
            if !series.label("reason").is_empty() {
                words.push_str(&format!(" ({})", series.label("reason")));
            }
            self.step_words.insert(words);
        }
        let cluster = product.cluster(NAMESPACE, CLUSTER);
        self.progressing
            .extend(condition_field(&cluster, "Progressing", "message"));
    }
}

/// After its lowest point, never lower again.
fn rises_after_its_low(values: &[f64]) -> bool {
    let low = values
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(at, _)| at);
    values[low..].windows(2).all(|w| w[1] >= w[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roll_progress_through_a_real_prometheus() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&FLEET);
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.0.0", Duration::from_secs(240))
        .await;

    // Prometheus scrapes the operator as the chart's ServiceMonitor says, with its rules.
    let chart = rendered_chart(&product);
    let address = product.operator().url.trim_start_matches("https://");
    let target = ScrapeTarget::from_service_monitor(
        of_kind(&chart, "ServiceMonitor"),
        address,
        &product.identity.path("ca.crt"),
        &product.identity.path("metrics-token"),
    );
    let rules_dir = tempfile::tempdir().unwrap();
    let rules = rules_dir.path().join("rules.yaml");
    let spec = &of_kind(&chart, "PrometheusRule")["spec"];
    std::fs::write(&rules, serde_yaml_ng::to_string(spec).unwrap()).unwrap();
    let prometheus = Prometheus::start(&target, &[&rules]).await;
    let shards = format!("valkey_operator_cluster_shards{{{OF_CART}}}");
    eventually(
        "Prometheus to scrape the operator",
        Duration::from_secs(60),
        async || match prometheus.scalar(&shards).await {
            Some(2.0) => Ok(()),
            other => Err(format!(
                "{other:?}; targets {:?}",
                prometheus.targets().await
            )),
        },
    )
    .await;
    assert_eq!(prometheus.targets().await[0].0, "up");
    let up_to_date = format!("valkey_operator_cluster_shards_up_to_date{{{OF_CART}}}");
    assert_eq!(value(&prometheus, &up_to_date).await, 2.0);
    assert_eq!(value(&prometheus, "valkey_operator_leader").await, 1.0);
    let failovers = format!("valkey_operator_failovers_total{{{OF_CART}}}");
    assert_eq!(value(&prometheus, &failovers).await, 0.0);

    // A second replica, which does not lead, exports no per-cluster series.
    let mut standby =
        Operator::start_with(&product.identity, "standby.log", OPERATOR_NAMESPACE, &[]);
    standby.wait_ready(Duration::from_secs(60)).await;
    assert_exports_no_cluster(&standby).await;

    // The guide's upgrade, sampled through Prometheus every second.
    let watch = ClusterWatch::start(&product, NAMESPACE, CLUSTER).await;
    product.patch(
        "valkeyconfig/shop-config",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    let mut samples = RollSamples::default();
    eventually(
        "the roll, seen by Prometheus",
        Duration::from_secs(300),
        async || {
            samples.take(&prometheus, &product).await;
            let converged = harness::k8s::converged(&product.cluster(NAMESPACE, CLUSTER), "9.1.2");
            let seen_done = samples.up_to_date.last() == Some(&2.0)
                && samples.outdated.last() == Some(&0.0)
                && samples.outdated.iter().any(|o| *o > 0.0);
            tokio::time::sleep(Duration::from_secs(1)).await;
            (converged && seen_done).then_some(())
        },
    )
    .await;
    let report = watch.finish(&product).await;
    report.assert_shards(2, 1, 1);

    println!(
        "up to date {:?}\noutdated {:?}\nsteps {:?}\nprogressing {:?}",
        samples.up_to_date, samples.outdated, samples.step_words, samples.progressing
    );
    assert!(
        samples.up_to_date.iter().any(|u| *u < 2.0),
        "{:?}",
        samples.up_to_date
    );
    assert!(
        rises_after_its_low(&samples.up_to_date),
        "{:?}",
        samples.up_to_date
    );
    let outdated: Vec<f64> = samples.outdated.iter().map(|o| -o).collect();
    assert!(
        rises_after_its_low(&outdated),
        "outdated nodes went up again: {:?}",
        samples.outdated
    );
    assert!(
        samples.stalled.iter().all(|s| *s == 0.0),
        "{:?}",
        samples.stalled
    );
    assert_eq!(value(&prometheus, &failovers).await, 2.0);

    // The step's words: Prometheus's labels, the Progressing condition and the events agree.
    // Short steps (a failover, a join) can fall between two scrapes, so: some words sampled in
    // both the metric and the condition, and every failover's and retirement's event in those
    // words.
    let shared: Vec<&String> = samples
        .progressing
        .iter()
        .filter(|m| {
            samples
                .step_words
                .iter()
                .any(|w| m.starts_with(&format!("{w}: ")))
        })
        .collect();
    assert!(
        !shared.is_empty(),
        "no Progressing message starts with words Prometheus saw: {:?} vs {:?}",
        samples.progressing,
        samples.step_words
    );
    let events = product.kubectl(&[
        "get",
        "events",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={range .items[*]}{.reason}|{.note}{.message}{\"\\n\"}{end}",
    ]);
    for shard in 0..2 {
        for (reason, step) in [("Failover", "Failover"), ("NodeRetired", "RetireNode")] {
            let words = format!("{reason}|shard {shard}, {step}: ");
            assert!(
                events.lines().any(|l| l.starts_with(&words)),
                "no {reason} event starts with {words:?}:\n{events}"
            );
        }
    }

    // The disruption figures of the roll.
    let count = |family: &str, extra: &str| {
        format!("sum(valkey_operator_{family}_count{{{OF_CART}{extra}}})")
    };
    // Observed in the same pass that leaves no node outdated, so perhaps one scrape later.
    let shard_rolls = count("shard_roll_duration_seconds", "");
    eventually(
        "both shards' roll times",
        Duration::from_secs(10),
        async || (prometheus.scalar(&shard_rolls).await == Some(2.0)).then_some(()),
    )
    .await;
    assert!(value(&prometheus, &count("replica_join_duration_seconds", "")).await >= 2.0);
    let completed = r#", result="completed""#;
    assert_eq!(
        value(&prometheus, &count("failover_duration_seconds", completed)).await,
        2.0
    );
    let p95 = format!(
        "histogram_quantile(0.95, sum by (le) (valkey_operator_failover_duration_seconds_bucket{{{OF_CART}}}))"
    );
    let failover_p95 = value(&prometheus, &p95).await;
    assert!(failover_p95 > 0.0 && failover_p95 <= 10.0, "{failover_p95}");
    let roles = prometheus
        .query(&format!(
            "count by (role) (valkey_operator_node_role{{{OF_CART}}})"
        ))
        .await
        .unwrap();
    let by_role: Vec<(String, f64)> = roles
        .iter()
        .map(|s| (s.label("role").to_owned(), s.value))
        .collect();
    assert!(
        by_role.contains(&("primary".into(), 2.0)) && by_role.contains(&("replica".into(), 2.0)),
        "{by_role:?}"
    );
    let lags = prometheus
        .query(&format!(
            "valkey_operator_node_replication_lag_bytes{{{OF_CART}}}"
        ))
        .await
        .unwrap();
    assert_eq!(lags.len(), 2, "one lag gauge per replica: {lags:?}");
    assert!(
        lags.iter()
            .all(|s| !s.label("node").is_empty() && !s.label("shard").is_empty())
    );

    // A scale-out migrates slots that hold the writer's keys.
    product.patch(
        "valkeycluster/cart",
        Some(NAMESPACE),
        r#"{"spec": {"shards": 3}}"#,
    );
    let migrated = format!("sum(valkey_operator_slot_migration_keys_sum{{{OF_CART}}})");
    eventually(
        "a slot migration, seen by Prometheus",
        Duration::from_secs(240),
        async || {
            let keys = prometheus.scalar(&migrated).await.unwrap_or(0.0);
            let up = prometheus.scalar(&up_to_date).await.unwrap_or(0.0);
            (keys > 0.0 && up == 3.0)
                .then_some(())
                .ok_or(format!("keys {keys}, shards up to date {up}"))
        },
    )
    .await;
    let migrations = format!("valkey_operator_slot_migrations_total{{{OF_CART}{completed}}}");
    assert!(value(&prometheus, &migrations).await >= 1.0);
    // A rate sees only what happened after a series' first scrape, and one scale-out's
    // migrations can all land before it: a second scale-out moves slots under watch.
    let before = value(&prometheus, &migrations).await;
    product.patch(
        "valkeycluster/cart",
        Some(NAMESPACE),
        r#"{"spec": {"shards": 4}}"#,
    );
    let more = format!("{migrations} > {before}");
    eventually(
        "the second scale-out's migrations, seen by Prometheus",
        Duration::from_secs(240),
        async || {
            let up = prometheus.scalar(&up_to_date).await.unwrap_or(0.0);
            (up == 4.0 && prometheus.scalar(&more).await.is_some()).then_some(())
        },
    )
    .await;
    eventually("a scrape after it", Duration::from_secs(30), async || {
        prometheus
            .scalar(&format!("increase({migrations}[5m]) > 0"))
            .await
    })
    .await;
    println!(
        "failover p95 bucket {failover_p95} s; keys moved {}",
        value(&prometheus, &migrated).await
    );
    for family in [
        "shard_roll_duration_seconds",
        "replica_join_duration_seconds",
        "failover_duration_seconds",
        "slot_migration_duration_seconds",
        "slot_migration_keys",
    ] {
        let mean = format!(
            "sum(valkey_operator_{family}_sum{{{OF_CART}}}) / sum(valkey_operator_{family}_count{{{OF_CART}}})"
        );
        let count = format!("sum(valkey_operator_{family}_count{{{OF_CART}}})");
        println!(
            "{family}: mean {:.3} over {}",
            value(&prometheus, &mean).await,
            value(&prometheus, &count).await
        );
    }

    assert_dashboard_queries_return_series(&prometheus).await;
    assert_exports_no_cluster(&standby).await;
    assert_alerts_name_exported_metrics(&prometheus).await;

    // A deleted cluster leaves no series behind in the operator's /metrics.
    product.kubectl(&[
        "delete",
        "valkeycluster",
        CLUSTER,
        "-n",
        NAMESPACE,
        "--timeout=120s",
    ]);
    let text = product.operator().metrics().await;
    let left: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(r#"cluster="cart""#))
        .collect();
    assert!(left.is_empty(), "series of the deleted cluster: {left:#?}");
}

/// A replica that does not lead: `leader` 0 and no series of any cluster.
async fn assert_exports_no_cluster(standby: &Operator) {
    let text = standby.metrics().await;
    assert!(text.contains("valkey_operator_leader 0"), "{text}");
    let of_clusters: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("cluster="))
        .collect();
    assert!(
        of_clusters.is_empty(),
        "a replica that does not lead exports {of_clusters:#?}"
    );
}

/// Every query of the chart's dashboard, for every namespace and cluster, parses and returns
/// series.
async fn assert_dashboard_queries_return_series(prometheus: &Prometheus) {
    let path = Path::new(REPO).join("charts/valkey-operator/files/dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            queries.push((title, target["expr"].as_str().unwrap().to_owned()));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            let inner = query
                .trim_start_matches("label_values(")
                .rsplit_once(',')
                .map(|(selector, _)| selector.to_owned())
                .unwrap();
            queries.push((format!("variable {}", variable["name"]), inner));
        }
    }
    assert!(queries.len() >= 20, "{queries:?}");
    let mut empty = Vec::new();
    for (title, expr) in &queries {
        let promql = expr.replace("$namespace", ".*").replace("$cluster", ".*");
        match prometheus.query(&promql).await {
            Ok(series) if series.iter().any(|s| !s.value.is_nan()) => {}
            Ok(_) => empty.push(format!("{title}: {promql}")),
            Err(error) => panic!("dashboard panel {title:?}: {error}"),
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries with no series: {empty:#?}"
    );
}

/// Every `valkey_operator_*` metric the alert rules name is one Prometheus has scraped.
async fn assert_alerts_name_exported_metrics(prometheus: &Prometheus) {
    let path = Path::new(REPO).join("charts/valkey-operator/files/alerts.yaml");
    let rules = std::fs::read_to_string(path).unwrap();
    let named: BTreeSet<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("valkey_operator_"))
        .collect();
    let scraped: BTreeSet<String> = prometheus
        .query(r#"group by (__name__) ({__name__=~"valkey_operator_.+"})"#)
        .await
        .unwrap()
        .iter()
        .map(|s| s.label("__name__").to_owned())
        .collect();
    // Series that exist only once something went wrong (a stall, a Degraded cluster, a failed
    // reconcile) are not this healthy roll's; the metrics module's unit test checks that the
    // operator registers every name the rules use.
    let only_on_failure = [
        "valkey_operator_cluster_roll_stalled",
        "valkey_operator_cluster_degraded",
        "valkey_operator_reconcile_errors_total",
        // Only TLS clusters reload certificates; this one has no TLS.
        "valkey_operator_node_certificate_reloads_total",
    ];
    let missing: Vec<&&str> = named
        .iter()
        .filter(|name| !scraped.contains(**name) && !only_on_failure.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "alerts name metrics never scraped: {missing:?} of {scraped:?}"
    );
    // The chart's rules, as the PrometheusRule renders them, loaded and evaluating cleanly.
    let rules = prometheus.rules().await;
    assert_eq!(rules.len(), 7, "{rules:?}");
    assert!(
        rules
            .iter()
            .all(|(_, health, error)| health == "ok" && error.is_empty()),
        "{rules:?}"
    );
}
