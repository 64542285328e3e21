//! The writer of every config's and image's fleet status while this replica leads, with an
//! event when a config's rollout starts, halts, pauses or completes.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::json;

use crate::api::{FleetStatus, ValkeyConfig, ValkeyImage};
use crate::controller::build::status;
use crate::controller::build::status::{ConditionType, Reason, set_condition};
use crate::controller::events::{EventRecorder, RolloutChange, RolloutEvent};
use crate::controller::memory::rollouts::Rollouts;
use crate::fleet::Fleet;
use crate::fleet::resolve;
use crate::fleet::rollout::{Tally, tallies};
use crate::fleet::window::Windows;

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
        // A new leader knows only the clusters it has reconciled: until it has had the time to
        // see them all, it writes a config's counts only once every cluster resolving through
        // it has reported (so a new config's columns fill at once), and no image's, rather
        // than counts that start from zero.
        let learning = rollouts.learning();
        let wanted = {
            let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
            wanted_statuses(&fleet, &rollouts, &written, learning)
        };
        if !learning {
            written.retain(|key, _| wanted.iter().any(|(wanted, _)| wanted == key));
        }
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
                            recorder
                                .record(&config_reference(&name), None, &event)
                                .await;
                        }
                    }
                    written.insert((is_config, name), status);
                }
                Err(error) => tracing::warn!(%name, %error, "could not write the fleet status"),
            }
        }
    }
}

/// Every config's and image's status as it should read now (see [`write_fleet_status`] for
/// what a learning leader leaves out), given what was `written` last.
fn wanted_statuses(
    fleet: &Fleet,
    rollouts: &Rollouts,
    written: &HashMap<(bool, String), FleetStatus>,
    learning: bool,
) -> Vec<((bool, String), FleetStatus)> {
    rollouts.keep_only(|key| fleet.cluster_config_ref(key).is_some());
    let standings = rollouts.snapshot();
    let (config_tallies, image_tallies) = tallies(&standings);
    let known = |name: &str| {
        !learning
            || fleet
                .clusters_resolving_through(name)
                .iter()
                .all(|key| standings.contains_key(key))
    };
    let paused = |name: &str| {
        let chain = resolve::chain_of(name, fleet).unwrap_or_default();
        chain.iter().any(|(config, _)| fleet.is_paused(config))
    };
    let before = |key: &(bool, String)| written.get(key);
    let now = Timestamp::now();
    let configs = fleet.config_names().filter(|name| known(name)).map(|name| {
        let tally = config_tallies.get(name).copied().unwrap_or_default();
        let key = (true, name.clone());
        let mut status = status(tally, paused(name), before(&key));
        status.next_window = next_window(fleet, name, now);
        (key, status)
    });
    let images = fleet.image_names().filter(|_| !learning).map(|name| {
        let tally = image_tallies.get(name).copied().unwrap_or_default();
        let key = (false, name.clone());
        let status = status(tally, false, before(&key));
        (key, status)
    });
    configs.chain(images).collect()
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
        held: tally.held,
        next_window: None,
        rollout: Some(tally.phase(paused).to_owned()),
        conditions,
    }
}

/// When config `name`'s own rollout policy next opens a maintenance window, if it has any.
fn next_window(fleet: &Fleet, name: &str, now: Timestamp) -> Option<String> {
    let policy = resolve::Catalog::config(fleet, name)?.rollout.as_ref()?;
    let windows = Windows::of(&policy.maintenance_windows).ok()?;
    windows.next_opening(now).map(|at| at.to_string())
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

/// A config's rollout moved to another phase: the event to tell it by, if any.
fn phase_event(
    before: Option<String>,
    now: Option<String>,
    status: &FleetStatus,
) -> Option<RolloutEvent> {
    let (Some(before), Some(now)) = (before, now) else {
        return None;
    };
    let change = match (before.as_str(), now.as_str()) {
        (a, b) if a == b => return None,
        ("Complete", "Rolling") => RolloutChange::Started,
        (_, "Halted") => RolloutChange::Halted,
        (_, "Paused") => RolloutChange::Paused,
        (_, "Complete") => RolloutChange::Completed,
        (_, "Rolling") => RolloutChange::Resumed,
        _ => return None,
    };
    let counts = format!(
        "{} of {} clusters up to date, {} rolling, {} queued, {} stalled, {} held",
        status.up_to_date,
        status.clusters,
        status.rolling,
        status.queued,
        status.stalled,
        status.held
    );
    Some(RolloutEvent { change, counts })
}

/// The reference of the ValkeyConfig `name`, for its events.
fn config_reference(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(ValkeyConfig::api_version(&()).into_owned()),
        kind: Some(ValkeyConfig::kind(&()).into_owned()),
        name: Some(name.to_owned()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::events::Said;

    #[test]
    fn a_config_says_when_its_rollout_starts_halts_and_completes() {
        let status = FleetStatus::default();
        let say = |a: &str, b: &str| {
            phase_event(Some(a.into()), Some(b.into()), &status).map(|e| e.reason())
        };
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
            held: 0,
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
}
