//! The controller: reconciles each ValkeyCluster into ValkeyNodes, Pods, a headless Service and
//! a PodDisruptionBudget, and rolls it one shard at a time through the planner in
//! [`crate::roll`] and the executor in [`crate::execute`]. A change of a ValkeyConfig or
//! ValkeyImage reaches every cluster that resolves through it, so a fleet change starts every
//! affected cluster at once.
//!
//! Its files, by kind:
//! - [`pass`]: one reconcile of a cluster, as its nine steps, one file each (and the light pass
//!   of a settled cluster);
//! - [`memory`]: what the leader remembers of each cluster between passes, with one owner;
//! - [`lead`](mod@lead): leadership (the Lease, and the fence every write passes);
//! - [`watches`]: what wakes a cluster (and which of its own writes do not);
//! - [`build`]: what it builds purely, the objects it owns and the status;
//! - [`fleet_status`]: the second loop, writing every config's and image's fleet status;
//! - what the steps share: [`context`] what every pass is given, [`view`] what a pass sees of
//!   the nodes and Pods, [`host`] how it changes them, [`events`] what it tells, [`error`] why
//!   it failed; this file runs the controller while this replica leads.

pub mod build;
pub mod context;
pub mod error;
pub mod events;
pub mod fleet_status;
pub mod host;
pub mod lead;
pub mod memory;
pub mod pass;
pub mod view;
pub mod watches;

use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use tokio::sync::{broadcast, watch};

use crate::api::ClusterKey;
use crate::api::ValkeyCluster;
use crate::execute::Timeouts;
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::settings::OperatorSettings;
use context::Context;
use error::Error;
use events::EventRecorder;
use lead::lease::Leadership;

/// Runs the controller while this replica leads; stops reconciling as soon as it does not.
pub async fn run(
    client: Client,
    fleet: Arc<RwLock<Fleet>>,
    settings: OperatorSettings,
    metrics: Arc<Metrics>,
    timeouts: Timeouts,
    changes: broadcast::Sender<ClusterKey>,
    mut leading: watch::Receiver<Leadership>,
) {
    let context = Arc::new(Context {
        client: client.clone(),
        fleet,
        settings,
        timeouts,
        recorder: EventRecorder::new(client),
        metrics,
        memory: Default::default(),
        kube_nodes: Default::default(),
        wake: changes.clone(),
        leadership: leading.clone(),
    });
    loop {
        if leading.wait_for(Option::is_some).await.is_err() {
            return;
        }
        lead(&context, &changes, &leading).await;
    }
}

/// One term of leadership: every cluster reconciled and every config's fleet status written
/// until the Lease is lost. Losing it drops the controller and with it every reconcile in
/// flight (a slot migration's wait, a pass acting on old observations), not only the ones to
/// come.
async fn lead(
    context: &Arc<Context>,
    changes: &broadcast::Sender<ClusterKey>,
    leading: &watch::Receiver<Leadership>,
) {
    tracing::info!("leading: reconciling ValkeyClusters");
    // Another replica may have written to the nodes while this one did not lead.
    context.memory.reset();
    context.metrics.leading(true);
    let mut lost = leading.clone();
    let lost = async move {
        let _ = lost.wait_for(Option::is_none).await;
    };
    let controller = watches::controller(context, changes)
        .run(pass::reconcile, error_policy, context.clone())
        .for_each(|_| async {});
    let fleet_status = fleet_status::write_fleet_status(
        context.client.clone(),
        context.fleet.clone(),
        context.memory.rollouts.clone(),
        context.recorder.clone(),
    );
    tokio::select! {
        () = controller => {}
        () = fleet_status => {}
        () = lost => tracing::warn!("lost the lease: reconciles in flight cancelled"),
    }
    context.metrics.leading(false);
    tracing::info!("not leading: stopped reconciling");
}

/// Requeue after a failure by its cause: an invalid object waits for a change; anything else
/// backs off exponentially per cluster.
fn error_policy(cluster: Arc<ValkeyCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(cluster = %cluster.name_any(), category = error.category(), %error, "reconcile failed");
    let key = ClusterKey::of(&cluster);
    // A deleted cluster's last pass failing (its finalizer already gone) is no reason to keep
    // a backoff for it.
    if error.is_invalid() || ctx.memory.cluster_cache.gone(&key) {
        return Action::await_change();
    }
    Action::requeue(ctx.memory.backoff.failed(&key))
}
