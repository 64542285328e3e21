//! Up-to-date joiners whose servers stopped before they joined, counted per cluster by this
//! leader ([`crate::roll::RollMemory::lost_joins`]), so that a node of the new revision that
//! dies while joining is replaced at once, but not without end.
//!
//! Why a bound: a joiner that dies is retired and another is joined in its place (planner rule
//! 2). A one-off (a killed process, a lost machine) is healed that way in seconds. But a new
//! revision whose nodes always die (an image that crashes at start, a memory limit that the
//! full sync exceeds) would be replaced for ever, each try a full sync from the primary, and
//! never stall, so never halt a fleet rollout. Past [`MAX_LOST_JOINS`](crate::roll::model::MAX_LOST_JOINS) losses within
//! [`LOST_JOIN_WINDOW`], the planner stalls instead (`JoinsLost`), which halts the rollout.
//!
//! Kept in memory, not in the status: a restart of the operator forgets the count, which only
//! allows a few more tries; and losses older than the window are forgotten too, so a stall for
//! a passing cause ends by itself (one try per window at most).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::api::ClusterKey;
use crate::controller::memory::{KeptPerCluster, PerCluster};
use crate::roll::{DesiredShape, Lifecycle, ObservedNode};

/// How long a joiner's loss counts.
pub const LOST_JOIN_WINDOW: Duration = Duration::from_secs(600);

/// One cluster's count: the revision counted, and when each of its lost joiners (by name) was
/// first seen stopped, those whose servers failed apart from those whose Pods were removed.
#[derive(Debug, Default)]
pub(in crate::controller) struct Counted {
    revision: String,
    failed: HashMap<String, Instant>,
    removed: HashMap<String, Instant>,
}

/// How many joiners of the revision a cluster lost within the window, by how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// Their servers stopped (what a revision can cause).
    pub failed: u32,
    /// Their Pods were removed (what no revision causes).
    pub removed: u32,
}

/// Per cluster, its [`Counted`] losses.
#[derive(Debug, Default)]
pub struct LostJoins(PerCluster<Counted>);

impl LostJoins {
    /// Notes the `observed` joiners of `desired`'s revision whose servers stopped, and returns
    /// how many were lost within the window (this pass's included).
    pub fn count(
        &self,
        cluster: &ClusterKey,
        desired: &DesiredShape,
        observed: &[ObservedNode],
    ) -> Lost {
        self.count_at(cluster, desired, observed, Instant::now())
    }

    pub fn count_at(
        &self,
        cluster: &ClusterKey,
        desired: &DesiredShape,
        observed: &[ObservedNode],
        now: Instant,
    ) -> Lost {
        let mut all = self.0.lock();
        let Counted {
            revision,
            failed,
            removed,
        } = all.entry(cluster.clone()).or_default();
        if *revision != desired.revision {
            *revision = desired.revision.clone();
            failed.clear();
            removed.clear();
        }
        let stopped = observed.iter().filter(|n| {
            n.lifecycle == Lifecycle::Joining && n.terminated && n.is_up_to_date(desired)
        });
        for node in stopped {
            // Counted once, as first seen: a failed joiner's Pod is removed when it is retired.
            if failed.contains_key(&node.name) || removed.contains_key(&node.name) {
                continue;
            }
            let how = if node.removed {
                &mut *removed
            } else {
                &mut *failed
            };
            how.insert(node.name.clone(), now);
        }
        let within = |at: &mut Instant| now.saturating_duration_since(*at) < LOST_JOIN_WINDOW;
        failed.retain(|_, at| within(at));
        removed.retain(|_, at| within(at));
        let count = |lost: &HashMap<String, Instant>| u32::try_from(lost.len()).unwrap_or(u32::MAX);
        Lost {
            failed: count(failed),
            removed: count(removed),
        }
    }
}

impl KeptPerCluster for LostJoins {
    type Entry = Counted;

    fn entries(&self) -> &PerCluster<Self::Entry> {
        &self.0
    }

    #[cfg(test)]
    fn sample_entry() -> Self::Entry {
        Counted::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::roll::Role;

    fn joiner(name: &str, revision: &str, terminated: bool) -> ObservedNode {
        ObservedNode {
            lifecycle: Lifecycle::Joining,
            reachable: !terminated,
            sync: None,
            terminated,
            ..ObservedNode::settled(name, 0, revision, Role::Replica)
        }
    }

    #[test]
    fn stopped_joiners_of_the_revision_count_once_each_within_the_window() {
        let lost = LostJoins::default();
        let cluster = ClusterKey::new("shop", "orders");
        let desired = |revision: &str| DesiredShape {
            shards: 1,
            replicas_per_shard: 1,
            revision: revision.into(),
            switchover: None,
            primary_update: Default::default(),
            primary_spread: Default::default(),
        };
        let start = Instant::now();
        let count = |revision: &str, nodes: &[ObservedNode], at: Duration| {
            lost.count_at(&cluster, &desired(revision), nodes, start + at)
                .failed
        };
        let running = joiner("a", "new", false);
        assert_eq!(count("new", &[running], Duration::ZERO), 0);
        let a = joiner("a", "new", true);
        assert_eq!(count("new", std::slice::from_ref(&a), Duration::ZERO), 1);
        assert_eq!(count("new", &[a], Duration::from_secs(5)), 1, "seen again");
        // An outdated joiner's loss is not the new revision's.
        assert_eq!(
            count("new", &[joiner("old", "r0", true)], Duration::ZERO),
            1
        );
        assert_eq!(count("new", &[joiner("b", "new", true)], Duration::ZERO), 2);
        // The window passes: forgotten.
        assert_eq!(count("new", &[], LOST_JOIN_WINDOW), 0);
        // A new revision starts again.
        assert_eq!(
            count("new", &[joiner("c", "new", true)], LOST_JOIN_WINDOW),
            1
        );
        assert_eq!(count("newer", &[], LOST_JOIN_WINDOW), 0);
    }

    #[test]
    fn joiners_whose_pods_were_removed_are_counted_apart_from_those_that_failed() {
        let lost = LostJoins::default();
        let cluster = ClusterKey::new("shop", "orders");
        let desired = DesiredShape {
            shards: 1,
            replicas_per_shard: 1,
            revision: "new".into(),
            switchover: None,
            primary_update: Default::default(),
            primary_spread: Default::default(),
        };
        let removed = |name: &str| ObservedNode {
            removed: true,
            ..joiner(name, "new", true)
        };
        let now = Instant::now();
        let seen = lost.count_at(&cluster, &desired, &[removed("a"), removed("b")], now);
        assert_eq!(
            seen,
            Lost {
                failed: 0,
                removed: 2
            }
        );
        // A joiner that failed is counted as failed, once, even when its Pod goes afterwards.
        let failed = joiner("c", "new", true);
        let seen = lost.count_at(&cluster, &desired, &[failed], now);
        assert_eq!(
            seen,
            Lost {
                failed: 1,
                removed: 2
            }
        );
        let seen = lost.count_at(&cluster, &desired, &[removed("c")], now);
        assert_eq!(
            seen,
            Lost {
                failed: 1,
                removed: 2
            }
        );
    }
}
