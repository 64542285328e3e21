//! How long each node has gone without answering, by the operator's own clock, and so which
//! nodes are hung ([`crate::roll::ObservedNode::hung`]): silent for longer than
//! [`silence_bound`] while their Pod runs.
//!
//! The timer stands beside the Pods' liveness probe (`render::liveness_probe`), which usually
//! acts first: the kubelet kills a hung server within about 21 s, and the Pod fails (it is never
//! restarted in place, where a primary would come back empty). The timer covers what the probe
//! cannot see: a server that answers on its socket but not on the Pod network, an image
//! without `valkey-cli`, a node whose kubelet is gone. What it decides goes through the planner
//! like every other step: a hung primary's shard is taken over by its most caught-up replica
//! (unless every node that answers sees it up: then only the operator is cut off from it),
//! and the hung node is then replaced and retired. A restart of the operator starts every
//! count again, which only delays a takeover.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::api::ClusterKey;
use crate::controller::memory::{KeptPerCluster, PerCluster};
use crate::execute::Member;
use crate::roll::ObservedNode;

/// Since when each node of each cluster has not answered.
#[derive(Debug, Default)]
pub struct Silence(PerCluster<HashMap<String, Instant>>);

/// How long a node may stay silent before it is treated as dead: twice Valkey's
/// `cluster-node-timeout` (so that where Valkey can fail a primary over itself, it does so
/// first), and never less than 20 s (a slow moment, a long fork, is not a death).
pub fn silence_bound(node_timeout: Duration) -> Duration {
    (node_timeout * 2).max(Duration::from_secs(20))
}

impl Silence {
    /// Marks `observed` nodes hung that have been silent for longer than `bound`: a node that
    /// answered once (its id is recorded) and does not answer now while its server may still
    /// run. A node that answers, has stopped for good, or never answered is not counted.
    pub fn judge(
        &self,
        cluster: &ClusterKey,
        members: &[Member],
        observed: &mut [ObservedNode],
        bound: Duration,
    ) {
        self.judge_at(cluster, members, observed, bound, Instant::now());
    }

    pub fn judge_at(
        &self,
        cluster: &ClusterKey,
        members: &[Member],
        observed: &mut [ObservedNode],
        bound: Duration,
        now: Instant,
    ) {
        let mut all = self.0.lock();
        let since = all.entry(cluster.clone()).or_default();
        since.retain(|name, _| observed.iter().any(|o| &o.name == name));
        for node in observed.iter_mut() {
            let answered_once = members
                .iter()
                .any(|m| m.name == node.name && m.id.is_some());
            // A node that refuses the login, or answers what cannot be read, is not silent.
            let answers = node.locked_out || node.unreadable;
            if node.reachable || node.terminated || answers || !answered_once {
                since.remove(&node.name);
                continue;
            }
            let first = *since.entry(node.name.clone()).or_insert(now);
            node.hung = now.saturating_duration_since(first) >= bound;
        }
        if since.is_empty() {
            all.remove(cluster);
        }
    }
}

impl Silence {
    /// The nodes of `cluster` silent at its last observation (see [`Member::silent`]).
    pub fn silent(&self, cluster: &ClusterKey) -> Vec<String> {
        let all = self.0.lock();
        all.get(cluster)
            .map(|since| since.keys().cloned().collect())
            .unwrap_or_default()
    }
}

impl KeptPerCluster for Silence {
    type Entry = HashMap<String, Instant>;

    fn entries(&self) -> &PerCluster<Self::Entry> {
        &self.0
    }

    #[cfg(test)]
    fn sample_entry() -> Self::Entry {
        HashMap::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::memory::ClusterMemory;
    use crate::roll::{Lifecycle, Role};

    fn member(name: &str, id: Option<&str>) -> Member {
        Member {
            name: name.into(),
            shard: 0,
            revision: "r".into(),
            lifecycle: Lifecycle::Active,
            join_overdue: false,
            address: None,
            id: id.map(String::from),
            closed: true,
            replica_of: None,
            handover_requested: false,
            terminated: false,
            removed: false,
            leaving: false,
            not_started: None,
            location: Default::default(),
            silent: false,
        }
    }

    fn seen(name: &str, reachable: bool) -> ObservedNode {
        ObservedNode {
            reachable,
            ..ObservedNode::settled(name, 0, "r", Role::Primary)
        }
    }

    #[test]
    fn a_node_that_answered_once_is_hung_after_the_bound_of_silence_and_not_before() {
        let silence = Silence::default();
        let cluster = ClusterKey::new("shop", "orders");
        let members = [member("a", Some("id-a")), member("new", None)];
        let bound = Duration::from_secs(20);
        let start = Instant::now();
        let judge = |reachable: bool, at: Duration| {
            let mut observed = [seen("a", reachable), seen("new", false)];
            silence.judge_at(&cluster, &members, &mut observed, bound, start + at);
            (observed[0].hung, observed[1].hung)
        };
        assert_eq!(judge(false, Duration::ZERO), (false, false));
        assert_eq!(judge(false, Duration::from_secs(19)), (false, false));
        assert_eq!(
            judge(false, Duration::from_secs(20)),
            (true, false),
            "never answered: never hung (an image that never starts stalls instead)"
        );
        // It answers: the count starts again from its next silence.
        assert_eq!(judge(true, Duration::from_secs(21)), (false, false));
        assert_eq!(judge(false, Duration::from_secs(22)), (false, false));
        assert_eq!(judge(false, Duration::from_secs(41)), (false, false));
        assert_eq!(judge(false, Duration::from_secs(42)), (true, false));
    }

    #[test]
    fn a_stopped_node_is_not_counted_and_a_forgotten_cluster_starts_again() {
        let silence = Silence::default();
        let cluster = ClusterKey::new("shop", "orders");
        let members = [member("a", Some("id-a"))];
        let bound = Duration::from_secs(20);
        let start = Instant::now();
        let mut stopped = [ObservedNode {
            terminated: true,
            removed: false,
            ..seen("a", false)
        }];
        silence.judge_at(&cluster, &members, &mut stopped, bound, start);
        assert!(silence.0.lock().is_empty(), "nothing kept for it");
        let mut silent = [seen("a", false)];
        silence.judge_at(&cluster, &members, &mut silent, bound, start);
        silence.forget(&cluster);
        silence.judge_at(&cluster, &members, &mut silent, bound, start + bound);
        assert!(!silent[0].hung, "counted again from the start");
    }

    #[test]
    fn a_node_that_answers_what_cannot_be_used_is_never_hung() {
        let silence = Silence::default();
        let cluster = ClusterKey::new("shop", "orders");
        let members = [member("a", Some("id-a")), member("b", Some("id-b"))];
        let bound = Duration::from_secs(20);
        let start = Instant::now();
        let mut observed = [
            ObservedNode {
                locked_out: true,
                ..seen("a", false)
            },
            ObservedNode {
                unreadable: true,
                ..seen("b", false)
            },
        ];
        for at in [Duration::ZERO, bound, bound * 3] {
            silence.judge_at(&cluster, &members, &mut observed, bound, start + at);
        }
        assert!(!observed[0].hung && !observed[1].hung, "{observed:?}");
    }

    #[test]
    fn the_bound_lets_valkey_fail_over_first() {
        assert_eq!(
            silence_bound(Duration::from_secs(15)),
            Duration::from_secs(30)
        );
        assert_eq!(
            silence_bound(Duration::from_secs(3)),
            Duration::from_secs(20)
        );
    }
}
