//! Settled clusters: what lets a converged cluster's periodic pass cost the API server nothing.
//!
//! A full pass that finds its cluster converged with nothing left to do (every node given its
//! users, no credentials rotation, no certificate reload in progress) settles it: the members
//! it worked with, how it reached them, and a fingerprint of what they said. The periodic
//! requeue of a settled cluster then only asks its Valkey nodes (a health check no watch can
//! replace: roles, slots and links change inside Valkey) and, while they say the same, ends
//! there. Any watch event that reaches the cluster unsettles it first, so the pass it wakes is a
//! full one: its spec, labels or annotations; its ValkeyNodes, Pods or owned objects; a Secret
//! it reads; a config or image it resolves through. So do a different answer from Valkey, a
//! new term of leadership and [`REFRESH`] (after which the users and owned objects are written
//! again anyway).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::Instant;

use super::live::REFRESH;
use crate::execute::Member;
use crate::fleet::ClusterKey;
use crate::roll::{DesiredShape, ObservedNode};
use crate::valkey::Reach;

/// What a settled cluster's light pass needs: whom to ask, how, and what they said.
#[derive(Clone, Debug)]
pub struct SettledView {
    pub members: Vec<Member>,
    pub reach: Reach,
    pub desired: DesiredShape,
    pub fingerprint: u64,
    since: Instant,
}

/// The settled clusters, by key.
#[derive(Debug, Default)]
pub struct Settled(Mutex<HashMap<ClusterKey, SettledView>>);

impl Settled {
    pub fn settle(
        &self,
        cluster: &ClusterKey,
        members: Vec<Member>,
        reach: Reach,
        desired: DesiredShape,
        observed: &[ObservedNode],
    ) {
        let view = SettledView {
            members,
            reach,
            desired,
            fingerprint: fingerprint(observed),
            since: Instant::now(),
        };
        let mut settled = self.0.lock().unwrap_or_else(|p| p.into_inner());
        settled.insert(cluster.clone(), view);
    }

    /// The cluster's view while it is settled and not older than [`REFRESH`].
    pub fn view(&self, cluster: &ClusterKey) -> Option<SettledView> {
        self.view_at(cluster, Instant::now())
    }

    fn view_at(&self, cluster: &ClusterKey, now: Instant) -> Option<SettledView> {
        let settled = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let view = settled.get(cluster)?;
        (now.saturating_duration_since(view.since) < REFRESH).then(|| view.clone())
    }

    /// Something about the cluster changed: its next pass is a full one.
    pub fn unsettle(&self, cluster: &ClusterKey) {
        let mut settled = self.0.lock().unwrap_or_else(|p| p.into_inner());
        settled.remove(cluster);
    }

    /// A new term of leadership: nothing is settled.
    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// What the planner and the status read of the nodes, without what moves on its own in a
/// healthy cluster (replication offsets): equal fingerprints plan and report alike.
pub fn fingerprint(observed: &[ObservedNode]) -> u64 {
    let mut hasher = DefaultHasher::new();
    for node in observed {
        node.name.hash(&mut hasher);
        node.shard.hash(&mut hasher);
        node.revision.hash(&mut hasher);
        node.reachable.hash(&mut hasher);
        node.role.hash(&mut hasher);
        let sync = node.sync.as_ref();
        sync.map(|s| {
            (
                s.link_up,
                s.sync_in_progress,
                s.known_to_primaries,
                s.is_synced(),
            )
        })
        .hash(&mut hasher);
        node.slots.hash(&mut hasher);
        node.cluster_ok.hash(&mut hasher);
        node.migrating.hash(&mut hasher);
        node.handover_requested.hash(&mut hasher);
        node.terminated.hash(&mut hasher);
        node.leaving.hash(&mut hasher);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roll::{Lifecycle, Role, SlotRange};

    fn primary(name: &str, slots: Vec<SlotRange>) -> ObservedNode {
        ObservedNode {
            name: name.into(),
            shard: 0,
            revision: "r1".into(),
            lifecycle: Lifecycle::Active,
            join_overdue: false,
            reachable: true,
            role: Role::Primary,
            sync: None,
            slots,
            cluster_ok: true,
            migrating: false,
            handover_requested: false,
            terminated: false,
            leaving: false,
        }
    }

    #[test]
    fn the_fingerprint_follows_what_the_planner_reads() {
        let all = vec![SlotRange::new(0, 16383)];
        let healthy = vec![primary("a", all.clone())];
        assert_eq!(fingerprint(&healthy), fingerprint(&healthy.clone()));
        let mut gone = healthy.clone();
        gone[0].reachable = false;
        assert_ne!(
            fingerprint(&healthy),
            fingerprint(&gone),
            "a node stopped answering"
        );
        let mut demoted = healthy.clone();
        demoted[0].role = Role::Replica;
        assert_ne!(
            fingerprint(&healthy),
            fingerprint(&demoted),
            "a role changed"
        );
        let fewer = vec![primary("a", vec![SlotRange::new(0, 100)])];
        assert_ne!(fingerprint(&healthy), fingerprint(&fewer), "slots moved");
    }

    #[test]
    fn a_cluster_stays_settled_until_unsettled_or_refresh() {
        let settled = Settled::default();
        let key = ClusterKey::new("shop", "orders");
        let desired = DesiredShape {
            shards: 1,
            replicas_per_shard: 0,
            revision: "r1".into(),
        };
        let reach = Reach::plain(std::time::Duration::from_secs(1));
        assert!(settled.view(&key).is_none(), "never settled");
        settled.settle(&key, Vec::new(), reach.clone(), desired.clone(), &[]);
        assert!(settled.view(&key).is_some());
        assert!(
            settled.view_at(&key, Instant::now() + REFRESH).is_none(),
            "a full pass after REFRESH"
        );
        settled.unsettle(&key);
        assert!(settled.view(&key).is_none(), "a watch event");
        settled.settle(&key, Vec::new(), reach, desired, &[]);
        settled.clear();
        assert!(settled.view(&key).is_none(), "a new term");
    }
}
