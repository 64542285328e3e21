//! Figures for the test environment, printed (not asserted): warm start of the control
//! plane (launch -> /readyz), its memory once settled, and how long a Pod takes from
//! creation through the API to a Ready valkey-server.
//!
//! Run: `cargo bench -p testenv --bench control_plane` (binaries already built). Under
//! `cargo test --all-targets` (no `--bench` argument) it makes one quick pass instead.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use testenv::{ControlPlane, TestKubelet};

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn summary(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{label}: min {:.0} ms, median {:.0} ms, max {:.0} ms ({} runs)",
        ms(samples[0]),
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let runs = if full { 5 } else { 1 };
    // Build or locate the binaries first so that the first start is not charged for it.
    let bin_dir = testenv::k8s_bin_dir().expect("Kubernetes binaries");
    let options = testenv::ControlPlaneOptions {
        bin_dir: Some(bin_dir),
        ..Default::default()
    };

    let mut starts = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let cp = ControlPlane::start_with(options.clone())
            .await
            .expect("start");
        starts.push(started.elapsed());
        drop(cp);
    }
    summary("control plane warm start (launch -> /readyz)", starts);

    let cp = ControlPlane::start_with(options).await.expect("start");
    let client = cp.client().await.expect("client");
    let kubelet = TestKubelet::start(client.clone(), Default::default())
        .await
        .expect("kubelet");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut pod_ready = Vec::new();
    for i in 0..runs {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("bench-{i}")},
            "spec": {"containers": [{"name": "valkey", "image": "valkey/valkey:9.1.2",
                "args": ["--bind", "$(POD_IP)", "--save", ""],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]},
        }))
        .expect("pod");
        let started = Instant::now();
        // The first create waits for the namespace's default ServiceAccount.
        while pods.create(&PostParams::default(), &pod).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(60), "Pod refused");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        loop {
            let current = pods.get(&format!("bench-{i}")).await.expect("get");
            let ready = current
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "Pod not Ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        pod_ready.push(started.elapsed());
    }
    summary("Pod create -> Ready valkey-server", pod_ready);

    // Let start-up work (caches, controllers' initial lists) settle before measuring.
    if full {
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let mut total = 0.0;
    for (name, pid) in cp.pids() {
        let rss = rss_mib(pid);
        total += rss;
        println!("RSS {name}: {rss:.0} MiB");
    }
    println!(
        "RSS control plane total (etcd + kube-apiserver + kube-controller-manager): {total:.0} MiB"
    );
    drop(kubelet);
}
