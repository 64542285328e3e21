//! Fleet rollouts a platform team can steer: whether a cluster may start rolling onto its new
//! revision now, given its rollout group (the clusters that share the nearest config with a
//! `spec.rollout` policy in their `baseRef` chains). No I/O: the controller reports each
//! cluster's [`Standing`] after each pass and asks [`gate`] before a cluster starts.
//!
//! The rules, in the order [`gate`] checks them:
//! 1. a cluster with a shard mid-roll (nodes on both revisions) finishes that shard; between
//!    shards, a cluster that has started (a node already on its revision: an earlier start, or
//!    a healed node) goes through the rules below like one that has not, so a pause or a halt
//!    stops it after its shard and the cap counts it only while it rolls a shard;
//! 2. a cluster none of whose configs is paused and that has no policy starts at once (the
//!    guide's behaviour: everything together);
//! 3. a paused rollout starts nobody (annotation
//!    [`ROLLOUT_PAUSED`](crate::api::annotations::ROLLOUT_PAUSED) on any config of the
//!    cluster's chain); outside every maintenance window of its group's policy, a cluster
//!    waits for the next to open ([`crate::fleet::window`]);
//! 4. in a leader's first [`LEARNING`], a cluster whose group has members this leader has not
//!    seen yet waits for their first pass (until then it cannot count them; after it, a member
//!    that never reaches the gate, say one whose config does not resolve, holds nobody up);
//! 5. a cluster whose group has a member stalled on the change (same target) waits until
//!    nobody is (halt on stall: a bad image reaches one wave at most);
//! 6. a cluster whose group has a member of an earlier wave not yet up to date on the same
//!    target (and not stuck for a cause of its own, nor held) waits for it;
//! 7. a cluster whose group already has `maxConcurrent` members rolling on the same target
//!    waits for one to finish;
//! 8. otherwise it starts.
//!
//! Waves are the platform's ([`wave_of`]): the policy's `waves` name their clusters; the
//! annotation [`ROLLOUT_WAVE`](crate::api::annotations::ROLLOUT_WAVE) a cluster's owner may put on it counts only where the policy
//! allows it (after the policy's waves); every other cluster is in the last wave.
//!
//! Only a stall of the change itself halts a group ([`RolloutProgress::Stalled`]): its new nodes never
//! come up, or a failover onto one never takes effect. A cluster stalled for a cause of its own
//! (its nodes refuse the operator's login, a dead primary, its Pods refused by a quota) is
//! [`RolloutProgress::Stuck`]: counted, shown, but it halts nobody and holds no place under the cap.
//! A cluster a person holds on its revision ([`RolloutProgress::Held`], the controller's gate decides
//! it before this one: annotation [`ROLLOUT_HOLD`](crate::api::annotations::ROLLOUT_HOLD)) is
//! the same: the rest of its group rolls past it.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use crate::api::ClusterKey;
use crate::api::{RolloutPolicy, RolloutProgress};
use crate::fleet::window::{Opening, Windows};
use crate::roll::rollout_waits::{WaitFor, Wave};

/// A cluster's wave in its group: the first of the `policy`'s waves naming it; else, where the
/// policy allows it, its owner's `annotation` (numbered after the policy's waves); else the last.
pub fn wave_of(key: &ClusterKey, policy: &RolloutPolicy, annotation: Option<&str>) -> Wave {
    if let Some(index) = policy
        .waves
        .iter()
        .position(|wave| wave.names(&key.namespace, &key.name))
    {
        return Wave::Numbered(u32::try_from(index).unwrap_or(u32::MAX));
    }
    match Wave::from_annotation(annotation) {
        Wave::Numbered(number) if policy.allow_wave_annotation => {
            let after = u32::try_from(policy.waves.len()).unwrap_or(u32::MAX);
            Wave::Numbered(after.saturating_add(number))
        }
        _ => Wave::Last,
    }
}

/// One cluster as the gate and the config status see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    /// The config whose policy governs it (its group), if any config in its chain has one.
    pub group: Option<String>,
    /// Its config chain, its own config first.
    pub chain: Vec<String>,
    /// The ValkeyImage it resolves to.
    pub image: String,
    pub wave: Wave,
    /// What the rollout moves it onto: the digest of the config's share of its revision
    /// ([`crate::fleet::change::RollingInputs`]), the same for every cluster a change reaches
    /// whatever its own placement. Members are compared by it, so a standing from before a change
    /// (reported under the old target) never counts as done, rolling or stalled on the new one.
    pub target: String,
    pub progress: RolloutProgress,
}

/// A group's policy (`spec.rollout` of the group's config).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// At most this many clusters of the group rolling at once; `None`: no cap.
    pub max_concurrent: Option<u32>,
    /// When its clusters may start rolling.
    pub windows: Windows,
}

/// What the gate needs to know of the cluster asking.
#[derive(Clone, Debug)]
pub struct Asking<'a> {
    pub key: &'a ClusterKey,
    pub standing: &'a Standing,
    pub policy: Option<&'a Policy>,
    /// The time, for the maintenance windows.
    pub now: Timestamp,
    /// Some config of its chain carries [`ROLLOUT_PAUSED`](crate::api::annotations::ROLLOUT_PAUSED).
    pub paused: bool,
    /// Some node already runs the desired revision.
    pub started: bool,
    /// Some shard has nodes on both revisions (it is between a replace and a retire).
    pub mid_shard: bool,
    /// Every cluster resolving through the group's config (the fleet index's answer).
    pub members: &'a [ClusterKey],
    /// This replica has led for less than [`LEARNING`].
    pub learning: bool,
}

/// How long a new leader waits for every member of a group to report before it counts.
pub const LEARNING: std::time::Duration = std::time::Duration::from_secs(30);

/// The gate's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Go,
    Wait(WaitFor),
}

/// Applies the module's rules to `asking` against its group's members (every cluster's
/// standing; members of other groups are ignored).
pub fn gate(asking: &Asking, fleet: &BTreeMap<ClusterKey, Standing>) -> Verdict {
    let standing = asking.standing;
    let group: Vec<(&ClusterKey, &Standing)> = fleet
        .iter()
        .filter(|(key, other)| *key != asking.key && other.group == standing.group)
        .filter(|_| standing.group.is_some())
        .collect();
    let same_target = |other: &&(&ClusterKey, &Standing)| other.1.target == standing.target;
    let halted = group
        .iter()
        .filter(same_target)
        .find(|(_, other)| other.progress == RolloutProgress::Stalled);
    if asking.started && asking.mid_shard {
        return Verdict::Go;
    }
    if asking.paused {
        return Verdict::Wait(WaitFor::Paused);
    }
    let Some(policy) = asking.policy else {
        return Verdict::Go;
    };
    if let Opening::ClosedUntil(opens) = policy.windows.at(asking.now) {
        return Verdict::Wait(WaitFor::OutsideWindow { opens });
    }
    let unseen = asking
        .members
        .iter()
        .filter(|member| *member != asking.key && !fleet.contains_key(member))
        .count();
    if asking.learning && unseen > 0 {
        return Verdict::Wait(WaitFor::Learning { unseen });
    }
    if let Some((stalled, _)) = halted {
        return Verdict::Wait(WaitFor::Halted {
            stalled: (*stalled).clone(),
        });
    }
    // A cluster stuck for its own cause, or held by a person, holds no later wave back.
    let aside = |progress: RolloutProgress| {
        matches!(progress, RolloutProgress::Stuck | RolloutProgress::Held)
    };
    let earlier = group
        .iter()
        .filter(|(_, other)| other.wave < standing.wave && !aside(other.progress))
        .find(|(_, other)| {
            other.progress != RolloutProgress::UpToDate || other.target != standing.target
        });
    if let Some((behind, other)) = earlier {
        return Verdict::Wait(WaitFor::EarlierWave {
            wave: other.wave,
            behind: (*behind).clone(),
        });
    }
    let rolling = group
        .iter()
        .filter(same_target)
        .filter(|(_, other)| other.progress == RolloutProgress::Rolling)
        .count();
    let rolling = u32::try_from(rolling).unwrap_or(u32::MAX);
    match policy.max_concurrent {
        Some(cap) if rolling >= cap => Verdict::Wait(WaitFor::Capped { rolling }),
        _ => Verdict::Go,
    }
}

/// How far the clusters resolving through one config (or running one image) have got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub clusters: u32,
    pub up_to_date: u32,
    pub rolling: u32,
    pub queued: u32,
    /// Stalled, for any cause.
    pub stalled: u32,
    /// Of those, stalled on the change itself: the rollout halts.
    pub halting: u32,
    /// Outdated and held on their revision by a person.
    pub held: u32,
}

impl Tally {
    fn count(&mut self, progress: RolloutProgress) {
        self.clusters += 1;
        let bucket = match progress {
            RolloutProgress::UpToDate => &mut self.up_to_date,
            RolloutProgress::Rolling => &mut self.rolling,
            RolloutProgress::Queued => &mut self.queued,
            RolloutProgress::Stalled | RolloutProgress::Stuck => &mut self.stalled,
            RolloutProgress::Held => &mut self.held,
        };
        *bucket += 1;
        if progress == RolloutProgress::Stalled {
            self.halting += 1;
        }
    }

    /// One word for the printer column: `Held` once every cluster but the held ones is up to
    /// date.
    pub fn phase(&self, paused: bool) -> &'static str {
        let settled = self.up_to_date + self.held;
        match () {
            _ if self.halting > 0 => "Halted",
            _ if paused && settled < self.clusters => "Paused",
            _ if settled < self.clusters => "Rolling",
            _ if self.held > 0 => "Held",
            _ => "Complete",
        }
    }
}

/// Each config's tally (a cluster counts for every config of its chain) and each image's.
pub fn tallies(
    fleet: &BTreeMap<ClusterKey, Standing>,
) -> (BTreeMap<String, Tally>, BTreeMap<String, Tally>) {
    let mut configs: BTreeMap<String, Tally> = BTreeMap::new();
    let mut images: BTreeMap<String, Tally> = BTreeMap::new();
    for standing in fleet.values() {
        for config in &standing.chain {
            configs
                .entry(config.clone())
                .or_default()
                .count(standing.progress);
        }
        images
            .entry(standing.image.clone())
            .or_default()
            .count(standing.progress);
    }
    (configs, images)
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
