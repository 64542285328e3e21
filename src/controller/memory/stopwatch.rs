//! The clocks behind the roll's duration histograms, one per cluster, kept in memory by the
//! leader (a new leader starts them afresh: a shard it finds mid-roll is timed from its next
//! step). No I/O: each pass hands over what it did and the time, and gets back what finished.
//!
//! The rules, in the order [`RollClock::record`] applies them:
//! 1. a replica being timed whose node is gone is forgotten (it never joined);
//! 2. an `Activate` of a replica being timed ends its join;
//! 3. a `JoinReplica` that created a node starts timing that node's join;
//! 4. a shard being timed with no outdated node left ends its roll;
//! 5. a step on a shard that has an outdated node starts timing that shard, if it is not yet.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::api::ClusterKey;
use crate::controller::memory::{KeptPerCluster, PerCluster};
use crate::metrics::Timed;
use crate::roll::Step;

/// What one pass did, as the clock needs it.
pub struct Pass<'a> {
    pub step: &'a Step,
    /// The step was carried out.
    pub ok: bool,
    /// The node a join created.
    pub created: Option<&'a str>,
    /// The nodes observed before the step.
    pub nodes: BTreeSet<&'a str>,
    /// The shards with a node not on the desired revision, observed before the step.
    pub outdated_shards: BTreeSet<u32>,
}

/// When each shard's roll and each replica's join started.
#[derive(Debug, Default)]
pub struct RollClock {
    shards: BTreeMap<u32, Instant>,
    joins: HashMap<String, Instant>,
}

impl RollClock {
    /// Applies the module's rules to one pass at `now`; returns what finished and how long it took.
    pub fn record(&mut self, pass: &Pass, now: Instant) -> Vec<(Timed, Duration)> {
        let mut finished = Vec::new();
        self.joins
            .retain(|node, _| pass.nodes.contains(node.as_str()));
        match pass.step {
            Step::Activate { node, .. } if pass.ok => {
                if let Some(started) = self.joins.remove(node) {
                    finished.push((Timed::ReplicaJoin, now - started));
                }
            }
            Step::JoinReplica { .. } => {
                if let Some(node) = pass.created {
                    self.joins.insert(node.to_owned(), now);
                }
            }
            _ => {}
        }
        let done: Vec<u32> = self
            .shards
            .keys()
            .filter(|shard| !pass.outdated_shards.contains(shard))
            .copied()
            .collect();
        for shard in done {
            if let Some(started) = self.shards.remove(&shard) {
                finished.push((Timed::ShardRoll, now - started));
            }
        }
        if let Some(shard) = pass
            .step
            .shard()
            .filter(|s| pass.outdated_shards.contains(s))
        {
            self.shards.entry(shard).or_insert(now);
        }
        finished
    }
}

/// Every cluster's [`RollClock`].
#[derive(Debug, Default)]
pub struct Stopwatches {
    clocks: PerCluster<RollClock>,
}

impl Stopwatches {
    pub fn record(
        &self,
        cluster: &ClusterKey,
        pass: &Pass,
        now: Instant,
    ) -> Vec<(Timed, Duration)> {
        let mut clocks = self.clocks.lock();
        let clock = clocks.entry(cluster.clone()).or_default();
        let finished = clock.record(pass, now);
        if clock.shards.is_empty() && clock.joins.is_empty() {
            clocks.remove(cluster);
        }
        finished
    }
}

impl KeptPerCluster for Stopwatches {
    type Entry = RollClock;

    fn entries(&self) -> &PerCluster<Self::Entry> {
        &self.clocks
    }

    #[cfg(test)]
    fn sample_entry() -> Self::Entry {
        RollClock::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass<'a>(
        step: &'a Step,
        created: Option<&'a str>,
        nodes: &[&'a str],
        outdated: &[u32],
    ) -> Pass<'a> {
        Pass {
            step,
            ok: true,
            created,
            nodes: nodes.iter().copied().collect(),
            outdated_shards: outdated.iter().copied().collect(),
        }
    }

    #[test]
    fn a_shard_is_timed_from_its_first_step_to_its_last_outdated_node_gone() {
        let mut clock = RollClock::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let join = Step::JoinReplica {
            shard: 1,
            primary: "c-1-old".into(),
        };
        let nodes = ["c-1-old", "c-0-old"];
        // Shard 0 waits its turn while shard 1 rolls: it is outdated but not timed.
        assert!(
            clock
                .record(&pass(&join, Some("c-1-new"), &nodes, &[0, 1]), at(0))
                .is_empty()
        );
        let activate = Step::Activate {
            shard: 1,
            node: "c-1-new".into(),
        };
        let with_new = ["c-1-old", "c-0-old", "c-1-new"];
        assert_eq!(
            clock.record(&pass(&activate, None, &with_new, &[0, 1]), at(4)),
            [(Timed::ReplicaJoin, Duration::from_secs(4))]
        );
        let wait = Step::Converged;
        assert_eq!(
            clock.record(&pass(&wait, None, &with_new, &[0]), at(9)),
            [(Timed::ShardRoll, Duration::from_secs(9))]
        );
        assert!(clock.shards.is_empty() && clock.joins.is_empty());
    }

    #[test]
    fn a_replica_that_never_joined_is_forgotten_and_scaling_is_not_a_roll() {
        let mut clock = RollClock::default();
        let now = Instant::now();
        let join = Step::JoinReplica {
            shard: 0,
            primary: "c-0-p".into(),
        };
        // A replica added by scaling: the shard is up to date, so no shard roll starts.
        clock.record(&pass(&join, Some("c-0-r"), &["c-0-p"], &[]), now);
        assert!(clock.shards.is_empty());
        assert!(clock.joins.contains_key("c-0-r"));
        let converged = Step::Converged;
        clock.record(&pass(&converged, None, &["c-0-p"], &[]), now);
        assert!(
            clock.joins.is_empty(),
            "the node is gone: its join is forgotten"
        );
    }
}
