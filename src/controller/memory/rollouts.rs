//! The fleet's rollouts as the leader sees them ([`crate::fleet::rollout`] holds the rules): each
//! cluster's standing, reported after each pass; the gate a cluster's roll step passes first;
//! and the writer of every config's and image's fleet status, with an event when a config's
//! rollout starts, halts, pauses or completes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Instant;

use crate::api::ClusterKey;
use crate::api::RolloutProgress;
use crate::controller::memory::ClusterMemory;
use crate::fleet::rollout::{Asking, LEARNING, Standing, Verdict, gate};

/// Every cluster's last standing, since this replica started leading.
#[derive(Debug, Default)]
pub struct Rollouts {
    standings: Mutex<BTreeMap<ClusterKey, Standing>>,
    leading_since: Mutex<Option<Instant>>,
    /// Queued clusters that a place freed in their group may let move on: the controller
    /// wakes them ([`Rollouts::take_wakes`]) rather than have every queued cluster poll.
    wakes: Mutex<Vec<ClusterKey>>,
}

/// Whether a cluster going from `before` to `after` changes what the gate tells the queued
/// clusters of its group: a roll finished (a place under the cap, or a wave done), a stall
/// ended (a halt lifted) or began (they are halted now, and say so). Not every step of every
/// member: under a cap of 2, waking 200 queued clusters at each would cost more than polling.
fn moves_the_gate(before: RolloutProgress, after: RolloutProgress) -> bool {
    match (before, after) {
        (RolloutProgress::Rolling, RolloutProgress::UpToDate | RolloutProgress::Queued) => true,
        (RolloutProgress::Stalled, other) | (other, RolloutProgress::Stalled) => {
            other != RolloutProgress::Stalled
        }
        (RolloutProgress::Rolling, RolloutProgress::Stuck) => true,
        // Held: its place under the cap and in its wave is free.
        (before, RolloutProgress::Held) => before != RolloutProgress::Held,
        _ => false,
    }
}

impl Rollouts {
    /// Puts `standing` in place of `key`'s, noting the queued clusters of its group to wake
    /// when the change moves the gate for them.
    pub fn replace(
        &self,
        standings: &mut BTreeMap<ClusterKey, Standing>,
        key: &ClusterKey,
        standing: Standing,
    ) {
        let frees = standings
            .get(key)
            .is_some_and(|before| moves_the_gate(before.progress, standing.progress));
        if frees && standing.group.is_some() {
            let queued = standings.iter().filter(|(other, s)| {
                *other != key && s.group == standing.group && s.progress == RolloutProgress::Queued
            });
            let mut wakes = self.wakes.lock().unwrap_or_else(|p| p.into_inner());
            wakes.extend(queued.map(|(other, _)| other.clone()));
        }
        standings.insert(key.clone(), standing);
    }

    /// The queued clusters to wake now (each once).
    pub fn take_wakes(&self) -> Vec<ClusterKey> {
        let mut wakes = self.wakes.lock().unwrap_or_else(|p| p.into_inner());
        let mut taken = std::mem::take(&mut *wakes);
        taken.sort();
        taken.dedup();
        taken
    }

    /// Gates `asking` and records its standing in one step, so two clusters passing at once
    /// cannot both take the last place under a cap.
    pub fn admit(&self, asking: &Asking) -> Verdict {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        let verdict = gate(asking, &standings);
        let mut standing = asking.standing.clone();
        // Between shards and held, a started cluster waits like a queued one: counted as
        // rolling, three held clusters under a cap of two would wait for each other forever.
        standing.progress = match verdict {
            Verdict::Go => RolloutProgress::Rolling,
            Verdict::Wait(_) if asking.mid_shard => RolloutProgress::Rolling,
            Verdict::Wait(_) => RolloutProgress::Queued,
        };
        self.replace(&mut standings, asking.key, standing);
        verdict
    }

    /// Where `key` stands now, as the gate last recorded it.
    pub fn progress(&self, key: &ClusterKey) -> Option<RolloutProgress> {
        let standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.get(key).map(|standing| standing.progress)
    }

    pub fn record(&self, key: &ClusterKey, standing: Standing) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        self.replace(&mut standings, key, standing);
    }

    /// The cluster left the fleet (deleted, or no longer resolving through a rollout's config).
    pub fn forget(&self, key: &ClusterKey) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut gone) = standings.get(key).cloned() {
            // Gone counts as done: its place under the cap is free.
            gone.progress = RolloutProgress::UpToDate;
            self.replace(&mut standings, key, gone);
        }
        standings.remove(key);
    }

    /// A new term of leadership: nothing is known of the fleet yet.
    pub fn clear(&self) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.clear();
        let mut since = self.leading_since.lock().unwrap_or_else(|p| p.into_inner());
        *since = Some(Instant::now());
    }

    /// Drops the standings of clusters that are gone (deleted without a cleanup pass).
    pub fn keep_only(&self, exists: impl Fn(&ClusterKey) -> bool) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.retain(|key, _| exists(key));
    }

    pub fn learning(&self) -> bool {
        let since = self.leading_since.lock().unwrap_or_else(|p| p.into_inner());
        since.is_none_or(|at| at.elapsed() < LEARNING)
    }

    pub fn snapshot(&self) -> BTreeMap<ClusterKey, Standing> {
        let standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.clone()
    }
}

impl ClusterMemory for Rollouts {
    fn forget(&self, cluster: &ClusterKey) {
        Rollouts::forget(self, cluster);
    }

    fn reset(&self) {
        self.clear();
    }

    fn clusters(&self) -> BTreeSet<ClusterKey> {
        let standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.keys().cloned().collect()
    }

    #[cfg(test)]
    fn sample(&self, cluster: &ClusterKey) {
        let standing = Standing {
            group: None,
            chain: Vec::new(),
            image: String::new(),
            wave: crate::roll::rollout_waits::Wave::Last,
            target: String::new(),
            progress: RolloutProgress::UpToDate,
        };
        self.record(cluster, standing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standing(group: &str, progress: RolloutProgress) -> Standing {
        Standing {
            group: Some(group.into()),
            chain: vec![group.into()],
            image: "valkey-9-1-2".into(),
            wave: crate::roll::rollout_waits::Wave::from_annotation(None),
            target: "t".into(),
            progress,
        }
    }

    #[test]
    fn a_place_freed_or_a_halt_wakes_the_queued_clusters_of_its_group_once() {
        let rollouts = Rollouts::default();
        let key = |name: &str| ClusterKey::new("shop", name);
        rollouts.record(&key("a"), standing("fleet", RolloutProgress::Rolling));
        rollouts.record(&key("b"), standing("fleet", RolloutProgress::Queued));
        rollouts.record(&key("c"), standing("fleet", RolloutProgress::Queued));
        rollouts.record(
            &key("other"),
            standing("elsewhere", RolloutProgress::Queued),
        );
        assert!(rollouts.take_wakes().is_empty(), "nothing freed yet");
        rollouts.record(&key("a"), standing("fleet", RolloutProgress::Rolling));
        assert!(rollouts.take_wakes().is_empty(), "still rolling");
        rollouts.record(&key("a"), standing("fleet", RolloutProgress::UpToDate));
        assert_eq!(rollouts.take_wakes(), vec![key("b"), key("c")]);
        assert!(rollouts.take_wakes().is_empty(), "each wake is taken once");

        rollouts.record(&key("b"), standing("fleet", RolloutProgress::Rolling));
        assert!(rollouts.take_wakes().is_empty(), "b took a place");
        rollouts.record(&key("b"), standing("fleet", RolloutProgress::Stalled));
        assert_eq!(rollouts.take_wakes(), vec![key("c")], "halted now");
        rollouts.record(&key("b"), standing("fleet", RolloutProgress::Rolling));
        assert_eq!(rollouts.take_wakes(), vec![key("c")], "a halt lifted");
        rollouts.forget(&key("b"));
        assert_eq!(
            rollouts.take_wakes(),
            vec![key("c")],
            "a deleted cluster's place"
        );
    }
}
