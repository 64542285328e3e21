//! What the leader remembers of each cluster between passes, with one owner: every memory is a
//! field of [`Memory`], and a deleted cluster ([`Memory::forget`]) and a new term of leadership
//! ([`Memory::reset`]) reach each of them through one exhaustive list, so a new kind of memory
//! cannot be forgotten in one place and kept in the other. Each memory's type is in its own file
//! here; the pass's steps use them through [`crate::controller::context::Context`].

pub mod applied;
pub mod backoff;
pub mod certificates;
pub mod cluster_cache;
pub mod credentials;
pub mod lost_joins;
pub mod node_cache;
pub mod owned;
pub mod rollouts;
pub mod settled;
pub mod silence;
pub mod stopwatch;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::api::ClusterKey;
use applied::Applied;
use backoff::Backoff;
use certificates::CertificateVersions;
use cluster_cache::ClusterCache;
use credentials::{Known, SecretVersions};
use lost_joins::LostJoins;
use node_cache::NodeCache;
use owned::AppliedObjects;
use rollouts::Rollouts;
use settled::Settled;
use silence::Silence;
use stopwatch::Stopwatches;

/// One kind of memory kept per cluster.
pub trait ClusterMemory: Send + Sync {
    /// The cluster was deleted: nothing of it is kept.
    fn forget(&self, cluster: &ClusterKey);
    /// A new term of leadership: what an earlier term learned may be stale (another replica may
    /// have acted meanwhile), so it is dropped.
    fn reset(&self);
    /// The clusters it keeps anything for.
    fn clusters(&self) -> BTreeSet<ClusterKey>;
    /// Keeps something for `cluster`, as a pass would.
    #[cfg(test)]
    fn sample(&self, cluster: &ClusterKey);
}

/// Everything the leader remembers per cluster (see the module's doc).
#[derive(Default)]
pub struct Memory {
    /// Consecutive failures, for the requeue's backoff.
    pub backoff: Backoff,
    /// What each node's users were last written as (see
    /// [`crate::controller::memory::applied::Applied`]).
    pub applied_acl: Applied,
    /// Which certificate each TLS node last reloaded.
    pub applied_tls: Applied,
    /// Which name each TLS node was last given to announce.
    pub applied_names: Applied,
    /// When each cluster's certificate Secret version was first seen.
    pub certificate_versions: CertificateVersions,
    /// Which live settings each node was last given.
    pub applied_settings: Applied,
    /// What each cluster's Service, budget and NetworkPolicy were last applied as.
    pub applied_owned: AppliedObjects,
    /// Every cluster's stored status from the cluster watch, and the writes a pass waits to
    /// see there.
    pub cluster_cache: ClusterCache,
    /// Every cluster's ValkeyNodes and Pods, and the writes a pass waits to see there.
    pub node_cache: NodeCache,
    /// The clusters whose periodic pass asks only their Valkey nodes (see
    /// [`crate::controller::memory::settled`]).
    pub settled: Settled,
    /// The last credentials read per cluster (see
    /// [`crate::controller::memory::credentials::Known`]).
    pub known_credentials: Known,
    /// The operator's Secrets' versions, from the Secret watch.
    pub secret_versions: SecretVersions,
    /// When each cluster's rolling shards and joining replicas started, for the histograms.
    pub stopwatches: Stopwatches,
    /// Since when each node has not answered (see [`crate::controller::memory::silence`]).
    pub silence: Silence,
    /// Joiners of the new revision lost before they joined (see
    /// [`crate::controller::memory::lost_joins`]).
    pub lost_joins: LostJoins,
    /// Every cluster's standing in its fleet rollout (see [`crate::controller::memory::rollouts`]).
    pub rollouts: Arc<Rollouts>,
}

impl Memory {
    /// Every memory, once.
    pub fn parts(&self) -> [&dyn ClusterMemory; 16] {
        // Destructured without `..` on purpose: a field added to `Memory` does not compile
        // until it is listed here, and so reached by both `forget` and `reset`.
        let Self {
            backoff,
            applied_acl,
            applied_tls,
            applied_names,
            certificate_versions,
            applied_settings,
            applied_owned,
            cluster_cache,
            node_cache,
            settled,
            known_credentials,
            secret_versions,
            stopwatches,
            silence,
            lost_joins,
            rollouts,
        } = self;
        [
            backoff,
            applied_acl,
            applied_tls,
            applied_names,
            certificate_versions,
            applied_settings,
            applied_owned,
            cluster_cache,
            node_cache,
            settled,
            known_credentials,
            secret_versions,
            stopwatches,
            silence,
            lost_joins,
            &**rollouts,
        ]
    }

    /// The cluster was deleted: every memory drops it.
    pub fn forget(&self, cluster: &ClusterKey) {
        for part in self.parts() {
            part.forget(cluster);
        }
    }

    /// The cluster is gone from the API server: [`Self::forget`], and say what is still kept.
    pub fn forget_deleted(&self, cluster: &ClusterKey) {
        self.forget(cluster);
        let remembered = self.clusters().len();
        let per_memory = self.clusters_per_part();
        tracing::info!(%cluster, remembered, ?per_memory, "forgot a deleted cluster");
    }

    /// A new term of leadership begins.
    pub fn reset(&self) {
        for part in self.parts() {
            part.reset();
        }
    }

    /// How many of the memories keep something for `cluster`.
    #[cfg(test)]
    pub fn holding(&self, cluster: &ClusterKey) -> usize {
        let parts = self.parts();
        parts
            .iter()
            .filter(|part| part.clusters().contains(cluster))
            .count()
    }

    /// How many clusters each memory keeps something for, in the order of [`Self::parts`]: what
    /// a "forgot a deleted cluster" log line shows, so a memory that keeps deleted clusters is
    /// named by its place.
    pub fn clusters_per_part(&self) -> Vec<usize> {
        self.parts()
            .iter()
            .map(|part| part.clusters().len())
            .collect()
    }

    /// The clusters any memory keeps something for.
    pub fn clusters(&self) -> BTreeSet<ClusterKey> {
        self.parts()
            .iter()
            .flat_map(|part| part.clusters())
            .collect()
    }
}

/// A memory kept as one entry per cluster: the shape most of them have.
#[derive(Debug)]
pub struct PerCluster<T>(Mutex<HashMap<ClusterKey, T>>);

impl<T> Default for PerCluster<T> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<T> PerCluster<T> {
    /// The entries. A pass that panicked while holding them left them as they were: each entry
    /// is only a memory, never half of an invariant, so they are used as found.
    pub fn lock(&self) -> MutexGuard<'_, HashMap<ClusterKey, T>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn forget(&self, cluster: &ClusterKey) {
        self.lock().remove(cluster);
    }

    pub fn reset(&self) {
        self.lock().clear();
    }

    pub fn clusters(&self) -> BTreeSet<ClusterKey> {
        self.lock().keys().cloned().collect()
    }
}

/// A memory kept as one [`PerCluster`] map: it forgets, resets and lists clusters through that
/// map (one implementation for all of them).
pub(in crate::controller) trait KeptPerCluster: Send + Sync {
    type Entry: Send;
    fn entries(&self) -> &PerCluster<Self::Entry>;
    /// An entry as a pass would keep one.
    #[cfg(test)]
    fn sample_entry() -> Self::Entry;
}

impl<M: KeptPerCluster> ClusterMemory for M {
    fn forget(&self, cluster: &ClusterKey) {
        self.entries().forget(cluster);
    }

    fn reset(&self) {
        self.entries().reset();
    }

    fn clusters(&self) -> BTreeSet<ClusterKey> {
        self.entries().clusters()
    }

    #[cfg(test)]
    fn sample(&self, cluster: &ClusterKey) {
        self.entries()
            .lock()
            .insert(cluster.clone(), M::sample_entry());
    }
}

/// How long a write is trusted: after this a node is written again, so a node changed by hand
/// is repaired and the memory never vouches for long for what it did not see.
pub const REFRESH: Duration = Duration::from_secs(600);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_cluster_leaves_nothing_behind_and_a_new_term_starts_empty() {
        let memory = Memory::default();
        let (gone, kept) = (ClusterKey::new("ns", "gone"), ClusterKey::new("ns", "kept"));
        for part in memory.parts() {
            part.sample(&gone);
            part.sample(&kept);
        }
        let every = memory.parts().len();
        assert_eq!(memory.holding(&gone), every, "each memory keeps its sample");
        memory.forget(&gone);
        assert_eq!(
            memory.holding(&gone),
            0,
            "a deleted cluster is forgotten by every memory"
        );
        assert_eq!(memory.holding(&kept), every, "and only that cluster");
        memory.reset();
        assert_eq!(
            memory.holding(&kept),
            0,
            "a new term remembers nothing of the last"
        );
    }
}
