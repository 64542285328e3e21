//! [`decide`] on hand-built Pods, clusters and nodes: each check in its order.

use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use kube::api::ObjectMeta;

use super::*;
use crate::api::{ValkeyClusterSpec, ValkeyNodeSpec};

fn now() -> Timestamp {
    "2026-11-30T12:00:00Z".parse().unwrap()
}

fn pod(role: &str, ready: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("orders-0-a1b2c".into()),
            labels: Some(
                [
                    (labels::MANAGED_BY, labels::MANAGED_BY_VALUE),
                    (labels::CLUSTER, "orders"),
                    (labels::ROLE, role),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            ..Default::default()
        },
        spec: None,
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn cluster(replicas_per_shard: i32) -> ValkeyCluster {
    let spec: ValkeyClusterSpec = serde_json::from_value(serde_json::json!({
        "configRef": "standard",
        "shards": 3,
        "replicasPerShard": replicas_per_shard,
    }))
    .unwrap();
    ValkeyCluster::new("orders", spec)
}

fn node(requested: Option<&str>) -> ValkeyNode {
    let mut node = ValkeyNode::new(
        "orders-0-a1b2c",
        ValkeyNodeSpec {
            cluster: "orders".into(),
            shard: 0,
            image: "valkey/valkey:9.0.0".into(),
            version: "9.0.0".into(),
            revision: "abc".into(),
        },
    );
    if let Some(at) = requested {
        node.metadata.annotations = Some([(HANDOVER_REQUESTED.to_string(), at.to_string())].into());
    }
    node
}

fn deferred_at(decision: Decision) -> Timestamp {
    match decision {
        Decision::Defer {
            requested_at,
            message,
            node,
        } => {
            assert_eq!(node, "orders-0-a1b2c");
            assert!(
                message.contains("shard 0 of ValkeyCluster orders"),
                "{message}"
            );
            requested_at
        }
        other => panic!("expected a deferral, got {other:?}"),
    }
}

#[test]
fn a_ready_primary_with_replicas_is_deferred_for_a_handover() {
    let decision = decide(
        &pod("primary", true),
        Some(&cluster(1)),
        Some(&node(None)),
        now(),
    );
    assert_eq!(deferred_at(decision), now());
}

#[test]
fn replicas_dead_primaries_strangers_and_lone_primaries_are_left_to_the_budget() {
    let (c, n) = (cluster(1), node(None));
    let allowed = |pod: &Pod, c: Option<&ValkeyCluster>, n: Option<&ValkeyNode>| {
        matches!(decide(pod, c, n, now()), Decision::Allow { .. })
    };
    assert!(allowed(&pod("replica", true), Some(&c), Some(&n)));
    assert!(allowed(&pod("primary", false), Some(&c), Some(&n)));
    let mut stranger = pod("primary", true);
    stranger.metadata.labels = None;
    assert!(allowed(&stranger, Some(&c), Some(&n)));
    assert!(allowed(&pod("primary", true), Some(&cluster(0)), Some(&n)));
    assert!(allowed(&pod("primary", true), None, Some(&n)));
}

#[test]
fn a_standing_request_is_kept_until_it_is_given_up_and_a_stale_one_starts_over() {
    let primary = pod("primary", true);
    let c = cluster(1);
    let recent = node(Some("2026-11-30T11:59:30Z"));
    assert_eq!(
        deferred_at(decide(&primary, Some(&c), Some(&recent), now())),
        "2026-11-30T11:59:30Z".parse::<Timestamp>().unwrap()
    );
    let overdue = node(Some("2026-11-30T11:57:00Z"));
    assert!(matches!(
        decide(&primary, Some(&c), Some(&overdue), now()),
        Decision::Allow { .. }
    ));
    for stale in ["2026-11-30T11:50:00Z", "not a time"] {
        let stale = node(Some(stale));
        assert_eq!(
            deferred_at(decide(&primary, Some(&c), Some(&stale), now())),
            now()
        );
    }
}
