//! The rules of a roll, in the order they are checked. [`plan`] returns the first rule's step.
//! Healing comes first, whatever else is in flight; the roll itself last.
//!
//! 1. A primary that owns slots but does not answer. If it is dead (its server stopped for
//!    good, or it has been silent for long while its Pod runs, and the nodes that answer do
//!    not all see it up: if they do, only the operator is cut off from it, and it waits), its
//!    most caught-up replica takes over; while a replica of it is silent only for a moment, that one is waited for
//!    first. With no copy left (a replica, or a primary of the shard taken over while it was
//!    silent), a primary whose server stopped is retired and its slots served again, empty;
//!    copies that exist but stay silent stall for a person. A primary silent only for a
//!    moment waits for Valkey's own failover (or stalls without a replica).
//! 2. A node whose server stopped for good and owns no slots is retired: it counts for nothing
//!    and holds nothing. Unless it is a joiner of the new revision and more than
//!    `MAX_LOST_JOINS` of those died lately: then the roll stalls (the revision is the likely
//!    cause), which halts a fleet rollout. Joiners whose Pods were removed (not failed) are
//!    counted apart: past the same bound the roll stalls too, for a cause of the cluster's own,
//!    which halts nobody.
//! 3. A failover of this roll that left the primary unchanged every one of the
//!    `MAX_FAILOVER_ATTEMPTS` times it was issued stalls the cluster (fewer: rule 9 retries it;
//!    never a second failover after one that took effect).
//! 4. A `Joining` node is activated once ready; until then the cluster waits for it, but first
//!    a shard left short of replicas (a node lost) with no joiner of its own gets one: the
//!    replacements of a lost machine's nodes join side by side, not one shard after another. Past its
//!    deadline, one that answered once and went silent is retired (a new one is joined), one
//!    that never answered stalls the roll. A joiner whose shard has lost every slot owner is
//!    retired. A new shard's primary is ready once it sees the slot map, if any other node
//!    serves one.
//! 5. A desired shard without any node gets a new primary (bootstrap, shards up).
//! 6. Slots nobody owns are assigned, each desired shard taking its even contiguous share.
//! 7. A key-by-key slot migration left open between two live primaries (the operator stopped
//!    in the middle of one) is finished first; a node that does not report `cluster_state:ok`,
//!    or a running atomic slot migration: wait.
//! 8. A primary whose Pod is being evicted, or whose ValkeyNode was deleted by hand, hands its
//!    shard over to its most caught-up synced replica (up-to-date ones first; never one that is
//!    itself leaving). A node being evicted or deleted by hand counts as outdated from then on
//!    (rule 9 replaces it before retiring it). Then a switchover a person asked for, once: the
//!    shard's primary hands over to the replica named, or to its most caught-up synced replica
//!    (up-to-date ones first); while that cannot be done, the cluster waits and says why.
//! 9. Replicas, one shard at a time (a shard already being rolled goes first), replacing before
//!    retiring, exactly as the upgrade guide describes (first, a second primary of a shard that
//!    owns no slots beside one that owns them is retired; two that own slots stall; a replica
//!    only the operator cannot reach, every answering node seeing it up, counts towards the
//!    target and is not retired as dead: rules 4 and 9 do not replace it):
//!    join an up-to-date replica while the shard is at or below its target and something is
//!    outdated (or it is below target); retire the dead, then outdated replicas, only while
//!    the shard stays at or above target; if the primary is outdated, one clean failover per
//!    roll onto the most caught-up synced up-to-date replica (with a supervised primary update,
//!    it waits there for a person's switchover, rule 8); retire excess replicas (scale down)
//!    only once the primary is up to date.
//! 10. Slots are balanced: shards being removed are drained first, a target must see the
//!     topology (rule 7) before slots move to it.
//! 11. Drained shards beyond the desired count are retired, replicas first, then the primary.
//! 12. Once every node answers and is up to date, primaries are spread over zones, then hosts
//!     (see [`super::spread`]): each shard whose primary stands elsewhere than the least
//!     crowded way of placing them all puts it hands over to the synced replica there, one
//!     shard at a time, each at most once. Never under a supervised primary update, nor for a
//!     shard a person switched over while that request stands, nor for one whose primary
//!     stands where this revision's roll failed it over to (the roll's failover was its one
//!     failover for that change), nor when turned off.
//! 13. With nothing else to do, a replica only the operator cannot reach (every node that
//!     answers sees it up) is waited for: the cluster says so instead of calling itself
//!     converged.
//!
//! Every planned handover (rules 8, 9 and 12) goes to the synced replica that leaves the
//! primaries least crowded, then to the most caught-up; a takeover of a dead primary (rule 1) to
//! the most caught-up, whatever its place: there, data comes first.
//!
//! A primary that owns slots, or the primary of a desired shard, is never retired, unless its
//! server has stopped for good and no copy of its slots is left anywhere (rule 1): then its
//! data is gone already.

use std::collections::BTreeSet;

use super::model::{
    DesiredShape, Lifecycle, Location, MAX_LOST_JOINS, ObservedNode, PrimarySpread, PrimaryUpdate,
    Role, RollMemory, Step,
};
use super::reasons::{JoinBlocker, StallReason, SwitchoverBlocker, WaitReason};
use super::slots::{
    SLOT_COUNT, bootstrap_range, coverage, take_highest, target_count, uncovered_parts,
};
use super::spread::{Crowding, best_choice};

/// The next step towards `desired`, given the observed `nodes` and the roll's `memory`.
pub fn plan(desired: &DesiredShape, nodes: &[ObservedNode], memory: &RollMemory) -> Step {
    let mut sorted: Vec<&ObservedNode> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let view = View {
        desired,
        nodes: sorted,
    };
    dead_primaries(&view)
        .or_else(|| gone_nodes(&view, memory))
        .or_else(|| failed_failovers(&view, memory))
        .or_else(|| joining_nodes(&view))
        .or_else(|| missing_primaries(&view))
        .or_else(|| unassigned_slots(&view))
        .or_else(|| unsettled_cluster(&view))
        .or_else(|| handovers(&view))
        .or_else(|| requested_switchover(&view, memory))
        .or_else(|| shard_replicas(&view, memory))
        .or_else(|| slot_balance(&view))
        .or_else(|| removed_shards(&view))
        .or_else(|| spread_primaries(&view, memory))
        .or_else(|| replicas_out_of_reach(&view))
        .unwrap_or(Step::Converged)
}

/// Rule 13: with nothing else to do, a replica only the operator cannot reach keeps the
/// cluster from calling itself converged; it waits, and says why.
fn replicas_out_of_reach(view: &View) -> Option<Step> {
    let node = (view.nodes.iter()).find(|n| is_replica_cut_off(n))?;
    Some(Step::Wait {
        reason: WaitReason::ReplicaCutOff {
            node: node.name.clone(),
            shard: node.shard,
        },
    })
}

/// An active replica only the operator cannot reach (see [`View::cut_off_replica_count`]).
fn is_replica_cut_off(node: &ObservedNode) -> bool {
    node.cut_off_from_operator_only()
        && node.role == Role::Replica
        && node.lifecycle == Lifecycle::Active
}

struct View<'a> {
    desired: &'a DesiredShape,
    nodes: Vec<&'a ObservedNode>,
}

impl<'a> View<'a> {
    fn in_shard(&self, shard: u32) -> impl Iterator<Item = &'a ObservedNode> + '_ {
        self.nodes.iter().copied().filter(move |n| n.shard == shard)
    }

    /// Every shard that is desired or still has nodes.
    fn shards(&self) -> BTreeSet<u32> {
        (0..self.desired.shards)
            .chain(self.nodes.iter().map(|n| n.shard))
            .collect()
    }

    /// The live primaries of a shard, the one owning slots first.
    fn primaries(&self, shard: u32) -> Vec<&'a ObservedNode> {
        let mut primaries: Vec<&ObservedNode> = self
            .in_shard(shard)
            .filter(|n| n.reachable && n.lifecycle == Lifecycle::Active && n.role == Role::Primary)
            .collect();
        primaries.sort_by_key(|n| n.slot_count() == 0);
        primaries
    }

    fn primary(&self, shard: u32) -> Option<&'a ObservedNode> {
        self.primaries(shard).first().copied()
    }

    /// Live, active replicas of a shard: the ones that count towards its target.
    fn replicas(&self, shard: u32) -> Vec<&'a ObservedNode> {
        self.in_shard(shard)
            .filter(|n| n.reachable && n.lifecycle == Lifecycle::Active && n.role == Role::Replica)
            .collect()
    }

    /// How many active replicas of the shard only the operator cannot reach: the server has not
    /// stopped, and every node that answers sees it up. Rules 4 and 9 count them towards the
    /// target and do not retire them; once nothing else is to be done, the cluster waits for
    /// them (rule 13) rather than calling itself converged.
    fn cut_off_replica_count(&self, shard: u32) -> usize {
        (self.in_shard(shard))
            .filter(|n| is_replica_cut_off(n))
            .count()
    }

    /// Live, active replicas of a shard that are not leaving themselves: the ones a primary's
    /// role may be handed to.
    fn staying_replicas(&self, shard: u32) -> Vec<&'a ObservedNode> {
        self.replicas(shard)
            .into_iter()
            .filter(|n| !n.handover_requested && !n.leaving)
            .collect()
    }

    /// The synced one of `candidates` a primary's role goes to in a planned handover:
    /// up-to-date ones first, then the one leaving the primaries least crowded, then the most
    /// caught-up, then by name.
    fn best_heir(&self, candidates: &[&'a ObservedNode]) -> Option<&'a ObservedNode> {
        candidates
            .iter()
            .copied()
            .filter(|n| n.sync.is_some_and(|s| s.is_synced()))
            .max_by(|a, b| {
                let rank = |n: &ObservedNode| {
                    (
                        n.is_up_to_date(self.desired),
                        std::cmp::Reverse(self.crowding_with(n)),
                        replica_offset(n),
                    )
                };
                rank(a).cmp(&rank(b)).then_with(|| b.name.cmp(&a.name))
            })
    }

    /// How crowded the desired shards' primaries stand now.
    fn crowding(&self) -> Crowding {
        Crowding::of(
            (0..self.desired.shards)
                .filter_map(|shard| self.primary(shard))
                .map(|p| &p.location),
        )
    }

    /// How crowded they would stand with `heir` the primary of its shard.
    fn crowding_with(&self, heir: &ObservedNode) -> Crowding {
        Crowding::of(
            (0..self.desired.shards)
                .filter(|&shard| shard != heir.shard)
                .filter_map(|shard| self.primary(shard))
                .map(|p| &p.location)
                .chain([&heir.location]),
        )
    }

    fn owned_slots(&self) -> u32 {
        self.nodes.iter().map(|n| n.slot_count()).sum()
    }

    /// How many nodes of `shard` own slots, answering or not.
    fn slot_owners(&self, shard: u32) -> usize {
        self.in_shard(shard).filter(|n| n.slot_count() > 0).count()
    }

    /// Another live node reports `cluster_state:ok`: there is a slot map for `node` to learn.
    /// When none does (a shard's slots were lost), waiting for one would never end; the new
    /// primary is activated and takes the lost slots (rule 6).
    fn serving_elsewhere(&self, node: &ObservedNode) -> bool {
        self.nodes
            .iter()
            .any(|n| n.name != node.name && n.reachable && n.cluster_ok)
    }
}

/// Rule 3: the failover of a shard that left its outdated primary in place every one of the
/// [`MAX_FAILOVER_ATTEMPTS`](super::model::MAX_FAILOVER_ATTEMPTS) times it was issued. Nothing
/// but healing moves until a person has looked (see `RollMemory::allow_more_attempts`). Fewer
/// attempts are retried by rule 9, as any failover: the primary, observed, never changed, so
/// no second failover can follow a first.
fn failed_failovers(view: &View, memory: &RollMemory) -> Option<Step> {
    let desired = view.desired;
    memory
        .failover_attempts
        .keys()
        .filter(|&&shard| !memory.may_fail_over(&desired.revision, shard))
        .find_map(|&shard| {
            let primary = view.primary(shard)?;
            (!primary.is_up_to_date(desired)).then(|| Step::Stalled {
                reason: StallReason::FailoverIncomplete {
                    shard,
                    primary: primary.name.clone(),
                    revision: primary.revision.clone(),
                    attempts: memory.attempts(&desired.revision, shard),
                },
            })
        })
}

/// Rule 4: activate, wait for, retire or stall on `Joining` nodes.
fn joining_nodes(view: &View) -> Option<Step> {
    let joining: Vec<&ObservedNode> = view
        .nodes
        .iter()
        .copied()
        .filter(|n| n.lifecycle == Lifecycle::Joining)
        .collect();
    let blockers: Vec<(&ObservedNode, JoinBlocker)> = joining
        .iter()
        .filter_map(|n| join_blocker(view, n).map(|why| (*n, why)))
        .collect();
    // A joiner that can become nothing is abandoned: it holds no slots and counts towards
    // nothing, so retiring it is safe. A join the spec has since moved past (e.g. onto an
    // image that never started, then fixed); one that answered and then went silent past its
    // deadline (a new node is joined instead); one whose shard lost every slot owner before it
    // synced (no primary will ever be there for it to follow).
    let abandoned = blockers.iter().find_map(|(n, why)| {
        if !n.slots.is_empty() {
            return None;
        }
        let reason = if !n.is_up_to_date(view.desired) {
            format!("its join is outdated and never completed ({why})")
        } else if n.join_overdue && n.hung {
            format!("it stopped answering while joining ({why}); a new node replaces it")
        } else if *why == JoinBlocker::NotPrimary && view.slot_owners(n.shard) == 0 {
            format!(
                "shard {} lost its primary before this node synced; the shard starts again",
                n.shard
            )
        } else {
            return None;
        };
        Some(Step::RetireNode {
            shard: n.shard,
            node: n.name.clone(),
            reason,
        })
    });
    if let Some(retire) = abandoned {
        return Some(retire);
    }
    if let Some(ready) = joining
        .iter()
        .find(|n| !blockers.iter().any(|(b, _)| b.name == n.name))
    {
        return Some(Step::Activate {
            shard: ready.shard,
            node: ready.name.clone(),
        });
    }
    if let Some((node, why)) = blockers.iter().find(|(n, _)| n.join_overdue) {
        return Some(Step::Stalled {
            reason: StallReason::JoinOverdue {
                node: node.name.clone(),
                shard: node.shard,
                blocker: why.clone(),
            },
        });
    }
    if !blockers.is_empty()
        && let Some(join) = short_shard(view)
    {
        return Some(join);
    }
    blockers.first().map(|(node, why)| Step::Wait {
        reason: WaitReason::Joining {
            node: node.name.clone(),
            shard: node.shard,
            blocker: why.clone(),
        },
    })
}

/// Rule 4, while joiners are waited for: a desired shard whose live primary owns slots, with
/// fewer live replicas than its target and no joiner of its own, gets a replica now rather
/// than after every other shard's joiner is ready (as rule 9 would). Only on a settled cluster
/// (rule 7's conditions), so a moment's trouble never surges nodes.
fn short_shard(view: &View) -> Option<Step> {
    // Only where rule 7 would let the cluster act at all.
    if unsettled_cluster(view).is_some() {
        return None;
    }
    let target = view.desired.replicas_per_shard as usize;
    (0..view.desired.shards).find_map(|shard| {
        let primary = view.primary(shard).filter(|p| p.slot_count() > 0)?;
        let joining = view
            .in_shard(shard)
            .any(|n| n.lifecycle == Lifecycle::Joining);
        let short = view.replicas(shard).len() + view.cut_off_replica_count(shard) < target;
        (!joining && short).then(|| Step::JoinReplica {
            shard,
            primary: primary.name.clone(),
        })
    })
}

/// Why a joining node is not ready yet, or `None` when it is.
fn join_blocker(view: &View, node: &ObservedNode) -> Option<JoinBlocker> {
    if !node.reachable {
        return Some(match &node.not_started {
            Some(why) => JoinBlocker::NotStarted { why: why.clone() },
            None => JoinBlocker::Unreachable,
        });
    }
    match view.primary(node.shard) {
        Some(primary) => {
            if node.role != Role::Replica {
                return Some(JoinBlocker::NotYetReplica {
                    primary: primary.name.clone(),
                });
            }
            let Some(sync) = node.sync else {
                return Some(JoinBlocker::NoReplicationState);
            };
            if !sync.link_up {
                Some(JoinBlocker::LinkDown)
            } else if sync.sync_in_progress {
                Some(JoinBlocker::FullSync)
            } else if sync.offset < sync.primary_offset {
                Some(JoinBlocker::Behind {
                    offset: sync.offset,
                    primary_offset: sync.primary_offset,
                })
            } else if !sync.known_to_primaries {
                Some(JoinBlocker::UnknownToPrimaries {
                    primary: primary.name.clone(),
                })
            } else {
                None
            }
        }
        None if node.role != Role::Primary => Some(JoinBlocker::NotPrimary),
        None if !node.cluster_ok && view.serving_elsewhere(node) => Some(JoinBlocker::NoSlotMap),
        None => None,
    }
}

/// Rule 1: a slot owner that does not answer. Dead (its server stopped for good, or silent
/// for long while its Pod runs, unless the nodes that answer all see it up: then only the
/// operator is cut off from it, and nothing is taken over): its most caught-up replica takes
/// over, once every replica that
/// is silent only for a moment has answered again or stayed silent for long; with no copy
/// left anywhere, a stopped primary is retired so that its slots can be served again (empty),
/// while copies that exist but stay silent stall for a person. Silent only for a moment
/// (paused, partitioned): failing it over is Valkey's job, which needs a majority of
/// primaries (a cluster of one or two shards has none: rule 1 takes it over once it has been
/// silent for long).
fn dead_primaries(view: &View) -> Option<Step> {
    let dead = view
        .nodes
        .iter()
        .find(|n| !n.reachable && n.slot_count() > 0)?;
    let (node, shard, slots) = (dead.name.clone(), dead.shard, dead.slot_count());
    // Copies of its data: its replicas, and a primary of the shard that owns no slots (one
    // taken over while it was silent still holds the data it had, and follows the heir once
    // it answers again).
    let copies = || {
        view.in_shard(shard)
            .filter(|n| n.lifecycle == Lifecycle::Active)
            .filter(|n| n.role == Role::Replica || n.slot_count() == 0)
    };
    let heir = view.replicas(shard).into_iter().max_by(|a, b| {
        replica_offset(a)
            .cmp(&replica_offset(b))
            .then_with(|| b.name.cmp(&a.name))
    });
    // A copy that does not answer now but may in a moment (its Pod runs, not silent for long).
    // One that answers but cannot be used (refuses the login, unreadable) is not waited for:
    // it will not change by itself.
    let waited_for = copies()
        .find(|n| !n.reachable && !n.terminated && !n.hung && !n.locked_out && !n.unreadable);
    let unreachable_copy = copies().any(|n| !n.reachable && !n.terminated);
    let step = if !(dead.terminated || dead.hung) {
        match heir.or(waited_for) {
            Some(_) => Step::Wait {
                reason: WaitReason::ValkeyFailover { node, shard, slots },
            },
            None => Step::Stalled {
                reason: StallReason::DeadPrimaryWithoutReplica { node, shard, slots },
            },
        }
    } else if dead.cut_off_from_operator_only() {
        Step::Wait {
            reason: WaitReason::OperatorCutOff { node, shard },
        }
    } else if let Some(waited_for) = waited_for {
        Step::Wait {
            reason: WaitReason::HeirUnreachable {
                node,
                shard,
                heir: waited_for.name.clone(),
            },
        }
    } else if let Some(heir) = heir {
        Step::TakeOver {
            shard,
            from: node,
            to: heir.name.clone(),
        }
    } else if view.primary(shard).is_some() {
        // A takeover that not every view has learnt yet: its heir is the shard's primary.
        Step::Wait {
            reason: WaitReason::ValkeyFailover { node, shard, slots },
        }
    } else if unreachable_copy {
        Step::Stalled {
            reason: StallReason::CopiesUnreachable { node, shard, slots },
        }
    } else if dead.terminated {
        Step::RetireNode {
            shard,
            node,
            reason: format!(
                "its server stopped and no replica holds its {slots} slots: they are served again, empty"
            ),
        }
    } else {
        Step::Stalled {
            reason: StallReason::DeadPrimaryWithoutReplica { node, shard, slots },
        }
    };
    Some(step)
}

/// Rule 2: a node whose server has stopped for good and that owns no slots is retired at once:
/// it counts towards nothing and holds nothing, and its shard's replacement is joined by the
/// rules that follow as for any missing replica.
fn gone_nodes(view: &View, memory: &RollMemory) -> Option<Step> {
    let gone = view
        .nodes
        .iter()
        .find(|n| n.terminated && !n.reachable && n.slot_count() == 0)?;
    let new_joiner = gone.lifecycle == Lifecycle::Joining && gone.is_up_to_date(view.desired);
    if new_joiner && gone.removed && memory.removed_joins > MAX_LOST_JOINS {
        return Some(Step::Stalled {
            reason: StallReason::JoinersRemoved {
                node: gone.name.clone(),
                shard: gone.shard,
                removed: memory.removed_joins,
            },
        });
    }
    if new_joiner && !gone.removed && memory.lost_joins > MAX_LOST_JOINS {
        return Some(Step::Stalled {
            reason: StallReason::JoinsLost {
                node: gone.name.clone(),
                shard: gone.shard,
                lost: memory.lost_joins,
            },
        });
    }
    Some(Step::RetireNode {
        shard: gone.shard,
        node: gone.name.clone(),
        reason: "its server has stopped for good".into(),
    })
}

/// Rule 5: a desired shard with no node at all gets its primary.
fn missing_primaries(view: &View) -> Option<Step> {
    (0..view.desired.shards)
        .find(|&shard| view.in_shard(shard).next().is_none())
        .map(|shard| Step::JoinPrimary { shard })
}

/// Rule 6: slots nobody owns go to the desired shard whose bootstrap range holds them.
fn unassigned_slots(view: &View) -> Option<Step> {
    if view.owned_slots() >= SLOT_COUNT {
        return None;
    }
    let covered = coverage(view.nodes.iter().flat_map(|n| n.slots.iter()));
    let mut assignments = Vec::new();
    for shard in 0..view.desired.shards {
        let missing = uncovered_parts(bootstrap_range(shard, view.desired.shards), &covered);
        if missing.is_empty() {
            continue;
        }
        let Some(primary) = view.primary(shard) else {
            return Some(Step::Stalled {
                reason: StallReason::UnownedSlotsWithoutPrimary { shard },
            });
        };
        assignments.push((primary.name.clone(), missing));
    }
    Some(Step::AssignSlots { assignments })
}

/// Rule 7: act only on a settled cluster.
fn unsettled_cluster(view: &View) -> Option<Step> {
    let live = || view.nodes.iter().filter(|n| n.reachable);
    if let Some(step) = live().find_map(|from| unfinished_move(view, from)) {
        return Some(step);
    }
    if let Some(node) = live().find(|n| n.migrating) {
        return Some(Step::Wait {
            reason: WaitReason::SlotMigration {
                node: node.name.clone(),
            },
        });
    }
    live().find(|n| !n.cluster_ok).map(|node| Step::Wait {
        reason: WaitReason::ClusterNotOk {
            node: node.name.clone(),
        },
    })
}

/// The first open key-by-key migration from `from` whose target is a live primary: moved on.
fn unfinished_move(view: &View, from: &ObservedNode) -> Option<Step> {
    if from.role != Role::Primary {
        return None;
    }
    from.unfinished_moves.iter().find_map(|open| {
        let to = view
            .nodes
            .iter()
            .find(|n| n.name == open.to && n.reachable && n.role == Role::Primary)?;
        Some(Step::MigrateSlots {
            from_shard: from.shard,
            to_shard: to.shard,
            from: from.name.clone(),
            to: to.name.clone(),
            slots: open.slots.clone(),
        })
    })
}

/// Rule 8: a primary about to be evicted or deleted hands over to a synced replica that stays.
fn handovers(view: &View) -> Option<Step> {
    view.nodes
        .iter()
        .filter(|n| (n.handover_requested || n.leaving) && n.reachable && n.role == Role::Primary)
        .find_map(|leaving| {
            let target = view.best_heir(&view.staying_replicas(leaving.shard))?;
            Some(Step::HandOver {
                shard: leaving.shard,
                from: leaving.name.clone(),
                to: target.name.clone(),
            })
        })
}

/// Rule 8, second part: the switchover a person asked for, once (see [`super::model::Switchover`]).
fn requested_switchover(view: &View, memory: &RollMemory) -> Option<Step> {
    let request = view
        .desired
        .switchover
        .as_ref()
        .filter(|request| memory.switchover_pending(request))?;
    let shard = request.shard;
    let blocked = |blocker| Step::Wait {
        reason: WaitReason::Switchover { shard, blocker },
    };
    if shard >= view.desired.shards {
        return Some(blocked(SwitchoverBlocker::NoSuchShard));
    }
    let Some(primary) = view.primary(shard) else {
        return Some(blocked(SwitchoverBlocker::NoPrimary));
    };
    let candidates = view.staying_replicas(shard);
    let target = match &request.to {
        Some(named) => {
            let Some(node) = candidates.iter().find(|n| n.name == *named) else {
                let node = named.clone();
                return Some(blocked(SwitchoverBlocker::NotAReplica { node }));
            };
            view.best_heir(&[node]).ok_or(Some(named.clone()))
        }
        None => view.best_heir(&candidates).ok_or(None),
    };
    match target {
        Ok(target) => Some(Step::Switchover {
            shard,
            from: primary.name.clone(),
            to: target.name.clone(),
            request: request.id.clone(),
        }),
        Err(node) => Some(blocked(SwitchoverBlocker::NotSynced { node })),
    }
}

/// Rule 9: replicas and the roll itself, strictly one shard at a time.
fn shard_replicas(view: &View, memory: &RollMemory) -> Option<Step> {
    let mut order: Vec<u32> = (0..view.desired.shards).collect();
    // A shard whose roll has begun is finished before another one starts.
    order.sort_by_key(|&shard| !roll_in_progress(view, memory, shard));
    order
        .into_iter()
        .find_map(|shard| shard_step(view, memory, shard))
}

fn roll_in_progress(view: &View, memory: &RollMemory, shard: u32) -> bool {
    let desired = view.desired;
    let up_to_date = view.in_shard(shard).filter(|n| n.is_up_to_date(desired));
    let outdated = view.in_shard(shard).filter(|n| !n.is_up_to_date(desired));
    (up_to_date.count() > 0 || memory.has_failed_over(&desired.revision, shard))
        && outdated.count() > 0
}

fn shard_step(view: &View, memory: &RollMemory, shard: u32) -> Option<Step> {
    let desired = view.desired;
    let Some(primary) = view.primary(shard) else {
        return Some(Step::Stalled {
            reason: StallReason::NoPrimary { shard },
        });
    };
    if let Some(second) = view.primaries(shard).get(1) {
        // One that owns nothing beside one that owns the slots is a replica Valkey promoted
        // after they had moved on (seen on real nodes: a lost node came back with its old
        // view, its stale claim made a replica follow the dead primary, and that replica then
        // won an election for no slot). It serves no key and holds none: it goes.
        if second.slot_count() == 0 && primary.slot_count() > 0 {
            return Some(Step::RetireNode {
                shard,
                node: second.name.clone(),
                reason: "a second primary of its shard, owning no slots".to_owned(),
            });
        }
        return Some(Step::Stalled {
            reason: StallReason::TwoPrimaries {
                shard,
                first: primary.name.clone(),
                second: second.name.clone(),
            },
        });
    }
    let target = desired.replicas_per_shard as usize;
    let replicas = view.replicas(shard);
    // A replica only the operator cannot reach still serves its shard: it counts towards the
    // target and is not retired as dead.
    let cut_off = view.cut_off_replica_count(shard);
    let join = || Step::JoinReplica {
        shard,
        primary: primary.name.clone(),
    };
    let retire = |node: &ObservedNode, reason: &str| Step::RetireNode {
        shard,
        node: node.name.clone(),
        reason: reason.to_owned(),
    };
    if replicas.len() + cut_off < target {
        return Some(join());
    }
    if let Some(dead) = (view.in_shard(shard)).find(|n| !n.reachable && !is_replica_cut_off(n)) {
        return Some(retire(dead, "unreachable, and its replacement has joined"));
    }
    let mut outdated: Vec<&ObservedNode> = replicas
        .iter()
        .copied()
        .filter(|n| !n.is_up_to_date(desired))
        .collect();
    outdated.sort_by_key(|n| replica_offset(n));
    if replicas.len() > target
        && let Some(oldest) = outdated.first()
    {
        return Some(retire(
            oldest,
            "outdated, and the shard is above its target",
        ));
    }
    if !primary.is_up_to_date(desired) {
        return Some(failover_step(view, memory, shard, primary, &replicas).unwrap_or_else(join));
    }
    if replicas.len() > target {
        let least_caught_up = replicas.iter().min_by_key(|n| replica_offset(n))?;
        return Some(retire(least_caught_up, "the shard is above its target"));
    }
    (!outdated.is_empty()).then(join)
}

/// The one failover of an outdated primary, a wait for its target to sync, or `None` when the
/// shard first needs an up-to-date replica.
fn failover_step(
    view: &View,
    memory: &RollMemory,
    shard: u32,
    primary: &ObservedNode,
    replicas: &[&ObservedNode],
) -> Option<Step> {
    let desired = view.desired;
    if !memory.may_fail_over(&desired.revision, shard) {
        // Rule 3 reports the details; never one attempt too many.
        return Some(Step::Stalled {
            reason: StallReason::AlreadyFailedOver { shard },
        });
    }
    let up_to_date: Vec<&ObservedNode> = replicas
        .iter()
        .copied()
        .filter(|n| n.is_up_to_date(desired))
        .collect();
    if let Some(target) = view.best_heir(&up_to_date) {
        if desired.primary_update == PrimaryUpdate::Supervised {
            return Some(Step::Wait {
                reason: WaitReason::SupervisedFailover {
                    shard,
                    primary: primary.name.clone(),
                    target: target.name.clone(),
                },
            });
        }
        return Some(Step::Failover {
            shard,
            from: primary.name.clone(),
            to: target.name.clone(),
        });
    }
    up_to_date.first().map(|n| Step::Wait {
        reason: WaitReason::FailoverTargetSyncing {
            shard,
            node: n.name.clone(),
        },
    })
}

fn replica_offset(node: &ObservedNode) -> u64 {
    node.sync.map_or(0, |s| s.offset)
}

/// Rule 10: balance slots, draining shards beyond the desired count first.
fn slot_balance(view: &View) -> Option<Step> {
    let shards = view.desired.shards;
    let owned = |shard: u32| -> u32 { view.in_shard(shard).map(|n| n.slot_count()).sum() };
    let all = view.shards();
    let source = all
        .iter()
        .copied()
        .filter(|&s| owned(s) > target_count(s, shards))
        .max_by_key(|&s| {
            (
                s >= shards,
                owned(s) - target_count(s, shards),
                u32::MAX - s,
            )
        })?;
    let dest = all
        .iter()
        .copied()
        .filter(|&s| owned(s) < target_count(s, shards))
        .max_by_key(|&s| (target_count(s, shards) - owned(s), u32::MAX - s))?;
    let count = (owned(source) - target_count(source, shards))
        .min(target_count(dest, shards) - owned(dest));
    let (Some(from), Some(to)) = (view.primary(source), view.primary(dest)) else {
        return Some(Step::Stalled {
            reason: StallReason::MigrationWithoutPrimaries {
                from_shard: source,
                to_shard: dest,
            },
        });
    };
    Some(Step::MigrateSlots {
        from_shard: source,
        to_shard: dest,
        from: from.name.clone(),
        to: to.name.clone(),
        slots: take_highest(&from.slots, count),
    })
}

/// Rule 11: retire the nodes of drained shards beyond the desired count, primary last.
fn removed_shards(view: &View) -> Option<Step> {
    let shard = view
        .shards()
        .into_iter()
        .find(|&s| s >= view.desired.shards)?;
    let nodes: Vec<&ObservedNode> = view.in_shard(shard).collect();
    if nodes.iter().any(|n| n.slot_count() > 0) {
        return None;
    }
    let last = nodes
        .iter()
        .find(|n| n.role == Role::Replica || !n.reachable)
        .or_else(|| nodes.first())?;
    Some(Step::RetireNode {
        shard,
        node: last.name.clone(),
        reason: format!("shard {shard} is being removed and owns no slots"),
    })
}

/// Rule 12: once every node answers, is active, up to date and staying, each shard's primary
/// is moved to where [`best_choice`] puts it (the least crowded way, reached by the fewest
/// moves), lowest shard first, one shard at a time; each moves at most once for each change of
/// where the nodes stand. A cluster with too many ways to weigh moves, instead, the one primary
/// whose handover alone lowers the crowding most.
fn spread_primaries(view: &View, memory: &RollMemory) -> Option<Step> {
    let desired = view.desired;
    if desired.primary_spread == PrimarySpread::Off
        || desired.primary_update == PrimaryUpdate::Supervised
    {
        return None;
    }
    // Rule 7 came first: every live node sees the slots served, and nothing migrates.
    let every_node_steady = (view.nodes.iter())
        .all(|n| n.reachable && n.lifecycle == Lifecycle::Active && n.is_up_to_date(desired));
    if !every_node_steady {
        return None;
    }
    // Each shard's primary and the nodes it may stand on (itself and its staying replicas,
    // synced or not: a set that changes as a replica catches up would change the choice),
    // by name: their order must not depend on which one is primary now.
    let mut shards = Vec::new();
    for shard in 0..desired.shards {
        let primary = view.primary(shard)?;
        let mut candidates = vec![primary];
        if !stays_put(view, memory, primary) {
            candidates.extend(view.staying_replicas(shard));
        }
        candidates.sort_by(|a, b| a.name.cmp(&b.name));
        shards.push((shard, primary, candidates));
    }
    let places: Vec<Vec<&Location>> = (shards.iter())
        .map(|(_, _, candidates)| candidates.iter().map(|n| &n.location).collect())
        .collect();
    let current: Vec<usize> = (shards.iter())
        .map(|(_, primary, candidates)| {
            let at = candidates.iter().position(|n| n.name == primary.name);
            at.unwrap_or_default()
        })
        .collect();
    let Some(choice) = best_choice(&places, &current) else {
        return single_spreading_move(view, memory);
    };
    shards
        .iter()
        .zip(choice)
        .find(|((_, primary, candidates), chosen)| candidates[*chosen].name != primary.name)
        .map(|((shard, primary, candidates), chosen)| {
            let target = candidates[chosen];
            match target.sync.is_some_and(|s| s.is_synced()) {
                true => Step::Rebalance {
                    shard: *shard,
                    from: primary.name.clone(),
                    to: target.name.clone(),
                },
                false => Step::Wait {
                    reason: WaitReason::FailoverTargetSyncing {
                        shard: *shard,
                        node: target.name.clone(),
                    },
                },
            }
        })
}

/// Rule 12 for a cluster with too many ways to weigh: the handover that alone lowers the
/// crowding most (then the lowest shard). Each lowers it strictly, so this ends too.
fn single_spreading_move(view: &View, memory: &RollMemory) -> Option<Step> {
    let now = view.crowding();
    (0..view.desired.shards)
        .filter_map(|shard| {
            let primary = view.primary(shard)?;
            if stays_put(view, memory, primary) {
                return None;
            }
            let heir = view.best_heir(&view.staying_replicas(shard))?;
            let after = view.crowding_with(heir);
            (after < now).then_some((after, shard, primary, heir))
        })
        .min_by_key(|(after, shard, ..)| (*after, *shard))
        .map(|(_, shard, primary, heir)| Step::Rebalance {
            shard,
            from: primary.name.clone(),
            to: heir.name.clone(),
        })
}

/// Whether rule 12 leaves `primary` where it stands: a person switched its shard over (while
/// the request stands), or this revision's roll failed it over there (the roll's failover was
/// the shard's one failover for that change).
fn stays_put(view: &View, memory: &RollMemory, primary: &ObservedNode) -> bool {
    let desired = view.desired;
    let shard = primary.shard;
    desired
        .switchover
        .as_ref()
        .is_some_and(|s| s.shard == shard)
        || memory.placed_by_roll(&desired.revision, shard, &primary.name)
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
