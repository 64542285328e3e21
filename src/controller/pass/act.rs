//! Step 7 of a pass, act: the one step the planner chose, performed by the product's executor on
//! the cluster's ValkeyNodes and Pods ([`crate::controller::host::KubeHost`]); this adds what a
//! person and a dashboard see of it, the events and the failover and migration metrics, and times
//! the roll's shards and joins across passes.

use std::time::{Duration, Instant};

use crate::api::ClusterKey;
use crate::api::ValkeyCluster;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::events::{ClusterEvent, publish};
use crate::controller::host::KubeHost;
use crate::controller::memory::stopwatch;
use crate::controller::pass::Pass;
use crate::controller::pass::plan::Planned;
use crate::execute::{Outcome, StepInputs, perform};
use crate::roll::{DesiredShape, ObservedNode, RollMemory, Step};
use crate::valkey::Reach;

/// Performs the planned step under the leadership check. The outer error stops the pass (this
/// replica no longer leads); the step's own failure is the pass's to report.
pub async fn act_planned(
    pass: &Pass<'_>,
    host: &mut KubeHost<'_>,
    planned: &mut Planned,
    reach: &Reach,
) -> Result<Result<Outcome, Error>, Error> {
    let ctx = pass.ctx;
    let inputs = StepInputs {
        desired: &planned.desired,
        acl: &planned.users,
        timeouts: &ctx.timeouts,
        reach,
    };
    let (step, memory) = (&planned.step, &mut planned.memory);
    // The one write that must never come from a replica that no longer leads.
    ctx.fence()?;
    let acted = act(ctx, pass.cluster, host, step, memory, &inputs).await;
    if let Err(error) = &acted {
        tracing::warn!(cluster = %pass.key.name, %step, %error, "step failed");
    }
    let outcome = acted.as_ref().ok();
    time_pass(
        ctx,
        &pass.key,
        step,
        outcome,
        &planned.observed,
        &planned.desired,
    );
    Ok(acted)
}

/// Performs `step`, recording its events and metrics.
async fn act(
    ctx: &Context,
    cluster: &ValkeyCluster,
    host: &mut KubeHost<'_>,
    step: &Step,
    memory: &mut RollMemory,
    inputs: &StepInputs<'_>,
) -> Result<Outcome, Error> {
    if let Some(announced) = announcement(step) {
        publish(&ctx.recorder, cluster, &announced).await;
    }
    let started = Instant::now();
    let result = perform(host, step, memory, inputs).await;
    record_metrics(ctx, cluster, step, result.as_ref().ok(), started.elapsed());
    let outcome = result?;
    if let Some(done) = completion(step, &outcome) {
        publish(&ctx.recorder, cluster, &done).await;
    }
    Ok(outcome)
}

/// The event said before a step that takes time (so it shows while it runs).
fn announcement(step: &Step) -> Option<ClusterEvent> {
    let what = step.headline();
    match step {
        Step::Failover { to, .. } => Some(ClusterEvent::Failover {
            to: to.clone(),
            what,
        }),
        Step::HandOver { to, .. } => Some(ClusterEvent::HandOver {
            to: to.clone(),
            what,
        }),
        Step::Rebalance { to, .. } => Some(ClusterEvent::Rebalance {
            to: to.clone(),
            what,
        }),
        Step::Switchover { to, .. } => Some(ClusterEvent::Switchover {
            to: to.clone(),
            what,
        }),
        Step::TakeOver { to, .. } => Some(ClusterEvent::TakeOver {
            to: to.clone(),
            what,
        }),
        Step::MigrateSlots { to, .. } => Some(ClusterEvent::SlotMigration {
            to: to.clone(),
            what,
        }),
        _ => None,
    }
}

/// The event said once a step has been carried out. (A stall's event is said once, when the
/// status first shows it: see `stall_is_new`.)
fn completion(step: &Step, outcome: &Outcome) -> Option<ClusterEvent> {
    let what = step.headline();
    match (step, outcome) {
        (Step::JoinPrimary { .. } | Step::JoinReplica { .. }, Outcome::Created { node }) => {
            Some(ClusterEvent::NodeJoining {
                node: node.clone(),
                what,
            })
        }
        (Step::Activate { node, shard }, _) => Some(ClusterEvent::NodeActive {
            node: node.clone(),
            shard: *shard,
        }),
        (Step::RetireNode { node, .. }, _) => Some(ClusterEvent::NodeRetired {
            node: node.clone(),
            what,
        }),
        _ => None,
    }
}

/// Times the roll's shards and joining replicas across passes (see
/// [`crate::controller::memory::stopwatch`]).
fn time_pass(
    ctx: &Context,
    key: &ClusterKey,
    step: &Step,
    outcome: Option<&Outcome>,
    observed: &[ObservedNode],
    desired: &DesiredShape,
) {
    let created = match outcome {
        Some(Outcome::Created { node }) => Some(node.as_str()),
        _ => None,
    };
    let pass = stopwatch::Pass {
        step,
        ok: outcome.is_some(),
        created,
        nodes: observed.iter().map(|o| o.name.as_str()).collect(),
        outdated_shards: observed
            .iter()
            .filter(|o| !o.is_up_to_date(desired))
            .map(|o| o.shard)
            .collect(),
    };
    for (what, took) in ctx.memory.stopwatches.record(key, &pass, Instant::now()) {
        ctx.metrics.timed(&key.namespace, &key.name, what, took);
    }
}

fn record_metrics(
    ctx: &Context,
    cluster: &ValkeyCluster,
    step: &Step,
    outcome: Option<&Outcome>,
    took: Duration,
) {
    let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    let ok = outcome.is_some();
    match step {
        Step::Failover { .. }
        | Step::HandOver { .. }
        | Step::Rebalance { .. }
        | Step::Switchover { .. } => ctx.metrics.failover(namespace, name, ok, took),
        Step::MigrateSlots { .. } => {
            let keys = match outcome {
                Some(Outcome::Migrated { keys }) => *keys,
                _ => None,
            };
            ctx.metrics.slot_migration(namespace, name, ok, keys, took)
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::events::Said;

    #[test]
    fn long_steps_are_announced_and_node_steps_reported_with_their_node() {
        let failover = Step::Failover {
            shard: 1,
            from: "c-1-old".into(),
            to: "c-1-new".into(),
        };
        let announced = announcement(&failover);
        assert_eq!(
            announced.as_ref().and_then(ClusterEvent::node),
            Some("c-1-new")
        );
        assert_eq!(completion(&failover, &Outcome::Done), None);
        let join = Step::JoinReplica {
            shard: 0,
            primary: "c-0-p".into(),
        };
        let created = Outcome::Created {
            node: "c-0-r".into(),
        };
        let joined = completion(&join, &created);
        assert_eq!(
            joined.as_ref().map(ClusterEvent::reason),
            Some("NodeJoining")
        );
        assert_eq!(joined.as_ref().and_then(ClusterEvent::node), Some("c-0-r"));
        assert_eq!(announcement(&join), None);
    }
}
