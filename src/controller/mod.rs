//! The controller: reconciles each ValkeyCluster into ValkeyNodes, Pods, a headless Service and
//! a PodDisruptionBudget, and rolls it one shard at a time through the planner in
//! [`crate::roll`] and the executor in [`crate::execute`]. A change of a ValkeyConfig or
//! ValkeyImage reaches every cluster that resolves through it, so a fleet change starts every
//! affected cluster at once.
//!
//! One file per concern: [`reconcile`] is the pass as a short pipeline; [`observe`] reads the
//! stored status and the nodes; [`membership`] keeps members in place outside the planner;
//! [`act`] performs the planned step through [`host`] (nodes as ValkeyNodes and Pods);
//! [`live`] applies settings and ACL users in place; [`status`] computes the status purely;
//! [`events`] are the cluster's Events; [`error`] and [`context`] hold the failure causes and
//! the retry state; [`render`] builds the objects; [`leader`] is the Lease that lets only one
//! replica reconcile.

pub mod act;
pub mod context;
pub mod credentials;
pub mod error;
pub mod events;
pub mod host;
pub mod leader;
pub mod live;
pub mod membership;
pub mod observe;
pub mod reconcile;
pub mod render;
pub mod rollouts;
pub mod secrets;
pub mod status;
pub mod stopwatch;

use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{broadcast, watch};

use crate::api::{ValkeyCluster, ValkeyNode, labels};
use crate::execute::Timeouts;
use crate::fleet::{ClusterKey, Fleet};
use crate::metrics::Metrics;
use crate::settings::OperatorSettings;
use context::{Backoff, Context};
use error::Error;
use leader::Leadership;

/// The clusters sent on the channel, as the controller's object references.
fn cluster_refs(
    changes: broadcast::Receiver<ClusterKey>,
) -> impl futures::Stream<Item = ObjectRef<ValkeyCluster>> + Send + 'static {
    futures::stream::unfold(changes, |mut changes| async move {
        loop {
            match changes.recv().await {
                Ok(key) => {
                    return Some((ObjectRef::new(&key.name).within(&key.namespace), changes));
                }
                // Missed some: each missed cluster is still reconciled by its periodic requeue.
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "fleet changes arrived faster than the controller took them"
                    );
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// The ValkeyCluster a Pod of ours belongs to, by its cluster label.
fn cluster_of_pod(pod: Pod) -> Option<ObjectRef<ValkeyCluster>> {
    let cluster = pod.labels().get(labels::CLUSTER)?;
    Some(ObjectRef::new(cluster).within(&pod.namespace()?))
}

/// The clusters whose users read a Secret (the fleet index keeps the edges).
fn clusters_reading(
    fleet: &RwLock<Fleet>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<ValkeyCluster>> {
    let (Some(namespace), Some(name)) = (&secret.metadata.namespace, &secret.metadata.name) else {
        return Vec::new();
    };
    let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
    fleet
        .clusters_using_secret(namespace, name)
        .into_iter()
        .map(|key| ObjectRef::new(&key.name).within(&key.namespace))
        .collect()
}

/// Requeue after a failure by its cause: an invalid object waits for a change; anything else
/// backs off exponentially per cluster.
fn error_policy(cluster: Arc<ValkeyCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(cluster = %cluster.name_any(), category = error.category(), %error, "reconcile failed");
    if error.is_invalid() {
        return Action::await_change();
    }
    let key = ClusterKey::new(cluster.namespace().unwrap_or_default(), cluster.name_any());
    Action::requeue(ctx.backoff.failed(&key))
}

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
        fleet: fleet.clone(),
        settings,
        timeouts,
        recorder: Recorder::new(client.clone(), Reporter::from("valkey-operator")),
        metrics,
        backoff: Backoff::default(),
        applied_acl: Default::default(),
        applied_tls: Default::default(),
        applied_settings: Default::default(),
        certificate_versions: Default::default(),
        known_credentials: Default::default(),
        stopwatches: Default::default(),
        rollouts: Default::default(),
        leadership: leading.clone(),
    });
    loop {
        if leading.wait_for(Option::is_some).await.is_err() {
            return;
        }
        tracing::info!("leading: reconciling ValkeyClusters");
        // Another replica may have written to the nodes while this one did not lead.
        context.applied_acl.clear();
        context.applied_tls.clear();
        context.applied_settings.clear();
        context.known_credentials.clear();
        context.stopwatches.clear();
        context.rollouts.clear();
        context.metrics.leading(true);
        let mut lost = leading.clone();
        let lost = async move {
            let _ = lost.wait_for(Option::is_none).await;
        };
        let managed = watcher::Config::default().labels(&format!(
            "{}={}",
            labels::MANAGED_BY,
            labels::MANAGED_BY_VALUE
        ));
        let controller = Controller::new(
            Api::<ValkeyCluster>::all(client.clone()),
            watcher::Config::default(),
        )
        .owns(
            Api::<ValkeyNode>::all(client.clone()),
            watcher::Config::default(),
        )
        // A Pod's owner is its ValkeyNode, so `owns` would never map it to its cluster: the
        // cluster label does. A Pod that terminates must wake its cluster at once (its shard
        // is taken over), not at the next periodic requeue.
        .watches(Api::<Pod>::all(client.clone()), managed, cluster_of_pod)
        // A Secret a cluster's users name changed: that cluster's users are written again.
        // Metadata only: Secret data is read when needed, never cached.
        .watches_stream(
            watcher(
                Api::<PartialObjectMeta<Secret>>::all(client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .touched_objects(),
            {
                let fleet = fleet.clone();
                move |secret| clusters_reading(&fleet, &secret)
            },
        )
        // Config and image changes arrive from the fleet index (caches.rs) once it reflects
        // them, as the clusters they reach.
        .reconcile_on(cluster_refs(changes.subscribe()))
        .run(reconcile::reconcile, error_policy, context.clone())
        .for_each(|_| async {});
        // Losing the Lease drops the controller and with it every reconcile in flight (a slot
        // migration's wait, a pass acting on old observations), not only the ones to come.
        let fleet_status = rollouts::write_fleet_status(
            client.clone(),
            fleet.clone(),
            context.rollouts.clone(),
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
}
