//! One reconcile of a ValkeyCluster: a pipeline of nine steps, one call each in [`apply`], each
//! in its own file and named for what it does (the steps that write say so):
//!
//! 1. **dereference** ([`dereference`]): the spec within the operator's limits, and
//!    `spec.configRef` resolved through the `baseRef` chain (fleet index), no I/O;
//! 2. **read** ([`read`]): every read of the cluster's objects but the stored status (read when
//!    the pass begins, since every early stop writes over it): the TLS trust, the ValkeyNodes
//!    and Pods, the users' password hashes ([`secrets`]); it writes nothing;
//! 3. **keep** ([`keep`]): the Secrets the operator owns for the cluster, written when they must
//!    be: its credentials ([`credentials`]), the passwords issued to the config's users
//!    ([`issued`]);
//! 4. **membership** ([`membership`]): the owned Service, budget and NetworkPolicy, node
//!    finalizers, missing Pods, MEET/REPLICATE, then what every node says and which are silent,
//!    and the role labels (outside the planner);
//! 5. **honour** ([`honour`]): a person's `retry-failovers` written into the roll's memory, and
//!    its annotation removed;
//! 6. **plan** ([`plan`]): the pure planner, the fleet rollout's [`gate`], the users the nodes
//!    get; it writes nothing;
//! 7. **act** ([`act`]): exactly the one planned step, through the product's executor;
//! 8. **live** ([`live`]): ACL users (the operator's own too) on every pass, a credentials
//!    rotation moved on, certificate reloads, and once converged, settings applied in place;
//! 9. **update status** ([`update_status`]): one server-side apply, events, then requeue by
//!    cause. A step that stops the pass early hands it a [`Halt`] saying why.
//!
//! Every write of a pass, to a Valkey node or to the API server, is sent only while this
//! replica's leadership still holds by its own clock, checked right before it is sent (see
//! [`crate::controller::lead::fence`]): a pass that outlived it (a paused process) writes nothing.
//!
//! A settled cluster's periodic pass is none of that: it asks its Valkey nodes only ([`light`]),
//! and goes on to the full pipeline when they answer differently.

pub mod act;
pub mod credentials;
pub mod dereference;
pub mod gate;
pub mod honour;
pub mod issued;
pub mod keep;
pub mod light;
pub mod live;
pub mod membership;
pub mod plan;
pub mod read;
pub mod secrets;
pub mod update_status;

use std::sync::Arc;
use std::time::Instant;

use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::{Api, ResourceExt};
use tracing::Instrument;

use crate::api::ClusterKey;
use crate::api::ValkeyCluster;
use crate::api::bounds::Problem;
use crate::api::finalizers::RETIRE_NODES;
use crate::controller::build::render::ClusterRender;
use crate::controller::build::status::Reason;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::events::{ClusterEvent, publish};
use crate::controller::host::{KubeHost, delete_node};
use crate::controller::memory::settled::PassStart;
use crate::controller::pass::read::{StoredStatus, read_nodes, read_status};
use crate::fleet::resolve::EffectiveConfig;

/// Reconciles one cluster (the entry point the controller runs).
pub async fn reconcile(cluster: Arc<ValkeyCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    // Every line the pass logs names its cluster (in JSON: `span.cluster`, `span.namespace`).
    let span = tracing::info_span!("pass", cluster = %cluster.name_any(), namespace = %namespace);
    let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, RETIRE_NODES, cluster, |event| async {
        match event {
            Finalized::Apply(cluster) => apply(&cluster, &ctx).await,
            Finalized::Cleanup(cluster) => cleanup(&cluster, &ctx).await,
        }
    })
    .instrument(span)
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .reconciled(started, result.as_ref().err().map(Error::category));
    result
}

/// What a full pass knows from its start: the cluster, and its status as stored when the pass
/// began (the roll memory with it).
pub struct Pass<'a> {
    pub ctx: &'a Context,
    pub cluster: &'a ValkeyCluster,
    pub namespace: String,
    pub key: ClusterKey,
    pub stored: StoredStatus,
    /// When the pass began, for settling (see [`crate::controller::memory::settled`]).
    pub began: PassStart,
}

impl<'a> Pass<'a> {
    async fn begin(ctx: &'a Context, cluster: &'a ValkeyCluster) -> Result<Self, Error> {
        let began = ctx.memory.settled.begin();
        let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
        let stored = read_status(ctx, cluster).await?;
        Ok(Self {
            ctx,
            cluster,
            namespace,
            key: ClusterKey::of(cluster),
            stored,
            began,
        })
    }

    /// The cluster's objects as `effective` renders them.
    pub fn render<'r>(&'r self, effective: &'r EffectiveConfig) -> ClusterRender<'r> {
        ClusterRender {
            cluster: self.cluster,
            effective,
            default_zone_spread: self.ctx.settings.default_zone_spread,
            cluster_domain: &self.ctx.settings.cluster_domain,
        }
    }
}

/// Why a pass stops before its last step; [`update_status::halted`] writes what it says.
pub enum Halt {
    /// The spec is past the operator's limits: said (on every full pass), nothing done until
    /// it changes.
    OutOfBounds(Vec<Problem>),
    /// Nothing can be done until something else appears or changes (a config, a CA, a usable
    /// credentials Secret): `Degraded` for `reason`, then wait for it.
    Waiting { reason: Reason, message: String },
    /// A step failed after saying why in the status: `Degraded` for `reason`, and the pass
    /// fails with `error` (backoff).
    Failed { reason: Reason, error: Error },
    /// A failure with nothing more to say than the error.
    Error(Error),
}

impl From<Error> for Halt {
    fn from(error: Error) -> Self {
        Halt::Error(error)
    }
}

/// The pipeline of a cluster that is not being deleted.
async fn apply(cluster: &ValkeyCluster, ctx: &Context) -> Result<Action, Error> {
    if let Some(action) = light::light_pass(ctx, cluster).await {
        return Ok(action);
    }
    let pass = Pass::begin(ctx, cluster).await?;
    match steps(&pass).await {
        Ok(action) => Ok(action),
        Err(halt) => update_status::halted(&pass, halt).await,
    }
}

/// Steps 1 to 9, one call each.
async fn steps(pass: &Pass<'_>) -> Result<Action, Halt> {
    let effective = dereference::dereference(pass)?;
    let render = pass.render(&effective);
    let (nodes, reads) = read::read(pass).await?;
    let seen = keep::keep(pass, &render, &nodes, reads).await?;
    let resource_version = pass.stored.resource_version.clone();
    let mut host = KubeHost::new(pass.ctx, &render, &pass.namespace, nodes, resource_version);
    let observed = membership::membership(pass, &render, &mut host, &seen.reach).await?;
    let memory = honour::honour(pass, &mut host).await?;
    let mut planned = plan::plan(pass, &render, observed, memory, &seen);
    let acted = act::act_planned(pass, &mut host, &mut planned, &seen.reach).await?;
    let lived = live::live(pass, &host, &planned, &seen, &render).await;
    Ok(update_status::update(pass, &host, &planned, &seen, acted, lived).await?)
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
    credentials::forget(ctx, &namespace, &cluster.name_any()).await?;
    let deleted = ClusterEvent::Deleted {
        nodes: nodes.objects.len(),
    };
    publish(&ctx.recorder, cluster, &deleted).await;
    ctx.metrics.forget_cluster(&namespace, &cluster.name_any());
    ctx.memory.forget_deleted(&ClusterKey::of(cluster));
    Ok(Action::await_change())
}
