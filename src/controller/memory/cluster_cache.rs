//! The stored status a pass starts from (the roll memory and the conditions), from the
//! controller's own cluster watch instead of a GET each pass (one a pass was, after the node and
//! Pod lists, the API server's largest share of a fleet roll).
//!
//! The watch may be behind, and a pass must never start from a status older than the one the
//! operator last wrote (it would redo a step the roll memory already records). So the object
//! each of the operator's writes to a cluster returned is kept until the watch delivers its
//! `resourceVersion`: meanwhile a pass starts from that object, the newest the operator knows
//! of, and afterwards from the store. A write that returned no object sends the next read to
//! the API server, and a read the store turns out to match clears it. Any other writer's change
//! is caught by the roll memory's own precondition, as before: its save fails and the pass is
//! tried again.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::api::ClusterKey;
use crate::api::ValkeyCluster;
use crate::controller::memory::ClusterMemory;

#[derive(Default)]
struct Book {
    /// This term's store of the controller's cluster watch.
    store: Option<Store<ValkeyCluster>>,
    /// Each cluster's last write that the store does not show yet.
    pending: HashMap<ClusterKey, Pending>,
}

/// A write the store does not show yet: its version, and the object it returned (`None`: only
/// the API server can say what is stored now).
struct Pending {
    version: String,
    written: Option<Arc<ValkeyCluster>>,
}

/// See the module's doc.
#[derive(Default)]
pub struct ClusterCache(Mutex<Book>);

impl ClusterCache {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new term of leadership, with a new watch and its store.
    pub fn start_term(&self, store: Store<ValkeyCluster>) {
        *self.book() = Book {
            store: Some(store),
            pending: HashMap::new(),
        };
    }

    /// A watch event, seen after the store applied it. Only a live change counts: a re-list
    /// reaches the store only at its end, so its objects say nothing of it before then.
    pub fn delivered(&self, event: &watcher::Event<ValkeyCluster>) {
        let mut book = self.book();
        match event {
            watcher::Event::Apply(cluster) => {
                let key = ClusterKey::of(cluster);
                let shown = cluster.meta().resource_version.as_deref();
                if book.pending.get(&key).map(|p| p.version.as_str()) == shown {
                    book.pending.remove(&key);
                }
            }
            watcher::Event::Delete(cluster) => {
                book.pending.remove(&ClusterKey::of(cluster));
            }
            watcher::Event::InitDone => {
                let Book { store, pending } = &mut *book;
                pending.retain(|key, pending| {
                    stored_version(store.as_ref(), key).as_deref() != Some(pending.version.as_str())
                });
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    /// The operator wrote the cluster; `written` is what the API server returned.
    pub fn wrote(&self, key: &ClusterKey, mut written: ValkeyCluster) {
        written.metadata.managed_fields = None;
        let mut book = self.book();
        let Some(version) = written.metadata.resource_version.clone() else {
            let unknown = Pending {
                version: String::new(),
                written: None,
            };
            book.pending.insert(key.clone(), unknown);
            return;
        };
        if stored_version(book.store.as_ref(), key).as_ref() == Some(&version) {
            book.pending.remove(key);
            return;
        }
        let pending = Pending {
            version,
            written: Some(Arc::new(written)),
        };
        book.pending.insert(key.clone(), pending);
    }

    /// The cluster as the operator last knew it: its own last write while the store does not
    /// show it yet, else the store's. `None`: read it from the API server.
    pub fn current(&self, key: &ClusterKey) -> Option<Arc<ValkeyCluster>> {
        let book = self.book();
        if let Some(pending) = book.pending.get(key) {
            return pending.written.clone();
        }
        let reference = ObjectRef::new(&key.name).within(&key.namespace);
        book.store.as_ref()?.get(&reference)
    }

    /// Whether the cluster is known to be gone: the watch has listed every cluster and its
    /// store does not hold this one (nor a write of the operator's). A late event or a failed
    /// pass of a deleted cluster then leaves nothing in memory for it.
    pub fn gone(&self, key: &ClusterKey) -> bool {
        let book = self.book();
        let Some(store) = book.store.as_ref() else {
            return false;
        };
        let reference = ObjectRef::new(&key.name).within(&key.namespace);
        // A store not yet listed (`wait_until_ready` pending) knows nothing: not gone.
        !store.is_empty() && store.get(&reference).is_none() && !book.pending.contains_key(key)
    }

    /// A pass read the cluster from the API server at `version`: if the store shows the same
    /// version, it has caught up, and nothing is pending.
    pub fn read(&self, key: &ClusterKey, version: Option<&str>) {
        let mut book = self.book();
        if version.is_some() && stored_version(book.store.as_ref(), key).as_deref() == version {
            book.pending.remove(key);
        }
    }
}

fn stored_version(store: Option<&Store<ValkeyCluster>>, key: &ClusterKey) -> Option<String> {
    let reference = ObjectRef::new(&key.name).within(&key.namespace);
    store?.get(&reference)?.meta().resource_version.clone()
}

/// The watch's store is the API server's word, kept current by the watch itself; what is
/// remembered per cluster is the writes a pass waits to see.
impl ClusterMemory for ClusterCache {
    fn forget(&self, cluster: &ClusterKey) {
        self.book().pending.remove(cluster);
    }

    fn reset(&self) {
        self.book().pending.clear();
    }

    fn clusters(&self) -> BTreeSet<ClusterKey> {
        self.book().pending.keys().cloned().collect()
    }

    #[cfg(test)]
    fn sample(&self, cluster: &ClusterKey) {
        let pending = Pending {
            version: "1".to_owned(),
            written: None,
        };
        self.book().pending.insert(cluster.clone(), pending);
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;

    use super::*;
    use crate::api::ValkeyClusterSpec;

    fn cluster(version: &str) -> ValkeyCluster {
        let spec: ValkeyClusterSpec =
            serde_json::from_value(serde_json::json!({"configRef": "standard", "shards": 1}))
                .unwrap();
        let mut cluster = ValkeyCluster::new("orders", spec);
        cluster.metadata.namespace = Some("shop".into());
        cluster.metadata.resource_version = Some(version.into());
        cluster
    }

    fn orders() -> ClusterKey {
        ClusterKey::new("shop", "orders")
    }

    /// A cache over a store that has listed `cluster`, and the store's writer.
    fn listed(version: &str) -> (ClusterCache, reflector::store::Writer<ValkeyCluster>) {
        let (store, mut writer) = reflector::store();
        let cache = ClusterCache::default();
        cache.start_term(store);
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(cluster(version)),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&event);
            cache.delivered(&event);
        }
        (cache, writer)
    }

    fn deliver(
        cache: &ClusterCache,
        writer: &mut reflector::store::Writer<ValkeyCluster>,
        event: watcher::Event<ValkeyCluster>,
    ) {
        writer.apply_watcher_event(&event);
        cache.delivered(&event);
    }

    fn version_read(cache: &ClusterCache) -> Option<String> {
        cache
            .current(&orders())
            .and_then(|c| c.metadata.resource_version.clone())
    }

    #[test]
    fn a_pass_starts_from_the_operators_last_write_until_the_watch_shows_it() {
        let (cache, mut writer) = listed("4");
        assert_eq!(version_read(&cache).as_deref(), Some("4"));
        cache.wrote(&orders(), cluster("7"));
        assert_eq!(
            version_read(&cache).as_deref(),
            Some("7"),
            "the write, not the store"
        );
        deliver(&cache, &mut writer, watcher::Event::Apply(cluster("6")));
        assert_eq!(
            version_read(&cache).as_deref(),
            Some("7"),
            "the store is still behind"
        );
        deliver(&cache, &mut writer, watcher::Event::Apply(cluster("7")));
        deliver(&cache, &mut writer, watcher::Event::Apply(cluster("8")));
        assert_eq!(
            version_read(&cache).as_deref(),
            Some("8"),
            "the store once it showed the write"
        );
    }

    #[test]
    fn a_write_without_a_version_is_read_from_the_api_server_until_the_store_matches() {
        let (cache, _writer) = listed("9");
        let mut unversioned = cluster("9");
        unversioned.metadata.resource_version = None;
        cache.wrote(&orders(), unversioned);
        assert_eq!(version_read(&cache), None, "read from the API server");
        cache.read(&orders(), Some("10"));
        assert_eq!(version_read(&cache), None, "the store is behind the read");
        cache.read(&orders(), Some("9"));
        assert_eq!(version_read(&cache).as_deref(), Some("9"));
    }

    #[test]
    fn a_write_the_store_already_shows_is_read_from_the_store() {
        let (cache, mut writer) = listed("4");
        deliver(&cache, &mut writer, watcher::Event::Apply(cluster("5")));
        cache.wrote(&orders(), cluster("5"));
        deliver(&cache, &mut writer, watcher::Event::Apply(cluster("6")));
        assert_eq!(version_read(&cache).as_deref(), Some("6"));
    }

    #[test]
    fn a_relist_counts_only_once_the_store_has_it() {
        let (cache, mut writer) = listed("4");
        let mut unversioned = cluster("5");
        unversioned.metadata.resource_version = None;
        cache.wrote(&orders(), unversioned);
        deliver(&cache, &mut writer, watcher::Event::Init);
        deliver(&cache, &mut writer, watcher::Event::InitApply(cluster("5")));
        assert_eq!(
            version_read(&cache),
            None,
            "the store swaps at the re-list's end"
        );
        deliver(&cache, &mut writer, watcher::Event::InitDone);
        cache.read(&orders(), Some("5"));
        assert_eq!(version_read(&cache).as_deref(), Some("5"));
    }

    #[test]
    fn nothing_is_read_before_a_term_has_a_store() {
        let cache = ClusterCache::default();
        assert!(cache.current(&orders()).is_none());
    }
}
