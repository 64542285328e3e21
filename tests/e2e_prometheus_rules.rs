//! The chart's alerts and dashboard with the real promtool and helm: `promtool test rules` runs
//! every alert's unit test (`tests/prometheus/alerts_test.yaml`); the chart lints clean with
//! the PrometheusRule and the dashboard on; `promtool check rules` accepts the rules as the chart
//! renders them, which are the rule file's; the dashboard ConfigMap carries the dashboard's JSON
//! as it is in `files/`. That every query and metric they use works against the operator is
//! `e2e_prometheus`'s part.

use std::path::Path;

use harness::REPO;
use harness::k8s::chart::{CHART, Helm, NAMESPACE, RELEASE};
use harness::prometheus::promtool;
use serde::Deserialize;
use serde_json::Value;

const ALERTS: &str = "charts/valkey-operator/files/alerts.yaml";
const DASHBOARD: &str = "charts/valkey-operator/files/dashboard.json";

#[test]
fn every_alert_passes_its_promtool_unit_test() {
    let (ok, output) = promtool(
        Path::new(REPO),
        &["test", "rules", "tests/prometheus/alerts_test.yaml"],
    );
    assert!(ok, "promtool test rules:\n{output}");
    assert!(output.contains("SUCCESS"), "{output}");
    // Every alert of the file has a test of its own.
    let tests =
        std::fs::read_to_string(Path::new(REPO).join("tests/prometheus/alerts_test.yaml")).unwrap();
    for alert in alert_names() {
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} has no test"
        );
    }
}

fn alert_names() -> Vec<String> {
    let rules: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(Path::new(REPO).join(ALERTS)).unwrap())
            .unwrap();
    let names: Vec<String> = rules["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| rule["alert"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), 7, "{names:?}");
    names
}

#[test]
fn the_chart_ships_the_rules_and_dashboard_promtool_and_helm_accept() {
    let helm = Helm::new(&testenv::k8s_bin_dir().expect("helm"), None);
    let on = [
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "dashboard.enabled=true",
        "--set",
        "serviceMonitor.enabled=true",
    ];
    let mut lint = vec!["lint", CHART, "--strict"];
    lint.extend(on);
    let output = helm.must(&lint);
    assert!(
        output.contains("0 chart(s) failed") && !output.contains("[WARNING]"),
        "{output}"
    );

    let mut template = vec!["template", RELEASE, CHART, "--namespace", NAMESPACE];
    template.extend(on);
    let objects: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&helm.must(&template))
        .map(|document| Value::deserialize(document).unwrap())
        .filter(|document| !document.is_null())
        .collect();
    let of_kind = |kind: &str| objects.iter().find(|o| o["kind"] == kind).unwrap();

    // The rendered rules are the file's, and promtool accepts them.
    let rule = of_kind("PrometheusRule");
    let file: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(Path::new(REPO).join(ALERTS)).unwrap())
            .unwrap();
    assert_eq!(
        rule["spec"], file,
        "the PrometheusRule's spec is not files/alerts.yaml"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rendered.yaml"),
        serde_yaml_ng::to_string(&rule["spec"]).unwrap(),
    )
    .unwrap();
    let (ok, output) = promtool(dir.path(), &["check", "rules", "rendered.yaml"]);
    assert!(
        ok && output.contains("SUCCESS: 7 rules found"),
        "promtool check rules:\n{output}"
    );

    // The dashboard ConfigMap: the sidecar's label, the file's JSON, every panel with a query.
    let dashboards: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap" && o["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect();
    assert_eq!(dashboards.len(), 1);
    let shipped: Value = serde_json::from_str(
        dashboards[0]["data"]["valkey-operator.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(REPO).join(DASHBOARD)).unwrap())
            .unwrap();
    assert_eq!(shipped, file);
    let panels = shipped["panels"].as_array().unwrap();
    let without_query: Vec<&Value> = panels
        .iter()
        .filter(|p| p["type"] != "row" && p["targets"].as_array().is_none_or(Vec::is_empty))
        .map(|p| &p["title"])
        .collect();
    assert!(without_query.is_empty(), "{without_query:?}");

    // Off by default.
    let defaults = helm.must(&["template", RELEASE, CHART, "--namespace", NAMESPACE]);
    assert!(!defaults.contains("kind: PrometheusRule") && !defaults.contains("grafana_dashboard"));
}
