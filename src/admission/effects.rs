//! What a config update does to each cluster resolving through it, said before it happens (a
//! `kubectl apply --dry-run=server` returns it): it rolls (and why), gets settings or users
//! live (which), nothing, or its chain stops or starts resolving; and in which rollout wave.
//! [`crate::fleet::change`] decides it, for the controller too; this file only words it.

use super::{Verdict, clip};
use crate::api::ClusterKey;
use crate::api::ValkeyConfigSpec;
use crate::fleet::Fleet;
use crate::fleet::change::Change;
use crate::fleet::resolve::{self, Catalog, WithConfig};
use crate::fleet::rollout::wave_of;
use crate::roll::rollout_waits::Wave;

/// How many clusters are named one by one before the rest are counted.
const CLUSTERS_NAMED: usize = 8;

/// The cluster's wave in its rollout, as the policy of the nearest config of its chain with
/// one places it (see [`crate::fleet::rollout::wave_of`]) in `catalog` (the configs as the change
/// makes them); the last wave without a policy.
fn wave(catalog: &impl Catalog, fleet: &Fleet, cluster: &ClusterKey) -> Wave {
    let chain = fleet
        .cluster_config_ref(cluster)
        .and_then(|config| resolve::resolve(config, catalog).ok())
        .map(|effective| effective.chain.0)
        .unwrap_or_default();
    let policy = chain
        .iter()
        .find_map(|name| catalog.config(name).and_then(|c| c.rollout.as_ref()));
    match policy {
        Some(policy) => wave_of(cluster, policy, fleet.cluster_wave_annotation(cluster)),
        None => Wave::Last,
    }
}

/// The order clusters are named in: rolls first, then chains that stop or start resolving, then
/// live changes, then nothing.
fn rank(change: &Change) -> usize {
    match change {
        Change::Rolls(_) => 0,
        Change::StopsResolving | Change::ResolvesAgain => 1,
        Change::Live { .. } => 2,
        Change::Nothing => 3,
    }
}

/// One warning per cluster (see [`rank`]), up to [`CLUSTERS_NAMED`], then one that counts the
/// rest; each in its wave as config `name`, changed to `new_spec`, places it.
pub fn warn_changes(
    changes: &[(ClusterKey, Change)],
    fleet: &Fleet,
    (name, new_spec): (&str, &ValkeyConfigSpec),
    verdict: &mut Verdict,
) {
    let candidate = WithConfig {
        inner: fleet,
        name,
        spec: Some(new_spec),
    };
    let wave = |cluster: &ClusterKey| wave(&candidate, fleet, cluster);
    if changes.iter().all(|(_, c)| *c == Change::Nothing) {
        return;
    }
    let mut sorted: Vec<&(ClusterKey, Change)> = changes.iter().collect();
    sorted.sort_by_key(|(cluster, change)| (rank(change), wave(cluster), cluster.clone()));
    for (cluster, change) in sorted.iter().take(CLUSTERS_NAMED) {
        let wave = wave(cluster);
        verdict.warn(clip(format!("{cluster} ({wave}): {change}.")));
    }
    let rest = &sorted[sorted.len().min(CLUSTERS_NAMED)..];
    if !rest.is_empty() {
        let count = |r: usize| rest.iter().filter(|(_, c)| rank(c) == r).count();
        verdict.warn(format!(
            "and {} more ValkeyClusters: {} roll, {} stop or start resolving, {} change live, {} unchanged.",
            rest.len(),
            count(0),
            count(1),
            count(2),
            count(3),
        ));
    }
}
