//! ValkeyNode and ValkeyRole admission.

use super::*;

#[test]
fn nodes_come_from_the_operator_and_roles_name_things_once() {
    let mut node = ValkeyNode::new(
        "orders-0-abc",
        ValkeyNodeSpec {
            cluster: "orders".into(),
            shard: 0,
            image: "valkey/valkey:8.1.4".into(),
            version: "8.1.4".into(),
            revision: "r1".into(),
        },
    );
    let verdict = validate_node(&review(
        Operation::Create,
        "orders-0-abc",
        Some(&node),
        None,
    ));
    assert_eq!(verdict.denials.len(), 2);
    assert!(verdict.denials[0].contains("created by the operator"));
    assert!(verdict.denials[1].contains("below the Valkey 9 floor"));
    node.spec.version = "9.0.0".into();
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
    assert!(
        validate_node(&review(
            Operation::Create,
            "orders-0-abc",
            Some(&node),
            None
        ))
        .allowed()
    );

    let role = ValkeyRole::new(
        "reader",
        ValkeyRoleSpec {
            categories: vec![
                Permission {
                    name: "@read".into(),
                    access: Access::Allow,
                },
                Permission {
                    name: "write".into(),
                    access: Access::Deny,
                },
                Permission {
                    name: "WRITE".into(),
                    access: Access::Allow,
                },
            ],
            commands: vec![],
        },
    );
    let verdict = validate_role(&review(Operation::Create, "reader", Some(&role), None));
    assert_eq!(verdict.denials.len(), 2, "{}", joined(&verdict));
    assert!(
        verdict.denials[0].contains("spec.categories[0].name: write \"read\" without ACL syntax")
    );
    assert!(verdict.denials[1].contains("\"WRITE\" is listed twice"));
}
