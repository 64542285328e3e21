//! The in-memory cache that admission and the controller read: watches over ValkeyImage,
//! ValkeyConfig, ValkeyRole, ValkeyCluster and ValkeyNamespacePolicy keep the [`Fleet`] index
//! current. An admission
//! answer never lists the API server. Only the index keeps what it needs of each object (a
//! config's spec, a cluster's references): no whole objects are cached here, so a fleet of
//! thousands of clusters costs a few hundred bytes each.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use crate::api::ClusterKey;
use crate::api::annotations::{ROLLOUT_PAUSED, ROLLOUT_WAVE};
use crate::api::{ValkeyCluster, ValkeyConfig, ValkeyImage, ValkeyNamespacePolicy, ValkeyRole};
use crate::fleet::Fleet;
use crate::fleet::policy::{Footprint, Member};
use crate::fleet::resolve::Catalog;

/// Which caches have completed their first list.
#[derive(Debug, Default)]
pub struct Readiness {
    images: AtomicBool,
    configs: AtomicBool,
    roles: AtomicBool,
    clusters: AtomicBool,
    policies: AtomicBool,
}

impl Readiness {
    /// A readiness already satisfied, for servers that are handed a prepared fleet.
    pub fn synced() -> Self {
        Self {
            images: AtomicBool::new(true),
            configs: AtomicBool::new(true),
            roles: AtomicBool::new(true),
            clusters: AtomicBool::new(true),
            policies: AtomicBool::new(true),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.waiting_for().is_empty()
    }

    /// The caches still waiting for their first list.
    pub fn waiting_for(&self) -> Vec<&'static str> {
        [
            (&self.images, "valkeyimages"),
            (&self.configs, "valkeyconfigs"),
            (&self.roles, "valkeyroles"),
            (&self.clusters, "valkeyclusters"),
            (&self.policies, "valkeynamespacepolicies"),
        ]
        .into_iter()
        .filter(|(flag, _)| !flag.load(Ordering::Acquire))
        .map(|(_, name)| name)
        .collect()
    }
}

/// How one kind's watch events update the fleet index.
trait Indexed:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
    fn apply(&self, fleet: &mut Fleet);
    /// Drops the object `gone` names from the index.
    fn remove(gone: &ObjectRef<Self>, fleet: &mut Fleet);
    fn flag(readiness: &Readiness) -> &AtomicBool;
    /// The clusters a change of this object may change (their effective config).
    fn reaches(&self, fleet: &Fleet) -> Vec<ClusterKey>;
    /// Whether this version differs from what the index holds in anything that matters to
    /// clusters: a status write (the operator's own fleet status, every few seconds during a
    /// rollout) must not wake every cluster it reaches.
    fn changes(&self, _fleet: &Fleet) -> bool {
        true
    }
}

impl Indexed for ValkeyImage {
    fn apply(&self, fleet: &mut Fleet) {
        fleet.upsert_image(&self.name_any(), self.spec.clone());
    }
    fn changes(&self, fleet: &Fleet) -> bool {
        fleet.image(&self.name_any()) != Some(&self.spec)
    }
    fn remove(gone: &ObjectRef<Self>, fleet: &mut Fleet) {
        fleet.remove_image(&gone.name);
    }
    fn flag(readiness: &Readiness) -> &AtomicBool {
        &readiness.images
    }
    fn reaches(&self, fleet: &Fleet) -> Vec<ClusterKey> {
        fleet
            .configs_using_image(&self.name_any())
            .flat_map(|config| fleet.clusters_resolving_through(config))
            .collect()
    }
}

/// A person paused the config's rollouts ([`ROLLOUT_PAUSED`]).
fn paused(config: &ValkeyConfig) -> bool {
    config
        .annotations()
        .get(ROLLOUT_PAUSED)
        .is_some_and(|value| value == "true")
}

impl Indexed for ValkeyConfig {
    fn apply(&self, fleet: &mut Fleet) {
        fleet.upsert_config(&self.name_any(), self.spec.clone());
        fleet.set_paused(&self.name_any(), paused(self));
    }
    fn changes(&self, fleet: &Fleet) -> bool {
        let name = self.name_any();
        fleet.config(&name) != Some(&self.spec) || fleet.is_paused(&name) != paused(self)
    }
    fn remove(gone: &ObjectRef<Self>, fleet: &mut Fleet) {
        fleet.remove_config(&gone.name);
    }
    fn flag(readiness: &Readiness) -> &AtomicBool {
        &readiness.configs
    }
    fn reaches(&self, fleet: &Fleet) -> Vec<ClusterKey> {
        fleet.clusters_resolving_through(&self.name_any())
    }
}

impl Indexed for ValkeyRole {
    fn apply(&self, fleet: &mut Fleet) {
        fleet.upsert_role(&self.name_any(), self.spec.clone());
    }
    fn remove(gone: &ObjectRef<Self>, fleet: &mut Fleet) {
        fleet.remove_role(&gone.name);
    }
    fn flag(readiness: &Readiness) -> &AtomicBool {
        &readiness.roles
    }
    /// Clusters whose ACL users hold the role: their users are set again, live.
    fn reaches(&self, fleet: &Fleet) -> Vec<ClusterKey> {
        fleet.clusters_using_role(&self.name_any())
    }
}

impl Indexed for ValkeyCluster {
    fn apply(&self, fleet: &mut Fleet) {
        let key = ClusterKey::of(self);
        fleet.upsert_cluster(key.clone(), &self.spec.config_ref);
        let member = Member {
            footprint: Footprint::of(&self.spec),
            created: self.metadata.creation_timestamp.as_ref().map(|t| t.0),
        };
        fleet.set_cluster_member(&key, member);
        let wave = self.annotations().get(ROLLOUT_WAVE);
        fleet.set_cluster_wave_annotation(&key, wave.map(String::as_str));
        let roles: BTreeSet<String> = self
            .spec
            .acl
            .iter()
            .flat_map(|user| &user.permissions)
            .map(|permission| permission.role_ref.clone())
            .collect();
        fleet.set_cluster_roles(&key, roles);
        let costs = self.spec.acl.iter().map(crate::acl::UserCost::of).collect();
        fleet.set_cluster_acl_costs(&key, costs);
        let secrets = self
            .spec
            .acl
            .iter()
            .filter_map(|user| user.password_secret_ref.as_ref())
            .map(|secret| secret.name.clone())
            .chain(self.spec.tls.iter().map(|tls| tls.secret_ref.clone()))
            .chain([crate::credentials::secret_name(&key.name)])
            .collect();
        fleet.set_cluster_secrets(&key, secrets);
    }
    fn remove(gone: &ObjectRef<Self>, fleet: &mut Fleet) {
        let namespace = gone.namespace.clone().unwrap_or_default();
        fleet.remove_cluster(&ClusterKey::new(namespace, gone.name.clone()));
    }
    fn flag(readiness: &Readiness) -> &AtomicBool {
        &readiness.clusters
    }
    /// The controller watches clusters itself.
    fn reaches(&self, _: &Fleet) -> Vec<ClusterKey> {
        Vec::new()
    }
}

impl Indexed for ValkeyNamespacePolicy {
    fn apply(&self, fleet: &mut Fleet) {
        fleet.upsert_policy(&self.name_any(), self.spec.clone());
    }
    fn changes(&self, fleet: &Fleet) -> bool {
        fleet.policy(&self.name_any()) != Some(&self.spec)
    }
    fn remove(gone: &ObjectRef<Self>, fleet: &mut Fleet) {
        fleet.remove_policy(&gone.name);
    }
    fn flag(readiness: &Readiness) -> &AtomicBool {
        &readiness.policies
    }
    /// The clusters of its namespaces: one that has not started yet may now be allowed.
    fn reaches(&self, fleet: &Fleet) -> Vec<ClusterKey> {
        self.spec
            .namespaces
            .iter()
            .flat_map(|namespace| fleet.members_of(namespace).map(|(key, _)| key.clone()))
            .collect()
    }
}

/// The objects of one kind the index holds, and those a re-list in progress has listed.
struct Listed<K: Indexed> {
    known: HashSet<ObjectRef<K>>,
    relisted: HashSet<ObjectRef<K>>,
}

impl<K: Indexed> Default for Listed<K> {
    fn default() -> Self {
        Self {
            known: HashSet::new(),
            relisted: HashSet::new(),
        }
    }
}

/// Applies one watch event to the index. A re-list (`Init`, `InitApply`…, `InitDone`) upserts
/// what it lists as it comes, then drops what the index held but the list no longer has: the
/// index never empties in between, so admission keeps answering during a re-list.
/// Returns the clusters a change (not a re-list) reaches, once the index reflects it.
fn index_event<K: Indexed>(
    event: &watcher::Event<K>,
    fleet: &RwLock<Fleet>,
    listed: &mut Listed<K>,
    readiness: &Readiness,
) -> Vec<ClusterKey> {
    let mut fleet = fleet
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match event {
        watcher::Event::Init => listed.relisted.clear(),
        watcher::Event::InitApply(object) => {
            listed.relisted.insert(ObjectRef::from(object));
            object.apply(&mut fleet);
        }
        watcher::Event::Apply(object) => {
            listed.known.insert(ObjectRef::from(object));
            let changes = object.changes(&fleet);
            object.apply(&mut fleet);
            if changes {
                return object.reaches(&fleet);
            }
        }
        watcher::Event::Delete(object) => {
            let gone = ObjectRef::from(object);
            K::remove(&gone, &mut fleet);
            listed.known.remove(&gone);
            return object.reaches(&fleet);
        }
        watcher::Event::InitDone => {
            let relisted = std::mem::take(&mut listed.relisted);
            for gone in listed.known.difference(&relisted) {
                K::remove(gone, &mut fleet);
            }
            listed.known = relisted;
            K::flag(readiness).store(true, Ordering::Release);
        }
    }
    Vec::new()
}

fn watch_kind<K: Indexed>(
    client: Client,
    fleet: Arc<RwLock<Fleet>>,
    readiness: Arc<Readiness>,
    changes: broadcast::Sender<ClusterKey>,
) -> impl Stream<Item = ()> + Send {
    let mut listed = Listed::default();
    watcher(Api::<K>::all(client), watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            match &event {
                Ok(event) => {
                    for cluster in index_event(event, &fleet, &mut listed, &readiness) {
                        // No receiver (not leading) is fine: nothing to reconcile then.
                        let _ = changes.send(cluster);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, kind = %K::kind(&()), "watch error; retrying with backoff");
                }
            }
            futures::future::ready(None)
        })
}

/// Starts the five watches; the returned future drives them and never completes on its own.
/// Every cluster a config, image or role change reaches is sent on `changes` once the index reflects
/// the change, so the controller never reconciles it against the config as it was before.
pub fn start(
    client: Client,
    fleet: Arc<RwLock<Fleet>>,
    readiness: Arc<Readiness>,
    changes: broadcast::Sender<ClusterKey>,
) -> impl std::future::Future<Output = ()> + Send {
    let images = watch_kind::<ValkeyImage>(
        client.clone(),
        fleet.clone(),
        readiness.clone(),
        changes.clone(),
    );
    let configs = watch_kind::<ValkeyConfig>(
        client.clone(),
        fleet.clone(),
        readiness.clone(),
        changes.clone(),
    );
    let roles = watch_kind::<ValkeyRole>(
        client.clone(),
        fleet.clone(),
        readiness.clone(),
        changes.clone(),
    );
    let policies = watch_kind::<ValkeyNamespacePolicy>(
        client.clone(),
        fleet.clone(),
        readiness.clone(),
        changes.clone(),
    );
    let clusters = watch_kind::<ValkeyCluster>(client, fleet, readiness, changes);
    async move {
        let merged = futures::stream::select_all([
            images.boxed(),
            configs.boxed(),
            roles.boxed(),
            policies.boxed(),
            clusters.boxed(),
        ]);
        merged.for_each(|()| async {}).await;
    }
}
