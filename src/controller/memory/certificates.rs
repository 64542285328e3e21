//! Each TLS cluster's certificate version as its Secret holds it, and when the operator first saw
//! it: the live step reloads the nodes' certificates for a while after it changes.

use std::time::{Duration, Instant};

use crate::api::ClusterKey;
use crate::controller::memory::{KeptPerCluster, PerCluster};

/// A TLS cluster's certificate as the Secret holds it now, and when the operator first saw
/// that version.
#[derive(Debug, Default)]
pub struct CertificateVersions(PerCluster<(String, Instant)>);

impl CertificateVersions {
    /// Whether `version` was first seen long enough ago that a reload now finds the new files.
    pub fn settled(&self, cluster: &ClusterKey, version: &str) -> bool {
        self.settled_at(cluster, version, Instant::now())
    }

    pub fn settled_at(&self, cluster: &ClusterKey, version: &str, now: Instant) -> bool {
        let mut seen = self.0.lock();
        match seen.get(cluster) {
            Some((known, since)) if known == version => {
                now.saturating_duration_since(*since) > RELOAD_WINDOW
            }
            _ => {
                seen.insert(cluster.clone(), (version.to_owned(), now));
                false
            }
        }
    }
}

impl KeptPerCluster for CertificateVersions {
    type Entry = (String, Instant);

    fn entries(&self) -> &PerCluster<Self::Entry> {
        &self.0
    }

    #[cfg(test)]
    fn sample_entry() -> Self::Entry {
        (String::new(), Instant::now())
    }
}

/// How long after a Secret change its certificate is still reloaded each pass: a kubelet
/// refreshes mounted Secrets within about a minute (its sync period plus cache).
pub const RELOAD_WINDOW: Duration = Duration::from_secs(150);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_reloaded_until_the_window_after_its_first_sighting() {
        let versions = CertificateVersions::default();
        let cluster = ClusterKey::new("a", "orders");
        let start = Instant::now();
        assert!(!versions.settled_at(&cluster, "v1", start));
        assert!(!versions.settled_at(&cluster, "v1", start + RELOAD_WINDOW / 2));
        assert!(versions.settled_at(&cluster, "v1", start + RELOAD_WINDOW * 2));
        // A renewal starts the window again.
        let later = start + RELOAD_WINDOW * 3;
        assert!(!versions.settled_at(&cluster, "v2", later));
        assert!(versions.settled_at(&cluster, "v2", later + RELOAD_WINDOW * 2));
    }
}
