//! Fleet-scale benchmark (not a test: it prints figures). The whole product on the test control
//! plane, as the end-to-end tests run it, with a fleet of small clusters (1 shard, 0 replicas) on
//! one config, each Pod a real valkey-server:
//!
//! 1. create the fleet → every cluster Active: wall time, the operator's peak RSS and CPU, and
//!    the API server's request rate (all clients, the test kubelet included); and, to show where
//!    the time goes on this 2-core machine, the CPU each program used (API server, etcd, the
//!    valkey-servers, this process with its test kubelet, the operator) and the API requests
//!    by verb and resource;
//! 2. the fleet idle for a minute: the operator's CPU (% of one core) and the API requests;
//! 3. one config patch → every cluster rolled: the same figures;
//! 4. optionally, clusters whose Pods never start (an image the test kubelet has no binary
//!    for), added 100 at a time up to 1,000 and 1,000 at a time after, with the operator's RSS
//!    once it holds each batch: the memory each cluster costs;
//! 5. then those clusters deleted: the operator's RSS, and how many clusters its memory still
//!    keeps anything for (the `remembered` of its last "forgot a deleted cluster" line).
//!
//! Run: `FLEET_SIZE=200 FLEET_OBJECTS=1000 cargo bench --bench fleet_scale` (defaults: 200
//! real clusters, no object-only clusters). `TESTENV_AUDIT_LOG=<file>` adds the requests by
//! client, `FLEET_LOG=<file>` keeps the operator's log. Needs `make tools`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use harness::k8s::{IMAGES, Product};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::Value;
use valkey_operator::api::ValkeyCluster;

const NAMESPACE: &str = "scale";

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn clusters_yaml(prefix: &str, config: &str, range: std::ops::Range<usize>) -> String {
    range
        .map(|i| {
            format!(
                "---\napiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyCluster\n\
                 metadata: {{name: {prefix}-{i:05}, namespace: {NAMESPACE}}}\n\
                 spec: {{configRef: {config}, shards: 1, replicasPerShard: 0}}\n"
            )
        })
        .collect()
}

/// The namespace's clusters as a watch last showed them, by name: the benchmark counts
/// converged clusters from it instead of listing them every second, which on this 2-core
/// machine would take the API server's time from the operator it measures.
#[derive(Clone, Default)]
struct Clusters(Arc<Mutex<BTreeMap<String, Value>>>);

impl Clusters {
    async fn watch(product: &Product) -> Self {
        let clusters = Self::default();
        let client = product.plane.client().await.unwrap();
        let api: Api<ValkeyCluster> = Api::namespaced(client, NAMESPACE);
        let seen = clusters.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let mut map = seen.0.lock().unwrap();
                match event {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                        map.insert(c.name_any(), serde_json::to_value(&c).unwrap());
                    }
                    Ok(watcher::Event::Delete(c)) => {
                        map.remove(&c.name_any());
                    }
                    _ => {}
                }
            }
        });
        clusters
    }

    /// How many clusters named `prefix-*` exist.
    fn named(&self, prefix: &str) -> usize {
        let map = self.0.lock().unwrap();
        map.keys().filter(|name| name.starts_with(prefix)).count()
    }

    /// How many clusters named `prefix-*` have nodes in their status (the operator has
    /// reconciled them at least once).
    fn with_nodes(&self, prefix: &str) -> usize {
        let map = self.0.lock().unwrap();
        map.iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .filter(|(_, c)| {
                c["status"]["nodes"]
                    .as_array()
                    .is_some_and(|nodes| !nodes.is_empty())
            })
            .count()
    }

    /// How many clusters named `prefix-*` are converged on `version`.
    fn converged(&self, prefix: &str, version: &str) -> usize {
        let map = self.0.lock().unwrap();
        map.iter()
            .filter(|(name, c)| name.starts_with(prefix) && harness::k8s::converged(c, version))
            .count()
    }
}

/// The labels of one Prometheus text-format sample line, and its value.
fn sample<'l>(line: &'l str, metric: &str) -> Option<(&'l str, f64)> {
    let labels = line.strip_prefix(metric)?.strip_prefix('{')?;
    let (labels, value) = labels.rsplit_once("} ")?;
    Some((labels, value.parse().unwrap_or(0.0)))
}

fn label(labels: &str, name: &str) -> String {
    labels
        .split(',')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
        .map(|v| v.trim_end_matches('"').to_owned())
        .unwrap_or_default()
}

/// What the API server counted so far: requests (`apiserver_request_total`, every client) by
/// `verb resource[/subresource]`, and the seconds requests spent queued by its priority and
/// fairness (`apiserver_flowcontrol_request_wait_duration_seconds`) by priority level.
#[derive(Default)]
struct ApiServer {
    requests: BTreeMap<String, f64>,
    /// Seconds spent serving requests (`apiserver_request_duration_seconds_sum`), by kind.
    seconds: BTreeMap<String, f64>,
    queued_seconds: BTreeMap<String, f64>,
}

/// `verb resource[/subresource]` of a request sample.
fn request_kind(labels: &str) -> String {
    let kind = format!("{} {}", label(labels, "verb"), label(labels, "resource"));
    match label(labels, "subresource") {
        sub if sub.is_empty() => kind,
        sub => format!("{kind}/{sub}"),
    }
}

impl ApiServer {
    fn read(product: &Product) -> Self {
        let mut read = Self::default();
        let metrics = product.kubectl(&["get", "--raw", "/metrics"]);
        for line in metrics.lines() {
            if let Some((labels, value)) = sample(line, "apiserver_request_total") {
                *read.requests.entry(request_kind(labels)).or_default() += value;
            } else if let Some((labels, value)) =
                sample(line, "apiserver_request_duration_seconds_sum")
            {
                // A watch lasts as long as its connection: not time spent serving.
                if label(labels, "verb") != "WATCH" {
                    *read.seconds.entry(request_kind(labels)).or_default() += value;
                }
            } else if let Some((labels, value)) = sample(
                line,
                "apiserver_flowcontrol_request_wait_duration_seconds_sum",
            ) {
                let level = label(labels, "priority_level");
                *read.queued_seconds.entry(level).or_default() += value;
            }
        }
        read
    }
}

/// The commands the operator has sent to Valkey nodes (its `valkey_commands_total`).
async fn valkey_commands(product: &Product) -> f64 {
    let text = product.operator().metrics().await;
    text.lines()
        .filter(|line| line.starts_with("valkey_operator_valkey_commands_total{"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The API server's audit log, when the run has one ([`testenv::AUDIT_LOG_VAR`]): which client
/// made the requests of a phase.
struct Audit {
    path: std::path::PathBuf,
    start: u64,
}

impl Audit {
    fn start() -> Option<Self> {
        let path = std::path::PathBuf::from(std::env::var_os(testenv::AUDIT_LOG_VAR)?);
        let start = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        Some(Self { path, start })
    }

    /// Requests since the start by `client: verb resource[/subresource]`, where the client is
    /// the operator (by its ServiceAccount) or the program its user agent names.
    fn by_client(&self) -> BTreeMap<String, f64> {
        use std::io::{Read, Seek};
        let mut counts = BTreeMap::new();
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return counts;
        };
        let mut text = String::new();
        if file.seek(std::io::SeekFrom::Start(self.start)).is_err()
            || file.read_to_string(&mut text).is_err()
        {
            return counts;
        }
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let user = event["user"]["username"].as_str().unwrap_or_default();
            let agent = event["userAgent"].as_str().unwrap_or_default();
            let client = if user.ends_with(":valkey-operator") {
                "operator".to_owned()
            } else {
                agent.split('/').next().unwrap_or_default().to_owned()
            };
            let mut kind = format!(
                "{client}: {} {}",
                event["verb"].as_str().unwrap_or_default(),
                event["objectRef"]["resource"].as_str().unwrap_or_default()
            );
            if let Some(sub) = event["objectRef"]["subresource"].as_str() {
                kind = format!("{kind}/{sub}");
            }
            *counts.entry(kind).or_default() += 1.0;
        }
        counts
    }
}

/// CPU seconds used so far by each running program (by its process name), summed over its
/// processes: where the time of this 2-core machine goes. A process that has exited is gone
/// from the sum (retired valkey-servers: little).
fn cpu_by_program() -> BTreeMap<String, f64> {
    // USER_HZ, the unit of /proc/<pid>/stat's times, is 100 on Linux.
    const TICKS: f64 = 100.0;
    let mut programs = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some((head, after)), Some(open)) = (stat.rsplit_once(')'), stat.find('(')) else {
            continue;
        };
        let name = head[open + 1..].to_owned();
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
        if let (Some(user), Some(system)) = (ticks(11), ticks(12)) {
            *programs.entry(name).or_default() += (user + system) / TICKS;
        }
    }
    programs
}

/// `after - before` per key, largest first, the first `n`.
fn largest_growth(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    n: usize,
) -> Vec<(String, f64)> {
    let mut grown: Vec<(String, f64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    grown.sort_by(|a, b| b.1.total_cmp(&a.1));
    grown.truncate(n);
    grown
}

/// What the operator and the API server did over a phase.
struct Phase {
    started: Instant,
    cpu: f64,
    api: ApiServer,
    audit: Option<Audit>,
    valkey_commands: f64,
    programs: BTreeMap<String, f64>,
    peak_kib: AtomicU64,
}

impl Phase {
    async fn start(product: &Product) -> Self {
        Self {
            started: Instant::now(),
            cpu: product.operator().cpu_seconds().unwrap_or(0.0),
            api: ApiServer::read(product),
            audit: Audit::start(),
            valkey_commands: valkey_commands(product).await,
            programs: cpu_by_program(),
            peak_kib: AtomicU64::new(product.operator().resident_kib().unwrap_or(0)),
        }
    }

    fn sample(&self, product: &Product) {
        if let Some(kib) = product.operator().resident_kib() {
            self.peak_kib.fetch_max(kib, Ordering::Relaxed);
        }
    }

    async fn report(&self, product: &Product, what: &str) {
        let seconds = self.started.elapsed().as_secs_f64();
        let cpu = product.operator().cpu_seconds().unwrap_or(0.0) - self.cpu;
        let api = ApiServer::read(product);
        let by_kind = largest_growth(&self.api.requests, &api.requests, 10);
        let total: f64 =
            api.requests.values().sum::<f64>() - self.api.requests.values().sum::<f64>();
        let queued = largest_growth(&self.api.queued_seconds, &api.queued_seconds, 4);
        let serving = largest_growth(&self.api.seconds, &api.seconds, 8);
        let programs = largest_growth(&self.programs, &cpu_by_program(), 6);
        println!(
            "{what}: {seconds:.1} s; operator CPU {cpu:.1} s ({:.1}% of one core), peak RSS {:.0} MiB; \
             API server {:.1} requests/s",
            100.0 * cpu / seconds,
            self.peak_kib.load(Ordering::Relaxed) as f64 / 1024.0,
            total / seconds
        );
        let commands = valkey_commands(product).await - self.valkey_commands;
        println!(
            "    the operator's Valkey commands: {commands:.0} ({:.0} a minute)",
            60.0 * commands / seconds
        );
        let cores = |cpu: f64| format!("{:.0}%", 100.0 * cpu / seconds);
        let programs: Vec<String> = programs
            .iter()
            .map(|(name, cpu)| format!("{name} {}", cores(*cpu)))
            .collect();
        println!(
            "    CPU by program (% of one core): {}",
            programs.join(", ")
        );
        let kinds: Vec<String> = by_kind
            .iter()
            .map(|(kind, n)| format!("{kind} {:.0}", n))
            .collect();
        println!("    API requests by kind: {}", kinds.join(", "));
        let serving: Vec<String> = serving
            .iter()
            .map(|(kind, seconds)| format!("{kind} {seconds:.1}"))
            .collect();
        println!(
            "    seconds the API server spent serving, by kind: {}",
            serving.join(", ")
        );
        if let Some(audit) = &self.audit {
            let by_client = audit.by_client();
            let operator: f64 = by_client
                .iter()
                .filter(|(kind, _)| kind.starts_with("operator:"))
                .map(|(_, n)| n)
                .sum();
            println!(
                "    the operator's API requests: {operator:.0} ({:.1}/s); by client (audit log): {}",
                operator / seconds,
                largest_growth(&BTreeMap::new(), &by_client, 12)
                    .iter()
                    .map(|(kind, n)| format!("{kind} {n:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let queued: Vec<String> = queued
            .iter()
            .map(|(level, seconds)| format!("{level} {seconds:.1} s"))
            .collect();
        println!(
            "    seconds requests waited in the API server's queues, by priority level: {}",
            if queued.is_empty() {
                "none".to_owned()
            } else {
                queued.join(", ")
            }
        );
    }
}

/// Waits, sampling the operator's memory, until `count` clusters named `prefix-*` converge.
async fn until_converged(
    product: &Product,
    clusters: &Clusters,
    phase: &Phase,
    prefix: &str,
    version: &str,
    count: usize,
) {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        phase.sample(product);
        let done = clusters.converged(prefix, version);
        if done >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {count} converged after an hour"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Phases 1 to 3: `size` real clusters created, idle for a minute, rolled by one patch.
async fn real_fleet(product: &Product, clusters: &Clusters, size: usize) {
    let phase = Phase::start(product).await;
    product.apply(&clusters_yaml("c", "scale", 0..size));
    until_converged(product, clusters, &phase, "c-", "9.0.0", size).await;
    phase
        .report(product, &format!("create → {size} Active"))
        .await;

    // Settle, then a minute of nothing.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let idle = Phase::start(product).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    idle.sample(product);
    idle.report(
        product,
        &format!("idle minute with {size} converged clusters"),
    )
    .await;

    let phase = Phase::start(product).await;
    product.patch(
        "valkeyconfig/scale",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    until_converged(product, clusters, &phase, "c-", "9.1.2", size).await;
    phase
        .report(product, &format!("one patch → {size} rolled"))
        .await;
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let size = setting("FLEET_SIZE", 200);
    let objects = setting("FLEET_OBJECTS", 0);
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {{name: scale}}
spec: {{imageRef: valkey-9-0-0, valkey: {{save: ""}}}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata: {{name: valkey-never}}
spec: {{repository: valkey/valkey, tag: "9.2.0", version: "9.2.0"}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {{name: never}}
spec: {{imageRef: valkey-never}}
"#
    ));
    let baseline_kib = product.operator().resident_kib().unwrap_or(0);
    println!(
        "fleet-scale benchmark: {size} clusters of 1 shard × 0 replicas; operator RSS before {:.0} MiB",
        baseline_kib as f64 / 1024.0
    );

    let clusters = Clusters::watch(&product).await;
    if size > 0 {
        real_fleet(&product, &clusters, size).await;
    }
    if objects > 0 {
        let before = object_only(&product, &clusters, size, objects).await;
        deleted(&product, &clusters, size, objects, before).await;
    }
    if let Ok(path) = std::env::var("FLEET_LOG") {
        std::fs::write(&path, product.operator().log()).unwrap();
        println!("the operator's log is in {path}");
    }
    // FLEET_HOLD_SECONDS keeps everything up at the end, e.g. to take a heap profile.
    let hold = setting("FLEET_HOLD_SECONDS", 0);
    tokio::time::sleep(Duration::from_secs(hold as u64)).await;
}

/// Phase 4: `objects` clusters whose Pods never start, and the operator's memory as it holds
/// them.
async fn object_only(product: &Product, clusters: &Clusters, size: usize, objects: usize) -> u64 {
    // Clusters whose Pods never start: their objects and the operator's caches, no servers.
    // Each batch is measured once the operator has made every cluster's nodes (its status
    // lists them), so the figure is of clusters it holds, not of clusters it has yet to see.
    let before = product.operator().resident_kib().unwrap_or(0);
    let mut added = 0;
    let mut at_100 = None;
    while added < objects {
        // 100 at a time up to 1,000 (the slope the target is set on), then 1,000 at a time.
        let batch = if added < 1000 { 100 } else { 1000 };
        let next = (added + batch).min(objects);
        for start in (added..next).step_by(100) {
            product.apply(&clusters_yaml("o", "never", start..(start + 100).min(next)));
        }
        added = next;
        let started = Instant::now();
        while clusters.with_nodes("o-") < added && started.elapsed() < Duration::from_secs(1800) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let kib = product.operator().resident_kib().unwrap_or(0);
        let held = clusters.with_nodes("o-");
        if added == 100 {
            at_100 = Some(kib);
        }
        let slope = at_100
            .filter(|_| added > 100)
            .map(|k100| {
                format!(
                    ", {:+.1} KiB per cluster since 100",
                    (kib as f64 - k100 as f64) / (added - 100) as f64
                )
            })
            .unwrap_or_default();
        println!(
            "  + {added} clusters whose Pods never start ({held} with nodes, {:.0} s): operator RSS {:.0} MiB ({:+.1} KiB per cluster over the {size} real ones{slope})",
            started.elapsed().as_secs_f64(),
            kib as f64 / 1024.0,
            (kib as f64 - before as f64) / added as f64
        );
    }
    before
}

/// Phase 5: the `objects` clusters of phase 4 deleted, and what the operator keeps of them.
async fn deleted(product: &Product, clusters: &Clusters, size: usize, objects: usize, before: u64) {
    let started = Instant::now();
    for start in (0..objects).step_by(100) {
        let names: Vec<String> = (start..(start + 100).min(objects))
            .map(|i| format!("o-{i:05}"))
            .collect();
        let mut args = vec!["delete", "valkeycluster", "-n", NAMESPACE, "--wait=false"];
        args.extend(names.iter().map(String::as_str));
        product.kubectl(&args);
    }
    while clusters.named("o-") > 0 && started.elapsed() < Duration::from_secs(1800) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let kib = product.operator().resident_kib().unwrap_or(0);
    let log = harness::strip_ansi(&product.operator().log());
    let remembered = log
        .lines()
        .filter(|line| line.contains("forgot a deleted cluster"))
        .filter_map(|line| line.split("remembered=").nth(1)?.split_whitespace().next())
        .next_back()
        .unwrap_or("?")
        .to_owned();
    println!(
        "  - {objects} clusters deleted ({:.0} s): operator RSS {:.0} MiB ({:+.1} MiB against before they were created); its memory keeps {remembered} clusters (of the {size} real ones)",
        started.elapsed().as_secs_f64(),
        kib as f64 / 1024.0,
        (kib as f64 - before as f64) / 1024.0
    );
}
