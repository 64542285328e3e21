//! Fleet roll benchmark on the whole product (not a test: it prints figures).
//!
//! The operator binary runs under the chart's identity against the test control plane, with the
//! test kubelet running Pods as real valkey-server processes, exactly as the end-to-end tests
//! do. Four clusters of 3 shards × 1 replica come up on 9.0.0. First one cluster alone is rolled
//! to 9.1.2, then a fleet of three sharing one config, all at once. It prints the wall time of
//! each roll (from the `kubectl patch` to every cluster converged), each cluster's longest gap
//! between acknowledged writes (its failovers' write unavailability, as a client sees it), and
//! the operator's resident memory, idle and at its peak while the fleet rolls.
//!
//! Run: `cargo bench --bench fleet` (needs `make tools`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::k8s::{ClusterWatch, IMAGES, Product};

const SHARDS: u16 = 3;

fn fleet_yaml() -> String {
    let mut yaml = String::from(
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: bench}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: solo}
spec: {imageRef: valkey-9-0-0, valkey: {save: ""}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: shared}
spec: {imageRef: valkey-9-0-0, valkey: {save: ""}}
"#,
    );
    for (name, config) in [
        ("solo", "solo"),
        ("fleet-a", "shared"),
        ("fleet-b", "shared"),
        ("fleet-c", "shared"),
    ] {
        yaml.push_str(&format!(
            "---\napiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyCluster\n\
             metadata: {{name: {name}, namespace: bench}}\n\
             spec: {{configRef: {config}, shards: {SHARDS}, replicasPerShard: 1}}\n"
        ));
    }
    yaml
}

fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}

/// Rolls `clusters` by pointing `config` at 9.1.2; prints the time and each writer's longest gap.
async fn roll(product: &Product, config: &str, clusters: &[&str]) {
    let mut watches = Vec::new();
    for name in clusters {
        watches.push(ClusterWatch::start(product, "bench", name).await);
    }
    let started = Instant::now();
    product.patch(
        &format!("valkeyconfig/{config}"),
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    let targets: Vec<(&str, &str)> = clusters.iter().map(|name| ("bench", *name)).collect();
    product
        .wait_converged(&targets, "9.1.2", Duration::from_secs(900))
        .await;
    let took = started.elapsed();
    println!(
        "  {} cluster(s) of {SHARDS} shards × 1 replica rolled 9.0.0 → 9.1.2 in {:.1} s",
        clusters.len(),
        took.as_secs_f64()
    );
    for watch in watches {
        let name = watch.name.clone();
        let report = watch.finish(product).await;
        report.assert_shards(SHARDS, 1, 1);
        println!(
            "    {name}: longest gap between acknowledged writes {:.3} s, {} writes, none lost",
            report.longest_write_gap().as_secs_f64(),
            report.log.acked
        );
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&fleet_yaml());
    let all = [
        ("bench", "solo"),
        ("bench", "fleet-a"),
        ("bench", "fleet-b"),
        ("bench", "fleet-c"),
    ];
    let started = Instant::now();
    product
        .wait_converged(&all, "9.0.0", Duration::from_secs(600))
        .await;
    println!(
        "fleet benchmark: 4 clusters ({} valkey-server Pods) Active in {:.1} s",
        all.len() * usize::from(SHARDS) * 2,
        started.elapsed().as_secs_f64()
    );
    let idle = product.operator().resident_kib().unwrap_or(0);

    println!("one cluster alone:");
    roll(&product, "solo", &["solo"]).await;

    // Peak resident memory while the fleet rolls, sampled every 100 ms.
    let peak = AtomicU64::new(idle);
    let sample_memory = async {
        loop {
            if let Some(kib) = product.operator().resident_kib() {
                peak.fetch_max(kib, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    println!("a fleet of three on one config, all at once:");
    tokio::select! {
        () = roll(&product, "shared", &["fleet-a", "fleet-b", "fleet-c"]) => {}
        () = sample_memory => {}
    }
    println!(
        "operator resident memory: {} idle with 4 clusters, {} peak while three rolled",
        mib(idle),
        mib(peak.load(Ordering::Relaxed))
    );
    // The operator's log goes with the control plane's temporary folder; keep it to read where
    // the time went.
    let kept = std::env::temp_dir().join("valkey-operator-fleet-bench.log");
    match std::fs::write(&kept, product.operator().log()) {
        Ok(()) => println!("the operator's log is kept in {}", kept.display()),
        Err(error) => println!("the operator's log could not be kept: {error}"),
    }
}
