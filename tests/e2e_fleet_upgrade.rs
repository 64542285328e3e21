//! The guide's fleet upgrade end to end: the operator binary reconciling on a real API server
//! with only the Helm chart's RBAC (a token of the chart's ServiceAccount), Pods run by the
//! test kubelet as real valkey-server processes, driven by kubectl. Patching
//! the shared base config's imageRef rolls every cluster resolving through it (directly or
//! through baseRef) at once, one shard at a time, exactly one failover per shard, replicas
//! never below target, state Active throughout, no acknowledged write lost; a cluster on an
//! unrelated config does not move.

mod roll_support;
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use roll_support::{Sampler, Writer, fewest_replicas, lost_writes, primary_changes, versions};
use serde_json::Value;
use support::chart::{
    ChartIdentity, Operator, control_plane_with_crds, get_json, install, must, repoint_webhooks,
};
use testenv::{ControlPlane, TestKubelet};

const FLEET: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata: {name: valkey-9-0-0}
spec: {repository: valkey/valkey, tag: "9.0.0", version: "9.0.0"}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: standard}
spec: {imageRef: valkey-9-0-0, valkey: {maxmemory-policy: noeviction, save: ""}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: standard-large}
spec: {baseRef: standard, valkey: {maxmemory: 256mb}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: other}
spec: {imageRef: valkey-9-0-0, valkey: {save: ""}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: orders, namespace: team-a}
spec: {configRef: standard, shards: 2, replicasPerShard: 1}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: sessions, namespace: team-b}
spec: {configRef: standard-large, shards: 1, replicasPerShard: 1}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: search, namespace: team-b}
spec: {configRef: other, shards: 1, replicasPerShard: 1}
"#;

const NEW_IMAGE: &str = r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata: {name: valkey-9-1-2}
spec: {repository: valkey/valkey, tag: "9.1.2", version: "9.1.2"}
"#;

fn cluster(plane: &ControlPlane, namespace: &str, name: &str) -> Value {
    get_json(
        plane,
        &["get", "valkeycluster", name, "-n", namespace, "-o", "json"],
    )
}

fn condition(cluster: &Value, type_: &str) -> Option<String> {
    cluster["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str().map(String::from))
}

/// Node name → Pod IP:6379 of a cluster's nodes.
fn addresses(plane: &ControlPlane, namespace: &str, name: &str) -> BTreeMap<String, String> {
    let pods = get_json(
        plane,
        &[
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            &format!("valkey.gomomento.com/cluster={name}"),
            "-o",
            "json",
        ],
    );
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| {
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                format!("{}:6379", p["status"]["podIP"].as_str()?),
            ))
        })
        .collect()
}

fn converged(cluster: &Value, version: &str) -> bool {
    cluster["status"]["state"] == "Active"
        && cluster["status"]["version"] == version
        && cluster["status"]["outdatedNodes"] == 0
        && condition(cluster, "Progressing").as_deref() == Some("False")
}

#[tokio::test]
async fn the_guides_fleet_upgrade() {
    let (plane, helm) = control_plane_with_crds().await;
    install(&helm, &[]);
    let identity = ChartIdentity::from_release(&plane);
    let mut operator = Operator::start(&identity, "operator.log");
    operator.wait_ready(Duration::from_secs(60)).await;
    repoint_webhooks(&plane, &operator.url);
    let _kubelet = TestKubelet::start(plane.client().await.unwrap(), Default::default())
        .await
        .unwrap();
    must(&plane, &["apply", "-f", "-"], Some(FLEET));

    // The clusters come up; their nodes show Joining, then Active.
    let clusters = [
        ("team-a", "orders"),
        ("team-b", "sessions"),
        ("team-b", "search"),
    ];
    let mut saw_joining = false;
    let deadline = Instant::now() + Duration::from_secs(240);
    while !clusters
        .iter()
        .all(|(ns, name)| converged(&cluster(&plane, ns, name), "9.0.0"))
    {
        let nodes = must(&plane, &["get", "valkeynodes", "-n", "team-a"], None);
        saw_joining |= nodes.contains("Joining");
        assert!(
            Instant::now() < deadline,
            "the fleet did not come up:\n{nodes}\n{}",
            operator.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        saw_joining,
        "kubectl get valkeynodes never showed a Joining node"
    );
    let nodes = must(&plane, &["get", "valkeynodes", "-n", "team-a"], None);
    assert_eq!(nodes.matches("Active").count(), 4, "{nodes}");

    // Writers and outside samplers on the two clusters that will roll.
    let rolling = [("team-a", "orders", 2u16), ("team-b", "sessions", 1)];
    let mut watchers = Vec::new();
    for (ns, name, _) in rolling {
        let nodes = addresses(&plane, ns, name);
        let seeds: Vec<String> = nodes.values().cloned().collect();
        let names: Vec<String> = nodes.into_keys().collect();
        watchers.push((Writer::start(seeds.clone()), Sampler::start(seeds), names));
    }
    for (writer, _, _) in &watchers {
        writer.assert_progressing().await;
    }
    let search_nodes_before = addresses(&plane, "team-b", "search");

    // The guide: register the new image, repoint the shared config.
    must(&plane, &["apply", "-f", "-"], Some(NEW_IMAGE));
    let patched = must(
        &plane,
        &[
            "patch",
            "valkeyconfig",
            "standard",
            "--type",
            "merge",
            "-p",
            r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
        ],
        None,
    );
    assert!(
        patched.contains("rolls 2 ValkeyClusters at once"),
        "{patched}"
    );

    let mut overlapped = false;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let states: Vec<Value> = rolling
            .iter()
            .map(|(ns, name, _)| cluster(&plane, ns, name))
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
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the roll did not finish: {states:?}\n{}",
            operator.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(overlapped, "the two clusters did not roll at the same time");

    for ((ns, name, shards), (writer, sampler, names_before)) in rolling.iter().zip(watchers) {
        writer.assert_progressing().await;
        let log = writer.stop().await;
        let samples = sampler.stop().await;
        let now = addresses(&plane, ns, name);
        let now_addresses: Vec<String> = now.values().cloned().collect();
        for shard in 0..*shards {
            let slot = shard * (16384 / shards);
            assert_eq!(
                primary_changes(&samples, slot),
                1,
                "{ns}/{name} shard {shard}: primary changes"
            );
            assert!(
                fewest_replicas(&samples, slot) >= 1,
                "{ns}/{name} shard {shard} dipped below its replica"
            );
        }
        let lost = lost_writes(&now_addresses, log.acked).await;
        assert!(
            lost.is_empty(),
            "{ns}/{name} lost {} of {} acknowledged writes",
            lost.len(),
            log.acked
        );
        assert!(versions(&now_addresses).await.iter().all(|v| v == "9.1.2"));
        assert!(
            names_before.iter().all(|n| !now.contains_key(n)),
            "{ns}/{name}: not every node was replaced"
        );
    }

    // The operator's own count: one failover per shard of each rolled cluster, none elsewhere.
    let metrics = operator.metrics().await;
    for (ns, name, shards) in [("team-a", "orders", 2), ("team-b", "sessions", 1)] {
        let line = format!(
            "valkey_operator_failovers_total{{cluster=\"{name}\",namespace=\"{ns}\"}} {shards}\n"
        );
        assert!(
            metrics.contains(&line),
            "expected {line}in\n{metrics}\n{}",
            operator.log()
        );
    }
    assert!(
        !metrics.contains(r#"failovers_total{cluster="search""#),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"valkey_operator_cluster_outdated_nodes{cluster="orders",namespace="team-a"} 0"#
        ),
        "{metrics}"
    );

    // The cluster on the unrelated config did not move.
    assert_eq!(addresses(&plane, "team-b", "search"), search_nodes_before);
    assert!(converged(&cluster(&plane, "team-b", "search"), "9.0.0"));
}
