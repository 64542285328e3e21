//! A real Prometheus (and promtool), built from the Go module proxy by
//! `hack/build-prometheus.sh` and cached under `~/.cache/valkey-operator/prometheus/`: started on
//! loopback with a scrape job made from the chart's rendered ServiceMonitor, and queried with
//! PromQL through its HTTP API, as a person's dashboard or alert would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::eventually;

/// The folder holding `prometheus` and `promtool`: `$PROMETHEUS_BIN_DIR` if set, else what
/// `hack/build-prometheus.sh` prints (it builds them on first use and reuses them afterwards).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PROMETHEUS_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let script = Path::new(crate::REPO).join("hack/build-prometheus.sh");
    let output = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(output.status.success(), "{} failed", script.display());
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
}

/// `promtool ARGS` in `dir`: success and everything it printed.
pub fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let output = Command::new(bin_dir().join("promtool"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running promtool: {e}"));
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// Where and how to scrape the operator, as the chart's ServiceMonitor says it.
pub struct ScrapeTarget {
    /// `host:port` the operator serves on (the ServiceMonitor's Service, here a loopback port).
    pub address: String,
    pub scheme: String,
    pub path: String,
    /// The name the serving certificate is verified against (`tlsConfig.serverName`).
    pub server_name: String,
    /// The CA file (`tlsConfig.ca`, the chart's `ca.crt`).
    pub ca_file: PathBuf,
    /// The bearer token sent (`bearerTokenFile`: in a cluster, Prometheus's own token).
    pub token_file: Option<PathBuf>,
}

impl ScrapeTarget {
    /// The first endpoint of a rendered ServiceMonitor, scraped at `address` with `ca_file`,
    /// and with `token_file` where the endpoint sends Prometheus's own token.
    pub fn from_service_monitor(
        monitor: &Value,
        address: &str,
        ca_file: &Path,
        token_file: &Path,
    ) -> Self {
        let endpoint = &monitor["spec"]["endpoints"][0];
        let field = |name: &str| {
            endpoint[name]
                .as_str()
                .unwrap_or_else(|| panic!("the ServiceMonitor's endpoint has no {name}"))
                .to_owned()
        };
        assert!(
            endpoint["tlsConfig"]["ca"]["secret"]["key"] == "ca.crt",
            "the ServiceMonitor must verify with the chart's CA: {endpoint}"
        );
        Self {
            address: address.to_owned(),
            scheme: field("scheme"),
            path: field("path"),
            server_name: endpoint["tlsConfig"]["serverName"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            ca_file: ca_file.to_owned(),
            token_file: endpoint["bearerTokenFile"]
                .is_string()
                .then(|| token_file.to_owned()),
        }
    }
}

/// A Prometheus process on a loopback port, scraping one target every second; killed when
/// dropped.
pub struct Prometheus {
    child: Child,
    pub url: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub async fn start(target: &ScrapeTarget, rule_files: &[&Path]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut scrape = json!({
            "job_name": "valkey-operator",
            "scheme": target.scheme,
            "metrics_path": target.path,
            "tls_config": {
                "ca_file": target.ca_file,
                "server_name": target.server_name,
                "insecure_skip_verify": false,
            },
            "static_configs": [{"targets": [target.address]}],
        });
        if let Some(token) = &target.token_file {
            scrape["authorization"] = json!({"type": "Bearer", "credentials_file": token});
        }
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rule_files,
            "scrape_configs": [scrape],
        });
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(bin_dir().join("prometheus"))
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let prometheus = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            _dir: dir,
        };
        let ready = format!("{}/-/ready", prometheus.url);
        eventually(
            "Prometheus to be ready",
            Duration::from_secs(60),
            async || {
                let response = prometheus.client.get(&ready).send().await.ok()?;
                response.status().is_success().then_some(())
            },
        )
        .await;
        prometheus
    }

    /// Prometheus's own log, for a failure's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The instant query's result, `Err` with Prometheus's words if it does not parse or fails.
    pub async fn query(&self, promql: &str) -> Result<Vec<Series>, String> {
        let url = reqwest::Url::parse_with_params(
            &format!("{}/api/v1/query", self.url),
            [("query", promql)],
        )
        .map_err(|e| e.to_string())?;
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = response.json().await.map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{promql}: {body}"));
        }
        let result = &body["data"]["result"];
        match body["data"]["resultType"].as_str() {
            Some("vector") => Ok(result
                .as_array()
                .into_iter()
                .flatten()
                .map(Series::from_json)
                .collect()),
            Some("scalar") => Ok(vec![Series {
                labels: Default::default(),
                value: value_of(result),
            }]),
            other => Err(format!("{promql}: unexpected result type {other:?}")),
        }
    }

    /// The value of a query expected to return one series (`None` if it returns none).
    pub async fn scalar(&self, promql: &str) -> Option<f64> {
        let series = self.query(promql).await.ok()?;
        series.first().map(|s| s.value)
    }

    /// The health of every target (`up`, `down`, `unknown`) with its last error.
    pub async fn targets(&self) -> Vec<(String, String)> {
        let url = format!("{}/api/v1/targets", self.url);
        let Ok(response) = self.client.get(url).send().await else {
            return Vec::new();
        };
        let body: Value = response.json().await.unwrap_or_default();
        body["data"]["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let health = t["health"].as_str().unwrap_or_default().to_owned();
                let error = t["lastError"].as_str().unwrap_or_default().to_owned();
                (health, error)
            })
            .collect()
    }

    /// Every loaded rule: its name, health (`ok`, `err`, `unknown`) and last error.
    pub async fn rules(&self) -> Vec<(String, String, String)> {
        let url = format!("{}/api/v1/rules", self.url);
        let Ok(response) = self.client.get(url).send().await else {
            return Vec::new();
        };
        let body: Value = response.json().await.unwrap_or_default();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        body["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
            .map(|rule| {
                (
                    text(&rule["name"]),
                    text(&rule["health"]),
                    text(&rule["lastError"]),
                )
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One series of an instant vector: its labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: std::collections::BTreeMap<String, String>,
    pub value: f64,
}

impl Series {
    fn from_json(item: &Value) -> Self {
        let labels = item["metric"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect();
        Self {
            labels,
            value: value_of(&item["value"]),
        }
    }

    pub fn label(&self, name: &str) -> &str {
        self.labels
            .get(name)
            .map(String::as_str)
            .unwrap_or_default()
    }
}

/// `[time, "value"]` into the value (NaN if it is not a number).
fn value_of(pair: &Value) -> f64 {
    pair[1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}
