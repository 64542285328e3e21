//! Table-driven tests of the pure validators over a small fleet.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use kube::core::admission::Operation;

use super::*;
use crate::api::*;
use crate::fleet::{ClusterKey, Fleet};

fn image(version: &str) -> ValkeyImage {
    ValkeyImage::new(
        &format!("valkey-{}", version.replace('.', "-")),
        ValkeyImageSpec {
            repository: "valkey/valkey".into(),
            tag: version.into(),
            version: version.into(),
        },
    )
}

fn config_spec(image: Option<&str>, base: Option<&str>) -> ValkeyConfigSpec {
    ValkeyConfigSpec {
        image_ref: image.map(Into::into),
        base_ref: base.map(Into::into),
        ..Default::default()
    }
}

fn config(name: &str, spec: ValkeyConfigSpec) -> ValkeyConfig {
    ValkeyConfig::new(name, spec)
}

fn cluster(namespace: &str, name: &str, config_ref: &str) -> ValkeyCluster {
    let mut cluster = ValkeyCluster::new(
        name,
        ValkeyClusterSpec {
            config_ref: config_ref.into(),
            shards: 3,
            replicas_per_shard: 1,
            acl: vec![],
            tls: None,
            placement: None,
            pod_annotations: BTreeMap::new(),
        },
    );
    cluster.metadata.namespace = Some(namespace.into());
    cluster
}

/// Images 8.1.4 (stored before the webhook existed), 9.0.0 and 9.1.2; `standard` on 9.0.0
/// inherited by `large` and `cache`; `other` on 9.1.2; one cluster on each config.
fn fleet() -> Fleet {
    let mut fleet = Fleet::default();
    for version in ["8.1.4", "9.0.0", "9.1.2"] {
        let image = image(version);
        fleet.upsert_image(&image.metadata.name.clone().unwrap(), image.spec);
    }
    fleet.upsert_config("standard", config_spec(Some("valkey-9-0-0"), None));
    fleet.upsert_config("large", config_spec(None, Some("standard")));
    fleet.upsert_config("cache", config_spec(None, Some("standard")));
    fleet.upsert_config("other", config_spec(Some("valkey-9-1-2"), None));
    for (ns, name, config) in [
        ("team-a", "orders", "standard"),
        ("team-b", "sessions", "large"),
        ("team-b", "feed", "cache"),
        ("team-c", "search", "other"),
    ] {
        fleet.upsert_cluster(ClusterKey::new(ns, name), config);
    }
    fleet
}

fn review<'a, T>(
    operation: Operation,
    name: &'a str,
    object: Option<&'a T>,
    old: Option<&'a T>,
) -> Review<'a, T> {
    Review {
        operation,
        name,
        namespace: None,
        object,
        old,
    }
}

fn joined(verdict: &Verdict) -> String {
    verdict.denials.join("; ")
}

#[test]
fn image_versions_against_the_floor() {
    let fleet = fleet();
    let table = [
        ("8.1.4", Some("below the Valkey 9 floor")),
        ("9.0.0", None),
        ("9.1.2", None),
        ("10.0.0", None),
        ("9.0.0-rc1", Some("pre-release")),
        ("nine", Some("\"nine\" is not a MAJOR.MINOR.PATCH version")),
        ("", Some("spec.version is empty")),
    ];
    for (version, denial) in table {
        let mut object = image("9.0.0");
        object.spec.version = version.into();
        let verdict = validate_image(
            &review(Operation::Create, "new-image", Some(&object), None),
            &fleet,
        );
        match denial {
            None => assert!(verdict.allowed(), "{version:?}: {}", joined(&verdict)),
            Some(fragment) => {
                assert!(
                    joined(&verdict).contains(fragment),
                    "{version:?}: {}",
                    joined(&verdict)
                );
                assert!(
                    joined(&verdict).starts_with("spec.version"),
                    "names the field"
                );
            }
        }
    }
}

#[test]
fn an_image_in_use_cannot_change_or_go() {
    let fleet = fleet();
    let old = image("9.0.0");
    let mut changed = old.clone();
    changed.spec.tag = "9.0.0-alpine".into();
    let update = validate_image(
        &review(
            Operation::Update,
            "valkey-9-0-0",
            Some(&changed),
            Some(&old),
        ),
        &fleet,
    );
    assert!(
        joined(&update).contains("used by 1 ValkeyConfig (standard)"),
        "{}",
        joined(&update)
    );
    assert!(joined(&update).contains("Register a new ValkeyImage"));

    let relabel = validate_image(
        &review(Operation::Update, "valkey-9-0-0", Some(&old), Some(&old)),
        &fleet,
    );
    assert!(relabel.allowed(), "metadata-only updates pass");

    let delete = validate_image(
        &review(Operation::Delete, "valkey-9-0-0", None, Some(&old)),
        &fleet,
    );
    assert!(joined(&delete).contains("cannot be deleted while 1 ValkeyConfig (standard) use it"));

    let unused = image("8.1.4");
    let delete_unused = validate_image(
        &review(Operation::Delete, "valkey-8-1-4", None, Some(&unused)),
        &fleet,
    );
    assert!(delete_unused.allowed());
}

#[test]
fn config_settings_owned_by_the_operator_are_refused() {
    let fleet = fleet();
    let mut spec = config_spec(Some("valkey-9-0-0"), None);
    spec.valkey = [
        ("port", "7000"),
        ("cluster-announce-ip", "1.2.3.4"),
        ("maxmemory", "1gb"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let object = config("tuned", spec);
    let verdict = validate_config(
        &review(Operation::Create, "tuned", Some(&object), None),
        &fleet,
        &Policy::default(),
    );
    assert_eq!(
        joined(&verdict),
        "spec.valkey: cluster-announce-ip, port are set by the operator on every node and cannot be configured; remove them"
    );
}

#[test]
fn config_cycles_and_floor_are_refused_with_the_chain() {
    let mut fleet = fleet();
    fleet.upsert_config("a", config_spec(Some("valkey-9-0-0"), None));
    fleet.upsert_config("b", config_spec(None, Some("a")));
    fleet.upsert_config("c", config_spec(None, Some("b")));
    // a → b → c → a, closed by updating a.
    let cyclic = config("a", config_spec(Some("valkey-9-0-0"), Some("c")));
    let verdict = validate_config(
        &review(Operation::Update, "a", Some(&cyclic), None),
        &fleet,
        &Policy::default(),
    );
    assert!(
        joined(&verdict).starts_with("spec.baseRef: baseRef cycle: a → c → b → a"),
        "{}",
        joined(&verdict)
    );

    let old_engine = config("standard", config_spec(Some("valkey-8-1-4"), None));
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&old_engine), None),
        &fleet,
        &Policy::default(),
    );
    assert!(joined(&verdict).contains("the effective image valkey-8-1-4 (chain standard) has version 8.1.4 is below the Valkey 9 floor"), "{}", joined(&verdict));

    let imageless_root = config("standard", config_spec(None, None));
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&imageless_root), None),
        &fleet,
        &Policy::default(),
    );
    assert!(
        joined(&verdict).contains("no config in the chain standard sets spec.imageRef"),
        "{}",
        joined(&verdict)
    );
}

#[test]
fn missing_references_warn_instead_of_refusing() {
    let fleet = fleet();
    let early = config("early", config_spec(None, Some("not-yet")));
    let verdict = validate_config(
        &review(Operation::Create, "early", Some(&early), None),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed());
    assert_eq!(verdict.warnings.len(), 1);
    assert!(
        verdict.warnings[0].starts_with("spec.baseRef: ValkeyConfig \"not-yet\" does not exist")
    );

    let waiting = cluster("team-z", "new", "not-yet");
    let verdict = validate_cluster(
        &review(Operation::Create, "new", Some(&waiting), None),
        &fleet,
    );
    assert!(verdict.allowed());
    assert!(verdict.warnings[0].contains("the cluster waits until it exists"));
}

#[test]
fn a_base_image_change_warns_of_the_clusters_of_all_three_configs() {
    let fleet = fleet();
    let mut object = config("standard", config_spec(Some("valkey-9-1-2"), None));
    object.metadata = ObjectMeta {
        name: Some("standard".into()),
        ..Default::default()
    };
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&object), None),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
    let all = verdict.warnings.join("\n");
    assert!(
        all.contains(
            "rolls 3 ValkeyClusters at once: team-a/orders, team-b/feed and team-b/sessions"
        ),
        "{all}"
    );
    assert!(
        all.contains(
            "from valkey-9-0-0 (valkey/valkey:9.0.0) to valkey-9-1-2 (valkey/valkey:9.1.2)"
        ),
        "{all}"
    );
    assert!(all.contains("nothing staggers them"), "{all}");
    assert!(
        all.contains("move clusters one at a time by spec.configRef"),
        "{all}"
    );
    assert!(!all.contains("downgrade"), "{all}");
    assert!(verdict.warnings.iter().all(|w| w.chars().count() <= 256));

    // A child that sets its own image is not moved by its base.
    let mut pinned = fleet;
    pinned.upsert_config("cache", config_spec(Some("valkey-9-0-0"), Some("standard")));
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&object), None),
        &pinned,
        &Policy::default(),
    );
    assert!(
        verdict.warnings[0].contains("rolls 2 ValkeyClusters"),
        "{}",
        verdict.warnings[0]
    );
}

#[test]
fn a_downgrade_gets_its_own_warning_and_unchanged_images_none() {
    let fleet = fleet();
    let object = config("other", config_spec(Some("valkey-9-0-0"), None));
    let verdict = validate_config(
        &review(Operation::Update, "other", Some(&object), None),
        &fleet,
        &Policy::default(),
    );
    assert!(
        verdict
            .warnings
            .iter()
            .any(|w| w.starts_with("This is a downgrade (9.1.2 → 9.0.0)"))
    );

    let mut settings_only = config_spec(Some("valkey-9-0-0"), None);
    settings_only
        .valkey
        .insert("maxmemory".into(), "2gb".into());
    let object = config("standard", settings_only);
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&object), None),
        &fleet,
        &Policy::default(),
    );
    assert_eq!(verdict, Verdict::default());
}

#[test]
fn the_fleet_threshold_refuses_without_a_matching_acknowledgement() {
    let fleet = fleet();
    let policy = Policy {
        fleet_roll_ack_threshold: Some(2),
    };
    let mut object = config("standard", config_spec(Some("valkey-9-1-2"), None));
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&object), None),
        &fleet,
        &policy,
    );
    assert!(
        joined(&verdict).contains("more than the operator's fleetRollAckThreshold of 2"),
        "{}",
        joined(&verdict)
    );
    assert!(
        joined(&verdict).contains("valkey.gomomento.com/acknowledge-fleet-roll: \"valkey-9-1-2\"")
    );

    // An acknowledgement of another image does not count.
    object.metadata.annotations = Some(BTreeMap::from([(
        annotations::ACKNOWLEDGE_FLEET_ROLL.to_string(),
        "valkey-9-0-0".to_string(),
    )]));
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&object), None),
        &fleet,
        &policy,
    );
    assert!(!verdict.allowed());

    object.metadata.annotations = Some(BTreeMap::from([(
        annotations::ACKNOWLEDGE_FLEET_ROLL.to_string(),
        "valkey-9-1-2".to_string(),
    )]));
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&object), None),
        &fleet,
        &policy,
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
    assert!(verdict.warnings[0].contains("rolls 3 ValkeyClusters"));

    let within = Policy {
        fleet_roll_ack_threshold: Some(3),
    };
    object.metadata.annotations = None;
    assert!(
        validate_config(
            &review(Operation::Update, "standard", Some(&object), None),
            &fleet,
            &within
        )
        .allowed()
    );
}

#[test]
fn a_config_in_use_cannot_be_deleted() {
    let fleet = fleet();
    let old = config("standard", config_spec(Some("valkey-9-0-0"), None));
    let verdict = validate_config(
        &review(Operation::Delete, "standard", None, Some(&old)),
        &fleet,
        &Policy::default(),
    );
    assert_eq!(
        joined(&verdict),
        "ValkeyConfig standard cannot be deleted while it is used by 1 ValkeyCluster (team-a/orders) through spec.configRef \
         and 2 ValkeyConfigs (cache and large) through spec.baseRef; move them to another config first"
    );
    let mut emptied = fleet;
    emptied.remove_cluster(&ClusterKey::new("team-c", "search"));
    let old = config("other", config_spec(Some("valkey-9-1-2"), None));
    assert!(
        validate_config(
            &review(Operation::Delete, "other", None, Some(&old)),
            &emptied,
            &Policy::default()
        )
        .allowed()
    );
}

#[test]
fn cluster_config_refs_obey_the_floor_and_warn_on_switches() {
    let mut fleet = fleet();
    fleet.upsert_config("legacy", config_spec(Some("valkey-8-1-4"), None));
    let legacy = cluster("team-a", "orders", "legacy");
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&legacy), None),
        &fleet,
    );
    assert!(joined(&verdict).starts_with("spec.configRef: ValkeyConfig legacy resolves to image valkey-8-1-4 whose version 8.1.4 is below"), "{}", joined(&verdict));

    let before = cluster("team-a", "orders", "standard");
    let after = cluster("team-a", "orders", "other");
    let verdict = validate_cluster(
        &review(Operation::Update, "orders", Some(&after), Some(&before)),
        &fleet,
    );
    assert!(verdict.allowed());
    assert_eq!(verdict.warnings.len(), 1);
    assert!(verdict.warnings[0].starts_with(
        "Switching spec.configRef from standard to other changes this cluster's image"
    ));
    let back = validate_cluster(
        &review(Operation::Update, "orders", Some(&before), Some(&after)),
        &fleet,
    );
    assert!(
        back.warnings
            .iter()
            .any(|w| w.contains("downgrade (9.1.2 → 9.0.0)"))
    );

    let same_image = cluster("team-a", "orders", "large");
    let verdict = validate_cluster(
        &review(
            Operation::Update,
            "orders",
            Some(&same_image),
            Some(&before),
        ),
        &fleet,
    );
    assert_eq!(verdict, Verdict::default());
}

#[test]
fn cluster_reserved_annotations_and_tls_changes_are_refused() {
    let fleet = fleet();
    let old = cluster("team-a", "orders", "standard");
    let mut new = old.clone();
    new.spec
        .pod_annotations
        .insert("valkey.gomomento.com/shard".into(), "x".into());
    new.spec.tls = Some(ClusterTls {
        secret_ref: "tls".into(),
    });
    let verdict = validate_cluster(
        &review(Operation::Update, "orders", Some(&new), Some(&old)),
        &fleet,
    );
    assert_eq!(verdict.denials.len(), 2, "{}", joined(&verdict));
    assert!(verdict.denials[0].starts_with("spec.podAnnotations"));
    assert!(verdict.denials[1].starts_with("spec.tls is set at creation only"));
}

#[test]
fn acl_users_leave_default_alone_and_missing_roles_warn() {
    let mut fleet = fleet();
    fleet.upsert_role("reader", ValkeyRoleSpec::default());
    let user = |username: &str, role_ref: &str| AclUser {
        username: username.into(),
        password_hashes: vec![],
        permissions: vec![AclPermission {
            role_ref: role_ref.into(),
            keys: vec![],
        }],
    };
    let mut new = cluster("team-a", "orders", "standard");
    new.spec.acl = vec![user("app", "reader")];
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&new), None),
        &fleet,
    );
    assert!(
        verdict.allowed() && verdict.warnings.is_empty(),
        "{verdict:?}"
    );

    new.spec.acl = vec![user("app", "ghost")];
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&new), None),
        &fleet,
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
    assert_eq!(
        verdict.warnings,
        [
            "spec.acl[0].permissions[0].roleRef: ValkeyRole ghost does not exist; user app is not applied until it does."
        ]
    );

    new.spec.acl = vec![user("app", "reader"), user("default", "reader")];
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&new), None),
        &fleet,
    );
    assert!(
        joined(&verdict).starts_with("spec.acl[1].username: \"default\" is Valkey's built-in user"),
        "{}",
        joined(&verdict)
    );
}

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
    assert!(verdict.denials[0].contains("write \"read\" without ACL syntax"));
    assert!(verdict.denials[1].contains("\"WRITE\" is listed twice"));
}
