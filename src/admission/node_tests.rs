//! ValkeyNode and ValkeyRole admission.

use super::*;
use crate::admission::fixtures::*;

/// The node `orders-0-abc` on `version`, owned by nothing yet.
fn node(version: &str) -> ValkeyNode {
    ValkeyNode::new(
        "orders-0-abc",
        ValkeyNodeSpec {
            cluster: "orders".into(),
            shard: 0,
            image: format!("valkey/valkey:{version}"),
            version: version.into(),
            revision: "r1".into(),
        },
    )
}

/// A controller ownerReference to the cluster `orders` (which anyone can write).
fn owned_by_orders(node: &mut ValkeyNode) {
    node.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "valkey.gomomento.com/v1alpha1".into(),
            kind: "ValkeyCluster".into(),
            name: "orders".into(),
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    ]);
}

#[test]
fn nodes_come_from_the_operator_and_roles_name_things_once() {
    let mut node = node("8.1.4");
    let verdict = validate_node(
        &review(Operation::Create, "orders-0-abc", Some(&node), None),
        &Policy::default(),
    );
    assert_eq!(verdict.denials.len(), 2);
    assert!(verdict.denials[0].contains("created by the operator"));
    assert!(verdict.denials[1].contains("below the Valkey 9 floor"));
    node.spec.version = "9.0.0".into();
    owned_by_orders(&mut node);
    assert!(
        validate_node(
            &review(Operation::Create, "orders-0-abc", Some(&node), None),
            &Policy::default()
        )
        .allowed()
    );

    let role = ValkeyRole::new(
        "reader",
        ValkeyRoleSpec {
            categories: vec![
                Permission {
                    name: "@read".into(),
                    subcommand: None,
                    access: Access::Allow,
                },
                Permission {
                    name: "write".into(),
                    subcommand: None,
                    access: Access::Deny,
                },
                Permission {
                    name: "WRITE".into(),
                    subcommand: None,
                    access: Access::Allow,
                },
            ],
            commands: vec![],
        },
    );
    let verdict = validate_role(
        &review(Operation::Create, "reader", Some(&role), None),
        &Fleet::default(),
    );
    assert_eq!(verdict.denials.len(), 2, "{}", joined(&verdict));
    assert!(
        verdict.denials[0].contains("spec.categories[0].name: write \"read\" without ACL syntax")
    );
    assert!(verdict.denials[1].contains("\"WRITE\" is listed twice"));
}

#[test]
fn only_the_operator_writes_a_node_spec() {
    let mut node = node("9.0.0");
    owned_by_orders(&mut node);
    let operator = "system:serviceaccount:valkey-operator:valkey-operator";
    let policy = Policy {
        node_writer: Some(operator.into()),
        ..Policy::default()
    };
    let as_user = |user: Option<&'static str>, object: &ValkeyNode, old: Option<&ValkeyNode>| {
        let mut review = review(
            if old.is_some() {
                Operation::Update
            } else {
                Operation::Create
            },
            "orders-0-abc",
            Some(object),
            old,
        );
        review.user = user;
        validate_node(&review, &policy)
    };
    assert!(as_user(Some(operator), &node, None).allowed());
    // A forged ownerReference is not enough.
    let verdict = as_user(Some("alice"), &node, None);
    assert_eq!(verdict.denials.len(), 1, "{}", joined(&verdict));
    assert!(
        verdict.denials[0].starts_with(&format!(
            "ValkeyNodes are written only by the operator ({operator}), not by alice"
        )),
        "{}",
        joined(&verdict)
    );
    assert!(!as_user(None, &node, None).allowed());

    // Someone else may change labels, annotations and finalizers, not the spec.
    let mut labelled = node.clone();
    labelled.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    assert!(as_user(Some("alice"), &labelled, Some(&node)).allowed());
    let mut swapped = node.clone();
    swapped.spec.image = "evil/miner:9.0.0".into();
    assert!(!as_user(Some("alice"), &swapped, Some(&node)).allowed());
}
