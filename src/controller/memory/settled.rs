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
//! again anyway). An event that arrives while a full pass is reading keeps its cluster
//! unsettled: the pass began before it ([`PassStart`]), so what it read may be older than the
//! event, and it does not settle the cluster at its end.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::Instant;

use crate::api::ClusterKey;
use crate::controller::memory::ClusterMemory;
use crate::controller::memory::REFRESH;
use crate::execute::Member;
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
    /// When its light pass last logged its heartbeat.
    heartbeat: Option<Instant>,
}

/// When a full pass began, by the [`Settled`] clock: a pass may settle its cluster only if
/// nothing unsettled it since (a watch event that arrived while the pass was reading would
/// otherwise be forgotten by the settle at its end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PassStart(u64);

/// The settled clusters, by key, and when each unsettled one was last unsettled.
#[derive(Debug, Default)]
pub struct Settled(Mutex<Book>);

#[derive(Debug, Default)]
struct Book {
    /// Ticks on every start and every unsettle, so the two can be ordered.
    clock: u64,
    views: HashMap<ClusterKey, SettledView>,
    /// Unsettled since their last settle; dropped again when they settle.
    unsettled_at: HashMap<ClusterKey, u64>,
    /// The last reset (see [`ClusterMemory::reset`]): a pass begun before it settles nothing.
    cleared_at: u64,
}

impl Book {
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

impl Settled {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A full pass of some cluster begins now.
    pub fn begin(&self) -> PassStart {
        PassStart(self.book().tick())
    }

    /// Settles `cluster` with what its pass found, unless something unsettled it after the
    /// pass began. Returns whether it settled.
    pub fn settle(
        &self,
        cluster: &ClusterKey,
        began: PassStart,
        members: Vec<Member>,
        reach: Reach,
        desired: DesiredShape,
        observed: &[ObservedNode],
    ) -> bool {
        let mut book = self.book();
        let unsettled = book.unsettled_at.get(cluster).copied().unwrap_or(0);
        if unsettled > began.0 || book.cleared_at > began.0 {
            return false;
        }
        let view = SettledView {
            members,
            reach,
            desired,
            fingerprint: fingerprint(observed),
            since: Instant::now(),
            heartbeat: None,
        };
        book.unsettled_at.remove(cluster);
        book.views.insert(cluster.clone(), view);
        true
    }

    /// The cluster's view while it is settled and not older than [`REFRESH`].
    pub fn view(&self, cluster: &ClusterKey) -> Option<SettledView> {
        self.view_at(cluster, Instant::now())
    }

    pub fn view_at(&self, cluster: &ClusterKey, now: Instant) -> Option<SettledView> {
        let book = self.book();
        let view = book.views.get(cluster)?;
        (now.saturating_duration_since(view.since) < REFRESH).then(|| view.clone())
    }

    /// Whether the settled cluster's light pass at `now` logs its heartbeat: the first one,
    /// then once every [`HEARTBEAT`], however often it is checked.
    pub fn heartbeat_due(&self, cluster: &ClusterKey, now: Instant) -> bool {
        let mut book = self.book();
        let Some(view) = book.views.get_mut(cluster) else {
            return false;
        };
        let due = view
            .heartbeat
            .is_none_or(|last| now.saturating_duration_since(last) >= HEARTBEAT);
        if due {
            view.heartbeat = Some(now);
        }
        due
    }

    /// Something about the cluster changed: its next pass is a full one, and a pass in
    /// flight does not settle it.
    pub fn unsettle(&self, cluster: &ClusterKey) {
        let mut book = self.book();
        book.views.remove(cluster);
        let at = book.tick();
        book.unsettled_at.insert(cluster.clone(), at);
    }
}

/// How often a settled cluster logs its heartbeat: the log's steady flow, one line a minute a
/// cluster, whatever the pace of its checks.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(60);

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

impl ClusterMemory for Settled {
    fn forget(&self, cluster: &ClusterKey) {
        let mut book = self.book();
        book.views.remove(cluster);
        book.unsettled_at.remove(cluster);
    }

    /// Nothing is settled, and no pass in flight settles anything: a new term of leadership,
    /// or watch events that were missed.
    fn reset(&self) {
        let mut book = self.book();
        book.views.clear();
        book.unsettled_at.clear();
        book.cleared_at = book.tick();
    }

    fn clusters(&self) -> BTreeSet<ClusterKey> {
        let book = self.book();
        let unsettled = book.unsettled_at.keys();
        book.views.keys().chain(unsettled).cloned().collect()
    }

    #[cfg(test)]
    fn sample(&self, cluster: &ClusterKey) {
        self.unsettle(cluster);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roll::{Role, SlotRange};

    fn primary(name: &str, slots: Vec<SlotRange>) -> ObservedNode {
        ObservedNode {
            slots,
            ..ObservedNode::settled(name, 0, "r1", Role::Primary)
        }
    }

    #[test]
    fn a_settled_cluster_logs_its_heartbeat_once_a_minute_however_often_it_is_checked() {
        let settled = Settled::default();
        let key = ClusterKey::new("ns", "c");
        let start = Instant::now();
        assert!(
            !settled.heartbeat_due(&key, start),
            "not settled: no heartbeat"
        );
        let began = settled.begin();
        let desired = DesiredShape {
            shards: 1,
            replicas_per_shard: 0,
            revision: "r1".into(),
            switchover: None,
            primary_update: Default::default(),
            primary_spread: Default::default(),
        };
        let reach = Reach::plain(std::time::Duration::from_secs(1));
        assert!(settled.settle(&key, began, Vec::new(), reach, desired, &[]));
        let beats: Vec<bool> = (0..13)
            .map(|check| {
                let at = start + std::time::Duration::from_secs(10 * check);
                settled.heartbeat_due(&key, at)
            })
            .collect();
        assert_eq!(beats.iter().filter(|b| **b).count(), 3, "{beats:?}");
        assert!(beats[0] && beats[6] && beats[12]);
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
            switchover: None,
            primary_update: Default::default(),
            primary_spread: Default::default(),
        };
        let reach = Reach::plain(std::time::Duration::from_secs(1));
        assert!(settled.view(&key).is_none(), "never settled");
        let began = settled.begin();
        assert!(settled.settle(&key, began, Vec::new(), reach.clone(), desired.clone(), &[]));
        assert!(settled.view(&key).is_some());
        assert!(
            settled.view_at(&key, Instant::now() + REFRESH).is_none(),
            "a full pass after REFRESH"
        );
        settled.unsettle(&key);
        assert!(settled.view(&key).is_none(), "a watch event");
        let began = settled.begin();
        settled.settle(&key, began, Vec::new(), reach, desired, &[]);
        settled.reset();
        assert!(settled.view(&key).is_none(), "a new term");
    }

    #[test]
    fn an_event_during_a_pass_keeps_the_cluster_unsettled() {
        let settled = Settled::default();
        let key = ClusterKey::new("shop", "orders");
        let other = ClusterKey::new("shop", "carts");
        let desired = DesiredShape {
            shards: 1,
            replicas_per_shard: 0,
            revision: "r1".into(),
            switchover: None,
            primary_update: Default::default(),
            primary_spread: Default::default(),
        };
        let reach = Reach::plain(std::time::Duration::from_secs(1));
        let settle =
            |began| settled.settle(&key, began, Vec::new(), reach.clone(), desired.clone(), &[]);

        let began = settled.begin();
        settled.unsettle(&key);
        assert!(
            !settle(began),
            "the config changed while the pass read the old one"
        );
        assert!(settled.view(&key).is_none());

        let began = settled.begin();
        settled.unsettle(&other);
        assert!(settle(began), "another cluster's event is not this one's");

        let began = settled.begin();
        settled.reset();
        assert!(!settle(began), "a pass begun before a clear");
        assert!(settle(settled.begin()), "one begun after it");
    }
}
