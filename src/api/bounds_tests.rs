use std::collections::BTreeMap;

use super::*;
use crate::api::{AclPermission, KeyAccess, KeyPermission};

fn spec(shards: i32, replicas: i32) -> ValkeyClusterSpec {
    ValkeyClusterSpec::new("standard", shards, replicas)
}

fn fields(problems: &[Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.field.as_str()).collect()
}

#[test]
fn a_plain_cluster_has_no_problem() {
    assert_eq!(cluster_problems("orders", &spec(3, 1)), vec![]);
    assert_eq!(cap_problems(&spec(3, 1), None, &Caps::default()), vec![]);
}

#[test]
fn names_that_would_make_invalid_node_or_service_names_are_refused() {
    let longest = "a".repeat(MAX_CLUSTER_NAME);
    assert_eq!(cluster_problems(&longest, &spec(1, 0)), vec![]);
    let problems = cluster_problems(&"a".repeat(60), &spec(1, 0));
    assert_eq!(fields(&problems), ["metadata.name"]);
    assert!(problems[0].message.contains("at most 50"), "{problems:?}");
    assert_eq!(
        fields(&cluster_problems("1orders", &spec(1, 0))),
        ["metadata.name"]
    );
    assert_eq!(
        fields(&cluster_problems("orders.eu", &spec(1, 0))),
        ["metadata.name"]
    );
}

#[test]
fn shape_is_bounded_by_slots_replicas_and_nodes() {
    let problems = cluster_problems("c", &spec(100_000, 1));
    assert!(fields(&problems).contains(&"spec.shards"), "{problems:?}");
    assert!(problems[0].message.contains("16384"), "{problems:?}");
    let problems = cluster_problems("c", &spec(1, 500));
    assert_eq!(fields(&problems), ["spec.replicasPerShard"]);
    assert!(problems[0].message.contains("0 to 15"));
    assert_eq!(fields(&cluster_problems("c", &spec(0, 1))), ["spec.shards"]);
    assert_eq!(
        fields(&cluster_problems("c", &spec(1, -1))),
        ["spec.replicasPerShard"]
    );
    // 1000 shards of 3 nodes: each number is fine, the total is not.
    let problems = cluster_problems("c", &spec(1000, 2));
    assert_eq!(fields(&problems), ["spec.shards"]);
    assert!(problems[0].message.contains("3000 nodes"), "{problems:?}");
    assert_eq!(cluster_problems("c", &spec(i32::MAX, i32::MAX)).len(), 3);
}

#[test]
fn caps_refuse_growth_only() {
    let caps = Caps {
        max_shards: 10,
        max_replicas_per_shard: 2,
    };
    assert_eq!(
        fields(&cap_problems(&spec(11, 3), None, &caps)),
        ["spec.shards", "spec.replicasPerShard"]
    );
    let message = &cap_problems(&spec(11, 0), None, &caps)[0].message;
    assert!(
        message.contains("maxShards") && message.contains("10"),
        "{message}"
    );
    // Already above a lowered cap: unchanged or shrinking is fine, growing is not.
    let old = spec(20, 4);
    assert_eq!(cap_problems(&spec(20, 4), Some(&old), &caps), vec![]);
    assert_eq!(cap_problems(&spec(15, 3), Some(&old), &caps), vec![]);
    assert_eq!(
        fields(&cap_problems(&spec(21, 4), Some(&old), &caps)),
        ["spec.shards"]
    );
}

#[test]
fn lists_are_bounded_before_their_entries_are_read() {
    let mut many = spec(1, 0);
    many.acl = (0..=MAX_ACL_USERS)
        .map(|i| AclUser {
            username: format!("u{i}"),
            password_hashes: vec![],
            password_secret_ref: None,
            permissions: vec![],
        })
        .collect();
    let problems = cluster_problems("c", &many);
    assert_eq!(fields(&problems), ["spec.acl"]);
    assert!(problems[0].message.contains("65 users; at most 64"));
}

#[test]
fn acl_entries_name_their_path() {
    let mut with_user = spec(1, 0);
    with_user.acl = vec![AclUser {
        username: "app".into(),
        password_hashes: vec![],
        password_secret_ref: None,
        permissions: vec![AclPermission {
            role_ref: "Bad_Role".into(),
            channels: vec![],
            keys: vec![KeyPermission {
                pattern: "k".repeat(MAX_KEY_PATTERN + 1),
                access: KeyAccess::Read,
            }],
        }],
    }];
    assert_eq!(
        fields(&cluster_problems("c", &with_user)),
        [
            "spec.acl[0].permissions[0].roleRef",
            "spec.acl[0].permissions[0].keys[0].pattern"
        ]
    );
}

#[test]
fn placement_values_follow_kubernetes_label_rules() {
    let mut placed = spec(1, 0);
    placed.placement = Some(Placement {
        zones: vec!["eu-west-1a".into(), "".into(), "bad zone".into()],
        zone_spread: None,
        primary_spread: None,
        node_selector: BTreeMap::from([
            ("disktype".into(), "ssd".into()),
            ("bad key!".into(), "x".into()),
            ("pool".into(), "-x".into()),
        ]),
    });
    assert_eq!(
        fields(&cluster_problems("c", &placed)),
        [
            "spec.placement.zones[1]",
            "spec.placement.zones[2]",
            "spec.placement.nodeSelector[\"bad key!\"]",
            "spec.placement.nodeSelector[\"pool\"]",
        ]
    );
}

#[test]
fn pod_annotation_keys_are_qualified_names_and_bounded_in_size() {
    let mut annotated = spec(1, 0);
    annotated.pod_annotations = BTreeMap::from([
        ("bad key!".into(), "x".into()),
        (
            "example.com/team".into(),
            "x".repeat(MAX_POD_ANNOTATION_BYTES),
        ),
    ]);
    let problems = cluster_problems("c", &annotated);
    assert_eq!(
        fields(&problems),
        ["spec.podAnnotations[\"bad key!\"]", "spec.podAnnotations"]
    );
    assert!(problems[0].message.contains("not a valid annotation key"));
}

#[test]
fn configs_roles_and_images_are_bounded_too() {
    use crate::api::{Access, Permission};
    let mut config = ValkeyConfigSpec {
        image_ref: Some("Valkey 9".into()),
        ..Default::default()
    };
    config.valkey = (0..=MAX_SETTINGS)
        .map(|i| (format!("s{i}"), "1".into()))
        .collect();
    assert_eq!(
        fields(&config_problems(&config)),
        ["spec.imageRef", "spec.valkey"]
    );
    config.valkey = BTreeMap::from([("maxmemory".into(), "1".repeat(MAX_SETTING_VALUE + 1))]);
    assert_eq!(
        fields(&config_problems(&config))[1],
        "spec.valkey[\"maxmemory\"]"
    );

    let entry = |name: &str| Permission {
        name: name.into(),
        subcommand: None,
        access: Access::Allow,
    };
    let role = ValkeyRoleSpec {
        categories: vec![entry("read"), entry(&"x".repeat(MAX_ROLE_NAME + 1))],
        commands: (0..=MAX_ROLE_ENTRIES).map(|_| entry("get")).collect(),
    };
    assert_eq!(
        fields(&role_problems(&role)),
        ["spec.categories[1].name", "spec.commands"]
    );

    let image = ValkeyImageSpec {
        repository: "valkey/valkey".into(),
        tag: "t".repeat(MAX_TAG + 1),
        version: "9.0.0".into(),
    };
    assert_eq!(fields(&image_problems(&image)), ["spec.tag"]);
}

/// The CRD schema carries the same numbers as the constants (the attributes need literals).
#[test]
fn the_crd_schema_states_the_same_limits() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(crate::api::ValkeyCluster::crd()).unwrap();
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let spec = &root["properties"]["spec"];
    let field = |path: &[&str]| {
        let mut at = spec;
        for step in path {
            at = &at["properties"][*step];
        }
        at.clone()
    };
    assert_eq!(field(&["shards"])["maximum"], f64::from(MAX_SHARDS));
    assert_eq!(
        field(&["replicasPerShard"])["maximum"],
        f64::from(MAX_REPLICAS_PER_SHARD)
    );
    assert_eq!(field(&["acl"])["maxItems"], MAX_ACL_USERS);
    let user = &field(&["acl"])["items"];
    assert_eq!(user["properties"]["username"]["maxLength"], MAX_USERNAME);
    assert_eq!(
        user["properties"]["passwordHashes"]["maxItems"],
        MAX_PASSWORD_HASHES
    );
    let permission = &user["properties"]["permissions"];
    assert_eq!(permission["maxItems"], MAX_PERMISSIONS);
    let keys = &permission["items"]["properties"]["keys"];
    assert_eq!(keys["maxItems"], MAX_KEY_PATTERNS);
    assert_eq!(
        keys["items"]["properties"]["pattern"]["maxLength"],
        MAX_KEY_PATTERN
    );
    assert_eq!(field(&["placement", "zones"])["maxItems"], MAX_ZONES);
    assert_eq!(
        field(&["placement", "nodeSelector"])["maxProperties"],
        MAX_NODE_SELECTOR
    );
    assert_eq!(
        field(&["podAnnotations"])["maxProperties"],
        MAX_POD_ANNOTATIONS
    );
    let rules = serde_json::to_string(&root["x-kubernetes-validations"]).unwrap()
        + &serde_json::to_string(&spec["x-kubernetes-validations"]).unwrap();
    assert!(
        rules.contains(&format!("size() <= {MAX_CLUSTER_NAME}")),
        "{rules}"
    );
    assert!(rules.contains(&format!("<= {MAX_NODES}")), "{rules}");
}
