//! The guide's fleet upgrade end to end, on the README's walkthrough: `config/samples/` applied
//! as they are, the operator binary reconciling on a real API server with only the Helm chart's
//! RBAC (a token of the chart's ServiceAccount), Pods run by the test kubelet as real
//! valkey-server processes, driven by kubectl. The samples come up Active; patching
//! the shared base config's imageRef rolls every cluster resolving through it (directly or
//! through baseRef) at once, one shard at a time, exactly one failover per shard, replicas
//! never below target, state Active throughout, no acknowledged write lost; a cluster on an
//! unrelated config does not move.

use std::time::Duration;

use harness::k8s::chart::get_json;
use harness::k8s::{ClusterWatch, Product, condition, converged};
use harness::valkey::versions;
use harness::{eventually, metric};
use serde_json::Value;

const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/samples");

#[tokio::test]
async fn the_guides_fleet_upgrade() {
    let product = Product::start(None, &[]).await;
    // The README's walkthrough: the samples, applied as they are.
    product.kubectl(&["apply", "-f", SAMPLES]);

    // The clusters come up; their nodes show Joining, then Active.
    let on_standard = [
        ("team-payments", "sessions"),
        ("team-payments", "ledger-cache"),
        ("team-search", "query-cache"),
    ];
    let mut saw_joining = false;
    eventually("the fleet comes up", Duration::from_secs(240), async || {
        let nodes = product.kubectl(&["get", "valkeynodes", "-n", "team-payments"]);
        saw_joining |= nodes.contains("Joining");
        if on_standard
            .iter()
            .all(|(ns, name)| converged(&product.cluster(ns, name), "9.0.0"))
            && converged(&product.cluster("team-search", "suggestions"), "9.1.2")
        {
            Ok(())
        } else {
            Err(nodes)
        }
    })
    .await;
    assert!(
        saw_joining,
        "kubectl get valkeynodes never showed a Joining node"
    );
    let nodes = product.kubectl(&["get", "valkeynodes", "-n", "team-payments"]);
    assert_eq!(nodes.matches("Active").count(), 6, "{nodes}");

    // Writers and outside samplers on the clusters that will roll.
    let rolling = [
        ("team-payments", "sessions", 2u16),
        ("team-payments", "ledger-cache", 1),
        ("team-search", "query-cache", 1),
    ];
    let mut watches = Vec::new();
    for (ns, name, _) in rolling {
        watches.push(ClusterWatch::start(&product, ns, name).await);
    }
    let edge_nodes_before = product.addresses("team-search", "suggestions");

    // The guide: the new image is registered (the samples did), repoint the shared config.
    let patched = product.patch(
        "valkeyconfig/standard",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    assert!(
        patched.contains("rolls 3 ValkeyClusters at once"),
        "{patched}"
    );

    let mut overlapped = false;
    eventually("the fleet rolls", Duration::from_secs(300), async || {
        let states: Vec<Value> = rolling
            .iter()
            .map(|(ns, name, _)| product.cluster(ns, name))
            .collect();
        for state in &states {
            assert_eq!(
                state["status"]["state"], "Active",
                "state left Active during the roll: {state}"
            );
        }
        overlapped |= states
            .iter()
            .all(|s| condition(s, "Progressing").as_deref() == Some("True"));
        if states.iter().all(|s| converged(s, "9.1.2")) {
            Ok(())
        } else {
            Err(format!("{states:#?}"))
        }
    })
    .await;
    assert!(overlapped, "the clusters did not roll at the same time");

    for ((ns, name, shards), watch) in rolling.iter().zip(watches) {
        let pods_before = watch.pods_before.clone();
        let report = watch.finish(&product).await;
        report.assert_shards(*shards, 1, 1);
        let now: Vec<String> = report.pods_after.values().cloned().collect();
        assert!(versions(&now).await.iter().all(|v| v == "9.1.2"));
        assert!(
            pods_before
                .keys()
                .all(|n| !report.pods_after.contains_key(n)),
            "{ns}/{name}: not every node was replaced"
        );
    }

    // The operator's own count: one failover per shard of each rolled cluster, none elsewhere.
    for (ns, name, shards) in rolling {
        product.assert_failovers(ns, name, u64::from(shards)).await;
    }
    product
        .assert_failovers("team-search", "suggestions", 0)
        .await;
    let metrics = product.operator().metrics().await;
    let sessions = [("cluster", "sessions"), ("namespace", "team-payments")];
    assert_eq!(
        metric(
            &metrics,
            "valkey_operator_cluster_outdated_nodes",
            &sessions
        ),
        Some(0.0),
        "{metrics}"
    );

    // One event per retired node (not one folded series per reason): sessions retired 2 nodes
    // in each of its 2 shards, ledger-cache 2 in its one.
    let retired = get_json(
        &product.plane,
        &[
            "get",
            "events",
            "-n",
            "team-payments",
            "--field-selector",
            "reason=NodeRetired",
            "-o",
            "json",
        ],
    );
    let retired = retired["items"].as_array().map_or(0, Vec::len);
    assert!(
        retired >= 6,
        "{retired} NodeRetired events in team-payments"
    );

    // The cluster on the unrelated config did not move.
    assert_eq!(
        product.addresses("team-search", "suggestions"),
        edge_nodes_before
    );
    assert!(converged(
        &product.cluster("team-search", "suggestions"),
        "9.1.2"
    ));
}
