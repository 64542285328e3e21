//! The API server gone for 20 s in the middle of a fleet roll, end to end: two clusters on one
//! config roll at once; once both have started, the kube-apiserver process is paused (SIGSTOP:
//! every request hangs, as in a partition or an overloaded control plane) for 20 s and then
//! resumed. The operator cannot renew its Lease, steps down (fenced: the reconciles in flight
//! are dropped), takes the Lease back once the API answers, and finishes both rolls: one
//! failover per shard, never fewer than one replica, Valkey serving throughout, no
//! acknowledged write lost.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product, condition};
use harness::{eventually, signal};

static FLEET: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("outage")
        .config("shared", "{imageRef: valkey-9-0-0}")
        .cluster(("outage", "orders"), "shared", 2, 1)
        .cluster(("outage", "carts"), "shared", 2, 1)
        .yaml()
});

const CLUSTERS: [(&str, &str); 2] = [("outage", "orders"), ("outage", "carts")];

#[tokio::test]
async fn a_fleet_roll_survives_the_api_server_gone_for_20_seconds() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&FLEET);
    product
        .wait_converged(&CLUSTERS, "9.0.0", Duration::from_secs(240))
        .await;
    let mut watches = Vec::new();
    for (namespace, name) in CLUSTERS {
        watches.push(ClusterWatch::start(&product, namespace, name).await);
    }
    let apiserver = product
        .plane
        .pids()
        .into_iter()
        .find(|(name, _)| name == "kube-apiserver")
        .map(|(_, pid)| pid)
        .expect("the kube-apiserver process");

    product.patch(
        "valkeyconfig/shared",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    eventually("both rolls to start", Duration::from_secs(60), async || {
        CLUSTERS.iter().all(|(namespace, name)| {
            let cluster = product.cluster(namespace, name);
            condition(&cluster, "Progressing").as_deref() == Some("True")
        })
    })
    .await;

    let paused = Instant::now();
    signal(apiserver, "-STOP");
    tokio::time::sleep(Duration::from_secs(20)).await;
    // Valkey does not need the API server: the clusters keep taking writes throughout.
    for watch in &watches {
        watch.assert_writing().await;
    }
    signal(apiserver, "-CONT");

    product
        .wait_converged(&CLUSTERS, "9.1.2", Duration::from_secs(240))
        .await;
    let finished = paused.elapsed();
    for watch in watches {
        let report = watch.finish(&product).await;
        report.assert_shards(2, 1, 1);
        println!(
            "api outage | {}: rolled to 9.1.2, {} acknowledged writes, none lost, longest write gap {:.3} s",
            report.cluster,
            report.log.acked,
            report.longest_write_gap().as_secs_f64()
        );
    }
    let log = product.operator().log();
    assert!(
        log.contains("stepping down") || log.contains("lost the lease"),
        "the operator noticed it could not renew its Lease"
    );
    println!(
        "api outage | API server paused 20 s mid-roll; both rolls finished {:.1} s after the pause began",
        finished.as_secs_f64()
    );
}
