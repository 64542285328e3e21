//! Fleet impact: which clusters a change of a config's effective image rolls, and the warnings
//! (or, above the operator's threshold, the refusal) that tell the user before it happens.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use semver::Version;

use super::{Policy, Verdict, clip, plural, some_of};
use crate::api::ClusterKey;
use crate::api::annotations::{ROLLOUT_PAUSED, ROLLOUT_WAVE};
use crate::api::{RolloutPolicy, ValkeyConfigSpec, annotations};
use crate::fleet::Fleet;
use crate::fleet::change::{Change, RollReason, change};
use crate::fleet::resolve::{self, Catalog, ResolvedImage, WithConfig};
use crate::fleet::window::{Opening, Windows};

/// How many cluster names a warning shows before "and N more".
const NAMES_SHOWN: usize = 3;

/// The image clusters move between, and which clusters move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageChange {
    pub from: ResolvedImage,
    pub to: ResolvedImage,
    /// Sorted.
    pub clusters: Vec<ClusterKey>,
}

/// Whether moving between two images lowers the engine version.
pub fn is_downgrade(from: &ResolvedImage, to: &ResolvedImage) -> bool {
    match (
        Version::parse(&from.spec.version),
        Version::parse(&to.spec.version),
    ) {
        (Ok(from), Ok(to)) => to < from,
        _ => false,
    }
}

/// The images `before` and `after` (config names, resolved in their catalogs) run, when the
/// move between them rolls for its image ([`crate::fleet::change`]'s rule).
fn image_roll(
    (before, old): (&str, &impl Catalog),
    (after, new): (&str, &impl Catalog),
) -> Option<(ResolvedImage, ResolvedImage)> {
    let from = resolve::resolve(before, old).ok()?;
    let to = resolve::resolve(after, new).ok()?;
    match change(Some(&from), Some(&to)) {
        Change::Rolls(RollReason::Image { .. }) => Some((from.image, to.image)),
        _ => None,
    }
}

/// The clusters whose image changes if config `name` takes `new_spec` (`None`: is deleted):
/// its own clusters and those of every config that inherits from it without overriding the image.
pub fn config_image_change(
    fleet: &Fleet,
    name: &str,
    new_spec: Option<&ValkeyConfigSpec>,
) -> Option<ImageChange> {
    let candidate = WithConfig {
        inner: fleet,
        name,
        spec: new_spec,
    };
    let mut change: Option<ImageChange> = None;
    for config in fleet.config_and_descendants(name) {
        let Some((from, to)) = image_roll((&config, fleet), (&config, &candidate)) else {
            continue;
        };
        let entry = change.get_or_insert_with(|| ImageChange {
            from,
            to,
            clusters: Vec::new(),
        });
        entry
            .clusters
            .extend(fleet.clusters_using(&config).cloned());
    }
    let mut change = change?;
    if change.clusters.is_empty() {
        return None;
    }
    change.clusters.sort();
    Some(change)
}

/// The image change of one cluster switching `configRef` from `old_ref` to `new_ref`.
pub fn config_ref_image_change(
    fleet: &Fleet,
    old_ref: &str,
    new_ref: &str,
) -> Option<(ResolvedImage, ResolvedImage)> {
    image_roll((old_ref, fleet), (new_ref, fleet))
}

fn describe(image: &ResolvedImage) -> String {
    format!("{} ({})", image.name, image.spec.reference())
}

fn downgrade_warning(from: &ResolvedImage, to: &ResolvedImage) -> String {
    clip(format!(
        "This is a downgrade ({} → {}): downgrades are not routinely exercised. Stage it: try it on a non-critical cluster first.",
        from.spec.version, to.spec.version
    ))
}

/// Warns (or refuses, past the policy's threshold without acknowledgement) a config change that
/// rolls clusters; `now` is when, for the maintenance windows.
pub fn judge_config_change(
    change: &ImageChange,
    config_name: &str,
    acknowledgement: Option<&str>,
    pacing: &Pacing,
    policy: &Policy,
    now: Timestamp,
    verdict: &mut Verdict,
) {
    let count = change.clusters.len();
    let clusters = plural(count, "ValkeyCluster");
    if let Some(threshold) = policy.fleet_roll_ack_threshold
        && count > threshold
        && acknowledgement != Some(change.to.name.as_str())
    {
        verdict.deny(format!(
            "spec.imageRef: this change rolls {clusters} at once ({}), more than the operator's fleetRollAckThreshold of {threshold}. \
             Stage it instead (duplicate ValkeyConfig {config_name} under a new name on image {} and move clusters by spec.configRef), \
             or acknowledge the fleet-wide roll by setting the annotation {}: \"{}\" in the same change",
            some_of(&change.clusters, NAMES_SHOWN),
            change.to.name,
            annotations::ACKNOWLEDGE_FLEET_ROLL,
            change.to.name,
        ));
        return;
    }
    let when = if pacing.paced.is_empty() {
        " at once"
    } else {
        ""
    };
    verdict.warn(clip(format!(
        "Changing ValkeyConfig {config_name}'s image from {} to {} rolls {clusters}{when}: {}.",
        describe(&change.from),
        describe(&change.to),
        some_of(&change.clusters, NAMES_SHOWN),
    )));
    if pacing.paced.is_empty() {
        verdict.warn(
            "All of them start rolling immediately; nothing staggers them (each cluster rolls one shard at a time).",
        );
        verdict.warn(clip(format!(
            "To stage instead: set spec.rollout on ValkeyConfig {config_name} (maxConcurrent; waves naming clusters), \
             or copy it as {config_name}-v2 on the new image and move clusters one at a time by spec.configRef."
        )));
    }
    for (group, (rollout, clusters)) in &pacing.paced {
        warn_paced(group, rollout, clusters, now, verdict);
    }
    if pacing.unpaced > 0 && !pacing.paced.is_empty() {
        verdict.warn(clip(format!(
            "{} of them have no rollout policy in their baseRef chains: they start rolling immediately.",
            pacing.unpaced,
        )));
    }
    if is_downgrade(&change.from, &change.to) {
        verdict.warn(downgrade_warning(&change.from, &change.to));
    }
}

/// How one rollout group's clusters will roll: its cap, its waves, its halt, its windows.
fn warn_paced(
    group: &str,
    rollout: &RolloutPolicy,
    clusters: &[ClusterKey],
    now: Timestamp,
    verdict: &mut Verdict,
) {
    let cap = match rollout.max_concurrent {
        Some(cap) => format!("at most {cap} rolling at once"),
        None => "no cap on how many roll at once".to_owned(),
    };
    let waves = match (rollout.waves.len(), rollout.allow_wave_annotation) {
        (0, false) => "in one wave".to_owned(),
        (0, true) => format!("in waves by the {ROLLOUT_WAVE} annotation"),
        (n, false) => format!("in {} named first, the rest last", plural(n, "wave")),
        (n, true) => format!(
            "in {} named first, then by the {ROLLOUT_WAVE} annotation, the rest last",
            plural(n, "wave")
        ),
    };
    verdict.warn(clip(format!(
        "{} paced by ValkeyConfig {group}'s spec.rollout: {cap}, {waves}.",
        plural(clusters.len(), "ValkeyCluster"),
    )));
    verdict.warn(clip(format!(
        "A stall on the new image halts the rest of {group}'s rollout; {ROLLOUT_PAUSED}: \"true\" on the config pauses it."
    )));
    if let Some(when) = window_warning(group, rollout, clusters, now) {
        verdict.warn(clip(when));
    }
}

/// When a group's clusters may start rolling, by its maintenance windows (none: `None`).
fn window_warning(
    group: &str,
    rollout: &RolloutPolicy,
    clusters: &[ClusterKey],
    now: Timestamp,
) -> Option<String> {
    let windows = Windows::of(&rollout.maintenance_windows).ok()?;
    let which = some_of(clusters, NAMES_SHOWN);
    match windows.at(now) {
        Opening::Always => None,
        Opening::ClosedUntil(opens) => Some(format!(
            "ValkeyConfig {group}'s maintenance windows are closed now: {which} start rolling when the next opens, at {opens}, and only inside a window."
        )),
        Opening::OpenUntil(closes) => {
            let next = windows
                .next_opening(closes)
                .map_or(String::new(), |next| format!(", at {next}"));
            Some(format!(
                "ValkeyConfig {group}'s maintenance window is open until {closes}: {which} start rolling now; any not started by then waits for the next window{next}."
            ))
        }
    }
}

/// How the clusters a change rolls are paced: by the policy of the nearest config with one in
/// each cluster's chain, as the chain would be after the change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pacing {
    /// The config whose policy paces them: the policy, and its clusters.
    pub paced: BTreeMap<String, (RolloutPolicy, Vec<ClusterKey>)>,
    /// Clusters with no policy in their chain.
    pub unpaced: usize,
}

/// The [`Pacing`] of `clusters` if config `name` takes `new_spec`.
pub fn pacing(
    fleet: &Fleet,
    name: &str,
    new_spec: Option<&ValkeyConfigSpec>,
    clusters: &[ClusterKey],
) -> Pacing {
    let candidate = WithConfig {
        inner: fleet,
        name,
        spec: new_spec,
    };
    let mut pacing = Pacing::default();
    for cluster in clusters {
        let chain = fleet
            .cluster_config_ref(cluster)
            .and_then(|config| resolve::chain_of(config, &candidate).ok())
            .unwrap_or_default();
        let policy = chain
            .into_iter()
            .find_map(|(config, spec)| Some((config, spec.rollout.clone()?)));
        match policy {
            Some((config, rollout)) => {
                let (_, members) = pacing.paced.entry(config).or_insert((rollout, Vec::new()));
                members.push(cluster.clone());
            }
            None => pacing.unpaced += 1,
        }
    }
    pacing
}

/// Warns of the roll a cluster's `configRef` switch starts.
pub fn judge_config_ref_switch(
    from_ref: &str,
    to_ref: &str,
    from: &ResolvedImage,
    to: &ResolvedImage,
    verdict: &mut Verdict,
) {
    verdict.warn(clip(format!(
        "Switching spec.configRef from {from_ref} to {to_ref} changes this cluster's image from {} to {}: it rolls now, one shard at a time.",
        describe(from),
        describe(to),
    )));
    if is_downgrade(from, to) {
        verdict.warn(downgrade_warning(from, to));
    }
}
