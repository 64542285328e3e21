//! The fleet's rollouts as the leader sees them ([`crate::rollout`] holds the rules): each
//! cluster's standing, reported after each pass; the gate a cluster's roll step passes first;
//! and the writer of every config's and image's fleet status, with an event when a config's
//! rollout starts, halts, pauses or completes.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::events::EventRecorder;
use super::memory::ClusterMemory;
use super::status::{self, ConditionType, Reason, set_condition};
use crate::api::annotations::ROLLOUT_WAVE;
use crate::api::{FleetStatus, ValkeyCluster, ValkeyConfig, ValkeyImage};
use crate::fleet::{ClusterKey, Fleet};
use crate::resolve::{self, Catalog, EffectiveConfig};
use crate::roll::{DesiredShape, Lifecycle, ObservedNode, Role, StallReason, Step, WaitReason};
use crate::rollout::{
    Asking, LEARNING, Policy, Progress, Standing, Tally, Verdict, WaitFor, Wave, gate, tallies,
    wave_of,
};
use crate::setting_impact::needs_restart;

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
fn moves_the_gate(before: Progress, after: Progress) -> bool {
    match (before, after) {
        (Progress::Rolling, Progress::UpToDate | Progress::Queued) => true,
        (Progress::Stalled, other) | (other, Progress::Stalled) => other != Progress::Stalled,
        (Progress::Rolling, Progress::Stuck) => true,
        _ => false,
    }
}

impl Rollouts {
    /// Puts `standing` in place of `key`'s, noting the queued clusters of its group to wake
    /// when the change moves the gate for them.
    fn replace(
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
                *other != key && s.group == standing.group && s.progress == Progress::Queued
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
    fn admit(&self, asking: &Asking) -> Verdict {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        let verdict = gate(asking, &standings);
        let mut standing = asking.standing.clone();
        // Between shards and held, a started cluster waits like a queued one: counted as
        // rolling, three held clusters under a cap of two would wait for each other forever.
        standing.progress = match verdict {
            Verdict::Go => Progress::Rolling,
            Verdict::Wait(_) if asking.mid_shard => Progress::Rolling,
            Verdict::Wait(_) => Progress::Queued,
        };
        self.replace(&mut standings, asking.key, standing);
        verdict
    }

    fn record(&self, key: &ClusterKey, standing: Standing) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        self.replace(&mut standings, key, standing);
    }

    /// The cluster left the fleet (deleted, or no longer resolving through a rollout's config).
    pub fn forget(&self, key: &ClusterKey) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut gone) = standings.get(key).cloned() {
            // Gone counts as done: its place under the cap is free.
            gone.progress = Progress::UpToDate;
            self.replace(&mut standings, key, gone);
        }
        standings.remove(key);
    }

    /// A new term of leadership: nothing is known of the fleet yet.
    fn clear(&self) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.clear();
        let mut since = self.leading_since.lock().unwrap_or_else(|p| p.into_inner());
        *since = Some(Instant::now());
    }

    /// Drops the standings of clusters that are gone (deleted without a cleanup pass).
    fn keep_only(&self, exists: impl Fn(&ClusterKey) -> bool) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.retain(|key, _| exists(key));
    }

    fn learning(&self) -> bool {
        let since = self.leading_since.lock().unwrap_or_else(|p| p.into_inner());
        since.is_none_or(|at| at.elapsed() < LEARNING)
    }

    fn snapshot(&self) -> BTreeMap<ClusterKey, Standing> {
        let standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.clone()
    }
}

/// The step to perform after the gate: `step` itself, or a wait when it would advance a roll the
/// rollout does not allow yet. Records the cluster's standing either way.
pub fn gated(
    rollouts: &Rollouts,
    fleet: &Fleet,
    cluster: &ValkeyCluster,
    effective: &EffectiveConfig,
    observed: &[ObservedNode],
    desired: &DesiredShape,
    step: Step,
) -> Step {
    let key = ClusterKey::of(cluster);
    let chain = &effective.chain.0;
    let group = chain
        .iter()
        .find(|name| fleet.config(name).is_some_and(|c| c.rollout.is_some()));
    let group_policy = group
        .and_then(|name| fleet.config(name))
        .and_then(|config| config.rollout.as_ref());
    let policy = group_policy.map(|rollout| Policy {
        max_concurrent: rollout.max_concurrent,
    });
    let annotation = cluster.annotations().get(ROLLOUT_WAVE).map(String::as_str);
    let outdated = observed.iter().any(|o| !o.is_up_to_date(desired));
    // The group's own resolution, so every member of a change compares alike whatever its
    // child config adds; without a group, the cluster's own.
    let group_effective = group.and_then(|name| resolve::resolve(name, fleet).ok());
    let mut standing = Standing {
        group: group.cloned(),
        chain: chain.to_vec(),
        image: effective.image.name.clone(),
        wave: match group_policy {
            Some(policy) => wave_of(&key, policy, annotation),
            None => Wave::Last,
        },
        target: rollout_target(group_effective.as_ref().unwrap_or(effective)),
        progress: Progress::UpToDate,
    };
    let started = started(observed, desired);
    let held = advances_a_roll(&step, observed, desired);
    // Nodes that refuse the operator's login (its Secret or its users changed by hand): the
    // cluster is stuck for a cause of its own. It is healed, but its roll waits: it holds no
    // place under a cap, so it must not move one on.
    let locked_out = observed.iter().any(|o| o.locked_out);
    if locked_out && outdated && held {
        standing.progress = Progress::Stuck;
        rollouts.record(&key, standing);
        return Step::Wait {
            reason: WaitReason::Rollout(WaitFor::LoginRefused),
        };
    }
    if matches!(step, Step::Stalled { .. }) || !outdated || !held {
        standing.progress = match (&step, outdated) {
            (_, true) if locked_out => Progress::Stuck,
            // Only a stall of the change itself halts the rollout; one for a cause of the
            // cluster's own (a dead primary, say) holds nobody up.
            (Step::Stalled { reason }, true) if stall_of_the_change(reason, observed, desired) => {
                Progress::Stalled
            }
            (Step::Stalled { .. }, true) => Progress::Stuck,
            (_, false) => Progress::UpToDate,
            _ if started => Progress::Rolling,
            _ => Progress::Queued,
        };
        rollouts.record(&key, standing);
        return step;
    }
    let members = group
        .map(|name| fleet.clusters_resolving_through(name))
        .unwrap_or_default();
    let asking = Asking {
        members: &members,
        learning: rollouts.learning(),
        key: &key,
        standing: &standing,
        policy,
        paused: chain.iter().any(|name| fleet.is_paused(name)),
        started,
        mid_shard: mid_shard(observed, desired),
    };
    match rollouts.admit(&asking) {
        Verdict::Go => step,
        Verdict::Wait(why) => Step::Wait {
            reason: WaitReason::Rollout(why),
        },
    }
}

/// Whether a stall is the change's own doing: a node on the new revision that never became a
/// ready member (whatever held it up: it never answered, never synced, never caught up), new
/// nodes that keep dying while they join, or a failover onto one that never took effect. A
/// stall over the cluster's own state (a dead primary, silent copies, two primaries, a node
/// that refuses the login or a stranger at its address) is not.
fn stall_of_the_change(
    reason: &StallReason,
    observed: &[ObservedNode],
    desired: &DesiredShape,
) -> bool {
    match reason {
        StallReason::FailoverIncomplete { .. }
        | StallReason::AlreadyFailedOver { .. }
        | StallReason::JoinsLost { .. } => true,
        StallReason::JoinOverdue { node, .. } => observed
            .iter()
            .any(|o| o.name == *node && o.is_up_to_date(desired) && !o.locked_out && !o.stranger),
        _ => false,
    }
}

/// The config's share of a cluster's revision (see [`Standing::target`]), as a short digest.
fn rollout_target(effective: &EffectiveConfig) -> String {
    let mut hasher = DefaultHasher::new();
    effective.image.spec.reference().hash(&mut hasher);
    effective.image.spec.version.hash(&mut hasher);
    let resources = &effective.resources;
    resources.cpu.as_ref().map(|q| &q.0).hash(&mut hasher);
    resources.memory.as_ref().map(|q| &q.0).hash(&mut hasher);
    for (name, value) in &effective.valkey {
        if needs_restart(name) {
            (name, value).hash(&mut hasher);
        }
    }
    format!("{:016x}", hasher.finish())
}

/// The steps that move a cluster onto its new revision for the roll's sake: a rollout may hold
/// them back. Healing never waits: a new primary for a shard without one, a replica for a
/// shard below its target, retiring a node that is gone, and the handover or takeover of a
/// leaving or dead primary.
fn advances_a_roll(step: &Step, observed: &[ObservedNode], desired: &DesiredShape) -> bool {
    match step {
        Step::Failover { .. } => true,
        Step::JoinReplica { shard, .. } => {
            let replicas = observed
                .iter()
                .filter(|o| o.shard == *shard && o.reachable && o.role == Role::Replica)
                .filter(|o| o.lifecycle == Lifecycle::Active && !o.leaving && !o.terminated)
                .count();
            u32::try_from(replicas).unwrap_or(u32::MAX) >= desired.replicas_per_shard
        }
        Step::RetireNode { node, .. } => observed
            .iter()
            .any(|o| o.name == *node && o.reachable && !o.terminated),
        _ => false,
    }
}

/// Some node already runs the desired revision.
fn started(observed: &[ObservedNode], desired: &DesiredShape) -> bool {
    observed.iter().any(|o| o.revision == desired.revision)
}

/// Some shard has nodes on the desired revision and nodes on another: it is between its
/// replace and its retire.
fn mid_shard(observed: &[ObservedNode], desired: &DesiredShape) -> bool {
    let mut shards: HashMap<u32, (bool, bool)> = HashMap::new();
    for node in observed {
        let entry = shards.entry(node.shard).or_default();
        if node.revision == desired.revision {
            entry.0 = true;
        } else {
            entry.1 = true;
        }
    }
    shards.values().any(|(new, old)| *new && *old)
}

/// How often the fleet status is recomputed and written where it changed.
const STATUS_PERIOD: Duration = Duration::from_secs(2);

/// Writes each config's and image's [`FleetStatus`] while this replica leads, with events on a
/// config's rollout phase changes. Runs until dropped.
pub async fn write_fleet_status(
    client: Client,
    fleet: std::sync::Arc<std::sync::RwLock<Fleet>>,
    rollouts: std::sync::Arc<Rollouts>,
    recorder: EventRecorder,
) {
    let configs: Api<ValkeyConfig> = Api::all(client.clone());
    let images: Api<ValkeyImage> = Api::all(client);
    let mut written: HashMap<(bool, String), FleetStatus> = HashMap::new();
    loop {
        tokio::time::sleep(STATUS_PERIOD).await;
        // A new leader knows only the clusters it has reconciled: it writes nothing until it
        // has had the time to see them, rather than counts that start from zero.
        if rollouts.learning() {
            continue;
        }
        let wanted = {
            let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
            rollouts.keep_only(|key| fleet.cluster_config_ref(key).is_some());
            let (config_tallies, image_tallies) = tallies(&rollouts.snapshot());
            let paused = |name: &str| {
                let chain = resolve::chain_of(name, &*fleet).unwrap_or_default();
                chain.iter().any(|(config, _)| fleet.is_paused(config))
            };
            let before = |key: &(bool, String)| written.get(key);
            let configs = fleet.config_names().map(|name| {
                let tally = config_tallies.get(name).copied().unwrap_or_default();
                let key = (true, name.clone());
                let status = status(tally, paused(name), before(&key));
                (key, status)
            });
            let images = fleet.image_names().map(|name| {
                let tally = image_tallies.get(name).copied().unwrap_or_default();
                let key = (false, name.clone());
                let status = status(tally, false, before(&key));
                (key, status)
            });
            configs.chain(images).collect::<Vec<_>>()
        };
        written.retain(|key, _| wanted.iter().any(|(wanted, _)| wanted == key));
        for ((is_config, name), status) in wanted {
            let before = written.get(&(is_config, name.clone()));
            if before == Some(&status) {
                continue;
            }
            let patch = Patch::Merge(json!({ "status": status }));
            let params = PatchParams::default();
            let result = if is_config {
                configs
                    .patch_status(&name, &params, &patch)
                    .await
                    .map(|_| ())
            } else {
                images
                    .patch_status(&name, &params, &patch)
                    .await
                    .map(|_| ())
            };
            match result {
                Ok(()) => {
                    if is_config {
                        let phase = |s: Option<&FleetStatus>| s.and_then(|s| s.rollout.clone());
                        if let Some(event) =
                            phase_event(phase(before), phase(Some(&status)), &status)
                        {
                            publish(&recorder, &name, event).await;
                        }
                    }
                    written.insert((is_config, name), status);
                }
                Err(error) => tracing::warn!(%name, %error, "could not write the fleet status"),
            }
        }
    }
}

/// The status for `tally`, its `Halted` condition carried on from `before` (the status last
/// written) so that its transition time moves only when it turns.
fn status(tally: Tally, paused: bool, before: Option<&FleetStatus>) -> FleetStatus {
    let mut conditions = before.map(|b| b.conditions.clone()).unwrap_or_default();
    set_condition(
        &mut conditions,
        halted(&tally),
        None,
        Time(Timestamp::now()),
    );
    FleetStatus {
        clusters: tally.clusters,
        up_to_date: tally.up_to_date,
        rolling: tally.rolling,
        queued: tally.queued,
        stalled: tally.stalled,
        rollout: Some(tally.phase(paused).to_owned()),
        conditions,
    }
}

/// `Halted`: whether a cluster stalled on the change holds the rollout back, and what starts it
/// again.
fn halted(tally: &Tally) -> status::Verdict {
    let stalled = tally.halting > 0;
    status::Verdict {
        type_: ConditionType::Halted,
        status: stalled,
        reason: if stalled {
            Reason::RollStalled
        } else {
            Reason::Healthy
        },
        message: if stalled {
            format!(
                "{} of {} clusters stalled on the change: no other cluster starts rolling until the \
                 cause is fixed (kubectl get valkeyclusters -A shows which; their Degraded \
                 condition says why)",
                tally.halting, tally.clusters
            )
        } else {
            String::new()
        },
    }
}

/// A config's rollout moved to another phase: what to say (reason, note, warning).
fn phase_event(
    before: Option<String>,
    now: Option<String>,
    status: &FleetStatus,
) -> Option<(&'static str, String, bool)> {
    let (Some(before), Some(now)) = (before, now) else {
        return None;
    };
    let counts = format!(
        "{} of {} clusters up to date, {} rolling, {} queued, {} stalled",
        status.up_to_date, status.clusters, status.rolling, status.queued, status.stalled
    );
    match (before.as_str(), now.as_str()) {
        (a, b) if a == b => None,
        ("Complete", "Rolling") => Some(("RolloutStarted", counts, false)),
        (_, "Halted") => Some((
            "RolloutHalted",
            format!("a cluster stalled: {counts}"),
            true,
        )),
        (_, "Paused") => Some(("RolloutPaused", counts, false)),
        (_, "Complete") => Some(("RolloutCompleted", counts, false)),
        (_, "Rolling") => Some(("RolloutResumed", counts, false)),
        _ => None,
    }
}

async fn publish(
    recorder: &EventRecorder,
    config: &str,
    (reason, note, warning): (&'static str, String, bool),
) {
    let reference = ObjectReference {
        api_version: Some(ValkeyConfig::api_version(&()).into_owned()),
        kind: Some(ValkeyConfig::kind(&()).into_owned()),
        name: Some(config.to_owned()),
        ..Default::default()
    };
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note),
        action: "Rollout".into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &reference).await {
        tracing::warn!(%config, %error, "could not record a rollout event");
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
            wave: Wave::Last,
            target: String::new(),
            progress: Progress::UpToDate,
        };
        self.record(cluster, standing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_says_when_its_rollout_starts_halts_and_completes() {
        let status = FleetStatus::default();
        let say =
            |a: &str, b: &str| phase_event(Some(a.into()), Some(b.into()), &status).map(|e| e.0);
        assert_eq!(say("Complete", "Rolling"), Some("RolloutStarted"));
        assert_eq!(say("Rolling", "Halted"), Some("RolloutHalted"));
        assert_eq!(say("Halted", "Rolling"), Some("RolloutResumed"));
        assert_eq!(say("Rolling", "Paused"), Some("RolloutPaused"));
        assert_eq!(say("Rolling", "Complete"), Some("RolloutCompleted"));
        assert_eq!(say("Rolling", "Rolling"), None);
        assert_eq!(phase_event(None, Some("Rolling".into()), &status), None);
    }

    #[test]
    fn a_halt_is_a_condition_that_turns_only_when_the_stall_comes_and_goes() {
        let rolling = Tally {
            clusters: 6,
            up_to_date: 1,
            rolling: 1,
            queued: 4,
            stalled: 0,
            halting: 0,
        };
        let halted_tally = Tally {
            stalled: 1,
            halting: 1,
            rolling: 0,
            ..rolling
        };
        let halt = |status: &FleetStatus| {
            let c = &status.conditions[0];
            (c.type_.clone(), c.status.clone(), c.reason.clone())
        };
        let first = status(rolling, false, None);
        assert_eq!(
            halt(&first),
            ("Halted".into(), "False".into(), "Healthy".into())
        );
        assert_eq!(
            status(rolling, false, Some(&first)),
            first,
            "nothing to write again"
        );
        let stalled = status(halted_tally, false, Some(&first));
        assert_eq!(
            halt(&stalled),
            ("Halted".into(), "True".into(), "RollStalled".into())
        );
        assert!(
            stalled.conditions[0]
                .message
                .starts_with("1 of 6 clusters stalled")
        );
        assert_eq!(stalled.conditions.len(), 1);
    }

    fn standing(group: &str, progress: Progress) -> Standing {
        Standing {
            group: Some(group.into()),
            chain: vec![group.into()],
            image: "valkey-9-1-2".into(),
            wave: Wave::from_annotation(None),
            target: "t".into(),
            progress,
        }
    }

    #[test]
    fn a_place_freed_or_a_halt_wakes_the_queued_clusters_of_its_group_once() {
        let rollouts = Rollouts::default();
        let key = |name: &str| ClusterKey::new("shop", name);
        rollouts.record(&key("a"), standing("fleet", Progress::Rolling));
        rollouts.record(&key("b"), standing("fleet", Progress::Queued));
        rollouts.record(&key("c"), standing("fleet", Progress::Queued));
        rollouts.record(&key("other"), standing("elsewhere", Progress::Queued));
        assert!(rollouts.take_wakes().is_empty(), "nothing freed yet");
        rollouts.record(&key("a"), standing("fleet", Progress::Rolling));
        assert!(rollouts.take_wakes().is_empty(), "still rolling");
        rollouts.record(&key("a"), standing("fleet", Progress::UpToDate));
        assert_eq!(rollouts.take_wakes(), vec![key("b"), key("c")]);
        assert!(rollouts.take_wakes().is_empty(), "each wake is taken once");

        rollouts.record(&key("b"), standing("fleet", Progress::Rolling));
        assert!(rollouts.take_wakes().is_empty(), "b took a place");
        rollouts.record(&key("b"), standing("fleet", Progress::Stalled));
        assert_eq!(rollouts.take_wakes(), vec![key("c")], "halted now");
        rollouts.record(&key("b"), standing("fleet", Progress::Rolling));
        assert_eq!(rollouts.take_wakes(), vec![key("c")], "a halt lifted");
        rollouts.forget(&key("b"));
        assert_eq!(
            rollouts.take_wakes(),
            vec![key("c")],
            "a deleted cluster's place"
        );
    }
}
