//! Each main rule's wait or stall, asserted by variant on small hand-built clusters.

use super::*;
use crate::roll::model::{
    MAX_FAILOVER_ATTEMPTS, MAX_LOST_JOINS, ReplicaSync, SlotRange, UnfinishedMove,
};

const OLD: &str = "9.0.0";
const NEW: &str = "9.1.2";

fn shape(shards: u32, replicas_per_shard: u32, revision: &str) -> DesiredShape {
    DesiredShape {
        shards,
        replicas_per_shard,
        revision: revision.into(),
        switchover: None,
        primary_update: Default::default(),
        primary_spread: Default::default(),
    }
}

fn synced(offset: u64) -> ReplicaSync {
    ReplicaSync {
        link_up: true,
        sync_in_progress: false,
        offset,
        primary_offset: offset,
        known_to_primaries: true,
    }
}

/// An active, reachable, settled primary on `OLD` owning `slots`.
fn primary(name: &str, shard: u32, slots: Vec<SlotRange>) -> ObservedNode {
    ObservedNode {
        slots,
        ..ObservedNode::settled(name, shard, OLD, Role::Primary)
    }
}

/// An active, reachable, synced replica on `OLD`.
fn replica(name: &str, shard: u32) -> ObservedNode {
    ObservedNode {
        sync: Some(synced(100)),
        ..ObservedNode::settled(name, shard, OLD, Role::Replica)
    }
}

fn all_slots() -> Vec<SlotRange> {
    vec![SlotRange::new(0, (SLOT_COUNT - 1) as u16)]
}

/// Shard 0: `p0` owning every slot and its replica `r0`, all on `OLD`.
fn one_shard() -> Vec<ObservedNode> {
    vec![primary("p0", 0, all_slots()), replica("r0", 0)]
}

fn stall(step: Step) -> StallReason {
    match step {
        Step::Stalled { reason } => reason,
        other => panic!("expected a stall, got {other}"),
    }
}

fn wait(step: Step) -> WaitReason {
    match step {
        Step::Wait { reason } => reason,
        other => panic!("expected a wait, got {other}"),
    }
}

#[test]
fn a_settled_cluster_on_its_revision_is_converged() {
    let step = plan(&shape(1, 1, OLD), &one_shard(), &RollMemory::default());
    assert_eq!(step, Step::Converged);
}

#[test]
fn a_join_waits_until_ready_and_stalls_once_overdue() {
    let mut nodes = one_shard();
    let mut joining = replica("n1", 0);
    joining.revision = NEW.into();
    joining.lifecycle = Lifecycle::Joining;
    joining.sync = Some(ReplicaSync {
        sync_in_progress: true,
        ..synced(0)
    });
    nodes.push(joining);
    let desired = shape(1, 1, NEW);
    let memory = RollMemory::default();
    let expected_wait = WaitReason::Joining {
        node: "n1".into(),
        shard: 0,
        blocker: JoinBlocker::FullSync,
    };
    assert_eq!(wait(plan(&desired, &nodes, &memory)), expected_wait);

    nodes[2].join_overdue = true;
    let reason = stall(plan(&desired, &nodes, &memory));
    assert_eq!(
        reason,
        StallReason::JoinOverdue {
            node: "n1".into(),
            shard: 0,
            blocker: JoinBlocker::FullSync,
        }
    );
    assert_eq!(reason.kind(), "JoinOverdue");
}

#[test]
fn a_new_primary_waits_for_the_slot_map_only_while_another_node_serves_one() {
    let mut nodes = vec![primary("p0", 0, vec![SlotRange::new(0, 8191)])];
    let mut joining = primary("p1", 1, vec![]);
    joining.lifecycle = Lifecycle::Joining;
    joining.cluster_ok = false;
    nodes.push(joining);
    let desired = shape(2, 0, OLD);
    let memory = RollMemory::default();
    assert_eq!(
        wait(plan(&desired, &nodes, &memory)),
        WaitReason::Joining {
            node: "p1".into(),
            shard: 1,
            blocker: JoinBlocker::NoSlotMap,
        }
    );

    // Shard 1's slots were lost with its node: no one serves, so no slot map will come.
    nodes[0].cluster_ok = false;
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::Activate {
            shard: 1,
            node: "p1".into()
        }
    );
}

#[test]
fn a_join_behind_its_primary_says_by_how_much() {
    let mut nodes = one_shard();
    let mut joining = replica("n1", 0);
    joining.lifecycle = Lifecycle::Joining;
    joining.sync = Some(ReplicaSync {
        offset: 40,
        ..synced(90)
    });
    nodes.push(joining);
    let reason = wait(plan(&shape(1, 1, OLD), &nodes, &RollMemory::default()));
    let WaitReason::Joining { blocker, .. } = reason else {
        panic!("expected a join wait, got {reason}");
    };
    assert_eq!(
        blocker,
        JoinBlocker::Behind {
            offset: 40,
            primary_offset: 90
        }
    );
}

#[test]
fn a_failover_that_never_took_effect_is_retried_then_stalls_until_a_person_allows_more() {
    // Shard 0 mid-roll: its outdated primary p0, and n1, up to date and synced.
    let mut nodes = one_shard();
    let mut fresh = replica("n1", 0);
    fresh.revision = NEW.into();
    nodes.push(fresh);
    let desired = shape(1, 2, NEW);
    let retry = Step::Failover {
        shard: 0,
        from: "p0".into(),
        to: "n1".into(),
    };
    let mut memory = RollMemory::default();
    // Recorded, then the primary never changed (the process died, or it timed out).
    for _ in 1..MAX_FAILOVER_ATTEMPTS {
        memory.record_failover(NEW, 0, "target");
        assert_eq!(plan(&desired, &nodes, &memory), retry);
    }
    memory.record_failover(NEW, 0, "target");
    let reason = stall(plan(&desired, &nodes, &memory));
    assert_eq!(
        reason,
        StallReason::FailoverIncomplete {
            shard: 0,
            primary: "p0".into(),
            revision: OLD.into(),
            attempts: MAX_FAILOVER_ATTEMPTS,
        }
    );
    assert_eq!(reason.kind(), "FailoverIncomplete");

    assert_eq!(memory.allow_more_attempts(), [0]);
    assert_eq!(plan(&desired, &nodes, &memory), retry);
}

#[test]
fn a_failover_that_took_effect_is_never_followed_by_another() {
    let mut memory = RollMemory::default();
    memory.record_failover(NEW, 0, "target");
    // p0 is now an up-to-date replica of the up-to-date n1: the shard is done with failovers.
    let mut nodes = vec![
        primary("n1", 0, all_slots()),
        replica("p0", 0),
        replica("r0", 0),
    ];
    for node in &mut nodes[..2] {
        node.revision = NEW.into();
    }
    let step = plan(&shape(1, 1, NEW), &nodes, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "r0"),
        "{step}"
    );
}

#[test]
fn a_dead_primary_waits_for_valkey_only_when_a_replica_can_take_over() {
    let mut nodes = one_shard();
    nodes[0].reachable = false;
    let memory = RollMemory::default();
    assert_eq!(
        wait(plan(&shape(1, 1, OLD), &nodes, &memory)),
        WaitReason::ValkeyFailover {
            node: "p0".into(),
            shard: 0,
            slots: SLOT_COUNT,
        }
    );

    // Its replica silent for a moment too: still Valkey's (or a moment's) business.
    nodes[1].reachable = false;
    assert_eq!(
        wait(plan(&shape(1, 1, OLD), &nodes, &memory)),
        WaitReason::ValkeyFailover {
            node: "p0".into(),
            shard: 0,
            slots: SLOT_COUNT,
        }
    );
    // Both silent for long: the copy exists but will not answer; a person decides.
    nodes[0].hung = true;
    nodes[1].hung = true;
    assert_eq!(
        stall(plan(&shape(1, 1, OLD), &nodes, &memory)),
        StallReason::CopiesUnreachable {
            node: "p0".into(),
            shard: 0,
            slots: SLOT_COUNT,
        }
    );
    // No replica at all, the primary silent: nothing to fail over to.
    nodes.truncate(1);
    nodes[0].hung = false;
    assert_eq!(
        stall(plan(&shape(1, 0, OLD), &nodes, &memory)),
        StallReason::DeadPrimaryWithoutReplica {
            node: "p0".into(),
            shard: 0,
            slots: SLOT_COUNT,
        }
    );
}

#[test]
fn a_dead_primary_waits_for_a_replica_silent_for_a_moment_and_never_gives_a_copy_up() {
    let mut nodes = one_shard();
    nodes[0].reachable = false;
    nodes[0].terminated = true;
    nodes[1].reachable = false;
    let memory = RollMemory::default();
    let desired = shape(1, 1, OLD);
    assert_eq!(
        wait(plan(&desired, &nodes, &memory)),
        WaitReason::HeirUnreachable {
            node: "p0".into(),
            shard: 0,
            heir: "r0".into(),
        },
        "r0 holds every slot's data: never retire p0 as if nothing did"
    );
    nodes[1].hung = true;
    assert_eq!(
        stall(plan(&desired, &nodes, &memory)),
        StallReason::CopiesUnreachable {
            node: "p0".into(),
            shard: 0,
            slots: SLOT_COUNT,
        }
    );
    // A copy that answers but refuses the login, or answers what cannot be read, will not
    // change by itself: a person decides, instead of a wait without end.
    nodes[1].hung = false;
    for unusable in [
        |n: &mut ObservedNode| n.locked_out = true,
        |n: &mut ObservedNode| n.unreadable = true,
    ] {
        let mut nodes = nodes.clone();
        unusable(&mut nodes[1]);
        assert_eq!(
            stall(plan(&desired, &nodes, &memory)),
            StallReason::CopiesUnreachable {
                node: "p0".into(),
                shard: 0,
                slots: SLOT_COUNT,
            }
        );
    }
    nodes[1].reachable = true;
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::TakeOver {
            shard: 0,
            from: "p0".into(),
            to: "r0".into(),
        }
    );
    // Only when every copy has stopped for good are the slots served again, empty.
    nodes[1].reachable = false;
    nodes[1].terminated = true;
    let step = plan(&desired, &nodes, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "p0"),
        "{step}"
    );
}

#[test]
fn a_primary_taken_over_while_silent_is_a_copy_when_its_heir_dies() {
    // p0 went silent for long and r0 took its slots over; then r0 stopped for good while p0
    // was still silent. p0 owns no slots now but holds the shard's data up to its pause.
    let mut nodes = one_shard();
    let slots = std::mem::take(&mut nodes[0].slots);
    nodes[0].reachable = false;
    nodes[0].hung = true;
    nodes[1].slots = slots;
    nodes[1].role = Role::Primary;
    nodes[1].sync = None;
    nodes[1].reachable = false;
    nodes[1].terminated = true;
    let memory = RollMemory::default();
    let desired = shape(1, 1, OLD);
    assert_eq!(
        stall(plan(&desired, &nodes, &memory)),
        StallReason::CopiesUnreachable {
            node: "r0".into(),
            shard: 0,
            slots: SLOT_COUNT,
        },
        "p0 holds a copy: never serve the slots again empty while it may come back"
    );
    // Silent only for a moment, it is waited for.
    nodes[0].hung = false;
    assert!(
        matches!(wait(plan(&desired, &nodes, &memory)), WaitReason::HeirUnreachable { heir, .. } if heir == "p0")
    );
}

#[test]
fn a_primary_silent_for_long_is_taken_over_by_its_most_caught_up_replica() {
    let mut nodes = one_shard();
    let mut behind = replica("r1", 0);
    behind.sync = Some(synced(40));
    nodes.push(behind);
    nodes[0].reachable = false;
    nodes[0].hung = true;
    assert_eq!(
        plan(&shape(1, 2, OLD), &nodes, &RollMemory::default()),
        Step::TakeOver {
            shard: 0,
            from: "p0".into(),
            to: "r0".into(),
        }
    );
}

#[test]
fn a_replica_silent_only_to_the_operator_is_not_replaced() {
    // r0 does not answer the operator, but every node that answers sees it up: replacing it
    // would cost a full sync for a copy that still serves.
    let mut nodes = one_shard();
    nodes[1].reachable = false;
    nodes[1].hung = true;
    nodes[1].alive_to_peers = true;
    let memory = RollMemory::default();
    let desired = shape(1, 1, OLD);
    assert_eq!(
        wait(plan(&desired, &nodes, &memory)),
        WaitReason::ReplicaCutOff {
            node: "r0".into(),
            shard: 0,
        }
    );
    // Once its peers doubt it too, it is lost: a replacement joins.
    nodes[1].alive_to_peers = false;
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::JoinReplica {
            shard: 0,
            primary: "p0".into(),
        }
    );
    // A server that stopped for good is lost whatever its peers last saw: it goes (rule 2).
    nodes[1].alive_to_peers = true;
    nodes[1].terminated = true;
    let step = plan(&desired, &nodes, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "r0"),
        "{step}"
    );
}

#[test]
fn a_replica_cut_off_from_the_operator_holds_up_no_other_shard_nor_a_dead_replica() {
    // Two shards of two replicas each. Shard 0's r0a is cut off from the operator only;
    // its r0b died (its peers see it down).
    let mut nodes = vec![
        primary("p0", 0, vec![SlotRange::new(0, 8191)]),
        replica("r0a", 0),
        replica("r0b", 0),
        primary("p1", 1, vec![SlotRange::new(8192, 16383)]),
        replica("r1a", 1),
        replica("r1b", 1),
    ];
    nodes[1].reachable = false;
    nodes[1].alive_to_peers = true;
    nodes[2].reachable = false;
    let memory = RollMemory::default();
    // The dead one is replaced: r0a counts towards the target of 2, r0b does not.
    let desired = shape(2, 2, OLD);
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::JoinReplica {
            shard: 0,
            primary: "p0".into(),
        }
    );
    // Once shard 0 has nothing to do but wait for r0a, shard 1 still scales down.
    nodes.remove(2);
    let desired = shape(2, 1, OLD);
    let step = plan(&desired, &nodes, &memory);
    assert!(matches!(&step, Step::RetireNode { shard: 1, .. }), "{step}");
    // And with nothing left to do, the cluster waits for r0a instead of calling itself
    // converged.
    nodes.remove(4);
    assert_eq!(
        wait(plan(&desired, &nodes, &memory)),
        WaitReason::ReplicaCutOff {
            node: "r0a".into(),
            shard: 0,
        }
    );
}

#[test]
fn a_primary_silent_only_to_the_operator_is_never_taken_over() {
    // p0 has not answered the operator for long, but the nodes that answer all see it up:
    // the operator's own path to it is cut. A takeover would demote a primary that serves.
    let mut nodes = one_shard();
    nodes[0].reachable = false;
    nodes[0].hung = true;
    nodes[0].alive_to_peers = true;
    let memory = RollMemory::default();
    let desired = shape(1, 1, OLD);
    assert_eq!(
        wait(plan(&desired, &nodes, &memory)),
        WaitReason::OperatorCutOff {
            node: "p0".into(),
            shard: 0,
        }
    );
    // Once its peers see it down too, it is dead: taken over.
    nodes[0].alive_to_peers = false;
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::TakeOver {
            shard: 0,
            from: "p0".into(),
            to: "r0".into(),
        }
    );
    // A server that stopped for good is dead whatever its peers last saw.
    nodes[0].alive_to_peers = true;
    nodes[0].hung = false;
    nodes[0].terminated = true;
    assert!(matches!(
        plan(&desired, &nodes, &memory),
        Step::TakeOver { .. }
    ));
}

#[test]
fn a_dead_primary_is_taken_over_whatever_else_is_in_flight() {
    let mut nodes = one_shard();
    nodes.push(primary("p1", 1, vec![]));
    nodes[0].slots = vec![SlotRange::new(0, 8191)];
    nodes[2].slots = vec![SlotRange::new(8192, 16383)];
    nodes.push(replica("r1", 1));
    // A joiner that is not ready, and a roll stalled on a failover that never took effect.
    let mut joining = replica("n1", 1);
    joining.revision = NEW.into();
    joining.lifecycle = Lifecycle::Joining;
    joining.reachable = false;
    nodes.push(joining);
    let mut memory = RollMemory::default();
    for _ in 0..MAX_FAILOVER_ATTEMPTS {
        memory.record_failover(NEW, 1, "target");
    }
    nodes[0].reachable = false;
    nodes[0].terminated = true;
    assert_eq!(
        plan(&shape(2, 1, NEW), &nodes, &memory),
        Step::TakeOver {
            shard: 0,
            from: "p0".into(),
            to: "r0".into(),
        }
    );
}

#[test]
fn a_stopped_node_without_slots_is_retired_at_once() {
    let mut nodes = one_shard();
    let mut joining = replica("n1", 0);
    joining.revision = NEW.into();
    joining.lifecycle = Lifecycle::Joining;
    joining.sync = Some(ReplicaSync {
        sync_in_progress: true,
        ..synced(0)
    });
    nodes.push(joining);
    nodes[1].reachable = false;
    nodes[1].terminated = true;
    assert_eq!(
        plan(&shape(1, 1, NEW), &nodes, &RollMemory::default()),
        Step::RetireNode {
            shard: 0,
            node: "r0".into(),
            reason: "its server has stopped for good".into(),
        },
        "not held back by a join in flight"
    );
}

#[test]
fn a_joiner_silent_past_its_deadline_is_replaced_one_that_never_answered_stalls() {
    let mut nodes = one_shard();
    let mut joining = replica("n1", 0);
    joining.lifecycle = Lifecycle::Joining;
    joining.reachable = false;
    joining.join_overdue = true;
    nodes.push(joining);
    let desired = shape(1, 2, OLD);
    let memory = RollMemory::default();
    assert!(
        matches!(
            stall(plan(&desired, &nodes, &memory)),
            StallReason::JoinOverdue { .. }
        ),
        "a node that never answered (an image that never starts) stops the roll"
    );
    nodes[2].hung = true;
    let step = plan(&desired, &nodes, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, reason, .. } if node == "n1" && reason.contains("stopped answering")),
        "{step}"
    );
}

#[test]
fn a_joiner_whose_shard_lost_every_slot_owner_is_retired() {
    let mut nodes = vec![primary("p1", 1, vec![SlotRange::new(8192, 16383)])];
    let mut orphan = replica("n0", 0);
    orphan.lifecycle = Lifecycle::Joining;
    orphan.role = Role::Replica;
    orphan.sync = None;
    nodes.push(orphan);
    let step = plan(&shape(2, 1, OLD), &nodes, &RollMemory::default());
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "n0"),
        "{step}"
    );
}

#[test]
fn a_primary_whose_server_stopped_is_taken_over_at_once_or_retired_without_a_replica() {
    let mut nodes = one_shard();
    let mut behind = replica("r1", 0);
    behind.sync = Some(synced(40));
    nodes.push(behind);
    nodes[0].reachable = false;
    nodes[0].terminated = true;
    let memory = RollMemory::default();
    // The most caught-up replica, without waiting for Valkey's vote.
    assert_eq!(
        plan(&shape(1, 2, OLD), &nodes, &memory),
        Step::TakeOver {
            shard: 0,
            from: "p0".into(),
            to: "r0".into(),
        }
    );

    nodes.truncate(1);
    let step = plan(&shape(1, 0, OLD), &nodes, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "p0"),
        "{step}"
    );
}

#[test]
fn unowned_slots_without_a_primary_stall() {
    let nodes = vec![replica("r0", 0)];
    assert_eq!(
        stall(plan(&shape(1, 1, OLD), &nodes, &RollMemory::default())),
        StallReason::UnownedSlotsWithoutPrimary { shard: 0 }
    );
}

#[test]
fn an_unsettled_cluster_waits() {
    let memory = RollMemory::default();
    let mut nodes = one_shard();
    nodes[1].cluster_ok = false;
    assert_eq!(
        wait(plan(&shape(1, 1, OLD), &nodes, &memory)),
        WaitReason::ClusterNotOk { node: "r0".into() }
    );
    nodes[0].migrating = true;
    assert_eq!(
        wait(plan(&shape(1, 1, OLD), &nodes, &memory)),
        WaitReason::SlotMigration { node: "p0".into() }
    );
}

#[test]
fn a_key_by_key_move_left_open_is_finished_before_anything_else() {
    let memory = RollMemory::default();
    let mut nodes = vec![
        primary("p0", 0, vec![SlotRange::new(0, 8191)]),
        primary("p1", 1, vec![SlotRange::new(8192, 16383)]),
    ];
    // Even on a cluster that would otherwise roll (new revision) and has a node not yet ok.
    nodes[1].cluster_ok = false;
    nodes[0].unfinished_moves = vec![UnfinishedMove {
        to: "p1".into(),
        slots: vec![SlotRange::new(8000, 8191)],
    }];
    assert_eq!(
        plan(&shape(2, 0, NEW), &nodes, &memory),
        Step::MigrateSlots {
            from_shard: 0,
            to_shard: 1,
            from: "p0".into(),
            to: "p1".into(),
            slots: vec![SlotRange::new(8000, 8191)],
        }
    );
    // Its target not answering: the rules for a dead primary come first, nothing is moved.
    nodes[1].reachable = false;
    assert!(
        !matches!(
            plan(&shape(2, 0, NEW), &nodes, &memory),
            Step::MigrateSlots { .. }
        ),
        "a move towards a node that does not answer"
    );
}

#[test]
fn a_shard_without_a_live_primary_stalls() {
    let mut nodes = one_shard();
    nodes.push(replica("r1", 1));
    assert_eq!(
        stall(plan(&shape(2, 1, OLD), &nodes, &RollMemory::default())),
        StallReason::NoPrimary { shard: 1 }
    );
}

#[test]
fn two_primaries_owning_slots_in_a_shard_stall() {
    let nodes = vec![
        primary("p0", 0, vec![SlotRange::new(0, 8191)]),
        primary("p1", 0, vec![SlotRange::new(8192, (SLOT_COUNT - 1) as u16)]),
        replica("r0", 0),
    ];
    let reason = stall(plan(&shape(1, 1, OLD), &nodes, &RollMemory::default()));
    assert_eq!(
        reason,
        StallReason::TwoPrimaries {
            shard: 0,
            first: "p0".into(),
            second: "p1".into(),
        }
    );
    assert_eq!(reason.kind(), "TwoPrimaries");
}

#[test]
fn a_second_primary_owning_nothing_beside_the_slot_owner_is_retired() {
    let mut nodes = one_shard();
    nodes.push(primary("p1", 0, vec![]));
    assert_eq!(
        plan(&shape(1, 1, OLD), &nodes, &RollMemory::default()),
        Step::RetireNode {
            shard: 0,
            node: "p1".into(),
            reason: "a second primary of its shard, owning no slots".into(),
        }
    );
    // Whatever the names' order: the one that owns the slots stays.
    let mut nodes = vec![primary("a0", 0, vec![]), replica("r0", 0)];
    nodes.push(primary("z0", 0, all_slots()));
    assert!(matches!(
        plan(&shape(1, 1, OLD), &nodes, &RollMemory::default()),
        Step::RetireNode { node, .. } if node == "a0"
    ));
}

#[test]
fn an_outdated_primary_waits_for_its_successor_to_sync() {
    let mut nodes = one_shard();
    nodes[1].revision = NEW.into();
    nodes[1].sync = Some(ReplicaSync {
        known_to_primaries: false,
        ..synced(100)
    });
    let desired = shape(1, 1, NEW);
    let memory = RollMemory::default();
    assert_eq!(
        wait(plan(&desired, &nodes, &memory)),
        WaitReason::FailoverTargetSyncing {
            shard: 0,
            node: "r0".into(),
        }
    );

    nodes[1].sync = Some(synced(100));
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::Failover {
            shard: 0,
            from: "p0".into(),
            to: "r0".into(),
        }
    );
}

#[test]
fn an_evicted_primary_hands_over_to_the_best_staying_replica() {
    let mut nodes = one_shard();
    let mut fresh = replica("r1", 0);
    fresh.revision = NEW.into();
    fresh.sync = Some(synced(90));
    nodes.push(fresh);
    let desired = shape(1, 2, NEW);
    let memory = RollMemory::default();
    nodes[0].handover_requested = true;
    // Up-to-date first, though r0 is further ahead.
    let expected = Step::HandOver {
        shard: 0,
        from: "p0".into(),
        to: "r1".into(),
    };
    assert_eq!(plan(&desired, &nodes, &memory), expected);
    // Never onto a replica that is leaving too; nothing is recorded for the roll.
    nodes[2].handover_requested = true;
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::HandOver {
            shard: 0,
            from: "p0".into(),
            to: "r0".into(),
        }
    );
    // Without a synced replica that stays, the roll goes on as before.
    nodes[1].handover_requested = true;
    assert!(!matches!(
        plan(&desired, &nodes, &memory),
        Step::HandOver { .. }
    ));
}

/// A shard without replicas whose primary is marked to go (`mark`): a replica joins first, so
/// the data has somewhere to go; once synced it takes the shard over; only then does the marked
/// node go.
fn a_marked_primary_without_replicas_moves_by_a_surge_and_one_handover(
    mark: fn(&mut ObservedNode),
) {
    let desired = shape(1, 0, OLD);
    let memory = RollMemory::default();
    let mut nodes = vec![primary("p0", 0, all_slots())];
    mark(&mut nodes[0]);
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::JoinReplica {
            shard: 0,
            primary: "p0".into(),
        }
    );
    nodes.push(replica("r0", 0));
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::HandOver {
            shard: 0,
            from: "p0".into(),
            to: "r0".into(),
        }
    );
    let mut handed_over = replica("p0", 0);
    mark(&mut handed_over);
    let after = vec![handed_over, primary("r0", 0, all_slots())];
    let step = plan(&desired, &after, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "p0"),
        "{step}"
    );
}

#[test]
fn a_node_deleted_by_hand_is_replaced_before_it_goes_and_hands_its_shard_over() {
    a_marked_primary_without_replicas_moves_by_a_surge_and_one_handover(|n| n.leaving = true);
}

#[test]
fn an_evicted_primary_without_replicas_is_moved_by_a_surge_and_one_handover() {
    // A drain of the Node of a shard without replicas (the eviction webhook's mark).
    a_marked_primary_without_replicas_moves_by_a_surge_and_one_handover(|n| {
        n.handover_requested = true;
    });
}

#[test]
fn an_evicted_replica_is_replaced_before_it_is_retired() {
    // A drain of the replica's Node: the shard keeps its one replica throughout.
    let desired = shape(1, 1, OLD);
    let memory = RollMemory::default();
    let mut nodes = one_shard();
    nodes[1].handover_requested = true;
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::JoinReplica {
            shard: 0,
            primary: "p0".into(),
        }
    );
    // The replacement synced and active: now the evicted one goes.
    let mut replacement = replica("r1", 0);
    replacement.sync = Some(synced(100));
    nodes.push(replacement);
    let step = plan(&desired, &nodes, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "r0"),
        "{step}"
    );
}

/// `j0`, a joiner of the new revision whose server has stopped for good.
fn dead_new_joiner() -> ObservedNode {
    let mut joiner = replica("j0", 0);
    joiner.revision = NEW.into();
    joiner.lifecycle = Lifecycle::Joining;
    joiner.reachable = false;
    joiner.terminated = true;
    joiner
}

#[test]
fn new_joiners_whose_pods_are_removed_stall_for_the_clusters_own_cause() {
    let mut joiner = dead_new_joiner();
    joiner.removed = true;
    let nodes = [one_shard(), vec![joiner]].concat();
    let desired = shape(1, 1, NEW);
    // However many joiners failed, a removed one is not the revision's doing.
    let mut memory = RollMemory {
        lost_joins: MAX_LOST_JOINS + 5,
        removed_joins: MAX_LOST_JOINS,
        ..RollMemory::default()
    };
    let step = plan(&desired, &nodes, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "j0"),
        "{step}"
    );
    memory.removed_joins = MAX_LOST_JOINS + 1;
    assert_eq!(
        stall(plan(&desired, &nodes, &memory)),
        StallReason::JoinersRemoved {
            node: "j0".into(),
            shard: 0,
            removed: MAX_LOST_JOINS + 1,
        }
    );
}

#[test]
fn a_new_joiner_that_died_is_replaced_at_once_but_not_without_end() {
    let nodes = [one_shard(), vec![dead_new_joiner()]].concat();
    let desired = shape(1, 1, NEW);
    let mut memory = RollMemory {
        lost_joins: MAX_LOST_JOINS,
        ..RollMemory::default()
    };
    let step = plan(&desired, &nodes, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "j0"),
        "{step}"
    );
    memory.lost_joins = MAX_LOST_JOINS + 1;
    assert_eq!(
        stall(plan(&desired, &nodes, &memory)),
        StallReason::JoinsLost {
            node: "j0".into(),
            shard: 0,
            lost: MAX_LOST_JOINS + 1,
        }
    );
    // An outdated node that died is retired whatever the count: it is not the revision's fault.
    let mut old = nodes.clone();
    old[2].revision = OLD.into();
    let step = plan(&desired, &old, &memory);
    assert!(
        matches!(&step, Step::RetireNode { node, .. } if node == "j0"),
        "{step}"
    );
}

fn switchover(id: &str, shard: u32, to: Option<&str>) -> Option<crate::roll::model::Switchover> {
    Some(crate::roll::model::Switchover {
        id: id.into(),
        shard,
        to: to.map(Into::into),
    })
}

#[test]
fn a_switchover_asked_for_goes_once_to_the_replica_named_or_the_best_synced_one() {
    let mut nodes = one_shard();
    let mut behind = replica("r1", 0);
    behind.sync = Some(synced(50));
    nodes.push(behind);
    let mut desired = shape(1, 2, OLD);
    let mut memory = RollMemory::default();
    assert_eq!(plan(&desired, &nodes, &memory), Step::Converged);
    desired.switchover = switchover("a", 0, None);
    let to_best = Step::Switchover {
        shard: 0,
        from: "p0".into(),
        to: "r0".into(),
        request: "a".into(),
    };
    assert_eq!(
        plan(&desired, &nodes, &memory),
        to_best,
        "the most caught-up"
    );
    desired.switchover = switchover("b", 0, Some("r1"));
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::Switchover {
            shard: 0,
            from: "p0".into(),
            to: "r1".into(),
            request: "b".into(),
        },
        "the one named, once synced"
    );
    memory.switchover_done = Some("b".into());
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::Converged,
        "carried out once: the same request again does nothing"
    );
    let blocked = |desired: &DesiredShape, nodes: &[ObservedNode]| match plan(
        desired,
        nodes,
        &RollMemory::default(),
    ) {
        Step::Wait {
            reason: WaitReason::Switchover { blocker, .. },
        } => blocker,
        other => panic!("expected a blocked switchover, got {other}"),
    };
    desired.switchover = switchover("c", 0, Some("p0"));
    assert_eq!(
        blocked(&desired, &nodes),
        SwitchoverBlocker::NotAReplica { node: "p0".into() }
    );
    desired.switchover = switchover("d", 3, None);
    assert_eq!(blocked(&desired, &nodes), SwitchoverBlocker::NoSuchShard);
    nodes[2].sync = Some(ReplicaSync {
        link_up: false,
        ..synced(50)
    });
    desired.switchover = switchover("e", 0, Some("r1"));
    assert_eq!(
        blocked(&desired, &nodes),
        SwitchoverBlocker::NotSynced {
            node: Some("r1".into())
        }
    );
}

#[test]
fn a_supervised_roll_surges_the_replicas_then_waits_for_a_switchover() {
    let mut nodes = one_shard();
    let mut fresh = replica("r1", 0);
    fresh.revision = NEW.into();
    nodes.push(fresh);
    nodes.remove(1);
    let mut desired = shape(1, 1, NEW);
    desired.primary_update = crate::roll::model::PrimaryUpdate::Supervised;
    let memory = RollMemory::default();
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::Wait {
            reason: WaitReason::SupervisedFailover {
                shard: 0,
                primary: "p0".into(),
                target: "r1".into(),
            }
        }
    );
    desired.switchover = switchover("go", 0, None);
    assert_eq!(
        plan(&desired, &nodes, &memory),
        Step::Switchover {
            shard: 0,
            from: "p0".into(),
            to: "r1".into(),
            request: "go".into(),
        }
    );
    desired.primary_update = crate::roll::model::PrimaryUpdate::Automatic;
    desired.switchover = None;
    assert!(matches!(
        plan(&desired, &nodes, &memory),
        Step::Failover { .. }
    ));
}

/// `name` of `shard` on host `host`, in zone `z<host>` (one host per zone).
fn placed(mut node: ObservedNode, host: u32) -> ObservedNode {
    node.location = crate::roll::model::Location {
        host: Some(format!("h{host}")),
        zone: Some(format!("z{host}")),
    };
    node
}

/// A settled `shards` × 1 cluster on `OLD`: shard `s`'s primary `p<s>` on host
/// `primaries[s]`, its replica `r<s>` on host `replicas[s]`.
fn placed_cluster(primaries: &[u32], replicas: &[u32]) -> Vec<ObservedNode> {
    let shards = primaries.len() as u32;
    (0..shards)
        .flat_map(|s| {
            let slots = vec![bootstrap_range(s, shards)];
            [
                placed(primary(&format!("p{s}"), s, slots), primaries[s as usize]),
                placed(replica(&format!("r{s}"), s), replicas[s as usize]),
            ]
        })
        .collect()
}

/// What a switchover leaves: `to` primary with `from`'s slots, `from` its synced replica.
fn switch_over(nodes: &mut [ObservedNode], from: &str, to: &str) {
    let slots = nodes
        .iter()
        .find(|n| n.name == from)
        .map(|n| n.slots.clone())
        .unwrap_or_default();
    for node in nodes.iter_mut() {
        if node.name == from {
            node.role = Role::Replica;
            node.slots = Vec::new();
            node.sync = Some(synced(100));
        } else if node.name == to {
            node.role = Role::Primary;
            node.slots = slots.clone();
            node.sync = None;
        }
    }
}

#[test]
fn primaries_sharing_a_place_are_spread_by_one_switchover_and_then_left_alone() {
    // Shards 0 and 1 both primary on h1; h2 holds only replicas.
    let mut nodes = placed_cluster(&[1, 1, 3], &[2, 2, 1]);
    let desired = shape(3, 1, OLD);
    let memory = RollMemory::default();
    let step = plan(&desired, &nodes, &memory);
    assert_eq!(
        step,
        Step::Rebalance {
            shard: 1,
            from: "p1".into(),
            to: "r1".into()
        }
    );
    switch_over(&mut nodes, "p1", "r1");
    assert_eq!(plan(&desired, &nodes, &memory), Step::Converged);
    // A target still catching up is waited for, not passed over for another choice.
    let mut lagging = placed_cluster(&[1, 1, 3], &[2, 2, 1]);
    lagging[3].sync = Some(ReplicaSync {
        sync_in_progress: true,
        ..synced(0)
    });
    assert_eq!(
        plan(&desired, &lagging, &memory),
        Step::Wait {
            reason: WaitReason::FailoverTargetSyncing {
                shard: 1,
                node: "r1".into()
            }
        }
    );

    // Turned off, or supervised: left where they are.
    let mut off = shape(3, 1, OLD);
    off.primary_spread = crate::roll::model::PrimarySpread::Off;
    let crowded = placed_cluster(&[1, 1, 3], &[2, 2, 1]);
    assert_eq!(plan(&off, &crowded, &memory), Step::Converged);
    let mut supervised = shape(3, 1, OLD);
    supervised.primary_update = PrimaryUpdate::Supervised;
    assert_eq!(plan(&supervised, &crowded, &memory), Step::Converged);

    // A shard a person switched over stays while the request stands: the other one moves.
    let mut asked = shape(3, 1, OLD);
    asked.switchover = switchover("mine", 1, None);
    let done = RollMemory {
        switchover_done: Some("mine".into()),
        ..RollMemory::default()
    };
    assert_eq!(
        plan(&asked, &crowded, &done),
        Step::Rebalance {
            shard: 0,
            from: "p0".into(),
            to: "r0".into()
        }
    );
}

#[test]
fn a_primary_where_the_roll_put_it_stays_there() {
    // The roll failed shard 1 over onto p1 (on h1, beside p0): its one failover.
    let crowded = placed_cluster(&[1, 1, 3], &[2, 2, 1]);
    let mut memory = RollMemory::default();
    memory.record_failover(OLD, 1, "p1");
    assert_eq!(
        plan(&shape(3, 1, OLD), &crowded, &memory),
        Step::Rebalance {
            shard: 0,
            from: "p0".into(),
            to: "r0".into()
        }
    );
    memory.record_failover(OLD, 0, "p0");
    assert_eq!(plan(&shape(3, 1, OLD), &crowded, &memory), Step::Converged);
    // Once a shard's primary is another node than the roll's (a failover since), it may move.
    memory.failover_targets.insert(1, "r1".into());
    assert!(matches!(
        plan(&shape(3, 1, OLD), &crowded, &memory),
        Step::Rebalance { shard: 1, .. }
    ));
}

#[test]
fn primaries_are_not_moved_while_anything_is_rolled_or_missing() {
    let crowded = placed_cluster(&[1, 1, 3], &[2, 2, 1]);
    let memory = RollMemory::default();
    // A roll: its own steps, never a rebalance.
    assert!(matches!(
        plan(&shape(3, 1, NEW), &crowded, &memory),
        Step::JoinReplica { .. }
    ));
    // A replica that does not answer: replaced first.
    let mut silent = crowded.clone();
    silent[3].reachable = false;
    assert!(!matches!(
        plan(&shape(3, 1, OLD), &silent, &memory),
        Step::Rebalance { .. }
    ));
}

#[test]
fn a_roll_fails_over_onto_the_replica_that_keeps_primaries_apart() {
    // Shard 0 rolls; its two up-to-date replicas stand on h2 (which holds shard 1's primary)
    // and h3 (which holds none). The one on h2 is further ahead; h3 still wins.
    let fresh = |node: ObservedNode, host: u32| {
        placed(
            ObservedNode {
                revision: NEW.into(),
                ..node
            },
            host,
        )
    };
    let mut nodes = vec![
        placed(primary("p0", 0, vec![bootstrap_range(0, 2)]), 1),
        fresh(primary("p1", 1, vec![bootstrap_range(1, 2)]), 2),
        fresh(replica("r1", 1), 1),
    ];
    for (name, host, offset) in [("n0a", 2, 900), ("n0b", 3, 100)] {
        let mut joined = fresh(replica(name, 0), host);
        joined.sync = Some(synced(offset));
        nodes.push(joined);
    }
    assert_eq!(
        plan(&shape(2, 1, NEW), &nodes, &RollMemory::default()),
        Step::Failover {
            shard: 0,
            from: "p0".into(),
            to: "n0b".into()
        }
    );
}

#[test]
fn replacements_of_a_lost_machines_nodes_join_side_by_side() {
    // Both replicas were on the lost machine; shard 0's replacement is joining already.
    let mut nodes = placed_cluster(&[1, 2], &[3, 3]);
    nodes.retain(|n| !n.name.starts_with('r'));
    let mut joining = replica("j0", 0);
    joining.lifecycle = Lifecycle::Joining;
    joining.sync = Some(ReplicaSync {
        sync_in_progress: true,
        ..synced(0)
    });
    nodes.push(joining);
    let memory = RollMemory::default();
    assert_eq!(
        plan(&shape(2, 1, OLD), &nodes, &memory),
        Step::JoinReplica {
            shard: 1,
            primary: "p1".into()
        }
    );
    // Shard 1's is joining too: now both are waited for.
    let mut second = replica("j1", 1);
    second.lifecycle = Lifecycle::Joining;
    second.reachable = false;
    nodes.push(second);
    assert!(matches!(
        plan(&shape(2, 1, OLD), &nodes, &memory),
        Step::Wait {
            reason: WaitReason::Joining { .. }
        }
    ));
}

proptest::proptest! {
    /// Wherever a cluster's nodes stand, rebalancing ends, no shard moves twice, and no
    /// single handover would leave the primaries less crowded than where it ends.
    #[test]
    fn rebalancing_ends_and_moves_each_shard_at_most_once(
        placement in proptest::collection::vec((0u32..4, 0u32..4), 1..6)
    ) {
        let primaries: Vec<u32> = placement.iter().map(|p| p.0).collect();
        let replicas: Vec<u32> = placement.iter().map(|p| p.1).collect();
        let mut nodes = placed_cluster(&primaries, &replicas);
        let desired = shape(placement.len() as u32, 1, OLD);
        let memory = RollMemory::default();
        let mut moved = std::collections::BTreeSet::new();
        loop {
            match plan(&desired, &nodes, &memory) {
                Step::Rebalance { shard, from, to } => {
                    proptest::prop_assert!(moved.insert(shard), "shard {} moved twice", shard);
                    switch_over(&mut nodes, &from, &to);
                }
                Step::Converged => break,
                other => proptest::prop_assert!(false, "{}", other),
            }
        }
        let view = View { desired: &desired, nodes: nodes.iter().collect() };
        proptest::prop_assert_eq!(single_spreading_move(&view, &memory), None);
    }
}
