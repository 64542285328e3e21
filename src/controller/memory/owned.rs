//! The objects a cluster owns besides its nodes (Service, budget, NetworkPolicy) as last
//! applied, so an unchanged one is not applied again each pass.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

use crate::api::ClusterKey;
use crate::controller::memory::REFRESH;
use crate::controller::memory::{KeptPerCluster, PerCluster};

/// The objects a cluster owns besides its nodes, each applied on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owned {
    Service,
    Budget,
    Policy,
}

/// What each of a cluster's owned objects was last applied as (a digest of the rendered
/// object), when, and the uid of the object the API server applied it to. Cleared at each term
/// of leadership, like every memory of writes.
#[derive(Debug, Default)]
pub struct AppliedObjects(PerCluster<HashMap<Owned, Applied>>);

#[derive(Clone, Debug)]
pub(in crate::controller) struct Applied {
    digest: u64,
    at: Instant,
    uid: Option<String>,
}

impl AppliedObjects {
    pub fn standing(&self, cluster: &ClusterKey, object: Owned, digest: Option<u64>) -> Standing {
        self.standing_at(cluster, object, digest, Instant::now())
    }

    pub fn standing_at(
        &self,
        cluster: &ClusterKey,
        object: Owned,
        digest: Option<u64>,
        now: Instant,
    ) -> Standing {
        let applied = self.0.lock();
        let Some(record) = applied
            .get(cluster)
            .and_then(|objects| objects.get(&object))
        else {
            return Standing::Unknown;
        };
        let fresh = now.saturating_duration_since(record.at) < REFRESH;
        match &record.uid {
            _ if fresh && digest == Some(record.digest) => Standing::Current,
            Some(uid) if fresh => Standing::Ours(uid.clone()),
            _ => Standing::Unknown,
        }
    }

    pub fn record(&self, cluster: &ClusterKey, object: Owned, digest: u64, uid: Option<String>) {
        let mut applied = self.0.lock();
        let objects = applied.entry(cluster.clone()).or_default();
        let at = Instant::now();
        objects.insert(object, Applied { digest, at, uid });
    }

    pub fn forget_object(&self, cluster: &ClusterKey, object: Owned) {
        let mut applied = self.0.lock();
        if let Some(objects) = applied.get_mut(cluster) {
            objects.remove(&object);
        }
    }
}

impl KeptPerCluster for AppliedObjects {
    type Entry = HashMap<Owned, Applied>;

    fn entries(&self) -> &PerCluster<Self::Entry> {
        &self.0
    }

    #[cfg(test)]
    fn sample_entry() -> Self::Entry {
        HashMap::new()
    }
}

/// Whether an owned object needs sending, and how.
#[derive(Debug, PartialEq, Eq)]
pub enum Standing {
    /// Applied as it renders now, less than [`REFRESH`] ago.
    Current,
    /// Applied this term to the object with this uid, which no deletion has been seen of: it
    /// can be applied over again with the uid as precondition, without reading it first.
    Ours(String),
    /// Nothing known: read it first, create it or apply over it only if it is the cluster's.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::memory::ClusterMemory;

    #[test]
    fn owned_objects_are_applied_again_only_when_changed_forgotten_or_old() {
        let applied = AppliedObjects::default();
        let orders = ClusterKey::new("shop", "orders");
        let now = Instant::now();
        let budget = Owned::Budget;
        let standing = |object, digest, at| applied.standing_at(&orders, object, Some(digest), at);
        assert_eq!(standing(budget, 7, now), Standing::Unknown, "never applied");
        applied.record(&orders, budget, 7, Some("uid-b".into()));
        applied.record(&orders, Owned::Service, 1, Some("uid-s".into()));
        assert_eq!(standing(budget, 7, now), Standing::Current);
        assert_eq!(
            standing(budget, 8, now),
            Standing::Ours("uid-b".into()),
            "renders differently: applied over the same object, unread"
        );
        assert_eq!(
            standing(Owned::Service, 1, now),
            Standing::Current,
            "a resized budget leaves the Service alone"
        );
        assert_eq!(
            standing(Owned::Policy, 7, now),
            Standing::Unknown,
            "each object has its own record"
        );
        assert_eq!(
            standing(budget, 7, Instant::now() + REFRESH),
            Standing::Unknown,
            "trusted for REFRESH only, then read again"
        );
        applied.forget_object(&orders, budget);
        assert_eq!(
            standing(budget, 7, now),
            Standing::Unknown,
            "its uid no longer matched"
        );
        assert_eq!(standing(Owned::Service, 1, now), Standing::Current);
        applied.forget(&orders);
        assert_eq!(
            standing(Owned::Service, 1, now),
            Standing::Unknown,
            "one was deleted"
        );
        applied.record(&orders, budget, 7, None);
        assert_eq!(
            standing(budget, 8, now),
            Standing::Unknown,
            "no uid known: read first"
        );
        applied.reset();
        assert_eq!(
            standing(budget, 7, now),
            Standing::Unknown,
            "a new term trusts nothing"
        );
    }
}
