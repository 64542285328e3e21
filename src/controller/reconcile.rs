//! One reconcile of a ValkeyCluster, as a short pipeline:
//!
//! 1. **dereference**: resolve `spec.configRef` through the `baseRef` chain (fleet index);
//! 2. **observe**: the stored status (roll memory) and the cluster's ValkeyNodes and Pods;
//!    with the credentials Secret (created if absent) the nodes start with and the operator
//!    logs in with;
//! 3. **membership**: the owned Service and budget, node finalizers, missing Pods,
//!    MEET/REPLICATE, roles (outside the planner; see [`super::membership`]);
//! 4. **plan**: what every node says (`crate::execute::observe`) → the pure planner, after a
//!    person's `retry-failovers` annotation has been honoured;
//! 5. **act**: exactly the one planned step, through the product's executor;
//! 6. **live**: ACL users (the operator's own too) on every pass, a credentials rotation moved
//!    on, and once converged, settings applied in place;
//! 7. **update status**: one server-side apply, then requeue by cause.
//!
//! Every write of a pass, to a Valkey node or to the API server, is sent only while this
//! replica's leadership still holds by its own clock, checked right before it is sent (see
//! [`super::fence`]): a pass that outlived it (a paused process) writes nothing.
//!
//! A settled cluster's periodic pass is none of that: it asks its Valkey nodes only, and goes
//! on to the full pipeline when they answer differently (see [`super::settled`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::context::Context;
use super::error::Error;
use super::events::{ClusterEvent, publish};
use super::host::{KubeHost, delete_node};
use super::live::Reloads;
use super::observe::{PodView, StoredStatus, memory_of, read_nodes, read_status};
use super::render::ClusterRender;
use super::silence::silence_bound;
use super::status::{
    ConditionType, PassReport, Reason, acl_applied, degraded, newly_failing, progress,
    set_condition, stall_is_new, stalled_for, stranger_is_new, summarize,
};
use super::{act, credentials, fence, live, membership, rollouts, secrets, settled};
use crate::api::annotations::RETRY_FAILOVERS;
use crate::api::bounds::{Problem, cluster_problems};
use crate::api::field_managers::CONTROLLER as MANAGER;
use crate::api::finalizers::RETIRE_NODES;
use crate::api::{ValkeyCluster, ValkeyClusterStatus};
use crate::credentials::{Rotation, secret_name};
use crate::execute::acl::DesiredAcl;
use crate::execute::{self, NodeHost, StepInputs, observe::observe};
use crate::fleet::ClusterKey;
use crate::resolve::{self, EffectiveConfig};
use crate::roll::{DesiredShape, JoinBlocker, RollMemory, Step, WaitReason, plan};
use crate::valkey::Reach;
use crate::words::first_of;

/// Reconciles one cluster (the entry point the controller runs).
pub async fn reconcile(cluster: Arc<ValkeyCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, RETIRE_NODES, cluster, |event| async {
        match event {
            Finalized::Apply(cluster) => apply(&cluster, &ctx).await,
            Finalized::Cleanup(cluster) => cleanup(&cluster, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .reconciled(started, result.as_ref().err().map(Error::category));
    result
}

/// A settled cluster's periodic pass: what its Valkey nodes say, and nothing else while they
/// say the same (the node gauges are refreshed from it). `None`: a full pass is needed.
async fn light_pass(ctx: &Context, cluster: &ValkeyCluster) -> Option<Action> {
    let key = ClusterKey::of(cluster);
    let view = ctx.memory.settled.view(&key)?;
    let observed = observe(&view.members, &view.reach).await;
    if settled::fingerprint(&observed) != view.fingerprint {
        ctx.memory.settled.unsettle(&key);
        return None;
    }
    let converged = Step::Converged;
    let progress = progress(&view.desired, &observed, &converged);
    ctx.metrics
        .roll_progress(&key.namespace, &key.name, &progress);
    Some(requeue_after(&converged, Duration::ZERO))
}

/// The pipeline of a cluster that is not being deleted.
async fn apply(cluster: &ValkeyCluster, ctx: &Context) -> Result<Action, Error> {
    if let Some(settled) = light_pass(ctx, cluster).await {
        return Ok(settled);
    }
    let began = ctx.memory.settled.begin();
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let stored = read_status(ctx, cluster).await?;
    let problems = cluster_problems(&cluster.name_any(), &cluster.spec);
    if !problems.is_empty() {
        return spec_out_of_bounds(ctx, cluster, &stored, &problems).await;
    }
    let effective = match dereference(ctx, cluster) {
        Ok(effective) => effective,
        Err(message) => {
            return degraded_until_fixed(ctx, cluster, &stored, Reason::ConfigUnresolved, message)
                .await;
        }
    };
    let render = ClusterRender {
        cluster,
        effective: &effective,
        default_zone_spread: ctx.settings.default_zone_spread,
    };
    let (mut reach, certificate) =
        match secrets::reach(&ctx.client, &namespace, cluster, ctx.timeouts.call).await {
            Ok(reached) => reached,
            Err(message) => {
                return degraded_until_fixed(
                    ctx,
                    cluster,
                    &stored,
                    Reason::TlsUnavailable,
                    message,
                )
                .await;
            }
        };
    let nodes = read_nodes(ctx, cluster).await?;
    let login = match credentials::ensure(
        &ctx.client,
        &render,
        &namespace,
        &ctx.memory.known_credentials,
        &ctx.memory.secret_versions,
        nodes
            .pods
            .values()
            .any(|pod| mounts(pod, &secret_name(&cluster.name_any()))),
    )
    .await
    {
        Ok(login) => login,
        Err(error @ (Error::NotOurs { .. } | Error::Credentials { .. })) => {
            let problem = error.to_string();
            if matches!(error, Error::NotOurs { .. }) {
                let event = ClusterEvent::NameConflict {
                    problem: problem.clone(),
                };
                publish(&ctx.recorder, cluster, &event).await;
            }
            let reason = Reason::CredentialsUnusable;
            return degraded_until_fixed(ctx, cluster, &stored, reason, problem).await;
        }
        Err(error) => return Err(error),
    };
    reach.credentials = login.credentials.logins();
    reach.fence = Some(fence::valkey_fence(&ctx.leadership));
    let mut host = KubeHost::new(
        ctx,
        &render,
        &namespace,
        nodes,
        stored.resource_version.clone(),
    );
    ctx.fence()?;
    let observed = match prepare(ctx, &render, &mut host, &namespace, &reach).await {
        Ok(observed) => observed,
        Err(error) => {
            // Said in the status too, so `kubectl describe` shows why nothing moves.
            let reason = match &error {
                Error::NotOurs { .. } => {
                    let problem = error.to_string();
                    publish(
                        &ctx.recorder,
                        cluster,
                        &ClusterEvent::NameConflict { problem },
                    )
                    .await;
                    Reason::NameConflict
                }
                _ => Reason::StepFailed,
            };
            let message = format!("preparing the next step: {error}");
            write_degraded(ctx, cluster, &stored.status, reason, message).await?;
            return Err(error);
        }
    };
    let desired = desired_shape(cluster, &render);
    let mut memory = memory_of(&stored.status);
    memory.lost_joins = ctx
        .memory
        .lost_joins
        .count(&ClusterKey::of(cluster), &desired, &observed);
    allow_more_failovers(ctx, cluster, &namespace, &mut host, &mut memory).await?;
    let step = {
        let fleet = ctx.fleet.read().unwrap_or_else(|p| p.into_inner());
        rollouts::gated(
            &ctx.memory.rollouts,
            &fleet,
            cluster,
            &effective,
            &observed,
            &desired,
            plan(&desired, &observed, &memory),
        )
    };
    for queued in ctx.memory.rollouts.take_wakes() {
        // No receiver only while the controller is not running: nothing to wake then.
        let _ = ctx.wake.send(queued);
    }
    ctx.metrics.roll_progress(
        &namespace,
        &cluster.name_any(),
        &progress(&desired, &observed, &step),
    );
    tracing::info!(cluster = %cluster.name_any(), %namespace, %step, "planned");
    let passwords = secrets::read_password_hashes(&ctx.client, &namespace, cluster).await;
    let system = login.credentials.system_users();
    let (users, unbuilt) = live::desired_acl(&ctx.fleet, cluster, &passwords, system);
    let inputs = StepInputs {
        desired: &desired,
        acl: &users,
        timeouts: &ctx.timeouts,
        reach: &reach,
    };
    // The one write that must never come from a replica that no longer leads.
    ctx.fence()?;
    let acted = act::act(ctx, cluster, &mut host, &step, &mut memory, &inputs).await;
    if let Err(error) = &acted {
        tracing::warn!(cluster = %cluster.name_any(), %step, %error, "step failed");
    }
    act::time_pass(
        ctx,
        cluster,
        &step,
        acted.as_ref().ok(),
        &observed,
        &desired,
    );
    let members = host.members();
    let live = LivePass {
        cluster,
        namespace: &namespace,
        members: &members,
        observed: &observed,
        users: &users,
        reach: &reach,
        step: &step,
    };
    let (applied, quiet) = live_stage(ctx, &live, &login, certificate.as_deref(), &render).await;
    let acl = acl_applied(&unbuilt, &applied.refusals);
    if newly_failing(&stored.status.conditions, &acl) {
        let problem = acl.message.clone();
        publish(
            &ctx.recorder,
            cluster,
            &ClusterEvent::AclNotApplied { problem },
        )
        .await;
    }
    let report = PassReport {
        generation: cluster.metadata.generation,
        shards: cluster.spec.shards,
        nodes: &host.nodes.objects,
        observed: &observed,
        desired: &desired,
        step: &step,
        failure: acted.as_ref().err().map(ToString::to_string),
    };
    let now = Time(Timestamp::now());
    let mut status = summarize(&stored.status, &report, now.clone());
    set_condition(
        &mut status.conditions,
        acl,
        cluster.metadata.generation,
        now.clone(),
    );
    if let Some(problem) = stranger_is_new(&stored.status.conditions, &status.conditions) {
        publish(
            &ctx.recorder,
            cluster,
            &ClusterEvent::StrangerAtAddress { problem },
        )
        .await;
    }
    if stall_is_new(&stored.status.conditions, &status.conditions) {
        let stalled = ClusterEvent::RollStalled {
            what: step.headline(),
        };
        publish(&ctx.recorder, cluster, &stalled).await;
    }
    let stalled_for = stalled_for(&status.conditions, &now);
    write_status(ctx, cluster, &stored.status, status).await?;
    acted?;
    if quiet && applied.everywhere && matches!(step, Step::Converged) {
        let key = ClusterKey::of(cluster);
        ctx.memory.settled.settle(
            &key,
            began,
            members,
            reach.clone(),
            desired.clone(),
            &observed,
        );
    }
    // Only a pass that got this far resets the backoff: one waiting for its config keeps it.
    ctx.memory.backoff.succeeded(&ClusterKey::of(cluster));
    Ok(requeue_after(&step, stalled_for.unwrap_or_default()))
}

/// What the live stage works on: the pass's members, as observed, and the users they get.
struct LivePass<'a> {
    cluster: &'a ValkeyCluster,
    namespace: &'a str,
    members: &'a [execute::Member],
    observed: &'a [crate::roll::ObservedNode],
    users: &'a DesiredAcl,
    reach: &'a Reach,
    step: &'a Step,
}

/// Stage 6, live: the users on every pass (so a removed user or a rotated password holds
/// during a long roll), the credentials rotation moved on, certificate reloads while a
/// Secret change is recent, and once converged, settings applied in place. Returns the users'
/// outcome, and whether nothing is left to redo on the nodes (with a converged step, the
/// cluster settles).
async fn live_stage(
    ctx: &Context,
    pass: &LivePass<'_>,
    login: &credentials::Read,
    certificate: Option<&str>,
    render: &ClusterRender<'_>,
) -> (live::AclOutcome, bool) {
    let key = ClusterKey::of(pass.cluster);
    let name = pass.cluster.name_any();
    let mut quiet = false;
    let applied = live::apply_acl(
        &ctx.memory.applied_acl,
        &key,
        pass.members,
        pass.observed,
        pass.users,
        pass.reach,
    )
    .await;
    let rotation_quiet = login.credentials.rotation == Rotation::Steady && !login.rotate_asked;
    let rotated = credentials::advance(
        &ctx.client,
        pass.namespace,
        &name,
        login,
        applied.everywhere,
        &ctx.memory.known_credentials,
    )
    .await;
    match rotated {
        Ok(Some(stage)) => {
            let event = ClusterEvent::CredentialsRotation { stage };
            publish(&ctx.recorder, pass.cluster, &event).await;
        }
        Ok(None) if rotation_quiet => quiet = true,
        Ok(None) => {}
        // Tried again next pass; the nodes keep accepting both passwords meanwhile.
        Err(error) => {
            tracing::warn!(cluster = %name, %error, "could not move the credentials rotation on")
        }
    }
    if let Some(version) = certificate {
        let reloads = live::reload_certificates(
            &ctx.memory.applied_tls,
            &ctx.memory.certificate_versions,
            &key,
            pass.members,
            pass.observed,
            version,
            pass.reach,
        )
        .await;
        ctx.metrics
            .node_certificate_reloads(pass.namespace, &name, reloads.ok, reloads.failed);
        // Reloads repeat each pass for a while after a Secret change.
        quiet &= reloads == Reloads::default();
    }
    if matches!(pass.step, Step::Converged) {
        live::apply_settings(
            &ctx.memory.applied_settings,
            &key,
            pass.members,
            pass.observed,
            &render.live_settings(),
            pass.reach,
        )
        .await;
    }
    (applied, quiet)
}

/// Whether the Pod mounts the Secret `secret` (a Pod made by an older operator has no
/// credentials Secret).
fn mounts(pod: &PodView, secret: &str) -> bool {
    pod.secrets.iter().any(|name| name == secret)
}

/// The effective config, or why there is none.
fn dereference(ctx: &Context, cluster: &ValkeyCluster) -> Result<EffectiveConfig, String> {
    let fleet = ctx.fleet.read().unwrap_or_else(|p| p.into_inner());
    resolve::resolve(&cluster.spec.config_ref, &*fleet)
        .map_err(|error| format!("spec.configRef does not resolve: {error}"))
}

/// A cluster that cannot be worked on until something else appears (its config, or the CA of
/// its TLS Secret; a TLS cluster is not touched when nothing could be verified): says why in
/// the status, and waits. The change it waits for wakes it through the fleet index or the
/// Secret watch; the backoff covers a cache still catching up.
async fn degraded_until_fixed(
    ctx: &Context,
    cluster: &ValkeyCluster,
    stored: &StoredStatus,
    reason: Reason,
    message: String,
) -> Result<Action, Error> {
    write_degraded(ctx, cluster, &stored.status, reason, message).await?;
    // It reaches no rollout gate until fixed: its last standing must not hold a cap's place
    // or halt its group meanwhile.
    ctx.memory.rollouts.forget(&ClusterKey::of(cluster));
    Ok(Action::requeue(
        ctx.memory.backoff.failed(&ClusterKey::of(cluster)),
    ))
}

/// A spec past the hard limits (admission was bypassed or off): said in the status and an
/// event, and nothing else is done, whatever the numbers, until the spec changes.
async fn spec_out_of_bounds(
    ctx: &Context,
    cluster: &ValkeyCluster,
    stored: &StoredStatus,
    problems: &[Problem],
) -> Result<Action, Error> {
    let problems = first_of(problems, 5);
    publish(
        &ctx.recorder,
        cluster,
        &ClusterEvent::SpecOutOfBounds {
            problems: problems.clone(),
        },
    )
    .await;
    let message = format!("the spec is outside the operator's limits: {problems}");
    write_degraded(
        ctx,
        cluster,
        &stored.status,
        Reason::SpecOutOfBounds,
        message,
    )
    .await?;
    ctx.memory.rollouts.forget(&ClusterKey::of(cluster));
    Ok(Action::await_change())
}

/// Membership, then what every node says.
async fn prepare(
    ctx: &Context,
    render: &ClusterRender<'_>,
    host: &mut KubeHost<'_>,
    namespace: &str,
    reach: &Reach,
) -> Result<Vec<crate::roll::ObservedNode>, Error> {
    let operator_namespace = &ctx.settings.operator_namespace;
    let conflict = membership::apply_owned_objects(
        &ctx.client,
        &ctx.memory.applied_owned,
        render,
        host,
        operator_namespace,
    )
    .await?;
    if let Some(conflict) = conflict {
        tracing::warn!(cluster = %render.cluster.name_any(), %conflict, "NetworkPolicy not applied");
        let problem = conflict.to_string();
        publish(
            &ctx.recorder,
            render.cluster,
            &ClusterEvent::NameConflict { problem },
        )
        .await;
    }
    membership::hold_nodes(host, &ctx.client, namespace).await?;
    membership::bound_handover_times(host, &ctx.client, namespace, Timestamp::now()).await?;
    membership::create_missing_pods(&ctx.client, render, host, namespace).await?;
    execute::membership::introduce(host, &ctx.timeouts, reach).await?;
    let members = host.members();
    let mut observed = observe(&members, reach).await;
    let bound = silence_bound(render.node_timeout());
    let key = ClusterKey::of(render.cluster);
    ctx.memory
        .silence
        .judge(&key, &members, &mut observed, bound);
    membership::sync_roles(&ctx.client, host, &observed, render, namespace).await?;
    Ok(observed)
}

fn desired_shape(cluster: &ValkeyCluster, render: &ClusterRender<'_>) -> DesiredShape {
    DesiredShape {
        shards: u32::try_from(cluster.spec.shards).unwrap_or(1),
        replicas_per_shard: u32::try_from(cluster.spec.replicas_per_shard).unwrap_or(0),
        revision: render.revision(),
    }
}

/// How soon a stalled cluster is asked again: at first, and at most (after 4 minutes stalled).
const STALL_RECHECK_FIRST: Duration = Duration::from_secs(5);
const STALL_RECHECK_MAX: Duration = Duration::from_secs(60);

/// Requeue by cause: soon while a step is in flight, slowly once settled, and slowly too
/// where a watch wakes the cluster when what it waits for happens.
fn requeue_after(step: &Step, stalled_for: Duration) -> Action {
    Action::requeue(match step {
        Step::Converged => Duration::from_secs(60),
        // A stall waits for a person or for a change a watch reports (a spec, an annotation,
        // a Pod); the pass only covers what Valkey may mend by itself. So the longer it has
        // lasted the less often it is asked: a fleet of stalled clusters costs little.
        Step::Stalled { .. } => (stalled_for / 4).clamp(STALL_RECHECK_FIRST, STALL_RECHECK_MAX),
        // Its place comes when another cluster of its group finishes or recovers, which wakes
        // it (`Rollouts::take_wakes`); the requeue only covers a new leader still learning.
        Step::Wait {
            reason: WaitReason::Rollout(_),
        } => Duration::from_secs(30),
        // A node whose server does not answer yet: its Pod turning ready wakes the cluster
        // (the Pod watch).
        Step::Wait {
            reason:
                WaitReason::Joining {
                    blocker: JoinBlocker::Unreachable,
                    ..
                },
        } => Duration::from_secs(5),
        Step::Wait { .. } => Duration::from_secs(1),
        _ => Duration::from_millis(200),
    })
}

/// Retires every node of a deleted cluster; the Service and budget go with their owner.
async fn cleanup(cluster: &ValkeyCluster, ctx: &Context) -> Result<Action, Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let nodes = read_nodes(ctx, cluster).await?;
    let nodes_api = Api::namespaced(ctx.client.clone(), &namespace);
    let pods_api = Api::namespaced(ctx.client.clone(), &namespace);
    let writes = ctx.memory.node_cache.writes(ClusterKey::of(cluster));
    for node in &nodes.objects {
        delete_node(&nodes_api, &pods_api, &node.name_any(), &writes).await?;
    }
    let deleted = ClusterEvent::Deleted {
        nodes: nodes.objects.len(),
    };
    publish(&ctx.recorder, cluster, &deleted).await;
    ctx.metrics.forget_cluster(&namespace, &cluster.name_any());
    ctx.memory.forget(&ClusterKey::of(cluster));
    let remembered = ctx.memory.clusters().len();
    tracing::info!(cluster = %cluster.name_any(), remembered, "forgot a deleted cluster");
    Ok(Action::await_change())
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
    write_status(ctx, cluster, stored, status).await
}

/// Acts once on a person's [`RETRY_FAILOVERS`] annotation naming this roll's revision: every
/// shard that spent its failover attempts gets them again (saved first, under the roll memory's
/// precondition), then the annotation is removed, so it never acts twice.
async fn allow_more_failovers(
    ctx: &Context,
    cluster: &ValkeyCluster,
    namespace: &str,
    host: &mut KubeHost<'_>,
    memory: &mut RollMemory,
) -> Result<(), Error> {
    let Some(asked) = cluster.annotations().get(RETRY_FAILOVERS) else {
        return Ok(());
    };
    if asked == &memory.revision {
        let shards = memory.allow_more_attempts();
        host.save_memory(memory).await?;
        publish(
            &ctx.recorder,
            cluster,
            &ClusterEvent::FailoversAllowed { shards },
        )
        .await;
    }
    // Removed also when it names another roll: it could never act, and must not later.
    let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = json!({"metadata": {"annotations": {RETRY_FAILOVERS: null}}});
    let written = api
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    host.cluster_written(written.metadata.resource_version.clone());
    ctx.memory
        .cluster_cache
        .wrote(&ClusterKey::of(cluster), written);
    Ok(())
}

/// Writes the status by server-side apply under the controller's field manager, unless it is
/// what `stored` (read at the start of this pass) already says: a settled cluster's passes
/// write nothing. The roll memory is left out: it has its own manager (see [`super::host`]).
async fn write_status(
    ctx: &Context,
    cluster: &ValkeyCluster,
    stored: &ValkeyClusterStatus,
    mut status: ValkeyClusterStatus,
) -> Result<(), Error> {
    status.roll = None;
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
            Action::requeue(Duration::from_secs(60))
        );
    }
}
