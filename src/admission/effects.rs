//! What a config update does to each cluster resolving through it, said before it happens (a
//! `kubectl apply --dry-run=server` returns it): it rolls (and why), gets a live `CONFIG SET`
//! (of which settings), or nothing; and in which rollout wave. The same inputs as the
//! controller's revision: the image and its version, resources, and the settings that need a
//! restart roll; the other settings are set live.

use std::collections::BTreeSet;
use std::fmt;

use super::{Verdict, clip};
use crate::api::ValkeyConfigSpec;
use crate::fleet::resolve::{self, Catalog, EffectiveConfig, WithConfig};
use crate::fleet::rollout::{Wave, wave_of};
use crate::fleet::{ClusterKey, Fleet};
use crate::valkey::setting_impact::needs_restart;

/// How many clusters are named one by one before the rest are counted.
const CLUSTERS_NAMED: usize = 8;

/// What a change does to one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Its nodes are replaced, for this reason.
    Rolls(String),
    /// These settings are set live on every node; the removed ones keep their value until the
    /// nodes are replaced (the operator sets what a config names, it does not unset).
    Live {
        set: Vec<String>,
        removed: Vec<String>,
    },
    Nothing,
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Effect::Rolls(why) => write!(f, "rolls ({why})"),
            Effect::Live { set, removed } => {
                if !set.is_empty() {
                    write!(f, "CONFIG SET {} live", set.join(", "))?;
                }
                if !set.is_empty() && !removed.is_empty() {
                    f.write_str("; ")?;
                }
                if !removed.is_empty() {
                    write!(
                        f,
                        "{} removed: nodes keep the value until replaced",
                        removed.join(", ")
                    )?;
                }
                Ok(())
            }
            Effect::Nothing => f.write_str("nothing"),
        }
    }
}

/// The effect of moving from `old` to `new`.
pub fn effect(old: &EffectiveConfig, new: &EffectiveConfig) -> Effect {
    let (from, to) = (&old.image, &new.image);
    if from.spec.reference() != to.spec.reference() || from.spec.version != to.spec.version {
        return Effect::Rolls(format!("image {} → {}", from.name, to.name));
    }
    if old.resources != new.resources {
        return Effect::Rolls("resources".into());
    }
    let names: BTreeSet<&String> = old.valkey.keys().chain(new.valkey.keys()).collect();
    let changed: Vec<&String> = names
        .into_iter()
        .filter(|name| old.valkey.get(*name) != new.valkey.get(*name))
        .collect();
    let (restart, live): (Vec<&String>, Vec<&String>) =
        changed.into_iter().partition(|name| needs_restart(name));
    if !restart.is_empty() {
        let names: Vec<&str> = restart.iter().map(|s| s.as_str()).collect();
        return Effect::Rolls(format!("{} only take effect at start", names.join(", ")));
    }
    if !live.is_empty() {
        let (set, removed): (Vec<&String>, Vec<&String>) = live
            .into_iter()
            .partition(|name| new.valkey.contains_key(*name));
        return Effect::Live {
            set: set.into_iter().cloned().collect(),
            removed: removed.into_iter().cloned().collect(),
        };
    }
    Effect::Nothing
}

/// Each cluster resolving through config `name`, and what `new_spec` would do to it; clusters
/// whose config does not resolve before or after are left out (other warnings cover them).
pub fn cluster_effects(
    fleet: &Fleet,
    name: &str,
    new_spec: &ValkeyConfigSpec,
) -> Vec<(ClusterKey, Effect)> {
    let candidate = WithConfig {
        inner: fleet,
        name,
        spec: Some(new_spec),
    };
    fleet
        .clusters_resolving_through(name)
        .into_iter()
        .filter_map(|cluster| {
            let config = fleet.cluster_config_ref(&cluster)?;
            let old = resolve::resolve(config, fleet).ok()?;
            let new = resolve::resolve(config, &candidate).ok()?;
            Some((cluster, effect(&old, &new)))
        })
        .collect()
}

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

/// One warning per cluster (rolls first, then live changes, then nothing), up to
/// [`CLUSTERS_NAMED`], then one that counts the rest; each in its wave as config `name`, changed
/// to `new_spec`, places it.
pub fn warn_effects(
    effects: &[(ClusterKey, Effect)],
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
    if effects.iter().all(|(_, e)| *e == Effect::Nothing) {
        return;
    }
    let rank = |effect: &Effect| match effect {
        Effect::Rolls(_) => 0,
        Effect::Live { .. } => 1,
        Effect::Nothing => 2,
    };
    let mut sorted: Vec<&(ClusterKey, Effect)> = effects.iter().collect();
    sorted.sort_by_key(|(cluster, effect)| (rank(effect), wave(cluster), cluster.clone()));
    for (cluster, effect) in sorted.iter().take(CLUSTERS_NAMED) {
        let wave = wave(cluster);
        verdict.warn(clip(format!("{cluster} ({wave}): {effect}.")));
    }
    let rest = &sorted[sorted.len().min(CLUSTERS_NAMED)..];
    if !rest.is_empty() {
        let count = |r: usize| rest.iter().filter(|(_, e)| rank(e) == r).count();
        verdict.warn(format!(
            "and {} more ValkeyClusters: {} roll, {} get a live CONFIG SET, {} unchanged.",
            rest.len(),
            count(0),
            count(1),
            count(2),
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::{NodeResources, ValkeyImageSpec};
    use crate::fleet::resolve::{Chain, ResolvedImage};

    fn effective(tag: &str, settings: &[(&str, &str)]) -> EffectiveConfig {
        EffectiveConfig {
            chain: Chain(vec!["c".into()]),
            image: ResolvedImage {
                name: format!("valkey-{tag}"),
                spec: ValkeyImageSpec {
                    repository: "valkey/valkey".into(),
                    tag: tag.into(),
                    version: tag.into(),
                },
            },
            resources: NodeResources::default(),
            valkey: settings
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            acl: Vec::new(),
        }
    }

    #[test]
    fn an_image_or_a_start_only_setting_rolls_a_live_setting_is_set_and_the_rest_is_nothing() {
        let old = effective("9.0.0", &[("maxmemory", "1gb")]);
        assert_eq!(
            effect(&old, &effective("9.1.2", &[("maxmemory", "1gb")])),
            Effect::Rolls("image valkey-9.0.0 → valkey-9.1.2".into())
        );
        assert_eq!(
            effect(&old, &effective("9.0.0", &[("maxmemory", "2gb")])),
            Effect::Live {
                set: vec!["maxmemory".into()],
                removed: vec![],
            }
        );
        let removed = effect(&old, &effective("9.0.0", &[]));
        assert_eq!(
            removed.to_string(),
            "maxmemory removed: nodes keep the value until replaced"
        );
        let restart = effective("9.0.0", &[("maxmemory", "1gb"), ("databases", "4")]);
        assert!(matches!(effect(&old, &restart), Effect::Rolls(why) if why.contains("databases")));
        assert_eq!(effect(&old, &old.clone()), Effect::Nothing);
        let both = Effect::Live {
            set: vec!["maxmemory".into(), "hz".into()],
            removed: vec![],
        };
        assert_eq!(both.to_string(), "CONFIG SET maxmemory, hz live");
    }
}
