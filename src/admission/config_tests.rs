//! ValkeyConfig admission: owned settings, chains, missing references, fleet-wide roll warnings
//! and the acknowledgement threshold, deletion while in use.

use super::*;
use crate::admission::fixtures::*;
use crate::api::{AclUser, PasswordHash, SecretKeyRef};

#[test]
fn config_settings_owned_by_the_operator_are_refused() {
    let fleet = fleet();
    let mut spec = config_spec(Some("valkey-9-0-0"), None);
    spec.valkey = [
        ("port", "7000"),
        ("cluster-announce-ip", "1.2.3.4"),
        ("cluster-node-timeout", "15000"),
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
        "spec.valkey: cluster-announce-ip, cluster-node-timeout, port are set by the operator on every node and cannot be configured; remove them"
    );
}

#[test]
fn platform_users_are_checked_and_take_hashes_only() {
    let fleet = fleet();
    let user = |name: &str, secret: bool| AclUser {
        username: name.into(),
        password_hashes: vec![],
        password_secret_ref: secret.then(|| SecretKeyRef {
            name: "app".into(),
            key: "password".into(),
        }),
        permissions: vec![],
    };
    let mut spec = config_spec(Some("valkey-9-0-0"), None);
    spec.acl = Some(vec![
        user("app", true),
        user("ops", false),
        user("ops", false),
    ]);
    let object = config("platform", spec);
    let verdict = validate_config(
        &review(Operation::Create, "platform", Some(&object), None),
        &fleet,
        &Policy::default(),
    );
    let said = joined(&verdict);
    assert!(
        said.contains(
            "spec.acl[0].passwordSecretRef: a ValkeyConfig's users take passwordHashes only"
        ),
        "{said}"
    );
    assert!(said.contains("user \"ops\" is listed twice"), "{said}");
}

#[test]
fn a_platform_user_with_its_own_hash_is_warned_it_opens_every_cluster() {
    let fleet = fleet();
    let user = |name: &str, hashes: Vec<PasswordHash>| AclUser {
        username: name.into(),
        password_hashes: hashes,
        password_secret_ref: None,
        permissions: vec![],
    };
    let mut spec = config_spec(Some("valkey-9-0-0"), None);
    spec.acl = Some(vec![
        user("shared", vec![PasswordHash("a".repeat(64))]),
        user("issued", vec![]),
    ]);
    let object = config("platform", spec);
    let verdict = validate_config(
        &review(Operation::Create, "platform", Some(&object), None),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
    assert_eq!(
        verdict.warnings,
        [crate::admission::config::shared_password_warning(
            0, "shared"
        )]
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
        &Policy::default(),
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
    // No roll: only what each cluster gets live.
    assert!(verdict.allowed());
    assert_eq!(verdict.warnings.len(), 3, "{:?}", verdict.warnings);
    assert!(
        verdict
            .warnings
            .iter()
            .all(|w| w.ends_with(": CONFIG SET maxmemory live.")),
        "{:?}",
        verdict.warnings
    );
}

#[test]
fn the_fleet_threshold_refuses_without_a_matching_acknowledgement() {
    let fleet = fleet();
    let policy = Policy {
        fleet_roll_ack_threshold: Some(2),
        ..Policy::default()
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
        ..Policy::default()
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
fn a_paced_change_says_how_it_is_paced_and_what_it_does_to_each_cluster() {
    let mut fleet = fleet();
    // Its owner's annotation says wave 0 too: the policy's word is what counts.
    fleet.set_cluster_wave_annotation(&ClusterKey::new("team-a", "orders"), Some("0"));
    let mut spec = config_spec(Some("valkey-9-1-2"), None);
    spec.rollout = Some(crate::api::RolloutPolicy {
        max_concurrent: Some(1),
        waves: vec![crate::api::RolloutWave {
            clusters: vec!["team-b/feed".into()],
        }],
        allow_wave_annotation: false,
        ..Default::default()
    });
    let object = config("standard", spec);
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&object), None),
        &fleet,
        &Policy::default(),
    );
    let all = verdict.warnings.join("\n");
    assert!(
        all.contains(
            "3 ValkeyClusters paced by ValkeyConfig standard's spec.rollout: at most 1 rolling at once, in 1 wave named first, the rest last."
        ),
        "{all}"
    );
    assert!(!all.contains("nothing staggers them"), "{all}");
    // Per cluster, the canary wave first.
    let feed = "team-b/feed (wave 0): rolls (image valkey-9-0-0 → valkey-9-1-2).";
    let orders = "team-a/orders (the last wave): rolls (image valkey-9-0-0 → valkey-9-1-2).";
    let (at_feed, at_orders) = (all.find(feed), all.find(orders));
    assert!(
        at_feed.is_some() && at_orders.is_some() && at_feed < at_orders,
        "{all}"
    );
    assert!(!all.contains("team-c/search"), "{all}");

    // A live setting only: a CONFIG SET on each cluster, no roll.
    let mut live = config_spec(Some("valkey-9-0-0"), None);
    live.valkey
        .insert("maxmemory-policy".into(), "allkeys-lru".into());
    let object = config("standard", live);
    let verdict = validate_config(
        &review(Operation::Update, "standard", Some(&object), None),
        &fleet,
        &Policy::default(),
    );
    let all = verdict.warnings.join("\n");
    assert!(
        all.contains("team-a/orders (the last wave): CONFIG SET maxmemory-policy live."),
        "{all}"
    );
    assert!(!all.contains("rolls"), "{all}");
}

#[test]
fn a_change_outside_the_maintenance_windows_says_when_its_clusters_start() {
    let fleet = fleet();
    let mut spec = config_spec(Some("valkey-9-1-2"), None);
    spec.rollout = Some(crate::api::RolloutPolicy {
        maintenance_windows: vec![crate::api::MaintenanceWindow {
            days: vec![],
            start: "02:00".into(),
            duration_minutes: 60,
        }],
        ..Default::default()
    });
    let object = config("standard", spec);
    // The fixtures judge at 1970-01-01T00:00:00Z, two hours before the day's window.
    let mut asked = review(Operation::Update, "standard", Some(&object), None);
    let warnings = |asked: &Review<ValkeyConfig>| {
        validate_config(asked, &fleet, &Policy::default())
            .warnings
            .join("\n")
    };
    let all = warnings(&asked);
    assert!(
        all.contains("ValkeyConfig standard's maintenance windows are closed now: team-a/orders, team-b/feed and team-b/sessions start rolling when the next opens, at 1970-01-01T02:00:00Z"),
        "{all}"
    );
    asked.now = k8s_openapi::jiff::Timestamp::from_second(2 * 3600 + 1800).unwrap();
    let all = warnings(&asked);
    assert!(
        all.contains("maintenance window is open until 1970-01-01T03:00:00Z: team-a/orders, team-b/feed and team-b/sessions start rolling now; any not started by then waits for the next window, at 1970-01-02T02:00:00Z."),
        "{all}"
    );
}

/// One edit of config `standard` as `kubectl valkey plan`, admission's warning and the
/// controller each see it for cluster team-a/orders: `rolls`, `live`, `nothing` or
/// `unresolved`. The first two word the one rule; the controller's answer is what it would do
/// (the node revision it renders, the settings it sets live, the users it sets).
fn three_answers(edited: ValkeyConfigSpec) -> [String; 3] {
    use crate::controller::build::render::ClusterRender;
    use crate::fleet::resolve::{self, WithConfig};

    let fleet = fleet();
    let config = config("standard", edited.clone());
    let rows = crate::plugin::plan::rows(&fleet, &[&config]);
    let plan = rows
        .iter()
        .find(|row| row[0] == "team-a" && row[1] == "orders")
        .map(|row| row[3].clone())
        .unwrap_or_default();

    let old = self::config("standard", config_spec(Some("valkey-9-0-0"), None));
    let mut review = review(Operation::Update, "standard", Some(&config), Some(&old));
    review.now = k8s_openapi::jiff::Timestamp::now();
    let verdict = validate_config(&review, &fleet, &Policy::default());
    let warned = verdict
        .warnings
        .iter()
        .find_map(|w| w.strip_prefix("team-a/orders ("))
        .and_then(|rest| rest.split_once("): ").map(|(_, said)| said.to_owned()));
    let admission = match warned.as_deref() {
        None => "nothing",
        Some(said) if said.starts_with("rolls") => "rolls",
        Some(said) if said.starts_with("its configRef") => "unresolved",
        Some(_) => "live",
    };

    let after = WithConfig {
        inner: &fleet,
        name: "standard",
        spec: Some(&edited),
    };
    let cluster = cluster("team-a", "orders", "standard");
    let render = |effective| ClusterRender {
        cluster: &cluster,
        effective,
        default_zone_spread: ZoneSpread::BestEffort,
        cluster_domain: "cluster.local",
    };
    let before = resolve::resolve("standard", &fleet).unwrap();
    let controller = match resolve::resolve("standard", &after) {
        Err(_) => "unresolved",
        Ok(now) if render(&now).revision() != render(&before).revision() => "rolls",
        Ok(now)
            if render(&now).live_settings() != render(&before).live_settings()
                || now.acl != before.acl =>
        {
            "live"
        }
        Ok(_) => "nothing",
    };
    [plan, admission.to_owned(), controller.to_owned()]
}

#[test]
fn the_plan_admission_and_the_controller_agree_on_what_an_edit_does() {
    let base = || config_spec(Some("valkey-9-0-0"), None);
    let with = |edit: fn(&mut ValkeyConfigSpec)| {
        let mut spec = base();
        edit(&mut spec);
        spec
    };
    let table: [(&str, ValkeyConfigSpec, &str); 7] = [
        ("nothing changed", base(), "nothing"),
        (
            "another image",
            config_spec(Some("valkey-9-1-2"), None),
            "rolls",
        ),
        (
            "a live setting",
            with(|s| {
                s.valkey
                    .insert("maxmemory-policy".into(), "allkeys-lru".into());
            }),
            "live",
        ),
        (
            "a start-only setting",
            with(|s| {
                s.valkey.insert("databases".into(), "32".into());
            }),
            "rolls",
        ),
        (
            "more memory",
            with(|s| {
                s.resources = Some(crate::api::NodeResources {
                    cpu: None,
                    memory: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                        "2Gi".into(),
                    )),
                });
            }),
            "rolls",
        ),
        (
            "a platform user",
            with(|s| {
                s.acl = Some(vec![AclUser {
                    username: "metrics".into(),
                    password_hashes: vec![PasswordHash("a".repeat(64))],
                    password_secret_ref: None,
                    permissions: vec![],
                }]);
            }),
            "live",
        ),
        (
            "an image that does not exist",
            config_spec(Some("valkey-9-9-9"), None),
            "unresolved",
        ),
    ];
    for (edit, spec, expected) in table {
        let answers = three_answers(spec);
        assert_eq!(
            answers,
            [expected; 3].map(String::from),
            "{edit}: [plan, admission, controller]"
        );
    }
}

#[test]
fn the_write_bound_without_a_short_link_timeout_is_warned_through_the_chain() {
    let mut fleet = fleet();
    let mut base = config_spec(Some("valkey-9-0-0"), None);
    base.valkey
        .insert("min-replicas-to-write".into(), "1".into());
    fleet.upsert_config("bounded", base);
    let child = config("child", config_spec(None, Some("bounded")));
    let verdict = validate_config(
        &review(Operation::Create, "child", Some(&child), None),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.allowed(), "{}", joined(&verdict));
    assert!(
        (verdict.warnings.iter()).any(|w| w.contains("repl-timeout (60 s) drops it")),
        "{:?}",
        verdict.warnings
    );
    let mut tuned = config_spec(None, Some("bounded"));
    tuned.valkey.insert("repl-timeout".into(), "10".into());
    tuned
        .valkey
        .insert("repl-ping-replica-period".into(), "1".into());
    let tuned = config("child", tuned);
    let verdict = validate_config(
        &review(Operation::Create, "child", Some(&tuned), None),
        &fleet,
        &Policy::default(),
    );
    assert!(verdict.warnings.is_empty(), "{:?}", verdict.warnings);
}
