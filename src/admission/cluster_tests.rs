//! ValkeyCluster admission: the floor through configRef, switch warnings, reserved annotations,
//! TLS changes and ACL users.

use super::*;
use crate::admission::fixtures::*;

#[test]
fn cluster_config_refs_obey_the_floor_and_warn_on_switches() {
    let mut fleet = fleet();
    fleet.upsert_config("legacy", config_spec(Some("valkey-8-1-4"), None));
    let legacy = cluster("team-a", "orders", "legacy");
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&legacy), None),
        &fleet,
        &Policy::default(),
    );
    assert!(joined(&verdict).starts_with("spec.configRef: ValkeyConfig legacy resolves to image valkey-8-1-4 whose version 8.1.4 is below"), "{}", joined(&verdict));

    let before = cluster("team-a", "orders", "standard");
    let after = cluster("team-a", "orders", "other");
    let verdict = validate_cluster(
        &review(Operation::Update, "orders", Some(&after), Some(&before)),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed());
    assert_eq!(verdict.warnings.len(), 1);
    assert!(verdict.warnings[0].starts_with(
        "Switching spec.configRef from standard to other changes this cluster's image"
    ));
    let back = validate_cluster(
        &review(Operation::Update, "orders", Some(&before), Some(&after)),
        &fleet,
        &Policy::default(),
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
        &Policy::default(),
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
        &Policy::default(),
    );
    assert_eq!(verdict.denials.len(), 2, "{}", joined(&verdict));
    assert!(verdict.denials[0].starts_with("spec.podAnnotations"));
    assert!(verdict.denials[1].starts_with("spec.tls is set at creation only"));

    // Momento's rotation by a new Secret: a TLS cluster's secretRef may be repointed.
    let tls = |secret: &str| {
        let mut cluster = old.clone();
        cluster.spec.tls = Some(ClusterTls {
            secret_ref: secret.into(),
        });
        cluster
    };
    let (before, after) = (tls("orders-tls"), tls("orders-tls-2026"));
    let verdict = validate_cluster(
        &review(Operation::Update, "orders", Some(&after), Some(&before)),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
    let verdict = validate_cluster(
        &review(Operation::Update, "orders", Some(&old), Some(&before)),
        &fleet,
        &Policy::default(),
    );
    assert!(
        joined(&verdict).contains("cannot be added or removed"),
        "{}",
        joined(&verdict)
    );
}

#[test]
fn a_cluster_may_not_redefine_a_user_its_config_gives_every_cluster() {
    let mut fleet = fleet();
    let user = |username: &str| AclUser {
        username: username.into(),
        password_hashes: vec![],
        password_secret_ref: None,
        permissions: vec![],
    };
    let mut platform = config_spec(Some("valkey-9-0-0"), None);
    platform.acl = Some(vec![user("app")]);
    fleet.upsert_config("standard", platform);
    let mut new = cluster("team-a", "orders", "large");
    new.spec.acl = vec![user("mine"), user("app")];
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&new), None),
        &fleet,
        &Policy::default(),
    );
    assert_eq!(
        joined(&verdict),
        "spec.acl[1].username: user \"app\" is defined by the acl of ValkeyConfig large (through baseRef: large → standard) for every cluster using it; name this cluster's user differently"
    );
}

#[test]
fn acl_users_leave_default_alone_and_missing_roles_warn() {
    let mut fleet = fleet();
    fleet.upsert_role("reader", ValkeyRoleSpec::default());
    let user = |username: &str, role_ref: &str| AclUser {
        username: username.into(),
        password_hashes: vec![],
        password_secret_ref: None,
        permissions: vec![AclPermission {
            role_ref: role_ref.into(),
            channels: vec![],
            keys: vec![],
        }],
    };
    let mut new = cluster("team-a", "orders", "standard");
    new.spec.acl = vec![user("app", "reader")];
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&new), None),
        &fleet,
        &Policy::default(),
    );
    assert!(
        verdict.allowed() && verdict.warnings.is_empty(),
        "{verdict:?}"
    );

    new.spec.acl = vec![user("app", "ghost")];
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&new), None),
        &fleet,
        &Policy::default(),
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
        &Policy::default(),
    );
    assert!(
        joined(&verdict).starts_with("spec.acl[1].username: \"default\" is Valkey's built-in user"),
        "{}",
        joined(&verdict)
    );

    new.spec.acl = vec![
        user("valkey-operator", "reader"),
        user("valkey-replication", "reader"),
    ];
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&new), None),
        &fleet,
        &Policy::default(),
    );
    assert_eq!(verdict.denials.len(), 2, "{}", joined(&verdict));
    assert!(
        verdict.denials[0]
            .starts_with("spec.acl[0].username: \"valkey-operator\" is reserved for the operator"),
        "{}",
        joined(&verdict)
    );
}

#[test]
fn clusters_past_their_bounds_are_refused_naming_field_and_limit() {
    let fleet = fleet();
    let mut huge = cluster("team-a", "orders", "standard");
    huge.spec.shards = 100_000;
    huge.spec.replicas_per_shard = 500;
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&huge), None),
        &fleet,
        &Policy::default(),
    );
    let said = joined(&verdict);
    assert!(
        said.contains("spec.shards: is 100000; it must be 1 to 16384"),
        "{said}"
    );
    assert!(
        said.contains("spec.replicasPerShard: is 500; it must be 0 to 15"),
        "{said}"
    );

    let long_name = "a".repeat(60);
    let named = cluster("team-a", &long_name, "standard");
    let verdict = validate_cluster(
        &review(Operation::Create, &long_name, Some(&named), None),
        &fleet,
        &Policy::default(),
    );
    assert!(joined(&verdict).starts_with("metadata.name: is 60 characters long; at most 50"));

    let mut annotated = cluster("team-a", "orders", "standard");
    annotated
        .spec
        .pod_annotations
        .insert("bad key!".into(), "x".into());
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&annotated), None),
        &fleet,
        &Policy::default(),
    );
    assert!(
        joined(&verdict)
            .starts_with("spec.podAnnotations[\"bad key!\"]: is not a valid annotation key"),
        "{}",
        joined(&verdict)
    );
}

#[test]
fn the_operators_caps_refuse_growth_past_them() {
    let fleet = fleet();
    let policy = Policy {
        caps: crate::api::bounds::Caps {
            max_shards: 4,
            max_replicas_per_shard: 1,
        },
        ..Policy::default()
    };
    let mut wide = cluster("team-a", "orders", "standard");
    wide.spec.shards = 5;
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&wide), None),
        &fleet,
        &policy,
    );
    assert!(
        joined(&verdict).contains("maxShards"),
        "{}",
        joined(&verdict)
    );
    // A cluster already that wide may still change other things.
    let mut relabelled = wide.clone();
    relabelled
        .spec
        .pod_annotations
        .insert("team".into(), "a".into());
    let verdict = validate_cluster(
        &review(Operation::Update, "orders", Some(&relabelled), Some(&wide)),
        &fleet,
        &policy,
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
}

#[test]
fn a_cluster_past_a_limit_can_still_change_and_leave() {
    let fleet = fleet();
    // It slipped past admission (or predates a limit): 70 ACL users.
    let mut crowded = cluster("team-a", "orders", "standard");
    crowded.spec.acl = (0..70)
        .map(|i| AclUser {
            username: format!("u{i}"),
            password_hashes: vec![],
            password_secret_ref: None,
            permissions: vec![],
        })
        .collect();
    // The operator adds its finalizer, then deletion removes it: spec unchanged, allowed.
    let mut finalized = crowded.clone();
    finalized.metadata.finalizers = Some(vec!["valkey.gomomento.com/retire-nodes".into()]);
    let verdict = validate_cluster(
        &review(
            Operation::Update,
            "orders",
            Some(&finalized),
            Some(&crowded),
        ),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
    // A change that does not make it worse is allowed; one that adds a new problem is not.
    let mut fewer = crowded.clone();
    fewer.spec.acl.truncate(66);
    let verdict = validate_cluster(
        &review(Operation::Update, "orders", Some(&fewer), Some(&crowded)),
        &fleet,
        &Policy::default(),
    );
    assert!(!verdict.allowed(), "66 users is a new count, still past 64");
    let mut relabelled = crowded.clone();
    relabelled
        .spec
        .pod_annotations
        .insert("team".into(), "a".into());
    let verdict = validate_cluster(
        &review(
            Operation::Update,
            "orders",
            Some(&relabelled),
            Some(&crowded),
        ),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
    relabelled
        .spec
        .pod_annotations
        .insert("bad key!".into(), "a".into());
    let verdict = validate_cluster(
        &review(
            Operation::Update,
            "orders",
            Some(&relabelled),
            Some(&crowded),
        ),
        &fleet,
        &Policy::default(),
    );
    assert!(
        joined(&verdict).contains("bad key!"),
        "{}",
        joined(&verdict)
    );
}

#[test]
fn a_key_pattern_that_would_grant_more_is_refused_naming_the_field() {
    let mut fleet = fleet();
    fleet.upsert_role("reader", ValkeyRoleSpec::default());
    let user = |pattern: &str| AclUser {
        username: "app".into(),
        password_hashes: vec![],
        password_secret_ref: None,
        permissions: vec![AclPermission {
            role_ref: "reader".into(),
            channels: vec![],
            keys: vec![KeyPermission {
                pattern: pattern.into(),
                access: KeyAccess::Read,
            }],
        }],
    };
    let mut injected = cluster("team-a", "orders", "standard");
    injected.spec.acl = vec![user("* +@all")];
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&injected), None),
        &fleet,
        &Policy::default(),
    );
    assert_eq!(verdict.denials.len(), 1, "{}", joined(&verdict));
    assert!(
        verdict.denials[0]
            .starts_with("spec.acl[0].permissions[0].keys[0].pattern: \"* +@all\" holds ' '"),
        "{}",
        joined(&verdict)
    );

    // A cluster that already holds such a pattern can still change something else.
    let mut changed = injected.clone();
    changed.spec.shards = 3;
    let verdict = validate_cluster(
        &review(Operation::Update, "orders", Some(&changed), Some(&injected)),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));

    let mut plain = injected.clone();
    plain.spec.acl = vec![user("orders:{eu}:*")];
    let verdict = validate_cluster(
        &review(Operation::Create, "orders", Some(&plain), None),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
}

#[test]
fn a_cluster_past_the_acl_bound_may_shrink_but_not_grow() {
    let mut fleet = fleet();
    // A role that grew after the cluster granted it: 150 commands, one token each per grant.
    let commands = (0..150)
        .map(|i| Permission {
            name: format!("c{i}"),
            subcommand: None,
            access: Access::Allow,
        })
        .collect();
    fleet.upsert_role(
        "wide",
        ValkeyRoleSpec {
            categories: vec![],
            commands,
        },
    );
    let user = |grants: usize| AclUser {
        username: "app".into(),
        password_hashes: vec![],
        password_secret_ref: None,
        permissions: (0..grants)
            .map(|i| AclPermission {
                role_ref: "wide".into(),
                channels: vec![],
                keys: vec![KeyPermission {
                    pattern: format!("k{i}:*"),
                    access: KeyAccess::Readwrite,
                }],
            })
            .collect(),
    };
    let with = |grants: usize| {
        let mut c = cluster("team-a", "orders", "standard");
        c.spec.acl = vec![user(grants)];
        c
    };
    let update = |new: &ValkeyCluster, old: &ValkeyCluster| {
        validate_cluster(
            &review(Operation::Update, "orders", Some(new), Some(old)),
            &fleet,
            &Policy::default(),
        )
    };
    let created = validate_cluster(
        &review(Operation::Create, "orders", Some(&with(30)), None),
        &fleet,
        &Policy::default(),
    );
    assert!(
        joined(&created).starts_with("spec.acl[0]: expands to")
            && joined(&created).contains("at most 4096 per user"),
        "{}",
        joined(&created)
    );
    assert!(
        update(&with(29), &with(30)).allowed(),
        "smaller, though still past the bound"
    );
    let grown = update(&with(31), &with(30));
    assert!(!grown.allowed(), "larger");
    assert!(
        joined(&grown).contains("at most 4096 per user"),
        "{}",
        joined(&grown)
    );
}

#[test]
fn namespace_policies_refuse_a_config_and_a_cap_naming_the_policy() {
    let mut fleet = fleet();
    fleet.upsert_policy(
        "team-a-limits",
        ValkeyNamespacePolicySpec {
            namespaces: vec!["team-a".into()],
            allowed_configs: vec!["standard".into()],
            max_clusters: Some(2),
            max_shards: Some(5),
            max_nodes: None,
        },
    );
    let existing = crate::fleet::policy::Member {
        footprint: crate::fleet::policy::Footprint {
            shards: 3,
            nodes: 6,
        },
        created: None,
    };
    fleet.set_cluster_member(&ClusterKey::new("team-a", "orders"), existing);
    let judge = |new: &ValkeyCluster, old: Option<&ValkeyCluster>| {
        let operation = if old.is_some() {
            Operation::Update
        } else {
            Operation::Create
        };
        let mut review = review(operation, "carts", Some(new), old);
        review.namespace = Some("team-a");
        validate_cluster(&review, &fleet, &Policy::default())
    };
    // `cluster()` asks for 3 shards: 3 + 3 is past the policy's 5.
    let on_other = cluster("team-a", "carts", "other");
    let said = joined(&judge(&on_other, None));
    assert!(said.contains("spec.configRef: ValkeyNamespacePolicy team-a-limits lets the clusters of namespace team-a use only ValkeyConfigs standard, not other"), "{said}");
    assert!(
        said.contains("spec.shards: ValkeyNamespacePolicy team-a-limits allows at most 5 shards"),
        "{said}"
    );
    let mut small = cluster("team-a", "carts", "standard");
    small.spec.shards = 2;
    assert!(
        judge(&small, None).allowed(),
        "{}",
        joined(&judge(&small, None))
    );
    // Another namespace is not governed.
    let mut elsewhere = review(Operation::Create, "carts", Some(&on_other), None);
    elsewhere.namespace = Some("team-b");
    assert!(validate_cluster(&elsewhere, &fleet, &Policy::default()).allowed());
    // A cluster already on a config the policy no longer allows may still change, but not grow.
    let mut grown = on_other.clone();
    grown.spec.shards = 2;
    let mut was = grown.clone();
    was.spec.shards = 1;
    assert!(judge(&was, Some(&was)).allowed());
    let said = joined(&judge(&grown, Some(&was)));
    assert!(
        !said.contains("spec.configRef") && !said.contains("spec.shards"),
        "{said}"
    );
    grown.spec.shards = 3;
    assert!(
        joined(&judge(&grown, Some(&was)))
            .contains("spec.shards: ValkeyNamespacePolicy team-a-limits")
    );
}
