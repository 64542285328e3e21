//! What every reconcile shares, and the per-cluster retry state behind requeue by cause:
//! transient failures back off exponentially, up to a cap, and a success resets the count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kube::Client;

use crate::execute::Timeouts;
use crate::fleet::{ClusterKey, Fleet};
use crate::metrics::Metrics;
use crate::settings::OperatorSettings;

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub fleet: Arc<RwLock<Fleet>>,
    pub settings: OperatorSettings,
    pub timeouts: Timeouts,
    pub recorder: super::events::EventRecorder,
    pub metrics: Arc<Metrics>,
    pub backoff: Backoff,
    /// What each node's users were last written as (see [`super::live::Applied`]).
    pub applied_acl: super::live::Applied,
    /// Which certificate each TLS node last reloaded, and when each Secret version was seen.
    pub applied_tls: super::live::Applied,
    pub certificate_versions: super::live::CertificateVersions,
    /// Which live settings each node was last given.
    pub applied_settings: super::live::Applied,
    /// What each cluster's Service, budget and NetworkPolicy were last applied as.
    pub applied_owned: super::membership::AppliedObjects,
    /// Every cluster's stored status from the cluster watch, and the writes a pass waits to
    /// see there.
    pub cluster_cache: super::cluster_cache::ClusterCache,
    /// Every cluster's ValkeyNodes and Pods, and the writes a pass waits to see there.
    pub node_cache: super::node_cache::NodeCache,
    /// The clusters whose periodic pass asks only their Valkey nodes (see [`super::settled`]).
    pub settled: super::settled::Settled,
    /// The last credentials read per cluster (see [`super::credentials::Known`]).
    pub known_credentials: super::credentials::Known,
    /// The operator's Secrets' versions, from the Secret watch.
    pub secret_versions: super::credentials::SecretVersions,
    /// When each cluster's rolling shards and joining replicas started, for the histograms.
    pub stopwatches: super::stopwatch::Stopwatches,
    /// Since when each node has not answered (see [`super::silence`]).
    pub silence: super::silence::Silence,
    /// Joiners of the new revision lost before they joined (see [`super::lost_joins`]).
    pub lost_joins: super::lost_joins::LostJoins,
    /// Every cluster's standing in its fleet rollout (see [`super::rollouts`]).
    pub rollouts: Arc<super::rollouts::Rollouts>,
    /// Wakes a cluster (the controller reconciles each key sent), e.g. a queued cluster of a
    /// fleet rollout when a place frees.
    pub wake: tokio::sync::broadcast::Sender<crate::fleet::ClusterKey>,
    /// The election's word, checked before acting (see [`super::leader::Leadership`]).
    pub leadership: tokio::sync::watch::Receiver<super::leader::Leadership>,
}

impl Context {
    /// Fails unless this replica's Lease still holds by its own clock.
    pub fn fence(&self) -> Result<(), super::error::Error> {
        if super::leader::holds(&self.leadership.borrow()) {
            Ok(())
        } else {
            Err(super::error::Error::NotLeading)
        }
    }
}

/// Consecutive failures per cluster, and the delays they earn: `first`, doubling, at most `cap`.
#[derive(Debug)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    failures: Mutex<HashMap<ClusterKey, u32>>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(30))
    }
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Self {
        Self {
            first,
            cap,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one more failure of `cluster` and returns how long to wait before the next try.
    pub fn failed(&self, cluster: &ClusterKey) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let count = failures.entry(cluster.clone()).or_insert(0);
        *count = count.saturating_add(1);
        let doublings = (*count - 1).min(16);
        self.first.saturating_mul(1 << doublings).min(self.cap)
    }

    /// `cluster` reconciled cleanly: its next failure starts from `first` again.
    pub fn succeeded(&self, cluster: &ClusterKey) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.remove(cluster);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_exponentially_up_to_the_cap_and_a_success_resets() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let a = ClusterKey::new("ns", "a");
        let b = ClusterKey::new("ns", "b");
        let delays: Vec<u64> = (0..6).map(|_| backoff.failed(&a).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(
            backoff.failed(&b),
            Duration::from_secs(1),
            "each cluster counts alone"
        );
        backoff.succeeded(&a);
        assert_eq!(backoff.failed(&a), Duration::from_secs(1));
    }
}
