//! Every cluster's ValkeyNodes and Pods as the controller's watches last showed them, so a pass
//! reads them from memory instead of listing them (two LISTs a pass were the largest share of
//! the API server's time in a fleet roll).
//!
//! A cache may be behind the API server, and a pass must never act on a view that lacks its
//! own last writes (a node it created and does not see, it would create again). So the
//! operator's every write to a node or Pod is an expectation: the version the write returned,
//! or the object's being gone. A cluster is read from the cache only once the watches have
//! delivered every expectation of it; until then a pass lists, as before. A list the cache
//! turns out to match clears the cluster's expectations (the watch caught up in a way no single
//! event showed, e.g. through a re-list).
//!
//! Until both watches have listed once (a new term of leadership), every pass lists.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::api::ClusterKey;
use crate::api::{ValkeyNode, labels};
use crate::controller::memory::ClusterMemory;
use crate::controller::view::{ClusterNodes, PodView};

/// Which of the two kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Node,
    Pod,
}

/// What the cache must show of an object the operator wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Sight {
    /// The object at the `resourceVersion` the write returned.
    Version(String),
    Gone,
    /// A write that returned no version: only a list can say what is there now.
    Unknown,
}

/// What the index keeps of an object: it is asked only for its version.
trait Versioned {
    fn version(&self) -> Option<&str>;
}

impl Versioned for ValkeyNode {
    fn version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }
}

impl Versioned for PodView {
    fn version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
}

/// One kind's objects by cluster (as what the cache keeps of each), with what a re-list in
/// progress has listed again.
#[derive(Debug)]
struct Index<K> {
    by_cluster: HashMap<ClusterKey, BTreeMap<String, Arc<K>>>,
    relisted: HashSet<(ClusterKey, String)>,
    /// A first list has completed.
    synced: bool,
}

impl<K> Default for Index<K> {
    fn default() -> Self {
        Self {
            by_cluster: HashMap::new(),
            relisted: HashSet::new(),
            synced: false,
        }
    }
}

/// The cluster an object belongs to: its namespace and cluster label, as the lists select.
fn cluster_of<K: Resource>(object: &K) -> Option<ClusterKey> {
    let cluster = object.meta().labels.as_ref()?.get(labels::CLUSTER)?;
    Some(ClusterKey::new(
        object.meta().namespace.clone()?,
        cluster.clone(),
    ))
}

impl<K: Versioned> Index<K> {
    pub fn version(&self, cluster: &ClusterKey, name: &str) -> Option<&str> {
        self.by_cluster.get(cluster)?.get(name)?.version()
    }

    pub fn upsert(&mut self, key: ClusterKey, name: String, object: K) {
        let objects = self.by_cluster.entry(key).or_default();
        objects.insert(name, Arc::new(object));
    }

    pub fn remove(&mut self, key: &ClusterKey, name: &str) {
        if let Some(objects) = self.by_cluster.get_mut(key) {
            objects.remove(name);
            if objects.is_empty() {
                self.by_cluster.remove(key);
            }
        }
    }

    /// Names and versions of a cluster's objects, to compare with a list.
    pub fn versions(&self, cluster: &ClusterKey) -> BTreeMap<String, Option<String>> {
        let objects = self.by_cluster.get(cluster).into_iter().flatten();
        objects
            .map(|(name, o)| (name.clone(), o.version().map(String::from)))
            .collect()
    }
}

/// The two indexes and the expectations, under one lock so that an event and a write recorded
/// at the same time cannot miss each other.
#[derive(Debug, Default)]
struct Book {
    nodes: Index<ValkeyNode>,
    pods: Index<PodView>,
    expected: Expected,
}

impl Book {
    pub fn seen(&self, cluster: &ClusterKey, kind: Kind, name: &str) -> Option<&str> {
        match kind {
            Kind::Node => self.nodes.version(cluster, name),
            Kind::Pod => self.pods.version(cluster, name),
        }
    }

    /// Whether the cache already shows `sight` of the object.
    pub fn shows(&self, cluster: &ClusterKey, kind: Kind, name: &str, sight: &Sight) -> bool {
        let seen = self.seen(cluster, kind, name);
        match sight {
            Sight::Version(version) => seen == Some(version.as_str()),
            Sight::Gone => seen.is_none(),
            Sight::Unknown => false,
        }
    }

    pub fn expect(&mut self, cluster: &ClusterKey, kind: Kind, name: &str, sight: Sight) {
        let key = (kind, name.to_owned());
        if self.shows(cluster, kind, name, &sight) {
            if let Some(pending) = self.expected.get_mut(cluster) {
                pending.remove(&key);
                if pending.is_empty() {
                    self.expected.remove(cluster);
                }
            }
            return;
        }
        self.expected
            .entry(cluster.clone())
            .or_default()
            .insert(key, sight);
    }
}

type Expected = HashMap<ClusterKey, HashMap<(Kind, String), Sight>>;

/// An event showed the object at `version` (`None`: deleted): the expectation it meets goes.
fn delivered(
    expected: &mut Expected,
    cluster: &ClusterKey,
    kind: Kind,
    name: &str,
    version: Option<&str>,
) {
    let Some(pending) = expected.get_mut(cluster) else {
        return;
    };
    let key = (kind, name.to_owned());
    let met = match (pending.get(&key), version) {
        (Some(Sight::Version(wanted)), Some(version)) => wanted == version,
        // Gone meets every expectation of it: there is nothing newer to wait for.
        (Some(_), None) => true,
        _ => false,
    };
    if met {
        pending.remove(&key);
        if pending.is_empty() {
            expected.remove(cluster);
        }
    }
}

/// The cache (see the module's doc).
#[derive(Debug, Default)]
pub struct NodeCache(Mutex<Book>);

/// What the cache keeps of a ValkeyNode: all but its managed fields.
fn slim_node(node: &mut ValkeyNode) {
    node.metadata.managed_fields = None;
}

impl NodeCache {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a ValkeyNode watch event.
    pub fn node_event(&self, event: &watcher::Event<ValkeyNode>) {
        let mut book = self.book();
        let Book {
            nodes, expected, ..
        } = &mut *book;
        let view = |node: &ValkeyNode| {
            let mut node = node.clone();
            slim_node(&mut node);
            node
        };
        apply(nodes, event, view, |cluster, name, version| {
            delivered(expected, cluster, Kind::Node, name, version)
        });
    }

    /// Applies a Pod watch event.
    pub fn pod_event(&self, event: &watcher::Event<Pod>) {
        let mut book = self.book();
        let Book { pods, expected, .. } = &mut *book;
        apply(
            pods,
            event,
            |pod: &Pod| PodView::from(pod),
            |cluster, name, version| delivered(expected, cluster, Kind::Pod, name, version),
        );
    }

    /// The cluster's nodes and Pods, if the cache may be read for it now.
    pub fn fresh(&self, cluster: &ClusterKey) -> Option<ClusterNodes> {
        let book = self.book();
        if !book.nodes.synced || !book.pods.synced || book.expected.contains_key(cluster) {
            return None;
        }
        let nodes = book.nodes.by_cluster.get(cluster).into_iter().flatten();
        let pods = book.pods.by_cluster.get(cluster).into_iter().flatten();
        Some(ClusterNodes {
            objects: nodes.map(|(_, node)| (**node).clone()).collect(),
            pods: pods
                .map(|(name, pod)| (name.clone(), (**pod).clone()))
                .collect(),
        })
    }

    /// A pass listed the cluster: if the cache shows exactly what the list did, it has caught
    /// up with every write before the list, and the cluster's expectations are met.
    pub fn listed(&self, cluster: &ClusterKey, listed: &ClusterNodes) {
        let nodes: BTreeMap<String, Option<String>> = (listed.objects.iter())
            .map(|node| (node.name_any(), node.metadata.resource_version.clone()))
            .collect();
        let pods: BTreeMap<String, Option<String>> = (listed.pods.iter())
            .map(|(name, pod)| (name.clone(), pod.resource_version.clone()))
            .collect();
        let mut book = self.book();
        if book.nodes.versions(cluster) == nodes && book.pods.versions(cluster) == pods {
            book.expected.remove(cluster);
        }
    }

    /// Where a pass records its writes to `cluster`'s nodes and Pods.
    pub fn writes(&self, cluster: ClusterKey) -> Writes<'_> {
        Writes {
            cache: self,
            cluster,
        }
    }
}

/// One cluster's writes, as the cache's expectations: each takes what the API server returned.
pub struct Writes<'a> {
    cache: &'a NodeCache,
    cluster: ClusterKey,
}

impl Writes<'_> {
    /// A ValkeyNode created or changed.
    pub fn node(&self, node: &ValkeyNode) {
        self.wrote(Kind::Node, node);
    }

    /// A Pod created or changed.
    pub fn pod(&self, pod: &Pod) {
        self.wrote(Kind::Pod, pod);
    }

    pub fn wrote<K: Resource>(&self, kind: Kind, object: &K) {
        let name = object.name_any();
        let sight = match &object.meta().resource_version {
            Some(version) => Sight::Version(version.clone()),
            None => Sight::Unknown,
        };
        self.cache.book().expect(&self.cluster, kind, &name, sight);
    }

    /// A delete of `name`: `marked` is the object when it was only marked for deletion (a
    /// grace period or a finalizer keeps it), `None` when it is gone.
    pub fn deleted<K: Resource>(&self, kind: Kind, name: &str, marked: Option<&K>) {
        match marked {
            Some(object) => self.wrote(kind, object),
            None => self
                .cache
                .book()
                .expect(&self.cluster, kind, name, Sight::Gone),
        }
    }
}

/// Applies one watch event to `index`, telling `delivered` what it showed. A re-list
/// (`Init`, `InitApply`…, `InitDone`) upserts as it goes and then drops what it no longer
/// listed, so the index never empties in between.
fn apply<K: Resource, V: Versioned>(
    index: &mut Index<V>,
    event: &watcher::Event<K>,
    view: impl Fn(&K) -> V,
    mut delivered: impl FnMut(&ClusterKey, &str, Option<&str>),
) {
    match event {
        watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
            let Some(key) = cluster_of(object) else {
                return;
            };
            let version = object.meta().resource_version.clone();
            let name = object.name_any();
            index.upsert(key.clone(), name.clone(), view(object));
            delivered(&key, &name, version.as_deref());
            if matches!(event, watcher::Event::InitApply(_)) {
                index.relisted.insert((key, name));
            }
        }
        watcher::Event::Delete(object) => {
            let Some(key) = cluster_of(object) else {
                return;
            };
            let name = object.name_any();
            index.remove(&key, &name);
            delivered(&key, &name, None);
        }
        watcher::Event::Init => index.relisted.clear(),
        watcher::Event::InitDone => {
            let relisted = std::mem::take(&mut index.relisted);
            let mut gone = Vec::new();
            for (key, objects) in &index.by_cluster {
                for name in objects.keys() {
                    if !relisted.contains(&(key.clone(), name.clone())) {
                        gone.push((key.clone(), name.clone()));
                    }
                }
            }
            for (key, name) in gone {
                index.remove(&key, &name);
                delivered(&key, &name, None);
            }
            index.synced = true;
        }
    }
}

impl ClusterMemory for NodeCache {
    /// The cluster's objects go with their deletion events too; a deleted cluster's writes
    /// waited for, and anything an event may have put back since, go now.
    fn forget(&self, cluster: &ClusterKey) {
        let mut book = self.book();
        book.nodes.by_cluster.remove(cluster);
        book.pods.by_cluster.remove(cluster);
        book.expected.remove(cluster);
    }

    /// A new term of leadership: nothing is known until the new watches have listed.
    fn reset(&self) {
        *self.book() = Book::default();
    }

    fn clusters(&self) -> BTreeSet<ClusterKey> {
        let book = self.book();
        let nodes = book.nodes.by_cluster.keys();
        let pods = book.pods.by_cluster.keys();
        nodes
            .chain(pods)
            .chain(book.expected.keys())
            .cloned()
            .collect()
    }

    #[cfg(test)]
    fn sample(&self, cluster: &ClusterKey) {
        let mut book = self.book();
        book.expect(cluster, Kind::Node, "node", Sight::Unknown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ValkeyNodeSpec;

    fn node(name: &str, version: &str) -> ValkeyNode {
        let spec = ValkeyNodeSpec {
            cluster: "orders".into(),
            shard: 0,
            image: "valkey/valkey:9.0.0".into(),
            version: "9.0.0".into(),
            revision: "r1".into(),
        };
        let mut node = ValkeyNode::new(name, spec);
        node.metadata.namespace = Some("shop".into());
        node.metadata.resource_version = Some(version.into());
        node.labels_mut()
            .insert(labels::CLUSTER.into(), "orders".into());
        node
    }

    fn pod(name: &str, version: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("shop".into());
        pod.metadata.resource_version = Some(version.into());
        pod.labels_mut()
            .insert(labels::CLUSTER.into(), "orders".into());
        pod
    }

    fn orders() -> ClusterKey {
        ClusterKey::new("shop", "orders")
    }

    /// A cache whose two watches have listed `nodes` and `pods`.
    fn listed(nodes: &[ValkeyNode], pods: &[Pod]) -> NodeCache {
        let cache = NodeCache::default();
        cache.node_event(&watcher::Event::Init);
        for n in nodes {
            cache.node_event(&watcher::Event::InitApply(n.clone()));
        }
        cache.node_event(&watcher::Event::InitDone);
        cache.pod_event(&watcher::Event::Init);
        for p in pods {
            cache.pod_event(&watcher::Event::InitApply(p.clone()));
        }
        cache.pod_event(&watcher::Event::InitDone);
        cache
    }

    fn names(nodes: &ClusterNodes) -> Vec<String> {
        nodes.objects.iter().map(|n| n.name_any()).collect()
    }

    #[test]
    fn nothing_is_read_from_the_cache_before_both_watches_listed() {
        let cache = NodeCache::default();
        cache.node_event(&watcher::Event::Init);
        cache.node_event(&watcher::Event::InitApply(node("orders-0-a", "1")));
        cache.node_event(&watcher::Event::InitDone);
        assert!(cache.fresh(&orders()).is_none(), "the Pods have not listed");
        cache.pod_event(&watcher::Event::Init);
        cache.pod_event(&watcher::Event::InitDone);
        let read = cache.fresh(&orders()).unwrap();
        assert_eq!(names(&read), ["orders-0-a"]);
        assert!(
            cache
                .fresh(&ClusterKey::new("shop", "carts"))
                .unwrap()
                .objects
                .is_empty(),
            "a cluster without nodes reads as none"
        );
    }

    #[test]
    fn a_created_node_is_read_from_the_cache_only_once_the_watch_shows_it() {
        let cache = listed(&[node("orders-0-a", "1")], &[]);
        let writes = cache.writes(orders());
        writes.node(&node("orders-0-b", "5"));
        assert!(cache.fresh(&orders()).is_none(), "not yet seen: list");
        cache.node_event(&watcher::Event::Apply(node("orders-0-b", "5")));
        assert_eq!(
            names(&cache.fresh(&orders()).unwrap()),
            ["orders-0-a", "orders-0-b"]
        );

        writes.node(&node("orders-0-b", "6"));
        cache.node_event(&watcher::Event::Apply(node("orders-0-a", "7")));
        assert!(
            cache.fresh(&orders()).is_none(),
            "another node's event meets nothing"
        );
        cache.node_event(&watcher::Event::Apply(node("orders-0-b", "6")));
        assert!(cache.fresh(&orders()).is_some());
    }

    #[test]
    fn a_write_whose_event_came_first_is_met_at_once() {
        let cache = listed(&[], &[]);
        cache.pod_event(&watcher::Event::Apply(pod("orders-0-a", "3")));
        cache.writes(orders()).pod(&pod("orders-0-a", "3"));
        assert!(cache.fresh(&orders()).is_some());
    }

    #[test]
    fn a_deletion_waits_for_the_object_to_go() {
        let cache = listed(&[node("orders-0-a", "1")], &[pod("orders-0-a", "2")]);
        let writes = cache.writes(orders());
        let mut terminating = pod("orders-0-a", "8");
        terminating.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        writes.deleted(Kind::Pod, "orders-0-a", Some(&terminating));
        writes.deleted::<ValkeyNode>(Kind::Node, "orders-0-a", None);
        assert!(cache.fresh(&orders()).is_none());
        cache.pod_event(&watcher::Event::Apply(terminating.clone()));
        assert!(cache.fresh(&orders()).is_none(), "the node is still shown");
        cache.node_event(&watcher::Event::Delete(node("orders-0-a", "9")));
        let read = cache.fresh(&orders()).unwrap();
        assert!(read.objects.is_empty());
        assert!(read.pods["orders-0-a"].deleting);
    }

    #[test]
    fn a_list_the_cache_matches_meets_what_no_event_could() {
        let cache = listed(&[node("orders-0-a", "4")], &[]);
        // Someone wrote after the operator, and a re-list showed only the later version.
        cache.writes(orders()).node(&node("orders-0-a", "3"));
        assert!(cache.fresh(&orders()).is_none());
        let stale = ClusterNodes {
            objects: vec![node("orders-0-a", "5")],
            pods: BTreeMap::new(),
        };
        cache.listed(&orders(), &stale);
        assert!(
            cache.fresh(&orders()).is_none(),
            "the cache is behind the list"
        );
        let same = ClusterNodes {
            objects: vec![node("orders-0-a", "4")],
            pods: BTreeMap::new(),
        };
        cache.listed(&orders(), &same);
        assert!(cache.fresh(&orders()).is_some());
    }

    #[test]
    fn a_relist_drops_what_went_while_the_watch_was_down() {
        let cache = listed(&[node("orders-0-a", "1"), node("orders-0-b", "2")], &[]);
        cache.node_event(&watcher::Event::Init);
        cache.node_event(&watcher::Event::InitApply(node("orders-0-a", "1")));
        assert_eq!(
            names(&cache.fresh(&orders()).unwrap()),
            ["orders-0-a", "orders-0-b"],
            "nothing is dropped while the re-list is under way"
        );
        cache.node_event(&watcher::Event::InitDone);
        assert_eq!(names(&cache.fresh(&orders()).unwrap()), ["orders-0-a"]);
    }

    #[test]
    fn a_cached_pod_keeps_what_a_pass_reads_and_no_more() {
        use k8s_openapi::api::core::v1::{PodSpec, PodStatus, SecretVolumeSource, Volume};
        let mut full = pod("orders-0-a", "1");
        full.labels_mut()
            .insert(labels::ROLE.into(), "primary".into());
        full.spec = Some(PodSpec {
            containers: vec![Default::default()],
            volumes: Some(vec![
                Volume {
                    name: "auth".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some("orders-credentials".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "data".into(),
                    empty_dir: Some(Default::default()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        });
        full.status = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("127.1.0.9".into()),
            host_ip: Some("127.0.0.1".into()),
            ..Default::default()
        });
        let view = PodView::from(&full);
        assert_eq!(
            view.secrets,
            ["orders-credentials"],
            "only the Secrets it mounts"
        );
        assert_eq!(view.ip.as_deref(), Some("127.1.0.9"));
        assert_eq!(view.phase.as_deref(), Some("Running"));
        assert_eq!(
            view.labels.get(labels::ROLE).map(String::as_str),
            Some("primary")
        );
        assert_eq!(view.resource_version.as_deref(), Some("1"));
        assert!(!view.deleting);
    }
}
