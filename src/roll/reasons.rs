//! Why the planner waits ([`WaitReason`]) or stalls ([`StallReason`]), and why a joining node is
//! not ready yet ([`JoinBlocker`]): one variant per cause the rules in [`super::rules`] produce,
//! carrying the nodes, shards and numbers involved.
//!
//! `Display` renders the sentence shown to people (status conditions, events, logs); `kind` is a
//! short, bounded name for the cause, fit for a metric label or a test's match. It is part of
//! [`super::StepWords`], the words a step goes by everywhere.

use std::fmt;

use crate::api::annotations::{RETRY_FAILOVERS, SWITCHOVER};

/// Why a `Joining` node is not yet a ready member of its shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinBlocker {
    Unreachable,
    /// Unreachable, and Kubernetes says why its server has not started (not schedulable, its
    /// image not pulled, its container failing).
    NotStarted {
        why: String,
    },
    /// Its shard has a primary, but the node does not report itself a replica yet.
    NotYetReplica {
        primary: String,
    },
    NoReplicationState,
    LinkDown,
    FullSync,
    /// The replica has less than the primary had when it was read.
    Behind {
        offset: u64,
        primary_offset: u64,
    },
    /// Gossip has not yet told every primary that it replicates `primary`.
    UnknownToPrimaries {
        primary: String,
    },
    /// Its shard has no primary, and the node is not one either.
    NotPrimary,
    /// A new shard's primary that does not see the slot map yet.
    NoSlotMap,
}

impl fmt::Display for JoinBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinBlocker::Unreachable => write!(f, "unreachable"),
            JoinBlocker::NotStarted { why } => write!(f, "its Pod has not started: {why}"),
            JoinBlocker::NotYetReplica { primary } => write!(f, "not yet a replica of {primary}"),
            JoinBlocker::NoReplicationState => write!(f, "no replication state yet"),
            JoinBlocker::LinkDown => write!(f, "replication link down"),
            JoinBlocker::FullSync => write!(f, "full sync in progress"),
            JoinBlocker::Behind {
                offset,
                primary_offset,
            } => write!(
                f,
                "replication offset {offset} behind the primary's {primary_offset}"
            ),
            JoinBlocker::UnknownToPrimaries { primary } => write!(
                f,
                "not every primary lists it as a replica of {primary} yet"
            ),
            JoinBlocker::NotPrimary => write!(f, "not a primary"),
            JoinBlocker::NoSlotMap => {
                write!(f, "has not learnt the slot map yet (cluster_state not ok)")
            }
        }
    }
}

/// Something is in progress; planning again shortly moves on by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// A node is joining its shard and is not ready yet (nor overdue).
    Joining {
        node: String,
        shard: u32,
        blocker: JoinBlocker,
    },
    /// A slot-owning primary is unreachable and its shard has a live replica: Valkey fails it
    /// over, not the planner.
    ValkeyFailover {
        node: String,
        shard: u32,
        slots: u32,
    },
    SlotMigration {
        node: String,
    },
    ClusterNotOk {
        node: String,
    },
    /// The up-to-date replica a shard will fail over to is not synced yet.
    FailoverTargetSyncing {
        shard: u32,
        node: String,
    },
    /// A dead primary's replica `heir` does not answer right now (nor for long yet): the
    /// takeover waits for it, so the most caught-up copy is chosen, and a shard whose only copy
    /// was slow for a moment is not given up as empty.
    HeirUnreachable {
        node: String,
        shard: u32,
        heir: String,
    },
    /// A primary has not answered the operator for long, but every node that answers sees it
    /// up: the operator's own path to it is cut, and it is not taken over.
    OperatorCutOff {
        node: String,
        shard: u32,
    },
    /// A replica does not answer the operator, but every node that answers sees it up: the
    /// operator's own path to it is cut, and it is not replaced (a replacement would cost a
    /// full sync for a copy that still serves).
    ReplicaCutOff {
        node: String,
        shard: u32,
    },
    /// A switchover a person asked for cannot be carried out yet, for `blocker`.
    Switchover {
        shard: u32,
        blocker: SwitchoverBlocker,
    },
    /// The primary update is supervised: shard `shard`'s up-to-date replica `target` is ready,
    /// and the roll waits for a person's switchover before its primary is failed over.
    SupervisedFailover {
        shard: u32,
        primary: String,
        target: String,
    },
    /// The fleet rollout the cluster belongs to does not let it move on yet (a cap, a wave, a pause
    /// or a halt): see [`crate::fleet::rollout`]. Not a planner's answer: the controller's gate
    /// puts it in place of a roll step.
    Rollout(crate::roll::rollout_waits::WaitFor),
}

impl WaitReason {
    /// The shard it is about, if it is about one.
    pub fn shard(&self) -> Option<u32> {
        match self {
            WaitReason::Joining { shard, .. }
            | WaitReason::ValkeyFailover { shard, .. }
            | WaitReason::FailoverTargetSyncing { shard, .. }
            | WaitReason::HeirUnreachable { shard, .. }
            | WaitReason::OperatorCutOff { shard, .. }
            | WaitReason::ReplicaCutOff { shard, .. }
            | WaitReason::Switchover { shard, .. }
            | WaitReason::SupervisedFailover { shard, .. } => Some(*shard),
            WaitReason::SlotMigration { .. }
            | WaitReason::ClusterNotOk { .. }
            | WaitReason::Rollout(_) => None,
        }
    }

    /// A short, bounded name for the cause (a metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            WaitReason::Joining { .. } => "Joining",
            WaitReason::ValkeyFailover { .. } => "ValkeyFailover",
            WaitReason::SlotMigration { .. } => "SlotMigration",
            WaitReason::ClusterNotOk { .. } => "ClusterNotOk",
            WaitReason::FailoverTargetSyncing { .. } => "FailoverTargetSyncing",
            WaitReason::HeirUnreachable { .. } => "HeirUnreachable",
            WaitReason::OperatorCutOff { .. } => "OperatorCutOff",
            WaitReason::ReplicaCutOff { .. } => "ReplicaCutOff",
            WaitReason::Switchover { .. } => "SwitchoverBlocked",
            WaitReason::SupervisedFailover { .. } => "SupervisedFailover",
            WaitReason::Rollout(why) => why.kind(),
        }
    }
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitReason::Joining {
                node,
                shard,
                blocker,
            } => write!(f, "{node} is joining shard {shard}: {blocker}"),
            WaitReason::ValkeyFailover { node, shard, slots } => {
                unreachable_primary(f, node, *shard, *slots)?;
                write!(f, ": waiting for Valkey's own failover")
            }
            WaitReason::SlotMigration { node } => {
                write!(f, "a slot migration is running on {node}")
            }
            WaitReason::ClusterNotOk { node } => {
                write!(f, "{node} does not report cluster_state:ok yet")
            }
            WaitReason::FailoverTargetSyncing { shard, node } => write!(
                f,
                "{node} must be synced before shard {shard} fails over to it"
            ),
            WaitReason::HeirUnreachable { node, shard, heir } => write!(
                f,
                "{node}, primary of shard {shard}, is dead and its replica {heir} does not \
                 answer right now: waiting for it before choosing who takes the shard over"
            ),
            WaitReason::OperatorCutOff { node, shard } => write!(
                f,
                "{node}, primary of shard {shard}, has not answered the operator for long, but \
                 every node that answers sees it up: the operator's path to it is cut, and \
                 nothing is taken over"
            ),
            WaitReason::ReplicaCutOff { node, shard } => write!(
                f,
                "{node}, replica of shard {shard}, does not answer the operator, but every node \
                 that answers sees it up: the operator's path to it is cut, and it is not \
                 replaced"
            ),
            WaitReason::Switchover { shard, blocker } => write!(
                f,
                "the switchover of shard {shard} asked for ({SWITCHOVER}) waits: {blocker}"
            ),
            WaitReason::SupervisedFailover {
                shard,
                primary,
                target,
            } => write!(
                f,
                "the primary update is supervised: shard {shard}'s replica {target} is up to \
                 date and synced, and {primary} fails over once a person asks (kubectl valkey \
                 switchover <cluster> --shard {shard}, or the {SWITCHOVER} annotation)"
            ),
            WaitReason::Rollout(why) => write!(f, "{why}"),
        }
    }
}

/// Why a switchover a person asked for is not carried out yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwitchoverBlocker {
    /// The shard asked for is not one of the cluster's.
    NoSuchShard,
    /// The shard has no live primary to switch over from.
    NoPrimary,
    /// The node asked for is not a live, active replica of the shard.
    NotAReplica { node: String },
    /// No replica of the shard (or not the one asked for) is synced yet.
    NotSynced { node: Option<String> },
}

impl fmt::Display for SwitchoverBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SwitchoverBlocker::NoSuchShard => {
                f.write_str("the cluster has no such shard; fix or remove the annotation")
            }
            SwitchoverBlocker::NoPrimary => f.write_str("the shard has no live primary"),
            SwitchoverBlocker::NotAReplica { node } => write!(
                f,
                "{node} is not a live replica of the shard; fix or remove the annotation"
            ),
            SwitchoverBlocker::NotSynced { node: Some(node) } => {
                write!(f, "{node} is not synced with its primary yet")
            }
            SwitchoverBlocker::NotSynced { node: None } => {
                f.write_str("no replica of the shard is synced with its primary yet")
            }
        }
    }
}

/// Acting now would break an invariant, or a previous step failed; every node is left serving.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StallReason {
    /// Every attempt at a failover of this roll left the outdated `primary` (running
    /// `revision`) in place.
    FailoverIncomplete {
        shard: u32,
        primary: String,
        revision: String,
        attempts: u32,
    },
    /// A joining node was not ready in time.
    JoinOverdue {
        node: String,
        shard: u32,
        blocker: JoinBlocker,
    },
    /// A slot-owning primary is unreachable and nothing can take its place.
    DeadPrimaryWithoutReplica {
        node: String,
        shard: u32,
        slots: u32,
    },
    /// A slot-owning primary is dead and the only copies of its slots are on replicas that
    /// have not answered for long, though their Pods run: serving the slots again empty
    /// would give up data that may come back, so a person decides.
    CopiesUnreachable {
        node: String,
        shard: u32,
        slots: u32,
    },
    /// Joiners of the new revision keep dying before they join (`lost` of them lately): the
    /// revision, not a passing fault, is the likely cause, so it is not tried again and again.
    JoinsLost {
        node: String,
        shard: u32,
        lost: u32,
    },
    /// Joiners of the new revision keep having their Pods removed before they join (`removed`
    /// of them lately): someone deletes them, or their machines go. No revision causes that,
    /// so it is a stall of the cluster's own, not of the change.
    JoinersRemoved {
        node: String,
        shard: u32,
        removed: u32,
    },
    /// Unowned slots belong to a shard with no live primary to assign them to.
    UnownedSlotsWithoutPrimary {
        shard: u32,
    },
    NoPrimary {
        shard: u32,
    },
    TwoPrimaries {
        shard: u32,
        first: String,
        second: String,
    },
    /// The shard's primary is outdated but its one failover of the roll was spent.
    AlreadyFailedOver {
        shard: u32,
    },
    /// Slots must move between shards one of which has no live primary.
    MigrationWithoutPrimaries {
        from_shard: u32,
        to_shard: u32,
    },
}

impl StallReason {
    /// The shard it is about (the shard slots would move to, for a migration).
    pub fn shard(&self) -> u32 {
        match self {
            StallReason::FailoverIncomplete { shard, .. }
            | StallReason::JoinOverdue { shard, .. }
            | StallReason::DeadPrimaryWithoutReplica { shard, .. }
            | StallReason::CopiesUnreachable { shard, .. }
            | StallReason::JoinsLost { shard, .. }
            | StallReason::JoinersRemoved { shard, .. }
            | StallReason::UnownedSlotsWithoutPrimary { shard }
            | StallReason::NoPrimary { shard }
            | StallReason::TwoPrimaries { shard, .. }
            | StallReason::AlreadyFailedOver { shard } => *shard,
            StallReason::MigrationWithoutPrimaries { to_shard, .. } => *to_shard,
        }
    }

    /// A short, bounded name for the cause (a metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            StallReason::FailoverIncomplete { .. } => "FailoverIncomplete",
            StallReason::JoinOverdue { .. } => "JoinOverdue",
            StallReason::DeadPrimaryWithoutReplica { .. } => "DeadPrimaryWithoutReplica",
            StallReason::CopiesUnreachable { .. } => "CopiesUnreachable",
            StallReason::JoinsLost { .. } => "JoinsLost",
            StallReason::JoinersRemoved { .. } => "JoinersRemoved",
            StallReason::UnownedSlotsWithoutPrimary { .. } => "UnownedSlotsWithoutPrimary",
            StallReason::NoPrimary { .. } => "NoPrimary",
            StallReason::TwoPrimaries { .. } => "TwoPrimaries",
            StallReason::AlreadyFailedOver { .. } => "AlreadyFailedOver",
            StallReason::MigrationWithoutPrimaries { .. } => "MigrationWithoutPrimaries",
        }
    }
}

impl fmt::Display for StallReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StallReason::FailoverIncomplete {
                shard,
                primary,
                revision,
                attempts,
            } => write!(
                f,
                "the failover of shard {shard} did not complete in {attempts} attempts: its \
                 primary {primary} still runs {revision}; once you have looked, annotate the \
                 ValkeyCluster {RETRY_FAILOVERS}=<its status.roll.revision> to allow more"
            ),
            StallReason::JoinOverdue {
                node,
                shard,
                blocker,
            } => write!(
                f,
                "{node} joined shard {shard} but never became ready ({blocker})"
            ),
            StallReason::DeadPrimaryWithoutReplica { node, shard, slots } => {
                unreachable_primary(f, node, *shard, *slots)?;
                write!(f, " and its shard has no live replica to fail over to")
            }
            StallReason::CopiesUnreachable { node, shard, slots } => {
                unreachable_primary(f, node, *shard, *slots)?;
                write!(
                    f,
                    " and its only copies are on replicas that have not answered for long \
                     though their Pods run: resume or delete them"
                )
            }
            StallReason::JoinsLost { node, shard, lost } => write!(
                f,
                "{node}'s server stopped before it joined shard {shard}, the {lost}th new node \
                 of this revision to die while joining lately: see its Pod's status and logs \
                 (an image that does not start, a memory limit a full sync exceeds); it is tried \
                 again once the cause is fixed or in 10 minutes"
            ),
            StallReason::JoinersRemoved {
                node,
                shard,
                removed,
            } => write!(
                f,
                "{node}'s Pod was removed before it joined shard {shard}, the {removed}th new \
                 node of this revision removed while joining lately: stop deleting the \
                 cluster's Pods (or see what removes them); it is tried again in 10 minutes"
            ),
            StallReason::UnownedSlotsWithoutPrimary { shard } => write!(
                f,
                "shard {shard} has no live primary to take its unowned slots"
            ),
            StallReason::NoPrimary { shard } => write!(f, "shard {shard} has no live primary"),
            StallReason::TwoPrimaries {
                shard,
                first,
                second,
            } => write!(f, "shard {shard} has two primaries, {first} and {second}"),
            StallReason::AlreadyFailedOver { shard } => {
                write!(f, "shard {shard} already had its failover in this roll")
            }
            StallReason::MigrationWithoutPrimaries {
                from_shard,
                to_shard,
            } => write!(
                f,
                "shards {from_shard} and {to_shard} need live primaries to move slots"
            ),
        }
    }
}

/// The start both unreachable-primary sentences share.
fn unreachable_primary(
    f: &mut fmt::Formatter<'_>,
    node: &str,
    shard: u32,
    slots: u32,
) -> fmt::Result {
    write!(
        f,
        "{node}, primary of shard {shard} owning {slots} slots, is unreachable"
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn node(name: &str) -> String {
        name.to_owned()
    }

    /// The sentences are matched by people, events and end-to-end tests: they must not drift.
    #[test]
    fn wait_reasons_read_as_before() {
        let cases = [
            (
                WaitReason::Joining {
                    node: node("n1"),
                    shard: 2,
                    blocker: JoinBlocker::Behind {
                        offset: 5,
                        primary_offset: 9,
                    },
                },
                "n1 is joining shard 2: replication offset 5 behind the primary's 9",
            ),
            (
                WaitReason::ValkeyFailover {
                    node: node("p0"),
                    shard: 0,
                    slots: 8192,
                },
                "p0, primary of shard 0 owning 8192 slots, is unreachable: waiting for \
                 Valkey's own failover",
            ),
            (
                WaitReason::OperatorCutOff {
                    node: node("p0"),
                    shard: 0,
                },
                "p0, primary of shard 0, has not answered the operator for long, but every \
                 node that answers sees it up: the operator's path to it is cut, and nothing \
                 is taken over",
            ),
            (
                WaitReason::ReplicaCutOff {
                    node: node("r0"),
                    shard: 0,
                },
                "r0, replica of shard 0, does not answer the operator, but every node that \
                 answers sees it up: the operator's path to it is cut, and it is not replaced",
            ),
            (
                WaitReason::SlotMigration { node: node("p1") },
                "a slot migration is running on p1",
            ),
            (
                WaitReason::ClusterNotOk { node: node("p1") },
                "p1 does not report cluster_state:ok yet",
            ),
            (
                WaitReason::FailoverTargetSyncing {
                    shard: 1,
                    node: node("r1"),
                },
                "r1 must be synced before shard 1 fails over to it",
            ),
            (
                WaitReason::HeirUnreachable {
                    node: node("p1"),
                    shard: 1,
                    heir: node("r1"),
                },
                "p1, primary of shard 1, is dead and its replica r1 does not answer right now: \
                 waiting for it before choosing who takes the shard over",
            ),
        ];
        for (reason, sentence) in &cases {
            assert_eq!(reason.to_string(), *sentence);
        }
        let kinds: BTreeSet<&str> = cases.iter().map(|(r, _)| r.kind()).collect();
        assert_eq!(kinds.len(), cases.len(), "one kind per cause");
    }

    #[test]
    fn stall_reasons_read_as_before() {
        let cases = [
            (
                StallReason::FailoverIncomplete {
                    shard: 0,
                    primary: node("p0"),
                    revision: "9.0.0".into(),
                    attempts: 3,
                },
                "the failover of shard 0 did not complete in 3 attempts: its primary p0 still \
                 runs 9.0.0; once you have looked, annotate the ValkeyCluster \
                 valkey.gomomento.com/retry-failovers=<its status.roll.revision> to allow more",
            ),
            (
                StallReason::JoinOverdue {
                    node: node("n3"),
                    shard: 0,
                    blocker: JoinBlocker::FullSync,
                },
                "n3 joined shard 0 but never became ready (full sync in progress)",
            ),
            (
                StallReason::DeadPrimaryWithoutReplica {
                    node: node("p0"),
                    shard: 0,
                    slots: 16384,
                },
                "p0, primary of shard 0 owning 16384 slots, is unreachable and its shard has \
                 no live replica to fail over to",
            ),
            (
                StallReason::CopiesUnreachable {
                    node: node("p0"),
                    shard: 0,
                    slots: 5461,
                },
                "p0, primary of shard 0 owning 5461 slots, is unreachable and its only copies \
                 are on replicas that have not answered for long though their Pods run: resume \
                 or delete them",
            ),
            (
                StallReason::UnownedSlotsWithoutPrimary { shard: 1 },
                "shard 1 has no live primary to take its unowned slots",
            ),
            (
                StallReason::NoPrimary { shard: 1 },
                "shard 1 has no live primary",
            ),
            (
                StallReason::TwoPrimaries {
                    shard: 1,
                    first: node("a"),
                    second: node("b"),
                },
                "shard 1 has two primaries, a and b",
            ),
            (
                StallReason::AlreadyFailedOver { shard: 2 },
                "shard 2 already had its failover in this roll",
            ),
            (
                StallReason::MigrationWithoutPrimaries {
                    from_shard: 3,
                    to_shard: 0,
                },
                "shards 3 and 0 need live primaries to move slots",
            ),
        ];
        for (reason, sentence) in &cases {
            assert_eq!(reason.to_string(), *sentence);
        }
        let kinds: BTreeSet<&str> = cases.iter().map(|(r, _)| r.kind()).collect();
        assert_eq!(kinds.len(), cases.len(), "one kind per cause");
    }

    #[test]
    fn join_blockers_read_as_before() {
        let primary = || node("p0");
        let cases = [
            (JoinBlocker::Unreachable, "unreachable"),
            (
                JoinBlocker::NotStarted {
                    why: "not schedulable: 0/6 nodes are available: 6 Insufficient cpu.".into(),
                },
                "its Pod has not started: not schedulable: 0/6 nodes are available: 6 \
                 Insufficient cpu.",
            ),
            (
                JoinBlocker::NotYetReplica { primary: primary() },
                "not yet a replica of p0",
            ),
            (JoinBlocker::NoReplicationState, "no replication state yet"),
            (JoinBlocker::LinkDown, "replication link down"),
            (JoinBlocker::FullSync, "full sync in progress"),
            (
                JoinBlocker::UnknownToPrimaries { primary: primary() },
                "not every primary lists it as a replica of p0 yet",
            ),
            (JoinBlocker::NotPrimary, "not a primary"),
            (
                JoinBlocker::NoSlotMap,
                "has not learnt the slot map yet (cluster_state not ok)",
            ),
        ];
        for (blocker, sentence) in cases {
            assert_eq!(blocker.to_string(), sentence);
        }
    }
}
