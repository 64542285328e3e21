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
//! replica reconcile; [`settled`] and [`wakes`] keep a converged fleet and the operator's own
//! writes from costing passes.

pub mod act;
pub mod cluster_cache;
pub mod context;
pub mod credentials;
pub mod dereference;
pub mod error;
pub mod events;
pub mod fence;
pub mod host;
pub mod leader;
pub mod live;
pub mod lost_joins;
pub mod membership;
pub mod memory;
pub mod node_cache;
pub mod observe;
pub mod plan;
pub mod reconcile;
pub mod render;
pub mod rollouts;
pub mod secrets;
pub mod settled;
pub mod silence;
pub mod status;
pub mod stopwatch;
pub mod update_status;
pub mod wakes;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{broadcast, watch};

use crate::api::{ValkeyCluster, ValkeyNode, labels};
use crate::execute::Timeouts;
use crate::fleet::{ClusterKey, Fleet};
use crate::metrics::Metrics;
use crate::settings::OperatorSettings;
use context::Context;
use error::Error;
use leader::Leadership;
use memory::ClusterMemory;

/// The cluster a watch event reaches, unsettled first (see [`settled`]): the pass the event
/// wakes is a full one.
fn woken(context: &Context, key: ClusterKey) -> ObjectRef<ValkeyCluster> {
    context.memory.settled.unsettle(&key);
    ObjectRef::new(&key.name).within(&key.namespace)
}

/// The clusters sent on the channel, as the controller's object references. When some were
/// missed (a change reaching more clusters than the channel holds), every cluster is
/// unsettled and a unit is sent on `missed`: the controller then reconciles them all, fully.
fn cluster_refs(
    changes: broadcast::Receiver<ClusterKey>,
    context: Arc<Context>,
    missed: futures::channel::mpsc::UnboundedSender<()>,
) -> impl futures::Stream<Item = ObjectRef<ValkeyCluster>> + Send + 'static {
    futures::stream::unfold(changes, move |mut changes| {
        let context = context.clone();
        let missed = missed.clone();
        async move {
            loop {
                match changes.recv().await {
                    Ok(key) => {
                        return Some((woken(&context, key), changes));
                    }
                    Err(broadcast::error::RecvError::Lagged(count)) => {
                        tracing::warn!(
                            missed = count,
                            "fleet changes arrived faster than the controller took them: reconciling every cluster"
                        );
                        context.memory.settled.reset();
                        // No receiver only once the controller has stopped.
                        let _ = missed.unbounded_send(());
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    })
}

/// What of a cluster the controller's own watch wakes it for: what a person (or the API
/// server, marking it deleted) changed. Not the operator's own status writes: every pass
/// requeues itself, and a status write waking its cluster again would double the passes of a
/// fleet in a roll.
fn changed_by_person(cluster: &ValkeyCluster) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    cluster.metadata.generation.hash(&mut hasher);
    cluster.labels().hash(&mut hasher);
    cluster.annotations().hash(&mut hasher);
    cluster.finalizers().hash(&mut hasher);
    let deleting = cluster.metadata.deletion_timestamp.as_ref();
    deleting.map(|t| t.0.to_string()).hash(&mut hasher);
    Some(hasher.finish())
}

/// What the controller's cache keeps of a cluster: no field-manager history and no
/// `kubectl apply` copy of the spec, which together are most of a cluster object's size (its
/// status is kept: a pass starts from it, see [`cluster_cache`]).
fn slim(cluster: &mut ValkeyCluster) {
    cluster.metadata.managed_fields = None;
    // A copy of the spec that `kubectl apply` keeps; nothing here reads it.
    if let Some(annotations) = cluster.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// The annotation in which client-side `kubectl apply` keeps what it last applied.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The ValkeyCluster a Pod of ours belongs to, by its cluster label.
fn cluster_of_pod(pod: &Pod) -> Option<ClusterKey> {
    let cluster = pod.labels().get(labels::CLUSTER)?;
    Some(ClusterKey::new(pod.namespace()?, cluster.clone()))
}

/// The clusters whose users read a Secret (the fleet index keeps the edges).
fn clusters_reading(fleet: &RwLock<Fleet>, secret: &PartialObjectMeta<Secret>) -> Vec<ClusterKey> {
    let (Some(namespace), Some(name)) = (&secret.metadata.namespace, &secret.metadata.name) else {
        return Vec::new();
    };
    let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
    fleet.clusters_using_secret(namespace, name)
}

/// The ValkeyCluster that controls `object`, by its controller ownerReference.
fn controlling_cluster<K: Resource>(object: &K) -> Option<ClusterKey> {
    let owner = object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true) && r.kind == ValkeyCluster::kind(&()))?;
    let namespace = object.meta().namespace.clone()?;
    Some(ClusterKey::new(namespace, owner.name.clone()))
}

/// Deletions of objects the operator manages of kind `K` (metadata only; the owned Service,
/// budget and NetworkPolicy): each one's cluster forgets having applied them, so the pass the
/// deletion wakes applies them again rather than trusting its record (see
/// [`membership::AppliedObjects`]).
fn deleted_owned<K>(
    client: &Client,
    context: Arc<Context>,
    managed: watcher::Config,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watcher(Api::<PartialObjectMeta<K>>::all(client.clone()), managed)
        .default_backoff()
        .filter_map(move |event| {
            let deleted = match event {
                Ok(watcher::Event::Delete(object)) => {
                    if let Some(cluster) = controlling_cluster(&object) {
                        context.memory.applied_owned.forget(&cluster);
                        context.memory.settled.unsettle(&cluster);
                    }
                    Some(Ok(object))
                }
                Ok(_) => None,
                Err(error) => Some(Err(error)),
            };
            futures::future::ready(deleted)
        })
}

/// The cluster to wake for an object it controls.
fn cluster_ref<K: Resource>(object: PartialObjectMeta<K>) -> Option<ObjectRef<ValkeyCluster>> {
    let key = controlling_cluster(&object)?;
    Some(ObjectRef::new(&key.name).within(&key.namespace))
}

/// Keeps [`credentials::SecretVersions`] current for the Secrets the operator manages (its
/// label), so a credentials Secret that has not changed is not read again.
fn note_secret_version(context: &Context, event: &watcher::Event<PartialObjectMeta<Secret>>) {
    let managed = |secret: &PartialObjectMeta<Secret>| {
        secret.labels().get(labels::MANAGED_BY).map(String::as_str)
            == Some(labels::MANAGED_BY_VALUE)
    };
    let versions = &context.memory.secret_versions;
    let (secret, present) = match event {
        watcher::Event::Apply(secret) | watcher::Event::InitApply(secret) => (secret, true),
        watcher::Event::Delete(secret) => (secret, false),
        watcher::Event::Init | watcher::Event::InitDone => return,
    };
    let (Some(namespace), Some(name)) = (&secret.metadata.namespace, &secret.metadata.name) else {
        return;
    };
    // One that lost the label is forgotten too: no version means it is read each pass.
    let version = secret.metadata.resource_version.clone();
    versions.saw(
        namespace,
        name,
        version.filter(|_| present && managed(secret)),
    );
}

/// Requeue after a failure by its cause: an invalid object waits for a change; anything else
/// backs off exponentially per cluster.
fn error_policy(cluster: Arc<ValkeyCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(cluster = %cluster.name_any(), category = error.category(), %error, "reconcile failed");
    if error.is_invalid() {
        return Action::await_change();
    }
    Action::requeue(ctx.memory.backoff.failed(&ClusterKey::of(&cluster)))
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
        recorder: events::EventRecorder::new(client.clone()),
        metrics,
        memory: Default::default(),
        wake: changes.clone(),
        leadership: leading.clone(),
    });
    loop {
        if leading.wait_for(Option::is_some).await.is_err() {
            return;
        }
        tracing::info!("leading: reconciling ValkeyClusters");
        // Another replica may have written to the nodes while this one did not lead.
        context.memory.reset();
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
        let (missed, missed_changes) = futures::channel::mpsc::unbounded();
        let (cached, cache) = reflector::store();
        context.memory.cluster_cache.start_term(cached.clone());
        let clusters = watcher(
            Api::<ValkeyCluster>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(slim)
        .reflect(cache)
        .inspect({
            let context = context.clone();
            move |event| {
                if let Ok(event) = event {
                    context.memory.cluster_cache.delivered(event);
                }
            }
        })
        .applied_objects()
        .predicate_filter(changed_by_person, PredicateConfig::default())
        .inspect({
            let context = context.clone();
            move |changed| {
                if let Ok(cluster) = changed {
                    let key = ClusterKey::new(
                        cluster.namespace().unwrap_or_default(),
                        cluster.name_any(),
                    );
                    context.memory.settled.unsettle(&key);
                }
            }
        });
        let tuning = kube::runtime::controller::Config::default()
            .concurrency(context.settings.max_concurrent_reconciles);
        let controller = Controller::for_stream(clusters, cached)
            .with_config(tuning)
            // A cluster's ValkeyNodes, by their controller ownerReference, for what someone
            // other than the operator changed (see [`wakes`]).
            .watches_stream(
                wakes::changed_only(
                    watcher(
                        Api::<ValkeyNode>::all(client.clone()),
                        watcher::Config::default(),
                    )
                    .default_backoff()
                    .inspect({
                        let context = context.clone();
                        move |event| {
                            if let Ok(event) = event {
                                context.memory.node_cache.node_event(event);
                            }
                        }
                    }),
                    wakes::node_fingerprint,
                ),
                {
                    let context = context.clone();
                    move |node| Some(woken(&context, controlling_cluster(&node)?))
                },
            )
            // A Pod's owner is its ValkeyNode, so an ownerReference would never map it to its
            // cluster: the cluster label does. A Pod that terminates must wake its cluster at
            // once (its shard is taken over), not at the next periodic requeue.
            .watches_stream(
                wakes::changed_only(
                    watcher(Api::<Pod>::all(client.clone()), managed.clone())
                        .default_backoff()
                        .inspect({
                            let context = context.clone();
                            move |event| {
                                if let Ok(event) = event {
                                    context.memory.node_cache.pod_event(event);
                                }
                            }
                        }),
                    wakes::pod_fingerprint,
                ),
                {
                    let context = context.clone();
                    move |pod| Some(woken(&context, cluster_of_pod(&pod)?))
                },
            )
            // The owned objects are applied only when they change (membership::AppliedObjects):
            // one deleted by hand is put back at once.
            .watches_stream(
                deleted_owned::<Service>(&client, context.clone(), managed.clone()),
                cluster_ref,
            )
            .watches_stream(
                deleted_owned::<PodDisruptionBudget>(&client, context.clone(), managed.clone()),
                cluster_ref,
            )
            .watches_stream(
                deleted_owned::<NetworkPolicy>(&client, context.clone(), managed),
                cluster_ref,
            )
            // A Secret a cluster's users name changed: that cluster's users are written again.
            // Metadata only: Secret data is read when needed, never cached.
            .watches_stream(
                watcher(
                    Api::<PartialObjectMeta<Secret>>::all(client.clone()),
                    watcher::Config::default(),
                )
                .default_backoff()
                .inspect({
                    let context = context.clone();
                    move |event| {
                        if let Ok(event) = event {
                            note_secret_version(&context, event);
                        }
                    }
                })
                .touched_objects(),
                {
                    let fleet = fleet.clone();
                    let context = context.clone();
                    move |secret| {
                        let reading = clusters_reading(&fleet, &secret);
                        reading
                            .into_iter()
                            .map(|key| woken(&context, key))
                            .collect::<Vec<_>>()
                    }
                },
            )
            // Config and image changes arrive from the fleet index (caches.rs) once it reflects
            // them, as the clusters they reach.
            .reconcile_on(cluster_refs(changes.subscribe(), context.clone(), missed))
            .reconcile_all_on(missed_changes)
            .run(reconcile::reconcile, error_policy, context.clone())
            .for_each(|_| async {});
        // Losing the Lease drops the controller and with it every reconcile in flight (a slot
        // migration's wait, a pass acting on old observations), not only the ones to come.
        let fleet_status = rollouts::write_fleet_status(
            client.clone(),
            fleet.clone(),
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
}
