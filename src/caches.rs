//! The in-memory caches that admission and the controller read: kube reflectors over
//! ValkeyImage, ValkeyConfig, ValkeyRole and ValkeyCluster, whose watch events also keep the
//! [`Fleet`] index current. An admission answer never lists the API server.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use crate::api::{ValkeyCluster, ValkeyConfig, ValkeyImage, ValkeyRole};
use crate::fleet::{ClusterKey, Fleet};
use crate::resolve::Catalog;

/// Which caches have completed their first list.
#[derive(Debug, Default)]
pub struct Readiness {
    images: AtomicBool,
    configs: AtomicBool,
    roles: AtomicBool,
    clusters: AtomicBool,
}

impl Readiness {
    /// A readiness already satisfied, for servers that are handed a prepared fleet.
    pub fn synced() -> Self {
        Self {
            images: AtomicBool::new(true),
            configs: AtomicBool::new(true),
            roles: AtomicBool::new(true),
            clusters: AtomicBool::new(true),
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
        ]
        .into_iter()
        .filter(|(flag, _)| !flag.load(Ordering::Acquire))
        .map(|(_, name)| name)
        .collect()
    }
}

/// The reflector stores, for readers that want whole objects (the controller).
#[derive(Clone)]
pub struct Stores {
    pub images: Store<ValkeyImage>,
    pub configs: Store<ValkeyConfig>,
    pub roles: Store<ValkeyRole>,
    pub clusters: Store<ValkeyCluster>,
}

/// How one kind's watch events update the fleet index.
trait Indexed:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
    fn apply(&self, fleet: &mut Fleet);
    fn remove(&self, fleet: &mut Fleet);
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
    fn remove(&self, fleet: &mut Fleet) {
        fleet.remove_image(&self.name_any());
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

/// A person paused the config's rollouts ([`crate::rollout::PAUSE_ANNOTATION`]).
fn paused(config: &ValkeyConfig) -> bool {
    config
        .annotations()
        .get(crate::rollout::PAUSE_ANNOTATION)
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
    fn remove(&self, fleet: &mut Fleet) {
        fleet.remove_config(&self.name_any());
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
    fn remove(&self, fleet: &mut Fleet) {
        fleet.remove_role(&self.name_any());
    }
    fn flag(readiness: &Readiness) -> &AtomicBool {
        &readiness.roles
    }
    /// Clusters whose ACL users hold the role: their users are set again, live.
    fn reaches(&self, fleet: &Fleet) -> Vec<ClusterKey> {
        fleet
            .clusters_using_role(&self.name_any())
            .cloned()
            .collect()
    }
}

fn cluster_key(cluster: &ValkeyCluster) -> ClusterKey {
    ClusterKey::new(cluster.namespace().unwrap_or_default(), cluster.name_any())
}

impl Indexed for ValkeyCluster {
    fn apply(&self, fleet: &mut Fleet) {
        let key = cluster_key(self);
        fleet.upsert_cluster(key.clone(), &self.spec.config_ref);
        let wave = self.annotations().get(crate::rollout::WAVE_ANNOTATION);
        fleet.set_cluster_wave(
            &key,
            crate::rollout::Wave::from_annotation(wave.map(String::as_str)),
        );
        let roles: BTreeSet<String> = self
            .spec
            .acl
            .iter()
            .flat_map(|user| &user.permissions)
            .map(|permission| permission.role_ref.clone())
            .collect();
        fleet.set_cluster_roles(&key, roles);
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
    fn remove(&self, fleet: &mut Fleet) {
        fleet.remove_cluster(&cluster_key(self));
    }
    fn flag(readiness: &Readiness) -> &AtomicBool {
        &readiness.clusters
    }
    /// The controller watches clusters itself.
    fn reaches(&self, _: &Fleet) -> Vec<ClusterKey> {
        Vec::new()
    }
}

/// Applies one watch event to the index. A re-list (`Init`, `InitApply`…, `InitDone`) upserts
/// what it lists as it comes, then drops what the store held but the list no longer has: the
/// index never empties in between, so admission keeps answering during a re-list.
/// Returns the clusters a change (not a re-list) reaches, once the index reflects it.
fn index_event<K: Indexed>(
    event: &watcher::Event<K>,
    fleet: &RwLock<Fleet>,
    store: &Store<K>,
    relisted: &mut HashSet<ObjectRef<K>>,
    readiness: &Readiness,
) -> Vec<ClusterKey> {
    let mut fleet = fleet
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match event {
        watcher::Event::Init => relisted.clear(),
        watcher::Event::InitApply(object) => {
            relisted.insert(ObjectRef::from(object));
            object.apply(&mut fleet);
        }
        watcher::Event::Apply(object) => {
            let changes = object.changes(&fleet);
            object.apply(&mut fleet);
            if changes {
                return object.reaches(&fleet);
            }
        }
        watcher::Event::Delete(object) => {
            object.remove(&mut fleet);
            return object.reaches(&fleet);
        }
        watcher::Event::InitDone => {
            for gone in store
                .state()
                .iter()
                .filter(|o| !relisted.contains(&ObjectRef::from(o.as_ref())))
            {
                gone.remove(&mut fleet);
            }
            relisted.clear();
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
) -> (Store<K>, impl Stream<Item = ()> + Send) {
    let (store, writer) = reflector::store();
    let reader = store.clone();
    let mut relisted = HashSet::new();
    let stream = watcher(Api::<K>::all(client), watcher::Config::default())
        .default_backoff()
        .map(move |event| {
            // Index before the reflector applies the event, so `InitDone` still sees the old state.
            if let Ok(event) = &event {
                for cluster in index_event(event, &fleet, &reader, &mut relisted, &readiness) {
                    // No receiver (not leading) is fine: nothing to reconcile then.
                    let _ = changes.send(cluster);
                }
            }
            event
        })
        .reflect(writer)
        .filter_map(|event| async move {
            if let Err(error) = event {
                tracing::warn!(%error, kind = %K::kind(&()), "watch error; retrying with backoff");
            }
            None
        });
    (store, stream)
}

/// Starts the four watches; the returned future drives them and never completes on its own.
/// Every cluster a config, image or role change reaches is sent on `changes` once the index reflects
/// the change, so the controller never reconciles it against the config as it was before.
pub fn start(
    client: Client,
    fleet: Arc<RwLock<Fleet>>,
    readiness: Arc<Readiness>,
    changes: broadcast::Sender<ClusterKey>,
) -> (Stores, impl std::future::Future<Output = ()> + Send) {
    let (images, image_events) = watch_kind::<ValkeyImage>(
        client.clone(),
        fleet.clone(),
        readiness.clone(),
        changes.clone(),
    );
    let (configs, config_events) = watch_kind::<ValkeyConfig>(
        client.clone(),
        fleet.clone(),
        readiness.clone(),
        changes.clone(),
    );
    let (roles, role_events) = watch_kind::<ValkeyRole>(
        client.clone(),
        fleet.clone(),
        readiness.clone(),
        changes.clone(),
    );
    let (clusters, cluster_events) = watch_kind::<ValkeyCluster>(client, fleet, readiness, changes);
    let driver = async move {
        let merged = futures::stream::select_all([
            image_events.boxed(),
            config_events.boxed(),
            role_events.boxed(),
            cluster_events.boxed(),
        ]);
        merged.for_each(|()| async {}).await;
    };
    (
        Stores {
            images,
            configs,
            roles,
            clusters,
        },
        driver,
    )
}
