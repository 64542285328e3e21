//! The exponential backoff of each cluster's failing passes.

use std::time::Duration;

use crate::api::ClusterKey;
use crate::controller::memory::{KeptPerCluster, PerCluster};

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
