//! Admission latency and throughput (a benchmark, not a test): ValkeyConfig updates that change
//! a root config's image, against a fleet index of 10,000 clusters and 1,000 configs in baseRef
//! chains of depth 4, over real HTTPS with keep-alive. Prints p50/p99 and requests per second.
//!
//! Run: `cargo bench --bench admission` (target: p99 under 2 ms on the 2-core machine).

use std::time::{Duration, Instant};

use harness::https::{TestServer, admission_review, object};
use serde_json::json;
use valkey_operator::admission::Policy;
use valkey_operator::api::ClusterKey;
use valkey_operator::api::{ValkeyConfigSpec, ValkeyImageSpec};
use valkey_operator::fleet::Fleet;

const CONFIGS: usize = 1_000;
const CHAIN_DEPTH: usize = 4;
const CLUSTERS: usize = 10_000;
const WARMUP: usize = 500;
const SEQUENTIAL: usize = 5_000;
const CONCURRENCY: usize = 4;
const CONCURRENT_PER_TASK: usize = 2_500;

fn config_name(chain: usize, depth: usize) -> String {
    format!("cfg-{chain}-{depth}")
}

fn build_fleet() -> Fleet {
    let mut fleet = Fleet::default();
    for (name, version) in [("valkey-9-0-0", "9.0.0"), ("valkey-9-1-2", "9.1.2")] {
        fleet.upsert_image(
            name,
            ValkeyImageSpec {
                repository: "valkey/valkey".into(),
                tag: version.into(),
                version: version.into(),
            },
        );
    }
    let chains = CONFIGS / CHAIN_DEPTH;
    for chain in 0..chains {
        for depth in 0..CHAIN_DEPTH {
            let spec = if depth == 0 {
                ValkeyConfigSpec {
                    image_ref: Some("valkey-9-0-0".into()),
                    ..Default::default()
                }
            } else {
                ValkeyConfigSpec {
                    base_ref: Some(config_name(chain, depth - 1)),
                    ..Default::default()
                }
            };
            fleet.upsert_config(&config_name(chain, depth), spec);
        }
    }
    for cluster in 0..CLUSTERS {
        let config = config_name(cluster % chains, (cluster / chains) % CHAIN_DEPTH);
        fleet.upsert_cluster(
            ClusterKey::new(
                format!("ns-{}", cluster % 100),
                format!("cluster-{cluster}"),
            ),
            &config,
        );
    }
    fleet
}

/// The body of the i-th request: repoint a root config (each root reaches 4 configs and 40
/// clusters) from 9.0.0 to 9.1.2.
fn request_body(i: usize) -> Vec<u8> {
    let root = config_name(i % (CONFIGS / CHAIN_DEPTH), 0);
    let old = object(
        "ValkeyConfig",
        &root,
        None,
        json!({"imageRef": "valkey-9-0-0"}),
    );
    let new = object(
        "ValkeyConfig",
        &root,
        None,
        json!({"imageRef": "valkey-9-1-2"}),
    );
    serde_json::to_vec(&admission_review(
        "ValkeyConfig",
        "UPDATE",
        &root,
        None,
        Some(new),
        Some(old),
    ))
    .unwrap()
}

async fn timed_request(server: &TestServer, body: Vec<u8>) -> Duration {
    let started = Instant::now();
    let (status, text) = server.post("/validate/valkeyconfigs", body).await;
    let elapsed = started.elapsed();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("rolls 40 ValkeyClusters at once"), "{text}");
    elapsed
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn report(label: &str, mut latencies: Vec<Duration>, wall: Duration) {
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{label}: n={} p50={:.3} ms p90={:.3} ms p99={:.3} ms max={:.3} ms throughput={:.0} req/s",
        latencies.len(),
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.90)),
        ms(percentile(&latencies, 0.99)),
        ms(*latencies.last().unwrap()),
        latencies.len() as f64 / wall.as_secs_f64(),
    );
}

#[tokio::main]
async fn main() {
    let build_started = Instant::now();
    let fleet = build_fleet();
    println!(
        "fleet index: {} clusters, {} configs (chains of depth {CHAIN_DEPTH}), built in {:.1} ms",
        fleet.cluster_count(),
        fleet.config_count(),
        build_started.elapsed().as_secs_f64() * 1000.0
    );
    let dir = tempfile::tempdir().unwrap();
    let server = std::sync::Arc::new(
        TestServer::start(dir.path(), fleet, Policy::default(), Duration::from_secs(5)).await,
    );

    for i in 0..WARMUP {
        timed_request(&server, request_body(i)).await;
    }

    let mut latencies = Vec::with_capacity(SEQUENTIAL);
    let started = Instant::now();
    for i in 0..SEQUENTIAL {
        latencies.push(timed_request(&server, request_body(i)).await);
    }
    report("sequential, 1 connection", latencies, started.elapsed());

    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|task| {
            let server = server.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(CONCURRENT_PER_TASK);
                for i in 0..CONCURRENT_PER_TASK {
                    latencies.push(
                        timed_request(&server, request_body(task * CONCURRENT_PER_TASK + i)).await,
                    );
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    report(
        &format!("concurrent, {CONCURRENCY} in flight"),
        latencies,
        started.elapsed(),
    );

    if let Ok(server) = std::sync::Arc::try_unwrap(server) {
        server.stop().await;
    }
}
