//! The gate a cluster's roll step passes first: the step itself, or a wait when the fleet
//! rollout it belongs to does not let it advance yet ([`crate::fleet::rollout`] holds the rules,
//! [`crate::controller::memory::rollouts`] the standings).

use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::ClusterKey;
use crate::api::RolloutProgress;
use crate::api::annotations::ROLLOUT_WAVE;
use crate::api::{Hold, ValkeyCluster};
use crate::controller::memory::rollouts::Rollouts;
use crate::fleet::Fleet;
use crate::fleet::change::RollingInputs;
use crate::fleet::resolve::{self, EffectiveConfig};
use crate::fleet::rollout::{Asking, Policy, Standing, Verdict, wave_of};
use crate::fleet::window::Windows;
use crate::roll::rollout_waits::{WaitFor, Wave};
use crate::roll::{DesiredShape, Lifecycle, ObservedNode, Role, StallReason, Step, WaitReason};

/// The step to perform after the gate: `step` itself, or a wait when it would advance a roll the
/// rollout does not allow yet. Records the cluster's standing either way.
pub fn gated(
    rollouts: &Rollouts,
    fleet: &Fleet,
    cluster: &ValkeyCluster,
    effective: &EffectiveConfig,
    observed: &[ObservedNode],
    desired: &DesiredShape,
    step: Step,
) -> Step {
    let key = ClusterKey::of(cluster);
    let (policy, mut standing) = standing_of(fleet, cluster, &key, effective);
    let outdated = observed.iter().any(|o| !o.is_up_to_date(desired));
    let started = started(observed, desired);
    let advances = advances_a_roll(&step, observed, desired);
    // A person holds it on its revision: it advances no roll, even in the middle of a shard
    // (a shard between its replace and its retire only has a node more than it needs), and is
    // healed; the rest of its rollout goes on without it.
    if let Some(hold) = cluster.rollout_hold(Timestamp::now())
        && outdated
        && advances
    {
        standing.progress = RolloutProgress::Held;
        rollouts.record(&key, standing);
        return Step::Wait {
            reason: WaitReason::Rollout(WaitFor::Held {
                until: hold_until(hold),
            }),
        };
    }
    // Nodes that refuse the operator's login (its Secret or its users changed by hand): the
    // cluster is stuck for a cause of its own. It is healed, but its roll waits: it holds no
    // place under a cap, so it must not move one on.
    let locked_out = observed.iter().any(|o| o.locked_out);
    if locked_out && outdated && advances {
        standing.progress = RolloutProgress::Stuck;
        rollouts.record(&key, standing);
        return Step::Wait {
            reason: WaitReason::Rollout(WaitFor::LoginRefused),
        };
    }
    if matches!(step, Step::Stalled { .. }) || !outdated || !advances {
        let before = Before {
            outdated,
            locked_out,
            started,
        };
        standing.progress = progress_at(&step, before, observed, desired);
        rollouts.record(&key, standing);
        return step;
    }
    let members = standing
        .group
        .as_ref()
        .map(|name| fleet.clusters_resolving_through(name))
        .unwrap_or_default();
    let asking = Asking {
        members: &members,
        learning: rollouts.learning(),
        key: &key,
        standing: &standing,
        policy: policy.as_ref(),
        now: Timestamp::now(),
        paused: effective.chain.0.iter().any(|name| fleet.is_paused(name)),
        started,
        mid_shard: mid_shard(observed, desired),
    };
    match rollouts.admit(&asking) {
        Verdict::Go => step,
        Verdict::Wait(why) => Step::Wait {
            reason: WaitReason::Rollout(why),
        },
    }
}

/// What the gate knows of a cluster before it lets a step through.
#[derive(Clone, Copy)]
struct Before {
    outdated: bool,
    locked_out: bool,
    started: bool,
}

/// The standing of a cluster whose step the gate lets through as it is (a stall, a step that
/// does not advance a roll, or an up-to-date cluster).
fn progress_at(
    step: &Step,
    before: Before,
    observed: &[ObservedNode],
    desired: &DesiredShape,
) -> RolloutProgress {
    match (step, before.outdated) {
        (_, true) if before.locked_out => RolloutProgress::Stuck,
        // Only a stall of the change itself halts the rollout; one for a cause of the
        // cluster's own (a dead primary, say) holds nobody up.
        (Step::Stalled { reason }, true) if stall_of_the_change(reason, observed, desired) => {
            RolloutProgress::Stalled
        }
        (Step::Stalled { .. }, true) => RolloutProgress::Stuck,
        // A switchover its own people asked for that cannot be carried out is a cause of its
        // own too: the rest of its rollout does not wait for them to fix it.
        (Step::Wait { reason }, true) if waits_for_its_people(reason) => RolloutProgress::Stuck,
        (_, false) => RolloutProgress::UpToDate,
        _ if before.started => RolloutProgress::Rolling,
        _ => RolloutProgress::Queued,
    }
}

/// When a hold ends, if it has a time.
fn hold_until(hold: Hold) -> Option<String> {
    match hold {
        Hold::Until(until) => Some(until.to_string()),
        Hold::UntilReleased => None,
    }
}

/// The cluster's rollout policy, and its standing before the gate (up to date until it says
/// more), whose `group` is the nearest config of its chain with a rollout.
fn standing_of(
    fleet: &Fleet,
    cluster: &ValkeyCluster,
    key: &ClusterKey,
    effective: &EffectiveConfig,
) -> (Option<Policy>, Standing) {
    let chain = &effective.chain.0;
    let (group, group_policy) = fleet.rollout_group(chain).unzip();
    let policy = group_policy.map(|rollout| Policy {
        max_concurrent: rollout.max_concurrent,
        // A start that is not HH:MM never gets past admission and the CRD's pattern.
        windows: Windows::of(&rollout.maintenance_windows).unwrap_or_default(),
    });
    let annotation = cluster.annotations().get(ROLLOUT_WAVE).map(String::as_str);
    // The group's own resolution, so every member of a change compares alike whatever its
    // child config adds; without a group, the cluster's own.
    let group_effective = group.and_then(|name| resolve::resolve(name, fleet).ok());
    let standing = Standing {
        group: group.cloned(),
        chain: chain.to_vec(),
        image: effective.image.name.clone(),
        wave: match group_policy {
            Some(policy) => wave_of(key, policy, annotation),
            None => Wave::Last,
        },
        target: RollingInputs::of(group_effective.as_ref().unwrap_or(effective)).digest(),
        progress: RolloutProgress::UpToDate,
    };
    (policy, standing)
}

/// Whether a stall is the change's own doing: a node on the new revision that never became a
/// ready member (whatever held it up: it never answered, never synced, never caught up), new
/// nodes that keep dying while they join, or a failover onto one that never took effect. A
/// stall over the cluster's own state (a dead primary, silent copies, two primaries, a node
/// that refuses the login or a stranger at its address) is not.
fn stall_of_the_change(
    reason: &StallReason,
    observed: &[ObservedNode],
    desired: &DesiredShape,
) -> bool {
    match reason {
        StallReason::FailoverIncomplete { .. }
        | StallReason::AlreadyFailedOver { .. }
        | StallReason::JoinsLost { .. } => true,
        StallReason::JoinOverdue { node, .. } => observed
            .iter()
            .any(|o| o.name == *node && o.is_up_to_date(desired) && !o.locked_out && !o.stranger),
        _ => false,
    }
}

/// Whether a wait is for the cluster's own people to act: a switchover asked for by its
/// annotation that cannot be carried out (a supervised primary update is the platform's
/// policy, and counts as rolling).
fn waits_for_its_people(reason: &WaitReason) -> bool {
    matches!(reason, WaitReason::Switchover { .. })
}

/// The steps that move a cluster onto its new revision for the roll's sake: a rollout may hold
/// them back. Healing never waits: a new primary for a shard without one, a replica for a
/// shard below its target, retiring a node that is gone, and the handover or takeover of a
/// leaving or dead primary.
fn advances_a_roll(step: &Step, observed: &[ObservedNode], desired: &DesiredShape) -> bool {
    match step {
        Step::Failover { .. } => true,
        Step::JoinReplica { shard, .. } => {
            let replicas = observed
                .iter()
                .filter(|o| o.shard == *shard && o.reachable && o.role == Role::Replica)
                .filter(|o| o.lifecycle == Lifecycle::Active && !o.leaving && !o.terminated)
                .count();
            u32::try_from(replicas).unwrap_or(u32::MAX) >= desired.replicas_per_shard
        }
        Step::RetireNode { node, .. } => observed
            .iter()
            .any(|o| o.name == *node && o.reachable && !o.terminated),
        _ => false,
    }
}

/// Some node already runs the desired revision.
fn started(observed: &[ObservedNode], desired: &DesiredShape) -> bool {
    observed.iter().any(|o| o.revision == desired.revision)
}

/// Some shard has nodes on the desired revision and nodes on another: it is between its
/// replace and its retire.
fn mid_shard(observed: &[ObservedNode], desired: &DesiredShape) -> bool {
    let mut shards: HashMap<u32, (bool, bool)> = HashMap::new();
    for node in observed {
        let entry = shards.entry(node.shard).or_default();
        if node.revision == desired.revision {
            entry.0 = true;
        } else {
            entry.1 = true;
        }
    }
    shards.values().any(|(new, old)| *new && *old)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::annotations::ROLLOUT_HOLD;
    use crate::api::{RolloutPolicy, ValkeyClusterSpec, ValkeyConfigSpec, ValkeyImageSpec};
    use crate::roll::reasons::{JoinBlocker, SwitchoverBlocker};
    use crate::roll::{PrimaryUpdate, SlotRange};

    const OLD: &str = "old-revision";
    const NEW: &str = "new-revision";

    /// Config `shared` (with a rollout of at most `max_concurrent` at once) and clusters `a`
    /// and `b` of namespace `team` on it.
    fn fleet(max_concurrent: u32) -> Fleet {
        let mut fleet = Fleet::default();
        let image = ValkeyImageSpec {
            repository: "valkey/valkey".into(),
            tag: "9.1.2".into(),
            version: "9.1.2".into(),
        };
        fleet.upsert_image("valkey-9-1-2", image);
        let config = ValkeyConfigSpec {
            image_ref: Some("valkey-9-1-2".into()),
            rollout: Some(RolloutPolicy {
                max_concurrent: Some(max_concurrent),
                ..Default::default()
            }),
            ..Default::default()
        };
        fleet.upsert_config("shared", config);
        for name in ["a", "b"] {
            fleet.upsert_cluster(ClusterKey::new("team", name), "shared");
        }
        fleet
    }

    fn cluster(name: &str) -> ValkeyCluster {
        let mut cluster = ValkeyCluster::new(name, ValkeyClusterSpec::new("shared", 1, 1));
        cluster.metadata.namespace = Some("team".into());
        cluster
    }

    fn desired() -> DesiredShape {
        DesiredShape {
            shards: 1,
            replicas_per_shard: 1,
            revision: NEW.into(),
            switchover: None,
            primary_update: PrimaryUpdate::Automatic,
            primary_spread: Default::default(),
        }
    }

    /// One shard on `revision`: primary `p0` owning every slot and its replica `r0`.
    fn shard_on(revision: &str) -> Vec<ObservedNode> {
        vec![
            ObservedNode {
                slots: vec![SlotRange::new(0, 16383)],
                ..ObservedNode::settled("p0", 0, revision, Role::Primary)
            },
            ObservedNode::settled("r0", 0, revision, Role::Replica),
        ]
    }

    /// A new replica joining the outdated shard: the roll's first step.
    fn join() -> Step {
        Step::JoinReplica {
            shard: 0,
            primary: "p0".into(),
        }
    }

    /// `cluster`'s `step` through the gate of `rollouts` over `fleet`, and where it stands.
    fn gate(
        rollouts: &Rollouts,
        fleet: &Fleet,
        cluster: &ValkeyCluster,
        observed: &[ObservedNode],
        step: Step,
    ) -> (Step, Option<RolloutProgress>) {
        let effective = resolve::resolve("shared", fleet).unwrap();
        let gated = gated(
            rollouts,
            fleet,
            cluster,
            &effective,
            observed,
            &desired(),
            step,
        );
        (gated, rollouts.progress(&ClusterKey::of(cluster)))
    }

    fn waits_for(step: &Step) -> Option<&WaitFor> {
        match step {
            Step::Wait {
                reason: WaitReason::Rollout(why),
            } => Some(why),
            _ => None,
        }
    }

    #[test]
    fn an_up_to_date_cluster_passes_and_is_counted_up_to_date() {
        let (rollouts, fleet) = (Rollouts::default(), fleet(1));
        let (step, progress) = gate(
            &rollouts,
            &fleet,
            &cluster("a"),
            &shard_on(NEW),
            Step::Converged,
        );
        assert_eq!(step, Step::Converged);
        assert_eq!(progress, Some(RolloutProgress::UpToDate));
    }

    #[test]
    fn under_a_cap_of_one_the_second_cluster_queues_until_the_first_is_done() {
        let (rollouts, fleet) = (Rollouts::default(), fleet(1));
        let (a, b) = (cluster("a"), cluster("b"));
        // Both seen once (nothing to learn), then `a` starts and takes the one place.
        gate(&rollouts, &fleet, &b, &shard_on(OLD), Step::Converged);
        let (step, progress) = gate(&rollouts, &fleet, &a, &shard_on(OLD), join());
        assert_eq!((step, progress), (join(), Some(RolloutProgress::Rolling)));
        let (step, progress) = gate(&rollouts, &fleet, &b, &shard_on(OLD), join());
        assert_eq!(
            waits_for(&step),
            Some(&WaitFor::Capped { rolling: 1 }),
            "{step}"
        );
        assert_eq!(progress, Some(RolloutProgress::Queued));
        gate(&rollouts, &fleet, &a, &shard_on(NEW), Step::Converged);
        let (step, progress) = gate(&rollouts, &fleet, &b, &shard_on(OLD), join());
        assert_eq!((step, progress), (join(), Some(RolloutProgress::Rolling)));
    }

    #[test]
    fn a_held_cluster_advances_no_roll_but_is_healed() {
        let (rollouts, fleet) = (Rollouts::default(), fleet(5));
        let mut held = cluster("a");
        held.metadata.annotations = Some(BTreeMap::from([(
            ROLLOUT_HOLD.to_string(),
            "true".to_string(),
        )]));
        let (step, progress) = gate(&rollouts, &fleet, &held, &shard_on(OLD), join());
        assert!(
            matches!(waits_for(&step), Some(WaitFor::Held { until: None })),
            "{step}"
        );
        assert_eq!(progress, Some(RolloutProgress::Held));
        // Its replica dead: a replacement joins anyway, as healing.
        let mut wounded = shard_on(OLD);
        wounded[1].reachable = false;
        wounded[1].terminated = true;
        let (step, _) = gate(&rollouts, &fleet, &held, &wounded, join());
        assert_eq!(step, join());
    }

    #[test]
    fn nodes_that_refuse_the_login_make_the_cluster_stuck_not_rolling() {
        let (rollouts, fleet) = (Rollouts::default(), fleet(5));
        let mut locked = shard_on(OLD);
        locked[1].locked_out = true;
        let (step, progress) = gate(&rollouts, &fleet, &cluster("a"), &locked, join());
        assert_eq!(waits_for(&step), Some(&WaitFor::LoginRefused), "{step}");
        assert_eq!(progress, Some(RolloutProgress::Stuck));
    }

    #[test]
    fn only_a_stall_of_the_change_itself_counts_as_stalled() {
        let (rollouts, fleet) = (Rollouts::default(), fleet(5));
        let a = cluster("a");
        let mut joining = shard_on(OLD);
        joining.push(ObservedNode {
            lifecycle: Lifecycle::Joining,
            ..ObservedNode::settled("j0", 0, NEW, Role::Replica)
        });
        let overdue = Step::Stalled {
            reason: StallReason::JoinOverdue {
                node: "j0".into(),
                shard: 0,
                blocker: JoinBlocker::LinkDown,
            },
        };
        let (_, progress) = gate(&rollouts, &fleet, &a, &joining, overdue);
        assert_eq!(progress, Some(RolloutProgress::Stalled));
        let dead_primary = Step::Stalled {
            reason: StallReason::DeadPrimaryWithoutReplica {
                node: "p0".into(),
                shard: 0,
                slots: 16384,
            },
        };
        let (_, progress) = gate(&rollouts, &fleet, &a, &shard_on(OLD), dead_primary);
        assert_eq!(progress, Some(RolloutProgress::Stuck));
        let asked = Step::Wait {
            reason: WaitReason::Switchover {
                shard: 0,
                blocker: SwitchoverBlocker::NoPrimary,
            },
        };
        let (_, progress) = gate(&rollouts, &fleet, &a, &shard_on(OLD), asked);
        assert_eq!(progress, Some(RolloutProgress::Stuck));
    }
}
