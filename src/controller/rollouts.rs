//! The fleet's rollouts as the leader sees them ([`crate::rollout`] holds the rules): each
//! cluster's standing, reported after each pass; the gate a cluster's roll step passes first;
//! and the writer of every config's and image's fleet status, with an event when a config's
//! rollout starts, halts, pauses or completes.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::api::{FleetStatus, ValkeyCluster, ValkeyConfig, ValkeyImage};
use crate::fleet::{ClusterKey, Fleet};
use crate::resolve::{Catalog, EffectiveConfig};
use crate::roll::{DesiredShape, ObservedNode, Step, WaitReason};
use crate::rollout::{
    Asking, LEARNING, Policy, Progress, Standing, Tally, Verdict, WAVE_ANNOTATION, Wave, gate,
    tallies,
};
use crate::setting_impact::needs_restart;

/// Every cluster's last standing, since this replica started leading.
#[derive(Debug, Default)]
pub struct Rollouts {
    standings: Mutex<BTreeMap<ClusterKey, Standing>>,
    leading_since: Mutex<Option<Instant>>,
}

impl Rollouts {
    /// Gates `asking` and records its standing in one step, so two clusters passing at once
    /// cannot both take the last place under a cap.
    fn admit(&self, asking: &Asking) -> Verdict {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        let verdict = gate(asking, &standings);
        let mut standing = asking.standing.clone();
        standing.progress = match verdict {
            Verdict::Go => Progress::Rolling,
            Verdict::Wait(_) if asking.started => Progress::Rolling,
            Verdict::Wait(_) => Progress::Queued,
        };
        standings.insert(asking.key.clone(), standing);
        verdict
    }

    fn record(&self, key: &ClusterKey, standing: Standing) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.insert(key.clone(), standing);
    }

    pub fn forget(&self, key: &ClusterKey) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.remove(key);
    }

    /// A new term of leadership: nothing is known of the fleet yet.
    pub fn clear(&self) {
        let mut standings = self.standings.lock().unwrap_or_else(|p| p.into_inner());
        standings.clear();
        let mut since = self.leading_since.lock().unwrap_or_else(|p| p.into_inner());
        *since = Some(Instant::now());
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
    let key = ClusterKey::new(cluster.namespace().unwrap_or_default(), cluster.name_any());
    let chain = &effective.chain.0;
    let group = chain
        .iter()
        .find(|name| fleet.config(name).is_some_and(|c| c.rollout.is_some()));
    let policy = group
        .and_then(|name| fleet.config(name))
        .and_then(|config| config.rollout.as_ref())
        .map(|rollout| Policy {
            max_concurrent: rollout.max_concurrent,
        });
    let outdated = observed.iter().any(|o| !o.is_up_to_date(desired));
    let mut standing = Standing {
        group: group.cloned(),
        chain: chain.to_vec(),
        image: effective.image.name.clone(),
        wave: Wave::from_annotation(
            cluster
                .annotations()
                .get(WAVE_ANNOTATION)
                .map(String::as_str),
        ),
        target: rollout_target(effective),
        progress: Progress::UpToDate,
    };
    if matches!(step, Step::Stalled { .. }) || !outdated || !advances_a_roll(&step) {
        standing.progress = match (&step, outdated) {
            (Step::Stalled { .. }, _) => Progress::Stalled,
            (_, false) => Progress::UpToDate,
            _ if started(observed, desired) => Progress::Rolling,
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
        started: started(observed, desired),
        mid_shard: mid_shard(observed, desired),
    };
    match rollouts.admit(&asking) {
        Verdict::Go => step,
        Verdict::Wait(why) => Step::Wait {
            reason: WaitReason::Rollout(why),
        },
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

/// The steps that move a cluster onto its new revision (or take it further): a rollout may hold
/// them back. Failovers of a dying or evicted primary, activations and waits are never held.
fn advances_a_roll(step: &Step) -> bool {
    matches!(
        step,
        Step::JoinPrimary { .. }
            | Step::JoinReplica { .. }
            | Step::Failover { .. }
            | Step::RetireNode { .. }
    )
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
    recorder: Recorder,
) {
    let configs: Api<ValkeyConfig> = Api::all(client.clone());
    let images: Api<ValkeyImage> = Api::all(client);
    let mut written: HashMap<(bool, String), FleetStatus> = HashMap::new();
    loop {
        let (config_tallies, image_tallies) = tallies(&rollouts.snapshot());
        let wanted = {
            let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
            let configs = fleet.config_names().map(|name| {
                let tally = config_tallies.get(name).copied().unwrap_or_default();
                ((true, name.clone()), status(tally, fleet.is_paused(name)))
            });
            let images = fleet.image_names().map(|name| {
                let tally = image_tallies.get(name).copied().unwrap_or_default();
                ((false, name.clone()), status(tally, false))
            });
            configs.chain(images).collect::<Vec<_>>()
        };
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
        tokio::time::sleep(STATUS_PERIOD).await;
    }
}

fn status(tally: Tally, paused: bool) -> FleetStatus {
    FleetStatus {
        clusters: tally.clusters,
        up_to_date: tally.up_to_date,
        rolling: tally.rolling,
        queued: tally.queued,
        stalled: tally.stalled,
        rollout: Some(tally.phase(paused).to_owned()),
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
    recorder: &Recorder,
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
}
