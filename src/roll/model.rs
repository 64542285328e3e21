//! The planner's vocabulary: what the cluster should look like ([`DesiredShape`]), what each
//! node was seen to be ([`ObservedNode`]), what the roll must remember between steps
//! ([`RollMemory`]), and the one action the planner asks for next ([`Step`]).
//!
//! Nothing here knows about Kubernetes or processes: a controller maps its `ValkeyNode` objects
//! and what it read from Valkey (`INFO replication`, `CLUSTER NODES`, `CLUSTER INFO`) onto
//! these types; the local runtime does the same from its process table.

use std::collections::BTreeMap;
use std::fmt;

use super::reasons::{StallReason, WaitReason};

/// The cluster the user asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredShape {
    /// Number of shards; shards are numbered `0..shards`. Nodes observed in a shard with a
    /// higher index belong to a shard being removed: it is drained of slots, then retired.
    pub shards: u32,
    /// Replicas each shard keeps besides its primary. A shard never drops below this count
    /// while it is rolled (it may start below it, e.g. after a node died).
    pub replicas_per_shard: u32,
    /// The revision every node should run: any string that changes exactly when a node must be
    /// replaced (e.g. the engine version, or a hash of the effective image and
    /// restart-requiring settings). Nodes whose `revision` differs are "outdated".
    pub revision: String,
    /// A switchover a person asked for, if any (carried out once: see [`RollMemory`]).
    pub switchover: Option<Switchover>,
    /// Who decides the failover of an outdated primary in a roll.
    pub primary_update: PrimaryUpdate,
    /// Whether primaries are moved apart once the cluster is settled (rule 12).
    pub primary_spread: PrimarySpread,
}

/// A switchover a person asked for: `shard`'s primary role handed to `to`, or to its most
/// caught-up synced replica (up-to-date ones first). `id` tells one request from the next (the
/// request as written): the roll memory records the last one carried out, so each is carried out
/// once, and asking again means writing a new one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Switchover {
    pub id: String,
    pub shard: u32,
    pub to: Option<String>,
}

/// Who decides the failover of an outdated primary in a roll.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PrimaryUpdate {
    /// The roll fails the primary over itself, once its shard has an up-to-date synced replica.
    #[default]
    Automatic,
    /// The roll surges the shard's up-to-date replicas, then waits for a person's switchover.
    Supervised,
}

/// Whether the planner moves a cluster's primaries apart by planned switchovers (rule 12).
/// Heirs are chosen to spread them either way: among equals, that choice costs nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PrimarySpread {
    /// Once the cluster is settled, a primary that shares a zone or a host with another of the
    /// cluster's primaries hands over to a replica where it stands more alone.
    #[default]
    Rebalance,
    /// Primaries stay wherever failovers left them.
    Off,
}

/// Where a node's server runs: its Kubernetes Node and that Node's zone, each `None` where
/// unknown (a local process, a Pod not yet scheduled, a Node without a zone label).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Location {
    pub host: Option<String>,
    pub zone: Option<String>,
}

/// A node's role in replication, as the node itself reports it (`INFO replication` `role:`),
/// or, for an unreachable node, as the rest of the cluster last saw it (`CLUSTER NODES` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Primary,
    Replica,
}

/// Where a node is in its life. A node is created `Joining`; the planner answers
/// [`Step::Activate`] once it is a ready member of its shard (a replica: synced with its
/// primary; a primary of a new shard: it sees the cluster's slot map). Only `Active` nodes
/// count towards a shard's replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    Joining,
    Active,
}

/// Replication state judged on the replica itself (its own `INFO replication`), never from the
/// primary's count of connected replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaSync {
    /// `master_link_status:up`.
    pub link_up: bool,
    /// `master_sync_in_progress:1`: a full sync is still transferring or loading.
    pub sync_in_progress: bool,
    /// The replica's `slave_repl_offset`.
    pub offset: u64,
    /// The primary's `master_repl_offset`, read from the primary *before* the replica's
    /// offset, so a replica that has caught up has `offset >= primary_offset` even under writes.
    pub primary_offset: u64,
    /// Every live primary's own `CLUSTER NODES` lists this node as a replica of its primary.
    /// Until gossip has told them, its primary ignores its failover request and the other
    /// primaries refuse their vote ("I don't know its primary"), so a failover must wait.
    pub known_to_primaries: bool,
}

impl ReplicaSync {
    /// Link up, no sync in progress, the replica has everything the primary had, and every
    /// primary knows it as its primary's replica.
    pub fn is_synced(&self) -> bool {
        self.link_up
            && !self.sync_in_progress
            && self.offset >= self.primary_offset
            && self.known_to_primaries
    }
}

/// An inclusive range of hash slots, `start..=end`, within `0..16384`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
}

impl SlotRange {
    pub fn new(start: u16, end: u16) -> Self {
        Self { start, end }
    }

    /// How many slots the range holds (at least one).
    pub fn count(&self) -> u32 {
        (u32::from(self.end) + 1).saturating_sub(u32::from(self.start))
    }
}

impl fmt::Display for SlotRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// One node as observed now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedNode {
    /// Stable, unique name (the `ValkeyNode` name, or the local runtime's node name).
    pub name: String,
    /// The shard this node was created for. It never changes for a node.
    pub shard: u32,
    /// The revision the node runs (compare with [`DesiredShape::revision`]).
    pub revision: String,
    pub lifecycle: Lifecycle,
    /// Set by the caller when a `Joining` node has been joining for longer than it may (the
    /// caller owns the clock). The planner then stops and reports it instead of moving on.
    pub join_overdue: bool,
    /// Whether the node answered just now. An unreachable node is treated as dead: it does not
    /// count towards its shard, is replaced, and is then retired; unless every node that
    /// answers sees it up ([`Self::alive_to_peers`]): then only the operator's path to it is
    /// cut.
    pub reachable: bool,
    pub role: Role,
    /// For a reachable replica, its replication state; `None` for primaries.
    pub sync: Option<ReplicaSync>,
    /// The slots this node owns (as primary), in the cluster's view.
    pub slots: Vec<SlotRange>,
    /// The node reports `cluster_state:ok` (it sees all 16384 slots served). For a new shard's
    /// primary, this is how the planner knows it has learnt the topology before slots move to it.
    pub cluster_ok: bool,
    /// An atomic slot migration (`CLUSTER GETSLOTMIGRATIONS`) is running on this node.
    pub migrating: bool,
    /// Slots a key-by-key migration from this node to another member left open (the operator
    /// stopped in the middle of one): finished before anything else moves (rule 5).
    pub unfinished_moves: Vec<UnfinishedMove>,
    /// Something other than this node answers at its address (its Pod's IP was handed to
    /// another server): it is unreachable, and nothing is ever sent to what answers there.
    pub stranger: bool,
    /// It answers, but refuses the operator's login (its users were changed by hand, or the
    /// credentials Secret was): unreachable, but not silent, so never taken for dead nor
    /// waited for as an heir (a person must look first).
    pub locked_out: bool,
    /// It let the operator in, then answered in a way the operator cannot read (an unexpected
    /// reply, a refused command): unreachable, but not silent, so never taken for dead.
    pub unreadable: bool,
    /// Its TLS certificate fails the operator's check (expired, not from the cluster's CA, not
    /// naming it): it answered, so it is [`ObservedNode::unreadable`] too (never taken for
    /// dead), and the status says what to renew.
    pub untrusted: bool,
    /// Its Pod is about to go (an Eviction was deferred): as a primary it hands its shard to a
    /// replica first, so clients see a planned failover instead of Valkey's detection, and it
    /// counts as outdated, so a replacement joins before it is retired.
    pub handover_requested: bool,
    /// Its server has stopped for good and will never answer again (its Pod terminated or is
    /// gone; Pods are never restarted in place). Unlike a node that merely does not answer
    /// (paused, partitioned), it cannot come back as a second primary, so its shard may be
    /// taken over at once.
    pub terminated: bool,
    /// Its server stopped because its Pod was removed (deleted, or gone with its machine),
    /// not because the server failed: a loss no revision causes (see
    /// [`RollMemory::lost_joins`]).
    pub removed: bool,
    /// It answered once, and has not answered for longer than the caller waits for a node
    /// that may come back (the caller owns the clock), while its Pod still runs: hung,
    /// paused or cut off. It is treated as dead (its shard is taken over, it is replaced),
    /// but not as gone: what it holds is never given up as lost while it may come back.
    pub hung: bool,
    /// It does not answer the operator, but every answering node that lists it sees it up (no
    /// failure flag, its link connected), a primary owning slots among them: the operator's own
    /// path to it is cut, not the node. Such a primary is never taken over (rule 1): Valkey's
    /// failure detection, which sees it, is the judge; such a replica is not replaced (rules 4
    /// and 9).
    pub alive_to_peers: bool,
    /// Someone asked for it to go (its ValkeyNode was deleted by hand): it counts as outdated,
    /// so it is replaced before it is retired, and as a primary it hands its shard over first.
    pub leaving: bool,
    /// Why its server has not started, as Kubernetes says it of its Pod (not schedulable, its
    /// image not pulled, its container failing to start); `None` while nothing is said.
    pub not_started: Option<String>,
    /// Where its server runs: heirs and rule 12 keep the cluster's primaries apart by it.
    pub location: Location,
}

/// Slots a key-by-key migration left open between this node and `to` (either end may say so:
/// `SETSLOT … MIGRATING` on the source, `IMPORTING` on the target).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnfinishedMove {
    /// The name of the node the slots were going to.
    pub to: String,
    pub slots: Vec<SlotRange>,
}

impl ObservedNode {
    /// Only the operator's path to it is cut: it does not answer the operator, its server has
    /// not stopped, and every node that answers sees it up ([`Self::alive_to_peers`]).
    pub fn cut_off_from_operator_only(&self) -> bool {
        !self.reachable && !self.terminated && self.alive_to_peers
    }

    /// An active node that answered and has nothing unusual about it: on `revision`, seeing
    /// every slot served, owning none yet; as a replica, caught up with its primary at offset 0.
    /// What a test (or a simulation) starts from, changing what it is about.
    pub fn settled(name: &str, shard: u32, revision: &str, role: Role) -> Self {
        Self {
            name: name.into(),
            shard,
            revision: revision.into(),
            lifecycle: Lifecycle::Active,
            join_overdue: false,
            reachable: true,
            role,
            sync: (role == Role::Replica).then_some(ReplicaSync {
                link_up: true,
                sync_in_progress: false,
                offset: 0,
                primary_offset: 0,
                known_to_primaries: true,
            }),
            slots: Vec::new(),
            cluster_ok: true,
            migrating: false,
            unfinished_moves: Vec::new(),
            stranger: false,
            locked_out: false,
            unreadable: false,
            untrusted: false,
            handover_requested: false,
            terminated: false,
            removed: false,
            hung: false,
            alive_to_peers: false,
            leaving: false,
            not_started: None,
            location: Location::default(),
        }
    }

    pub fn slot_count(&self) -> u32 {
        self.slots.iter().map(SlotRange::count).sum()
    }

    /// Of the desired revision, and staying: a node asked to go (deleted by hand, or its Pod
    /// being evicted) is replaced before it is retired, as an outdated one is.
    pub fn is_up_to_date(&self, desired: &DesiredShape) -> bool {
        self.revision == desired.revision && !self.leaving && !self.handover_requested
    }
}

/// How many times a roll issues the failover of one shard whose primary, observed afterwards,
/// never changed (a failover that timed out, or an operator that died between recording and
/// issuing it). Each attempt is recorded before it is issued; past this, the shard stalls.
pub const MAX_FAILOVER_ATTEMPTS: u32 = 3;

/// How many joiners of a revision may die before they join, each replaced at once, before the
/// planner stalls instead (see [`RollMemory::lost_joins`]).
pub const MAX_LOST_JOINS: u32 = 3;

/// What the roll must remember across steps, because it cannot be observed afterwards. The
/// controller persists it (e.g. in the ValkeyCluster status) and passes it back on every plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RollMemory {
    /// The revision the recorded failovers were made for: a new desired revision is a new roll.
    pub revision: String,
    /// Shards whose failover was issued in the roll towards `revision`, with how many times.
    pub failover_attempts: BTreeMap<u32, u32>,
    /// The node each of those failovers was last issued to: where the roll put the shard's
    /// primary. Rule 12 leaves it there (the roll's failover was the shard's one failover).
    pub failover_targets: BTreeMap<u32, String>,
    /// Joiners of the desired revision whose servers stopped before they joined, lately. Kept
    /// by the caller (the controller in memory, for a while: not persisted), so that a revision
    /// whose nodes always die stalls instead of being replaced without end.
    pub lost_joins: u32,
    /// Joiners of the desired revision whose Pods were removed (deleted, or gone with their
    /// machine) before they joined, lately, kept like [`RollMemory::lost_joins`]: no revision
    /// causes that, so past the same bound the stall is the cluster's own
    /// ([`StallReason::JoinersRemoved`]).
    pub removed_joins: u32,
    /// The last switchover a person asked for that was carried out ([`Switchover::id`]),
    /// recorded before it is issued, so it is never issued twice.
    pub switchover_done: Option<String>,
}

impl RollMemory {
    /// Whether the switchover `request` is still to be carried out.
    pub fn switchover_pending(&self, request: &Switchover) -> bool {
        self.switchover_done.as_deref() != Some(request.id.as_str())
    }

    /// Whether `shard`'s failover was issued in the roll towards `revision`.
    pub fn has_failed_over(&self, revision: &str, shard: u32) -> bool {
        self.attempts(revision, shard) > 0
    }

    /// How many times `shard`'s failover was issued in the roll towards `revision`.
    pub fn attempts(&self, revision: &str, shard: u32) -> u32 {
        if self.revision == revision {
            self.failover_attempts.get(&shard).copied().unwrap_or(0)
        } else {
            0
        }
    }

    /// Whether `shard` may be failed over (again) in the roll towards `revision`.
    pub fn may_fail_over(&self, revision: &str, shard: u32) -> bool {
        self.attempts(revision, shard) < MAX_FAILOVER_ATTEMPTS
    }

    /// Record a failover attempt onto `to` *before* issuing it, so that an attempt whose
    /// outcome is unknown counts: the next one is issued only if the primary, observed, never
    /// changed.
    pub fn record_failover(&mut self, revision: &str, shard: u32, to: &str) {
        if self.revision != revision {
            self.revision = revision.to_owned();
            self.failover_attempts.clear();
            self.failover_targets.clear();
        }
        *self.failover_attempts.entry(shard).or_default() += 1;
        self.failover_targets.insert(shard, to.to_owned());
    }

    /// Whether `node` is where the roll towards `revision` put `shard`'s primary.
    pub fn placed_by_roll(&self, revision: &str, shard: u32, node: &str) -> bool {
        self.revision == revision
            && self
                .failover_targets
                .get(&shard)
                .is_some_and(|to| to == node)
    }

    /// A person looked at a stalled failover and asks for more attempts: every shard of the
    /// current roll that used them all gets [`MAX_FAILOVER_ATTEMPTS`] again. Returns the shards.
    pub fn allow_more_attempts(&mut self) -> Vec<u32> {
        let spent: Vec<u32> = self
            .failover_attempts
            .iter()
            .filter(|(_, attempts)| **attempts >= MAX_FAILOVER_ATTEMPTS)
            .map(|(shard, _)| *shard)
            .collect();
        for shard in &spent {
            self.failover_attempts.insert(*shard, 0);
        }
        spent
    }
}

/// The one next action for the cluster. The executor performs it and plans again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create a node on the desired revision for `shard`, which has no primary yet (bootstrap
    /// or a shard being added), and introduce it to the cluster (`CLUSTER MEET`). It stays an
    /// empty primary until slots are assigned or migrated to it.
    JoinPrimary { shard: u32 },
    /// Create a node on the desired revision, introduce it, and make it a replica of `primary`
    /// (`CLUSTER REPLICATE`, retried until gossip has introduced the primary).
    JoinReplica { shard: u32, primary: String },
    /// Mark a `Joining` node `Active`: it is now a ready member of its shard.
    Activate { shard: u32, node: String },
    /// Give unowned slots to primaries (`CLUSTER ADDSLOTSRANGE`); used at bootstrap.
    AssignSlots {
        assignments: Vec<(String, Vec<SlotRange>)>,
    },
    /// Promote `to` in place of `from` with Valkey's default `CLUSTER FAILOVER` (sent to `to`):
    /// a clean handoff that waits for replication to catch up. Record it in [`RollMemory`]
    /// before issuing it; the failover is complete once `to` is primary and `from` its replica.
    Failover {
        shard: u32,
        from: String,
        to: String,
    },
    /// Promote `to` in place of `from`, a primary whose Pod is about to be evicted, exactly as
    /// [`Step::Failover`] does. It is not a step of a roll and is not recorded in
    /// [`RollMemory`]: once it is done `from` is a replica, and nothing asks for it again.
    HandOver {
        shard: u32,
        from: String,
        to: String,
    },
    /// Promote `to` in place of `from` because a person asked for it ([`Switchover`]), exactly
    /// as [`Step::Failover`] does. The request is recorded in [`RollMemory`] before the failover
    /// is issued: each is carried out once.
    Switchover {
        shard: u32,
        from: String,
        to: String,
        request: String,
    },
    /// Promote `to` in place of `from` to spread the cluster's primaries over zones and hosts
    /// (rule 12), exactly as [`Step::Failover`] does. Not recorded in [`RollMemory`]: each one
    /// leaves the primaries strictly less crowded, so none is ever undone by another.
    Rebalance {
        shard: u32,
        from: String,
        to: String,
    },
    /// Promote `to`, a replica of `from`, which is dead: its server stopped for good, or has
    /// not answered for long (`CLUSTER FAILOVER TAKEOVER`: no agreement of the other primaries
    /// is needed, which a cluster of fewer than three shards could never reach). Not recorded
    /// in [`RollMemory`]: the dead primary cannot be taken over twice.
    TakeOver {
        shard: u32,
        from: String,
        to: String,
    },
    /// Move `slots` from `from` (primary of `from_shard`) to `to` (primary of `to_shard`): with
    /// atomic slot migration between 9.1 nodes, key by key otherwise (see
    /// `crate::valkey::migration`). Also planned to finish a key-by-key move left open.
    MigrateSlots {
        from_shard: u32,
        to_shard: u32,
        from: String,
        to: String,
        slots: Vec<SlotRange>,
    },
    /// Remove `node` from the cluster: stop it, then `CLUSTER FORGET` it on every other node.
    RetireNode {
        shard: u32,
        node: String,
        reason: String,
    },
    /// Something is in progress (a sync, a join, Valkey's own failover); plan again shortly.
    Wait { reason: WaitReason },
    /// Acting now would break an invariant, or a previous step failed. Every node is left
    /// serving; planning again resumes by itself once the cause is gone.
    Stalled { reason: StallReason },
    /// The cluster has the desired shape: nothing to do until something changes.
    Converged,
}

/// The words a step goes by wherever a person or a dashboard meets it: the start of the
/// `Progressing` condition's message, of a roll event's note, and the labels of the
/// `cluster_roll_step` metric. One source, so the three never disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepWords {
    /// The shard the step acts on, if it acts on one.
    pub shard: Option<u32>,
    /// The step's name: a [`Step`] variant's name (`Failover`, `JoinReplica`, `Wait`, ...).
    pub step: &'static str,
    /// Why it waits or is stalled: a [`WaitReason::kind`] or [`StallReason::kind`].
    pub reason: Option<&'static str>,
}

impl fmt::Display for StepWords {
    /// `shard 1, Failover`, `shard 0, Wait (Joining)`, `Converged`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(shard) = self.shard {
            write!(f, "shard {shard}, ")?;
        }
        f.write_str(self.step)?;
        match self.reason {
            Some(reason) => write!(f, " ({reason})"),
            None => Ok(()),
        }
    }
}

impl Step {
    /// The step's [`StepWords`].
    pub fn words(&self) -> StepWords {
        let (shard, reason) = match self {
            Step::Wait { reason } => (reason.shard(), Some(reason.kind())),
            Step::Stalled { reason } => (Some(reason.shard()), Some(reason.kind())),
            step => (step.shard(), None),
        };
        StepWords {
            shard,
            step: self.name(),
            reason,
        }
    }

    /// What a person reads of the step: its words, then the sentence
    /// (`shard 1, Failover: fail over shard 1 from c-1-a to c-1-b`; for a wait or a stall the
    /// sentence is the reason's, as the words already say which it is).
    pub fn headline(&self) -> String {
        let words = self.words();
        match self {
            Step::Wait { reason } => format!("{words}: {reason}"),
            Step::Stalled { reason } => format!("{words}: {reason}"),
            Step::Converged => words.to_string(),
            step => format!("{words}: {step}"),
        }
    }

    /// The variant's name.
    fn name(&self) -> &'static str {
        match self {
            Step::JoinPrimary { .. } => "JoinPrimary",
            Step::JoinReplica { .. } => "JoinReplica",
            Step::Activate { .. } => "Activate",
            Step::AssignSlots { .. } => "AssignSlots",
            Step::Failover { .. } => "Failover",
            Step::HandOver { .. } => "HandOver",
            Step::Switchover { .. } => "Switchover",
            Step::Rebalance { .. } => "Rebalance",
            Step::TakeOver { .. } => "TakeOver",
            Step::MigrateSlots { .. } => "MigrateSlots",
            Step::RetireNode { .. } => "RetireNode",
            Step::Wait { .. } => "Wait",
            Step::Stalled { .. } => "Stalled",
            Step::Converged => "Converged",
        }
    }

    /// The shard the step acts on, when it acts on one.
    pub fn shard(&self) -> Option<u32> {
        match self {
            Step::JoinPrimary { shard }
            | Step::JoinReplica { shard, .. }
            | Step::Activate { shard, .. }
            | Step::Failover { shard, .. }
            | Step::HandOver { shard, .. }
            | Step::Switchover { shard, .. }
            | Step::Rebalance { shard, .. }
            | Step::TakeOver { shard, .. }
            | Step::RetireNode { shard, .. } => Some(*shard),
            Step::MigrateSlots { to_shard, .. } => Some(*to_shard),
            _ => None,
        }
    }
}

fn ranges(slots: &[SlotRange]) -> String {
    slots
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::JoinPrimary { shard } => write!(f, "join a new primary to shard {shard}"),
            Step::JoinReplica { shard, primary } => {
                write!(f, "join a new replica of {primary} to shard {shard}")
            }
            Step::Activate { shard, node } => write!(f, "activate {node} in shard {shard}"),
            Step::AssignSlots { assignments } => {
                write!(f, "assign slots")?;
                for (node, slots) in assignments {
                    write!(f, " {node}:{}", ranges(slots))?;
                }
                Ok(())
            }
            Step::Failover { shard, from, to } => {
                write!(f, "fail over shard {shard} from {from} to {to}")
            }
            Step::HandOver { shard, from, to } => write!(
                f,
                "hand shard {shard} over from {from} to {to}: the Pod of {from} is being evicted"
            ),
            Step::Rebalance { shard, from, to } => write!(
                f,
                "switch shard {shard} over from {from} to {to}: its primary shares a zone or a host with another of the cluster's"
            ),
            Step::Switchover {
                shard, from, to, ..
            } => write!(
                f,
                "switch shard {shard} over from {from} to {to}, as a person asked"
            ),
            Step::TakeOver { shard, from, to } => write!(
                f,
                "take shard {shard} over onto {to}: its primary {from} is dead (its server stopped, or has not answered for long)"
            ),
            Step::MigrateSlots {
                from_shard,
                to_shard,
                slots,
                ..
            } => write!(
                f,
                "migrate slots {} from shard {from_shard} to shard {to_shard}",
                ranges(slots)
            ),
            Step::RetireNode {
                shard,
                node,
                reason,
            } => write!(f, "retire {node} of shard {shard}: {reason}"),
            Step::Wait { reason } => write!(f, "wait: {reason}"),
            Step::Stalled { reason } => write!(f, "stalled: {reason}"),
            Step::Converged => write!(f, "converged"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roll::JoinBlocker;

    #[test]
    fn a_steps_words_lead_its_headline_and_name_the_shard_a_wait_or_stall_is_about() {
        let failover = Step::Failover {
            shard: 1,
            from: "c-1-a".into(),
            to: "c-1-b".into(),
        };
        assert_eq!(
            failover.headline(),
            "shard 1, Failover: fail over shard 1 from c-1-a to c-1-b"
        );
        let wait = Step::Wait {
            reason: WaitReason::Joining {
                node: "c-0-n".into(),
                shard: 0,
                blocker: JoinBlocker::FullSync,
            },
        };
        assert_eq!(
            wait.words(),
            StepWords {
                shard: Some(0),
                step: "Wait",
                reason: Some("Joining"),
            }
        );
        assert_eq!(
            wait.headline(),
            "shard 0, Wait (Joining): c-0-n is joining shard 0: full sync in progress"
        );
        assert_eq!(Step::Converged.headline(), "Converged");
    }
}
