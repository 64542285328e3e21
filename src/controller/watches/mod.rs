//! The watches that wake the controller, and the controller they feed: its own ValkeyClusters
//! (cached slim, see [`crate::controller::memory::cluster_cache`]), their ValkeyNodes and Pods
//! (for what someone other than the operator changed, see [`crate::controller::watches::wakes`]), the
//! owned objects deleted by hand, the Secrets the clusters' users name, and the fleet index's
//! changes of configs and images; and the Kubernetes Nodes' zones ([`mod@kube_nodes`]), which wake
//! nothing.

pub mod kube_nodes;
pub mod wakes;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, store::Writer};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::broadcast;

use crate::api::ClusterKey;
use crate::api::{ValkeyCluster, ValkeyNode, labels};
use crate::controller::context::Context;
use crate::controller::memory::ClusterMemory;
use crate::credentials::ISSUED_SUFFIX;
use crate::fleet::Fleet;

/// The controller of one term: the clusters, woken by every watch below.
pub fn controller(
    context: &Arc<Context>,
    changes: &broadcast::Sender<ClusterKey>,
) -> Controller<ValkeyCluster> {
    let client = &context.client;
    let managed = watcher::Config::default().labels(&format!(
        "{}={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    ));
    let (missed, missed_changes) = futures::channel::mpsc::unbounded();
    let (cached, cache) = reflector::store();
    context.memory.cluster_cache.start_term(cached.clone());
    let tuning = kube::runtime::controller::Config::default()
        .concurrency(context.settings.max_concurrent_reconciles);
    let waking = |context: &Arc<Context>| {
        let context = context.clone();
        move |key: Option<ClusterKey>| Some(woken(&context, key?))
    };
    let node_wakes = waking(context);
    let pod_wakes = waking(context);
    Controller::for_stream(clusters(context, cache), cached)
        .with_config(tuning)
        .watches_stream(nodes(context), move |node| {
            node_wakes(controlling_cluster(&node))
        })
        // A Pod's owner is its ValkeyNode, so an ownerReference would never map it to its
        // cluster: the cluster label does. A Pod that terminates must wake its cluster at
        // once (its shard is taken over), not at the next periodic requeue.
        .watches_stream(pods(context, managed.clone()), move |pod| {
            pod_wakes(cluster_of_pod(&pod))
        })
        // The owned objects are applied only when they change (memory::owned): one deleted by
        // hand is put back at once.
        .watches_stream(
            deleted_owned::<Service>(client, context.clone(), managed.clone()),
            cluster_ref,
        )
        .watches_stream(
            deleted_owned::<PodDisruptionBudget>(client, context.clone(), managed.clone()),
            cluster_ref,
        )
        .watches_stream(
            deleted_owned::<NetworkPolicy>(client, context.clone(), managed),
            cluster_ref,
        )
        // A Secret a cluster's users name changed: that cluster's users are written again.
        .watches_stream(secrets(context), {
            let context = context.clone();
            move |secret| {
                let home = &context.settings.operator_namespace;
                let reading = clusters_reading(&context.fleet, home, &secret);
                reading
                    .into_iter()
                    .map(|key| woken(&context, key))
                    .collect::<Vec<_>>()
            }
        })
        // Where primaries stand is judged at each pass: a Node's zone wakes no cluster.
        .watches_stream(kube_nodes(context), |_| None::<ObjectRef<ValkeyCluster>>)
        // Config and image changes arrive from the fleet index (fleet::caches) once it
        // reflects them, as the clusters they reach.
        .reconcile_on(cluster_refs(changes.subscribe(), context.clone(), missed))
        .reconcile_all_on(missed_changes)
}

/// The clusters, slim, into the controller's cache; woken only for what a person changed.
fn clusters(
    context: &Arc<Context>,
    cache: Writer<ValkeyCluster>,
) -> impl futures::Stream<Item = Result<ValkeyCluster, watcher::Error>> + Send + 'static {
    let delivered = context.clone();
    let changed = context.clone();
    watcher(
        Api::<ValkeyCluster>::all(context.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(slim)
    .reflect(cache)
    .inspect(move |event| {
        if let Ok(event) = event {
            delivered.memory.cluster_cache.delivered(event);
        }
        // Gone from the API server: its cleanup pass forgot it already, but what ran after
        // (an error's backoff, a pass's settling, a late watch event) may have put some back.
        if let Ok(watcher::Event::Delete(cluster)) = event {
            delivered.memory.forget_deleted(&ClusterKey::of(cluster));
        }
    })
    .applied_objects()
    .predicate_filter(changed_by_person, PredicateConfig::default())
    .inspect(move |cluster| {
        if let Ok(cluster) = cluster {
            changed.memory.settled.unsettle(&ClusterKey::of(cluster));
        }
    })
}

/// Every ValkeyNode, into the node cache; passed on when someone else changed it.
fn nodes(
    context: &Arc<Context>,
) -> impl futures::Stream<Item = Result<ValkeyNode, watcher::Error>> + Send + 'static {
    let cached = context.clone();
    let events = watcher(
        Api::<ValkeyNode>::all(context.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .inspect(move |event| {
        if let Ok(event) = event {
            cached.memory.node_cache.node_event(event);
        }
    });
    wakes::changed_only(events, wakes::node_fingerprint)
}

/// The operator's Pods (by its label), into the node cache; passed on when someone else
/// changed one.
fn pods(
    context: &Arc<Context>,
    managed: watcher::Config,
) -> impl futures::Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    let cached = context.clone();
    let events = watcher(Api::<Pod>::all(context.client.clone()), managed)
        .default_backoff()
        .inspect(move |event| {
            if let Ok(event) = event {
                cached.memory.node_cache.pod_event(event);
            }
        });
    wakes::changed_only(events, wakes::pod_fingerprint)
}

/// Every Kubernetes Node's metadata, into [`Context::kube_nodes`].
fn kube_nodes(
    context: &Arc<Context>,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<Node>, watcher::Error>> + Send + 'static {
    let noted = context.clone();
    watcher(
        Api::<PartialObjectMeta<Node>>::all(context.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .inspect(move |event| {
        if let Ok(event) = event {
            noted.kube_nodes.node_event(event);
        }
    })
    .touched_objects()
}

/// Every Secret's metadata (its data is read when needed, never cached), noting the versions
/// of the operator's own.
fn secrets(
    context: &Arc<Context>,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<Secret>, watcher::Error>> + Send + 'static
{
    let noted = context.clone();
    watcher(
        Api::<PartialObjectMeta<Secret>>::all(context.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .inspect(move |event| {
        if let Ok(event) = event {
            note_secret_version(&noted, event);
        }
    })
    .touched_objects()
}

/// The cluster a watch event reaches, unsettled first (see [`crate::controller::memory::settled`]):
/// the pass the event wakes is a full one.
fn woken(context: &Context, key: ClusterKey) -> ObjectRef<ValkeyCluster> {
    if !context.memory.cluster_cache.gone(&key) {
        context.memory.settled.unsettle(&key);
    }
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
/// status is kept: a pass starts from it, see [`crate::controller::memory::cluster_cache`]).
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

/// The clusters that read a Secret: whose users name it (the fleet index keeps the edges), or
/// whose own it is in the operator's namespace (`home`): a private credentials Secret or the
/// passwords issued for it, by name (see [`crate::credentials::private_secret_name`]), so one
/// deleted or edited by hand is put right at once.
fn clusters_reading(
    fleet: &RwLock<Fleet>,
    home: &str,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ClusterKey> {
    let (Some(namespace), Some(name)) = (&secret.metadata.namespace, &secret.metadata.name) else {
        return Vec::new();
    };
    let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
    let mut reading = fleet.clusters_using_secret(namespace, name);
    let ours = secret.labels().get(labels::MANAGED_BY).map(String::as_str)
        == Some(labels::MANAGED_BY_VALUE);
    if namespace == home && ours {
        let own = name.strip_suffix(ISSUED_SUFFIX).unwrap_or(name);
        if let Some((namespace, cluster)) = own.split_once('.') {
            reading.push(ClusterKey::new(namespace, cluster));
        }
    }
    reading
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
/// [`crate::controller::memory::owned::AppliedObjects`]).
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
                        if !context.memory.cluster_cache.gone(&cluster) {
                            context.memory.settled.unsettle(&cluster);
                        }
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

/// Keeps [`crate::controller::memory::credentials::SecretVersions`] current for the Secrets the
/// operator manages (its label), so a credentials Secret that has not changed is not read again.
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
