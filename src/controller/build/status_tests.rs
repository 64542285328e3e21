//! Tests of the pure status computation.

use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::api::ValkeyNodeSpec;
use crate::roll::{ReplicaSync, SlotRange, StallReason};

fn at(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn verdict(type_: ConditionType, status: bool, reason: Reason, message: &str) -> Verdict {
    Verdict {
        type_,
        status,
        reason,
        message: message.into(),
    }
}

fn desired(revision: &str) -> DesiredShape {
    DesiredShape {
        shards: 2,
        replicas_per_shard: 0,
        revision: revision.into(),
        switchover: None,
        primary_update: Default::default(),
        primary_spread: Default::default(),
    }
}

fn node(name: &str, shard: u32, revision: &str, slots: (u16, u16)) -> ObservedNode {
    ObservedNode {
        slots: vec![SlotRange::new(slots.0, slots.1)],
        ..ObservedNode::settled(name, shard, revision, Role::Primary)
    }
}

fn valkey_node(name: &str, shard: i32, version: &str, revision: &str) -> ValkeyNode {
    ValkeyNode::new(
        name,
        ValkeyNodeSpec {
            cluster: "c".into(),
            shard,
            image: format!("valkey:{version}"),
            version: version.into(),
            revision: revision.into(),
        },
    )
}

fn condition(status: &ValkeyClusterStatus, type_: ConditionType) -> &Condition {
    let found = status.conditions.iter().find(|c| c.type_ == type_.as_str());
    found.unwrap_or_else(|| panic!("no {type_} condition in {:?}", status.conditions))
}

#[test]
fn transition_time_moves_only_on_a_transition() {
    let mut conditions = Vec::new();
    let progressing =
        |message: &str| verdict(ConditionType::Progressing, true, Reason::Rolling, message);
    set_condition(
        &mut conditions,
        progressing("shard 0: join"),
        Some(2),
        at(100),
    );
    set_condition(
        &mut conditions,
        progressing("shard 1: failover"),
        Some(2),
        at(200),
    );
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].last_transition_time, at(100));
    assert_eq!(conditions[0].message, "shard 1: failover");
    let done = verdict(
        ConditionType::Progressing,
        false,
        Reason::UpToDate,
        "up to date",
    );
    set_condition(&mut conditions, done, Some(3), at(300));
    assert_eq!(conditions[0].last_transition_time, at(300));
    assert_eq!(conditions[0].status, "False");
    assert_eq!(conditions[0].reason, "UpToDate");
    assert_eq!(conditions[0].observed_generation, Some(3));
    let ready = verdict(ConditionType::Ready, true, Reason::AllSlotsServed, "");
    set_condition(&mut conditions, ready, Some(3), at(300));
    assert_eq!(conditions.len(), 2);
}

#[test]
fn versions_sort_by_precedence() {
    assert_eq!(versions_running(["9.1.2", "9.0.0", "9.1.2"]), "9.0.0,9.1.2");
    assert_eq!(versions_running(["10.0.0", "9.1.2"]), "9.1.2,10.0.0");
    assert_eq!(versions_running([]), "");
}

#[test]
fn a_converged_cluster_serving_every_slot_is_active_ready_and_healthy() {
    let observed = [
        node("c-0", 0, "r1", (0, 8191)),
        node("c-1", 1, "r1", (8192, 16383)),
    ];
    let nodes = [
        valkey_node("c-0", 0, "9.0.0", "r1"),
        valkey_node("c-1", 1, "9.0.0", "r1"),
    ];
    let pass = PassReport {
        generation: Some(4),
        shards: 2,
        nodes: &nodes,
        observed: &observed,
        desired: &desired("r1"),
        step: &Step::Converged,
        failure: None,
        rollout: None,
        granted: None,
    };
    let status = summarize(&ValkeyClusterStatus::default(), &pass, at(10));
    assert_eq!(status.state, Some(ClusterState::Active));
    assert_eq!(status.version.as_deref(), Some("9.0.0"));
    assert_eq!(status.outdated_nodes, Some(0));
    assert_eq!(status.observed_generation, Some(4));
    assert_eq!(status.shards[1].primary.as_deref(), Some("c-1"));
    assert_eq!(
        condition(&status, ConditionType::Ready).reason,
        "AllSlotsServed"
    );
    assert_eq!(
        condition(&status, ConditionType::Progressing).status,
        "False"
    );
    assert_eq!(
        condition(&status, ConditionType::Degraded).reason,
        "Healthy"
    );
    assert_eq!(
        status.roll, None,
        "the roll memory is the executor's to write"
    );
}

#[test]
fn a_stall_is_degraded_and_an_active_cluster_stays_active_while_slots_are_unserved() {
    let mut dead = node("c-1", 1, "r1", (8192, 16383));
    dead.reachable = false;
    let observed = [node("c-0", 0, "r1", (0, 8191)), dead];
    let stalled = Step::Stalled {
        reason: StallReason::NoPrimary { shard: 1 },
    };
    let pass = PassReport {
        generation: Some(1),
        shards: 2,
        nodes: &[],
        observed: &observed,
        desired: &desired("r2"),
        step: &stalled,
        failure: None,
        rollout: None,
        granted: None,
    };
    let before = ValkeyClusterStatus {
        state: Some(ClusterState::Active),
        ..Default::default()
    };
    let status = summarize(&before, &pass, at(10));
    assert_eq!(status.state, Some(ClusterState::Active));
    assert_eq!(status.outdated_nodes, Some(2));
    assert_eq!(condition(&status, ConditionType::Ready).status, "False");
    let degraded = condition(&status, ConditionType::Degraded);
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "RollStalled")
    );
    assert_eq!(
        degraded.message,
        "shard 1, Stalled (NoPrimary): shard 1 has no live primary"
    );
    assert_eq!(
        summarize(&ValkeyClusterStatus::default(), &pass, at(10)).state,
        Some(ClusterState::Creating)
    );
    // Its peers all see it up: only the operator's path to it is cut, its slots are served.
    let mut cut_off = observed.clone();
    cut_off[1].alive_to_peers = true;
    let pass = PassReport {
        observed: &cut_off,
        ..pass
    };
    let status = summarize(&before, &pass, at(10));
    assert_eq!(condition(&status, ConditionType::Ready).status, "True");
}

#[test]
fn a_failed_step_says_which_step_and_why() {
    let step = Step::JoinPrimary { shard: 1 };
    let pass = PassReport {
        generation: None,
        shards: 2,
        nodes: &[],
        observed: &[],
        desired: &desired("r1"),
        step: &step,
        failure: Some("pods is forbidden".into()),
        rollout: None,
        granted: None,
    };
    let status = summarize(&ValkeyClusterStatus::default(), &pass, at(10));
    let degraded = condition(&status, ConditionType::Degraded);
    assert_eq!(degraded.reason, "StepFailed");
    assert_eq!(
        degraded.message,
        "shard 1, JoinPrimary: join a new primary to shard 1: pods is forbidden"
    );
    let progressing = condition(&status, ConditionType::Progressing);
    assert_eq!(
        progressing.message,
        "shard 1, JoinPrimary: join a new primary to shard 1"
    );
}

#[test]
fn progress_counts_up_to_date_shards_and_outdated_nodes() {
    let observed = [
        node("c-0", 0, "r2", (0, 8191)),
        node("c-1", 1, "r1", (8192, 16383)),
        node("c-2", 1, "r2", (0, 0)),
    ];
    let progress = progress(&desired("r2"), &observed, &Step::Converged);
    assert_eq!(progress.shards, 2);
    assert_eq!(progress.shards_up_to_date, 1);
    assert_eq!(progress.outdated_nodes, 1);
    assert!(!progress.in_progress);
    assert_eq!(progress.words.step, "Converged");
    let stalled = Step::Stalled {
        reason: StallReason::NoPrimary { shard: 1 },
    };
    let progress = super::progress(&desired("r2"), &observed, &stalled);
    assert_eq!(
        progress.words.to_string(),
        "shard 1, Stalled (NoPrimary)",
        "the words of the Progressing and Degraded messages"
    );
}

#[test]
fn progress_counts_shards_short_of_in_sync_replicas_and_each_replicas_lag() {
    let mut replica = node("c-0-r", 0, "r2", (0, 0));
    replica.slots.clear();
    replica.role = Role::Replica;
    replica.sync = Some(ReplicaSync {
        link_up: true,
        sync_in_progress: false,
        offset: 900,
        primary_offset: 1000,
        known_to_primaries: true,
    });
    let mut syncing = replica.clone();
    syncing.name = "c-1-r".into();
    syncing.shard = 1;
    syncing.sync = syncing.sync.map(|s| ReplicaSync {
        sync_in_progress: true,
        ..s
    });
    let mut observed = [
        node("c-0", 0, "r2", (0, 8191)),
        replica,
        node("c-1", 1, "r2", (8192, 16383)),
        syncing,
    ];
    let one_replica = DesiredShape {
        replicas_per_shard: 1,
        ..desired("r2")
    };
    let progress = progress(&one_replica, &observed, &Step::Converged);
    assert_eq!(
        progress.shards_below_replica_target, 1,
        "shard 1's replica is still syncing"
    );
    let lags: Vec<(&str, Option<u64>)> = progress
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.lag_bytes))
        .collect();
    assert_eq!(
        lags,
        [
            ("c-0", None),
            ("c-0-r", Some(100)),
            ("c-1", None),
            ("c-1-r", Some(100))
        ]
    );
    // Its primary gone, a replica's lag is unknown, not 0.
    observed[2].reachable = false;
    let progress = super::progress(&one_replica, &observed, &Step::Converged);
    let lag = progress
        .nodes
        .iter()
        .find(|n| n.name == "c-1-r")
        .map(|n| n.lag_bytes);
    assert_eq!(lag, Some(None));
}

#[test]
fn acl_applied_names_the_refusing_node_first_then_unbuilt_users() {
    let refusal = |node: &str| NodeRefusal {
        node: node.into(),
        refusal: crate::execute::acl::Refusal {
            user: "app".into(),
            error: "ERR Error in ACL SETUSER modifier '+nosuch': Unknown command".into(),
        },
    };
    let missing = AclError::RoleMissing {
        user: "app".into(),
        role: "ghost".into(),
    };
    let refused = acl_applied(
        std::slice::from_ref(&missing),
        &[refusal("a-0-x"), refusal("a-0-y")],
    );
    assert!(!refused.status);
    assert_eq!(refused.reason, Reason::NodeRefused);
    assert!(
        refused
            .message
            .starts_with("node a-0-x: user app: ERR Error in ACL SETUSER"),
        "{}",
        refused.message
    );
    assert!(
        refused.message.contains("; node a-0-y: "),
        "{}",
        refused.message
    );

    let unbuilt = acl_applied(&[missing], &[]);
    assert!(!unbuilt.status);
    assert_eq!(unbuilt.reason, Reason::RoleMissing);
    assert!(unbuilt.message.contains("ValkeyRole ghost does not exist"));

    let invalid = AclError::Invalid {
        user: "app".into(),
        field: "key pattern".into(),
        message: "bad".into(),
    };
    assert_eq!(acl_applied(&[invalid], &[]).reason, Reason::InvalidAcl);

    let fine = acl_applied(&[], &[]);
    assert!(fine.status);
    assert_eq!(fine.type_, ConditionType::AclApplied);
    assert_eq!(fine.reason, Reason::UsersApplied);
}

#[test]
fn a_failing_verdict_is_news_once_per_reason() {
    let refused = verdict(
        ConditionType::AclApplied,
        false,
        Reason::NodeRefused,
        "node a: x",
    );
    let mut conditions = Vec::new();
    assert!(newly_failing(&conditions, &refused), "no condition yet");
    set_condition(&mut conditions, refused.clone(), Some(1), at(10));
    assert!(!newly_failing(&conditions, &refused), "already said");
    let missing = verdict(
        ConditionType::AclApplied,
        false,
        Reason::RoleMissing,
        "ghost",
    );
    assert!(newly_failing(&conditions, &missing), "another reason");
    let fine = verdict(ConditionType::AclApplied, true, Reason::UsersApplied, "");
    assert!(
        !newly_failing(&conditions, &fine),
        "true is never news here"
    );
    set_condition(&mut conditions, fine, Some(1), at(20));
    assert!(
        newly_failing(&conditions, &refused),
        "false again after true"
    );
}

#[test]
fn a_stall_is_news_once_and_dates_from_its_start() {
    let stalled =
        |message: &str| verdict(ConditionType::Degraded, true, Reason::RollStalled, message);
    let mut stored = Vec::new();
    let mut now = Vec::new();
    set_condition(
        &mut now,
        stalled("shard 0, Stalled (JoinOverdue): a"),
        Some(1),
        at(10),
    );
    assert!(stall_is_new(&stored, &now), "a stall began");
    assert_eq!(stalled_for(&now, &at(12)), Some(Duration::from_secs(2)));
    stored = now.clone();
    set_condition(
        &mut now,
        stalled("shard 0, Stalled (JoinOverdue): a"),
        Some(1),
        at(20),
    );
    assert!(!stall_is_new(&stored, &now), "the same stall, seen again");
    assert_eq!(
        stalled_for(&now, &at(25)),
        Some(Duration::from_secs(15)),
        "dated from its start"
    );
    set_condition(
        &mut now,
        stalled("shard 1, Stalled (NoPrimary)"),
        Some(1),
        at(30),
    );
    assert!(stall_is_new(&stored, &now), "another stall");
    let failed = verdict(ConditionType::Degraded, true, Reason::StepFailed, "x");
    set_condition(&mut now, failed, Some(1), at(40));
    assert!(!stall_is_new(&stored, &now), "a failed step is not a stall");
    assert_eq!(stalled_for(&now, &at(45)), None);
}

#[test]
fn creation_reaches_active_when_every_shard_has_its_replicas_and_invalid_recovers_via_creating() {
    let mut replica = node("c-0r", 0, "r1", (0, 0));
    replica.role = Role::Replica;
    replica.slots.clear();
    replica.sync = Some(ReplicaSync {
        link_up: true,
        sync_in_progress: false,
        offset: 10,
        primary_offset: 10,
        known_to_primaries: true,
    });
    let primaries = [
        node("c-0", 0, "r1", (0, 8191)),
        node("c-1", 1, "r1", (8192, 16383)),
    ];
    let with_replicas = DesiredShape {
        replicas_per_shard: 1,
        ..desired("r1")
    };
    let status_of = |observed: &[ObservedNode], before: Option<ClusterState>| {
        let pass = PassReport {
            generation: Some(1),
            shards: 2,
            nodes: &[],
            observed,
            desired: &with_replicas,
            step: &Step::Converged,
            failure: None,
            rollout: None,
            granted: None,
        };
        let before = ValkeyClusterStatus {
            state: before,
            ..Default::default()
        };
        summarize(&before, &pass, at(10)).state
    };
    // Every slot served, but shard 1 has no replica yet.
    let mut observed = primaries.to_vec();
    observed.push(replica.clone());
    assert_eq!(status_of(&observed, None), Some(ClusterState::Creating));
    assert_eq!(
        status_of(&observed, Some(ClusterState::Active)),
        Some(ClusterState::Active)
    );
    let mut second = replica;
    second.name = "c-1r".into();
    second.shard = 1;
    observed.push(second);
    assert_eq!(status_of(&observed, None), Some(ClusterState::Active));
    // A spec made acceptable again is created anew before it is Active.
    assert_eq!(
        status_of(&primaries, Some(ClusterState::Invalid)),
        Some(ClusterState::Creating)
    );
}

#[test]
fn the_message_says_what_needs_a_person_and_goes_when_it_is_resolved() {
    let mut conditions = Vec::new();
    let acl = verdict(
        ConditionType::AclApplied,
        false,
        Reason::RoleMissing,
        "user app: no role",
    );
    set_condition(&mut conditions, acl, Some(1), at(1));
    assert_eq!(
        needs_a_person(&conditions).as_deref(),
        Some("user app: no role")
    );
    let stall = verdict(
        ConditionType::Degraded,
        true,
        Reason::RollStalled,
        "shard 1 stalled",
    );
    set_condition(&mut conditions, stall, Some(1), at(2));
    assert_eq!(
        needs_a_person(&conditions).as_deref(),
        Some("shard 1 stalled")
    );
    let healthy = verdict(ConditionType::Degraded, false, Reason::Healthy, "all good");
    set_condition(&mut conditions, healthy, Some(1), at(3));
    let applied = verdict(
        ConditionType::AclApplied,
        true,
        Reason::UsersApplied,
        "2 users",
    );
    set_condition(&mut conditions, applied, Some(1), at(4));
    assert_eq!(needs_a_person(&conditions), None);
}

#[test]
fn nodes_whose_certificate_is_not_trusted_are_degraded_for_that_cause_and_the_gate_word_is_kept() {
    let mut untrusted = node("c-1", 1, "r1", (8192, 16383));
    (
        untrusted.reachable,
        untrusted.unreadable,
        untrusted.untrusted,
    ) = (false, true, true);
    let observed = [node("c-0", 0, "r1", (0, 8191)), untrusted];
    let pass = PassReport {
        generation: Some(1),
        shards: 2,
        nodes: &[],
        observed: &observed,
        desired: &desired("r1"),
        step: &Step::Converged,
        failure: None,
        rollout: Some(RolloutProgress::UpToDate),
        granted: None,
    };
    let status = summarize(&ValkeyClusterStatus::default(), &pass, at(10));
    let degraded = condition(&status, ConditionType::Degraded);
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "CertificateRefused")
    );
    assert!(
        degraded
            .message
            .starts_with("c-1 present a TLS certificate")
    );
    assert_eq!(status.rollout, Some(RolloutProgress::UpToDate));
}

#[test]
fn held_growth_is_degraded_naming_the_policy_and_the_granted_shape_is_kept() {
    let observed = [node("c-0", 0, "r1", (0, 16383))];
    let breach = Breach {
        policy: "limits".into(),
        field: "spec.replicasPerShard",
        message: "allows at most 3 Valkey nodes in namespace team-a".into(),
    };
    let shape = GrantedShape {
        shards: 1,
        replicas_per_shard: 0,
    };
    let held = [breach];
    let pass = PassReport {
        generation: Some(1),
        shards: 1,
        nodes: &[],
        observed: &observed,
        desired: &desired("r1"),
        step: &Step::Converged,
        failure: None,
        rollout: None,
        granted: Some((shape, &held)),
    };
    let status = summarize(&ValkeyClusterStatus::default(), &pass, at(10));
    let degraded = condition(&status, ConditionType::Degraded);
    assert_eq!(degraded.reason, "NamespacePolicy");
    assert!(
        degraded
            .message
            .starts_with("growth held at 1 shards of 0 replicas: spec.replicasPerShard: ValkeyNamespacePolicy limits"),
        "{}",
        degraded.message
    );
    assert_eq!(status.granted, Some(shape));
}

#[test]
fn a_pod_that_cannot_start_says_why_in_degraded_and_in_the_wait() {
    let mut pending = node("c-1", 1, "r1", (8192, 16383));
    pending.reachable = false;
    pending.lifecycle = Lifecycle::Joining;
    pending.slots = Vec::new();
    pending.not_started =
        Some("not schedulable: 0/6 nodes are available: 6 Insufficient cpu.".into());
    let observed = [node("c-0", 0, "r1", (0, 16383)), pending];
    let step = crate::roll::plan(&desired("r1"), &observed, &Default::default());
    let pass = PassReport {
        generation: Some(1),
        shards: 2,
        nodes: &[],
        observed: &observed,
        desired: &desired("r1"),
        step: &step,
        failure: None,
        rollout: None,
        granted: None,
    };
    let status = summarize(&ValkeyClusterStatus::default(), &pass, at(10));
    let degraded = condition(&status, ConditionType::Degraded);
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "PodNotStarted")
    );
    assert_eq!(
        degraded.message,
        "Pods have not started, the cluster waits for them: c-1 (not schedulable: 0/6 nodes are \
         available: 6 Insufficient cpu.)"
    );
    // What `status.message` is made of.
    assert_eq!(
        needs_a_person(&status.conditions).as_deref(),
        Some(degraded.message.as_str())
    );
    let progressing = condition(&status, ConditionType::Progressing);
    assert!(
        progressing.message.ends_with(
            "its Pod has not started: not schedulable: 0/6 nodes are available: 6 Insufficient cpu."
        ),
        "{}",
        progressing.message
    );
}
