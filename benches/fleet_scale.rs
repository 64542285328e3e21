//! Fleet-scale benchmark (not a test: it prints figures). The whole product on the test control
//! plane, as the end-to-end tests run it, with a fleet of small clusters (1 shard, 0 replicas) on
//! one config, each Pod a real valkey-server:
//!
//! 1. create the fleet → every cluster Active: wall time, the operator's peak RSS and CPU, and
//!    the API server's request rate (all clients, the test kubelet included);
//! 2. the fleet idle for a minute: the operator's CPU (% of one core) and the API requests;
//! 3. one config patch → every cluster rolled: the same figures;
//! 4. optionally, clusters whose Pods never start (an image the test kubelet has no binary
//!    for), added in batches, with the operator's RSS after each: the memory each cluster costs.
//!
//! Run: `FLEET_SIZE=200 FLEET_OBJECTS=1000 cargo bench --bench fleet_scale` (defaults: 200
//! real clusters, no object-only clusters). Needs `make tools`.

// Test code reports failures by panicking; the house rules against it are for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::k8s::{IMAGES, Product};
use serde_json::Value;

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

/// How many of the namespace's clusters named `prefix-*` are converged on `version`.
fn converged(product: &Product, prefix: &str, version: &str) -> usize {
    let list: Value = serde_json::from_str(&product.kubectl(&[
        "get",
        "valkeyclusters",
        "-n",
        NAMESPACE,
        "-o",
        "json",
    ]))
    .unwrap_or_default();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter(|c| harness::k8s::converged(c, version))
        .count()
}

/// The API server's request count so far (`apiserver_request_total`, every client).
fn api_requests(product: &Product) -> f64 {
    product
        .kubectl(&["get", "--raw", "/metrics"])
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// What the operator and the API server did over a phase.
struct Phase {
    started: Instant,
    cpu: f64,
    requests: f64,
    peak_kib: AtomicU64,
}

impl Phase {
    fn start(product: &Product) -> Self {
        Self {
            started: Instant::now(),
            cpu: product.operator.cpu_seconds().unwrap_or(0.0),
            requests: api_requests(product),
            peak_kib: AtomicU64::new(product.operator.resident_kib().unwrap_or(0)),
        }
    }

    fn sample(&self, product: &Product) {
        if let Some(kib) = product.operator.resident_kib() {
            self.peak_kib.fetch_max(kib, Ordering::Relaxed);
        }
    }

    fn report(&self, product: &Product, what: &str) {
        let seconds = self.started.elapsed().as_secs_f64();
        let cpu = product.operator.cpu_seconds().unwrap_or(0.0) - self.cpu;
        let requests = api_requests(product) - self.requests;
        println!(
            "{what}: {seconds:.1} s; operator CPU {cpu:.1} s ({:.1}% of one core), peak RSS {:.0} MiB; \
             API server {:.1} requests/s",
            100.0 * cpu / seconds,
            self.peak_kib.load(Ordering::Relaxed) as f64 / 1024.0,
            requests / seconds
        );
    }
}

/// Waits, sampling the operator's memory, until `count` clusters named `prefix-*` converge.
async fn until_converged(
    product: &Product,
    phase: &Phase,
    prefix: &str,
    version: &str,
    count: usize,
) {
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        phase.sample(product);
        let done = converged(product, prefix, version);
        if done >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {count} converged after an hour"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
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
    let baseline_kib = product.operator.resident_kib().unwrap_or(0);
    println!(
        "fleet-scale benchmark: {size} clusters of 1 shard × 0 replicas; operator RSS before {:.0} MiB",
        baseline_kib as f64 / 1024.0
    );

    let phase = Phase::start(&product);
    product.apply(&clusters_yaml("c", "scale", 0..size));
    until_converged(&product, &phase, "c-", "9.0.0", size).await;
    phase.report(&product, &format!("create → {size} Active"));

    // Settle, then a minute of nothing.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let idle = Phase::start(&product);
    tokio::time::sleep(Duration::from_secs(60)).await;
    idle.sample(&product);
    idle.report(
        &product,
        &format!("idle minute with {size} converged clusters"),
    );

    let phase = Phase::start(&product);
    product.patch(
        "valkeyconfig/scale",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    until_converged(&product, &phase, "c-", "9.1.2", size).await;
    phase.report(&product, &format!("one patch → {size} rolled"));

    if objects == 0 {
        return;
    }
    // Clusters whose Pods never start: their objects and the operator's caches, no servers.
    let before = product.operator.resident_kib().unwrap_or(0);
    let batch = 100;
    let mut added = 0;
    while added < objects {
        let next = (added + batch).min(objects);
        product.apply(&clusters_yaml("o", "never", added..next));
        added = next;
        tokio::time::sleep(Duration::from_secs(15)).await;
        let kib = product.operator.resident_kib().unwrap_or(0);
        println!(
            "  + {added} clusters whose Pods never start: operator RSS {:.0} MiB ({:+.1} KiB per cluster so far)",
            kib as f64 / 1024.0,
            (kib as f64 - before as f64) / added as f64
        );
    }
}
