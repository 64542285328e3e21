//! ValkeyCluster admission: the floor through configRef, switch warnings, reserved annotations,
//! TLS changes and ACL users.

use super::*;

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
