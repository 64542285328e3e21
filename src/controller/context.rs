//! What every reconcile shares, and the per-cluster retry state behind requeue by cause:
//! transient failures back off exponentially, up to a cap, and a success resets the count.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::Client;

use super::memory::{KeptPerCluster, PerCluster};
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
    /// Everything the leader remembers per cluster (see [`super::memory`]).
    pub memory: super::memory::Memory,
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
    failures: PerCluster<u32>,
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
            failures: PerCluster::default(),
        }
    }

    /// Counts one more failure of `cluster` and returns how long to wait before the next try.
    pub fn failed(&self, cluster: &ClusterKey) -> Duration {
        let mut failures = self.failures.lock();
        let count = failures.entry(cluster.clone()).or_insert(0);
        *count = count.saturating_add(1);
        let doublings = (*count - 1).min(16);
        self.first.saturating_mul(1 << doublings).min(self.cap)
    }

    /// `cluster` reconciled cleanly: its next failure starts from `first` again.
    pub fn succeeded(&self, cluster: &ClusterKey) {
        self.failures.forget(cluster);
    }
}

impl KeptPerCluster for Backoff {
    type Entry = u32;

    fn entries(&self) -> &PerCluster<Self::Entry> {
        &self.failures
    }

    #[cfg(test)]
    fn sample_entry() -> Self::Entry {
        1
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
