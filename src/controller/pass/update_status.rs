//! Step 9 of a pass, update status: the status computed from what the pass found (see
//! [`crate::controller::build::status`], pure), the events of what changed in it, one server-side apply
//! (none when it says what the pass read), then the requeue by cause. A pass stopped early by a
//! [`Halt`] writes here too: `Degraded` with why.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::api::ClusterKey;
use crate::api::field_managers::CONTROLLER as MANAGER;
use crate::api::{ClusterState, ValkeyCluster, ValkeyClusterStatus};
use crate::controller::build::status::{
    ConditionType, PassReport, Reason, acl_applied, degraded, degraded_anew, needs_a_person,
    newly_failing, set_condition, stall_is_new, stalled_for, summarize,
};
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::events::{ClusterEvent, publish};
use crate::controller::host::KubeHost;
use crate::controller::pass::keep::Seen;
use crate::controller::pass::live::Lived;
use crate::controller::pass::plan::Planned;
use crate::controller::pass::{Halt, Pass};
use crate::execute::Outcome;
use crate::roll::rollout_waits::WaitFor;
use crate::roll::{JoinBlocker, Step, SwitchoverBlocker, WaitReason};
use crate::words::first_of;

/// Writes what the pass found, settles a converged cluster, and says when to come back.
pub async fn update(
    pass: &Pass<'_>,
    host: &KubeHost<'_>,
    planned: &Planned,
    seen: &Seen,
    acted: Result<Outcome, Error>,
    lived: Lived,
) -> Result<Action, Error> {
    let (ctx, cluster, stored) = (pass.ctx, pass.cluster, &pass.stored.status);
    let acl = acl_applied(&planned.unbuilt, &lived.acl.refusals);
    if newly_failing(&stored.conditions, &acl) {
        let problem = acl.message.clone();
        let event = ClusterEvent::AclNotApplied { problem };
        publish(&ctx.recorder, cluster, &event).await;
    }
    let step = &planned.step;
    let report = PassReport {
        generation: cluster.metadata.generation,
        shards: cluster.spec.shards,
        nodes: &host.nodes.objects,
        observed: &planned.observed,
        desired: &planned.desired,
        step,
        failure: acted.as_ref().err().map(ToString::to_string),
        rollout: planned.rollout,
        granted: Some((planned.granted.0.into(), &planned.granted.1)),
    };
    let now = Time(Timestamp::now());
    let mut status = summarize(stored, &report, now.clone());
    let generation = cluster.metadata.generation;
    set_condition(&mut status.conditions, acl, generation, now.clone());
    publish_changes(pass, &status, step).await;
    let stalled_for = stalled_for(&status.conditions, &now);
    write_status(ctx, cluster, stored, status).await?;
    acted?;
    // A cluster whose growth is held is never settled: its next full pass asks again.
    let held = !planned.granted.1.is_empty();
    if lived.quiet && lived.acl.everywhere && matches!(step, Step::Converged) && !held {
        let (members, reach) = (lived.members, seen.reach.clone());
        let (desired, observed) = (planned.desired.clone(), &planned.observed);
        let settled = &ctx.memory.settled;
        settled.settle(&pass.key, pass.began, members, reach, desired, observed);
    }
    // Only a pass that got this far resets the backoff: one waiting for its config keeps it.
    ctx.memory.backoff.succeeded(&pass.key);
    if held && matches!(step, Step::Converged) {
        // No event says another cluster of the namespace shrank: ask again soon.
        return Ok(Action::requeue(HELD_RECHECK));
    }
    Ok(requeue_after(step, stalled_for.unwrap_or_default()))
}

/// How soon a cluster whose growth a namespace policy holds asks again.
const HELD_RECHECK: Duration = Duration::from_secs(10);

/// The events of what the new status says that the stored one did not: a stranger at a
/// node's address, Pods that have not started, a stall.
async fn publish_changes(pass: &Pass<'_>, status: &ValkeyClusterStatus, step: &Step) {
    let (ctx, cluster) = (pass.ctx, pass.cluster);
    let stored = &pass.stored.status.conditions;
    if let Some(problem) = degraded_anew(Reason::StrangerAtAddress, stored, &status.conditions) {
        let event = ClusterEvent::StrangerAtAddress { problem };
        publish(&ctx.recorder, cluster, &event).await;
    }
    if let Some(problem) = degraded_anew(Reason::PodNotStarted, stored, &status.conditions) {
        let event = ClusterEvent::PodNotStarted { problem };
        publish(&ctx.recorder, cluster, &event).await;
    }
    if stall_is_new(stored, &status.conditions) {
        let what = step.headline();
        publish(&ctx.recorder, cluster, &ClusterEvent::RollStalled { what }).await;
    }
}

/// A pass stopped early: `Degraded` with why, and the requeue its cause earns.
pub async fn halted(pass: &Pass<'_>, halt: Halt) -> Result<Action, Error> {
    let (ctx, cluster, stored) = (pass.ctx, pass.cluster, &pass.stored.status);
    match halt {
        // Nothing else is done, whatever the numbers, until the spec changes.
        Halt::OutOfBounds(problems) => {
            let problems = first_of(&problems, 5);
            let event = ClusterEvent::SpecOutOfBounds {
                problems: problems.clone(),
            };
            publish(&ctx.recorder, cluster, &event).await;
            let message = format!("the spec is outside the operator's limits: {problems}");
            write_degraded(ctx, cluster, stored, Reason::SpecOutOfBounds, message).await?;
            ctx.memory.rollouts.forget(&pass.key);
            Ok(Action::await_change())
        }
        // The change it waits for wakes it through the fleet index or the Secret watch; the
        // backoff covers a cache still catching up.
        Halt::Waiting { reason, message } => {
            write_degraded(ctx, cluster, stored, reason, message).await?;
            // It reaches no rollout gate until fixed: its last standing must not hold a cap's
            // place or halt its group meanwhile.
            ctx.memory.rollouts.forget(&pass.key);
            Ok(Action::requeue(ctx.memory.backoff.failed(&pass.key)))
        }
        // Said in the status too, so `kubectl describe` shows why nothing moves.
        Halt::Failed { reason, error } => {
            let message = format!("preparing the next step: {error}");
            write_degraded(ctx, cluster, stored, reason, message).await?;
            Err(error)
        }
        Halt::Error(error) => Err(error),
    }
}

/// How soon a stalled cluster is asked again: at first, and at most (after 4 minutes stalled).
const STALL_RECHECK_FIRST: Duration = Duration::from_secs(5);
const STALL_RECHECK_MAX: Duration = Duration::from_secs(60);

/// How often a converged cluster's nodes are asked how they are (a light pass, see
/// [`crate::controller::memory::settled`]): no watch tells of a machine that died with its
/// Pods still `Running` in the API server, and Kubernetes says so only after 40 s or more.
pub const SETTLED_CHECK: Duration = Duration::from_secs(10);

/// Requeue by cause: soon while a step is in flight, every [`SETTLED_CHECK`] once settled, and
/// slowly where a watch wakes the cluster when what it waits for happens.
pub fn requeue_after(step: &Step, stalled_for: Duration) -> Action {
    Action::requeue(match step {
        Step::Converged => SETTLED_CHECK,
        // A stall waits for a person or for a change a watch reports (a spec, an annotation,
        // a Pod); the pass only covers what Valkey may mend by itself. So the longer it has
        // lasted the less often it is asked: a fleet of stalled clusters costs little.
        Step::Stalled { .. } => (stalled_for / 4).clamp(STALL_RECHECK_FIRST, STALL_RECHECK_MAX),
        // Its place comes when another cluster of its group finishes or recovers, which wakes
        // it (`Rollouts::take_wakes`); the requeue only covers a new leader still learning.
        // Until the window opens, at most: a cluster waits for no event then.
        Step::Wait {
            reason: WaitReason::Rollout(WaitFor::OutsideWindow { opens }),
        } => until(*opens).clamp(Duration::from_secs(1), Duration::from_secs(30)),
        Step::Wait {
            reason: WaitReason::Rollout(_),
        } => Duration::from_secs(30),
        // A person's switchover (an annotation, which wakes the cluster) is what it waits for.
        Step::Wait {
            reason:
                WaitReason::SupervisedFailover { .. }
                | WaitReason::Switchover {
                    blocker: SwitchoverBlocker::NoSuchShard | SwitchoverBlocker::NotAReplica { .. },
                    ..
                },
        } => Duration::from_secs(30),
        // A node whose server does not answer yet: its Pod turning ready wakes the cluster
        // (the Pod watch).
        Step::Wait {
            reason:
                WaitReason::Joining {
                    blocker: JoinBlocker::Unreachable | JoinBlocker::NotStarted { .. },
                    ..
                },
        } => Duration::from_secs(5),
        Step::Wait { .. } => Duration::from_secs(1),
        _ => Duration::from_millis(200),
    })
}

/// How long from now until `at` (zero once it has passed).
fn until(at: Timestamp) -> Duration {
    let left = at
        .as_millisecond()
        .saturating_sub(Timestamp::now().as_millisecond());
    Duration::from_millis(u64::try_from(left).unwrap_or(0))
}

/// The stored status with `Degraded=True` for `reason`.
async fn write_degraded(
    ctx: &Context,
    cluster: &ValkeyCluster,
    stored: &ValkeyClusterStatus,
    reason: Reason,
    message: String,
) -> Result<(), Error> {
    // Nothing was observed or planned: the last pass's step, stall and node series would lie.
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    ctx.metrics.roll_unknown(&namespace, &cluster.name_any());
    let mut status = stored.clone();
    let now = Time(Timestamp::now());
    set_condition(
        &mut status.conditions,
        degraded(reason, message),
        cluster.metadata.generation,
        now,
    );
    // A spec the operator cannot accept as it stands: Momento's `Invalid`.
    if matches!(reason, Reason::TlsUnavailable | Reason::NamespacePolicy) {
        status.state = Some(ClusterState::Invalid);
    }
    write_status(ctx, cluster, stored, status).await
}

/// Writes the status by server-side apply under the controller's field manager, unless it is what
/// `stored` (read at the start of this pass) already says: a settled cluster's passes write
/// nothing. The roll memory is left out: it has its own manager (see [`crate::controller::host`]).
async fn write_status(
    ctx: &Context,
    cluster: &ValkeyCluster,
    stored: &ValkeyClusterStatus,
    mut status: ValkeyClusterStatus,
) -> Result<(), Error> {
    status.roll = None;
    status.message = needs_a_person(&status.conditions);
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let unchanged = status
        == ValkeyClusterStatus {
            roll: None,
            ..stored.clone()
        };
    if !unchanged {
        let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = json!({
            "apiVersion": ValkeyCluster::api_version(&()),
            "kind": ValkeyCluster::kind(&()),
            "status": status,
        });
        let written = api
            .patch_status(
                &cluster.name_any(),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        ctx.memory
            .cluster_cache
            .wrote(&ClusterKey::of(cluster), written);
    }
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Degraded.as_str() && c.status == "True");
    let reason = degraded.map(|c| c.reason.as_str());
    ctx.metrics
        .degraded(&namespace, &cluster.name_any(), reason);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::roll::StallReason;

    #[test]
    fn a_stall_is_asked_less_often_the_longer_it_lasts() {
        let stalled = Step::Stalled {
            reason: StallReason::NoPrimary { shard: 0 },
        };
        let after = |seconds: u64| requeue_after(&stalled, Duration::from_secs(seconds));
        assert_eq!(after(0), Action::requeue(Duration::from_secs(5)));
        assert_eq!(after(40), Action::requeue(Duration::from_secs(10)));
        assert_eq!(after(120), Action::requeue(Duration::from_secs(30)));
        assert_eq!(after(3600), Action::requeue(Duration::from_secs(60)));
        assert_eq!(
            requeue_after(&Step::Converged, Duration::ZERO),
            Action::requeue(SETTLED_CHECK)
        );
    }
}
