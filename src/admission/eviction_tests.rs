//! [`decide`] on hand-built Pods, clusters and nodes: each check in its order.

use k8s_openapi::api::core::v1::{NodeSpec, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

use super::*;
use crate::api::{ValkeyClusterSpec, ValkeyNodeSpec, ValkeyNodeStatus};

fn now() -> Timestamp {
    "2026-11-30T12:00:00Z".parse().unwrap()
}

const NODE_UID: &str = "uid-of-orders-0-a1b2c";

/// The Pod of `orders-0-a1b2c`, owned by it.
fn pod(ready: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("orders-0-a1b2c".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "valkey.gomomento.com/v1alpha1".into(),
                kind: "ValkeyNode".into(),
                name: "orders-0-a1b2c".into(),
                uid: NODE_UID.into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
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

fn valkey_node(name: &str, role: NodeRole, requested: Option<&str>) -> ValkeyNode {
    let mut node = ValkeyNode::new(
        name,
        ValkeyNodeSpec {
            cluster: "orders".into(),
            shard: 0,
            image: "valkey/valkey:9.0.0".into(),
            version: "9.0.0".into(),
            revision: "abc".into(),
        },
    );
    node.metadata.uid = Some(format!("uid-of-{name}"));
    node.status = Some(ValkeyNodeStatus {
        role: Some(role),
        ..Default::default()
    });
    if let Some(at) = requested {
        node.metadata.annotations = Some([(HANDOVER_REQUESTED.to_string(), at.to_string())].into());
    }
    node
}

fn node(requested: Option<&str>) -> ValkeyNode {
    valkey_node("orders-0-a1b2c", NodeRole::Primary, requested)
}

fn facts<'a>(
    pod: &'a Pod,
    cluster: Option<&'a ValkeyCluster>,
    node: Option<&'a ValkeyNode>,
) -> Facts<'a> {
    Facts {
        pod,
        cluster,
        node,
        shard: &[],
        confirmation: Confirmation::CertifiedCaller,
        now: now(),
    }
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
    let (p, c, n) = (pod(true), cluster(1), node(None));
    assert_eq!(deferred_at(decide(&facts(&p, Some(&c), Some(&n)))), now());
}

#[test]
fn the_primary_of_a_shard_without_replicas_is_deferred_to_be_moved_first() {
    let (p, c, n) = (pod(true), cluster(0), node(None));
    let decision = decide(&facts(&p, Some(&c), Some(&n)));
    assert!(
        matches!(&decision, Decision::Defer { message, .. } if message.contains("which has no replica")),
        "{decision:?}"
    );
    assert_eq!(deferred_at(decision), now());
}

#[test]
fn a_ready_replica_is_deferred_until_it_is_replaced() {
    let (p, c) = (pod(true), cluster(1));
    let replica = valkey_node("orders-0-a1b2c", NodeRole::Replica, None);
    let decision = decide(&facts(&p, Some(&c), Some(&replica)));
    assert!(
        matches!(&decision, Decision::Defer { message, .. } if message.contains("replacing it first")),
        "{decision:?}"
    );
    assert_eq!(deferred_at(decision), now());
}

#[test]
fn dead_nodes_and_strangers_are_left_to_the_budget() {
    let (c, n) = (cluster(1), node(None));
    let allowed = |f: Facts| matches!(decide(&f), Decision::Allow { .. });
    assert!(allowed(facts(&pod(false), Some(&c), Some(&n))));
    // A Pod its node does not own (another of that name, or none at all): not ours.
    let mut stranger = pod(true);
    stranger.metadata.owner_references = None;
    assert!(allowed(facts(&stranger, Some(&c), Some(&n))));
    assert!(allowed(facts(&pod(true), Some(&c), None)));
    assert!(allowed(facts(&pod(true), None, Some(&n))));
}

#[test]
fn labels_say_nothing_only_the_operators_records_do() {
    let (c, n) = (cluster(1), node(None));
    // Labels a tenant could set: a primary's label on a Pod the operator calls a replica.
    let mut labelled = pod(true);
    labelled.metadata.labels = Some(
        [(labels::ROLE.to_string(), "primary".to_string())]
            .into_iter()
            .collect(),
    );
    let replica = valkey_node("orders-0-a1b2c", NodeRole::Replica, None);
    assert!(matches!(
        decide(&facts(&labelled, Some(&c), Some(&replica))),
        Decision::Defer { message, .. } if message.contains("is a replica of shard")
    ));
    // And no label at all on a primary's Pod: still the primary.
    assert_eq!(
        deferred_at(decide(&facts(&pod(true), Some(&c), Some(&n)))),
        now()
    );
}

#[test]
fn an_unconfirmed_eviction_asks_for_nothing() {
    let (p, c, n) = (pod(true), cluster(1), node(None));
    let unconfirmed = Facts {
        confirmation: Confirmation::Unconfirmed,
        ..facts(&p, Some(&c), Some(&n))
    };
    assert!(
        matches!(decide(&unconfirmed), Decision::Allow { reason } if reason.contains("cannot be confirmed"))
    );
    let draining = Facts {
        confirmation: Confirmation::NodeDraining,
        ..facts(&p, Some(&c), Some(&n))
    };
    assert_eq!(deferred_at(decide(&draining)), now());
}

#[test]
fn a_node_is_draining_when_cordoned_or_tainted_to_keep_pods_away() {
    let tainted = |unschedulable: Option<bool>, key: &str, effect: Option<&str>| Node {
        spec: Some(NodeSpec {
            unschedulable,
            taints: effect.map(|effect| {
                vec![Taint {
                    key: key.into(),
                    effect: effect.into(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let node = |unschedulable, effect| tainted(unschedulable, "karpenter.sh/disrupted", effect);
    let any = Pod::default();
    // An unhealthy Node is tainted by Kubernetes itself: that is no drain.
    assert!(!draining(
        &tainted(None, "node.kubernetes.io/not-ready", Some("NoSchedule")),
        &any
    ));
    assert!(!draining(
        &tainted(None, "node.kubernetes.io/unreachable", Some("NoExecute")),
        &any
    ));
    assert!(draining(&node(Some(true), None), &any));
    assert!(draining(&node(None, Some("NoSchedule")), &any));
    assert!(draining(&node(None, Some("NoExecute")), &any));
    assert!(!draining(&node(None, Some("PreferNoSchedule")), &any));
    assert!(!draining(&node(Some(false), None), &any));
    assert!(!draining(&Node::default(), &any));

    // A pool's standing taint that the Pod tolerates is no drain; a drain's taint still is.
    let pool = Node {
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "dedicated".into(),
                value: Some("valkey".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let tolerating = |key: Option<&str>, operator: Option<&str>, value: Option<&str>| Pod {
        spec: Some(PodSpec {
            tolerations: Some(vec![Toleration {
                key: key.map(String::from),
                operator: operator.map(String::from),
                value: value.map(String::from),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(
        draining(&pool, &any),
        "not tolerated: it keeps the Pod away"
    );
    assert!(!draining(
        &pool,
        &tolerating(Some("dedicated"), None, Some("valkey"))
    ));
    assert!(!draining(
        &pool,
        &tolerating(Some("dedicated"), Some("Exists"), None)
    ));
    assert!(!draining(&pool, &tolerating(None, Some("Exists"), None)));
    assert!(draining(
        &pool,
        &tolerating(Some("dedicated"), None, Some("cache"))
    ));
    let mut drained = pool.clone();
    if let Some(taints) = drained.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        taints.push(Taint {
            key: "ToBeDeletedByClusterAutoscaler".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
    }
    assert!(draining(
        &drained,
        &tolerating(Some("dedicated"), None, Some("valkey"))
    ));
}

#[test]
fn handovers_of_one_shard_are_paced() {
    let (p, c, n) = (pod(true), cluster(1), node(None));
    let other = |at: &str| valkey_node("orders-0-zzzzz", NodeRole::Replica, Some(at));
    let recent = [other("2026-11-30T11:59:40Z")];
    let paced = Facts {
        shard: &recent,
        ..facts(&p, Some(&c), Some(&n))
    };
    match decide(&paced) {
        Decision::Retry { message } => {
            assert!(
                message.contains("20s ago; retry the eviction in 40s"),
                "{message}"
            )
        }
        other => panic!("expected a retry, got {other:?}"),
    }
    let old = [other("2026-11-30T11:58:00Z")];
    let past = Facts {
        shard: &old,
        ..facts(&p, Some(&c), Some(&n))
    };
    assert_eq!(deferred_at(decide(&past)), now());
}

#[test]
fn a_standing_request_is_kept_until_it_is_given_up_and_a_stale_one_starts_over() {
    let (p, c) = (pod(true), cluster(1));
    let decide_with = |requested: &str| {
        let n = node(Some(requested));
        decide(&facts(&p, Some(&c), Some(&n)))
    };
    assert_eq!(
        deferred_at(decide_with("2026-11-30T11:59:30Z")),
        "2026-11-30T11:59:30Z".parse::<Timestamp>().unwrap()
    );
    assert!(matches!(
        decide_with("2026-11-30T11:57:00Z"),
        Decision::Allow { .. }
    ));
    for stale in ["2026-11-30T11:50:00Z", "not a time"] {
        assert_eq!(deferred_at(decide_with(stale)), now());
    }
    // A time ahead of the operator's clock counts as now: never a request that cannot expire.
    assert_eq!(deferred_at(decide_with("2100-01-01T00:00:00Z")), now());
}
