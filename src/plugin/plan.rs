//! `kubectl valkey plan <file>`: what applying a file of ValkeyConfigs would do, per cluster,
//! before it is applied. Each config is first sent as a server-side dry run, so admission
//! judges it as it would the real change (its refusal stops the plan; its warnings are
//! printed). Then every cluster resolving through a changed config is resolved before and
//! after, with the operator's own resolution: it `rolls` (the image, its version, the
//! resources or a setting Valkey reads only at start change), changes `live` (settings applied
//! in place) or sees `nothing`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde::Deserialize;

use super::status::table;
use crate::api::{ValkeyCluster, ValkeyConfig, ValkeyImage};
use crate::fleet::resolve::{self, EffectiveConfig, WithConfig};
use crate::fleet::{ClusterKey, Fleet};
use crate::valkey::setting_impact::needs_restart;

/// What a change does to one cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effect {
    Rolls,
    Live,
    Nothing,
}

impl Effect {
    fn word(self) -> &'static str {
        match self {
            Effect::Rolls => "rolls",
            Effect::Live => "live",
            Effect::Nothing => "nothing",
        }
    }
}

/// Reads `file`, dry-runs each config on the server, and prints each cluster's effect.
pub async fn plan(client: &Client, file: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut changed: Vec<(ValkeyConfig, serde_json::Value)> = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(document).context("reading the YAML")?;
        if value.is_null() {
            continue;
        }
        if value.get("kind").and_then(|k| k.as_str()) != Some("ValkeyConfig") {
            bail!(
                "plan reads ValkeyConfigs only; {} holds another kind",
                file.display()
            );
        }
        let config: ValkeyConfig =
            serde_json::from_value(value.clone()).context("reading a ValkeyConfig")?;
        changed.push((config, value));
    }
    let mut out = String::new();
    let configs: Api<ValkeyConfig> = Api::all(client.clone());
    for (config, body) in &changed {
        let name = config.name_any();
        // Forced: only a dry run, which owns no field afterwards.
        let params = PatchParams::apply("kubectl-valkey-plan").force().dry_run();
        configs
            .patch(&name, &params, &Patch::Apply(body))
            .await
            .with_context(|| format!("admission refused ValkeyConfig {name}"))?;
        let _ = writeln!(out, "valkeyconfig/{name}: admitted (server dry run)");
    }
    let fleet = fleet_of(client).await?;
    let mut rows = vec![["NAMESPACE", "CLUSTER", "CONFIG", "EFFECT"].map(String::from)];
    for (config, _) in &changed {
        for (key, effect) in effects(&fleet, &config.name_any(), &config.spec) {
            let config_ref = fleet
                .cluster_config_ref(&key)
                .unwrap_or_default()
                .to_owned();
            rows.push([
                key.namespace,
                key.name,
                config_ref,
                effect.word().to_owned(),
            ]);
        }
    }
    out.push_str(&table(&rows));
    Ok(out)
}

/// The fleet index, from the API server's images, configs and clusters.
async fn fleet_of(client: &Client) -> anyhow::Result<Fleet> {
    let all = ListParams::default();
    let mut fleet = Fleet::default();
    let images: Api<ValkeyImage> = Api::all(client.clone());
    for image in images
        .list(&all)
        .await
        .context("listing ValkeyImages")?
        .items
    {
        fleet.upsert_image(&image.name_any(), image.spec);
    }
    let configs: Api<ValkeyConfig> = Api::all(client.clone());
    for config in configs
        .list(&all)
        .await
        .context("listing ValkeyConfigs")?
        .items
    {
        fleet.upsert_config(&config.name_any(), config.spec);
    }
    let clusters: Api<ValkeyCluster> = Api::all(client.clone());
    for cluster in clusters
        .list(&all)
        .await
        .context("listing ValkeyClusters")?
        .items
    {
        fleet.upsert_cluster(ClusterKey::of(&cluster), &cluster.spec.config_ref);
    }
    Ok(fleet)
}

/// Each cluster resolving through config `name` and what `spec` in its place does to it.
pub fn effects(
    fleet: &Fleet,
    name: &str,
    spec: &crate::api::ValkeyConfigSpec,
) -> BTreeMap<ClusterKey, Effect> {
    let after = WithConfig {
        inner: fleet,
        name,
        spec: Some(spec),
    };
    let mut effects = BTreeMap::new();
    for key in fleet.clusters_resolving_through(name) {
        let Some(config_ref) = fleet.cluster_config_ref(&key) else {
            continue;
        };
        let before = resolve::resolve(config_ref, fleet).ok();
        let now = resolve::resolve(config_ref, &after).ok();
        let effect = match (before, now) {
            (Some(before), Some(now)) => effect(&before, &now),
            // A chain that stops resolving (or starts to): nothing runs until it does.
            _ => Effect::Rolls,
        };
        effects.insert(key, effect);
    }
    effects
}

/// What moving a cluster from `before` to `after` does to its nodes.
pub fn effect(before: &EffectiveConfig, after: &EffectiveConfig) -> Effect {
    let restart_only = |config: &EffectiveConfig| -> BTreeMap<String, String> {
        (config.valkey.iter())
            .filter(|(name, _)| needs_restart(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    };
    let image = |config: &EffectiveConfig| {
        (
            config.image.spec.reference(),
            config.image.spec.version.clone(),
        )
    };
    if image(before) != image(after)
        || before.resources != after.resources
        || restart_only(before) != restart_only(after)
    {
        Effect::Rolls
    } else if before.valkey != after.valkey || before.acl != after.acl {
        Effect::Live
    } else {
        Effect::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ValkeyConfigSpec, ValkeyImageSpec};

    fn fleet() -> Fleet {
        let mut fleet = Fleet::default();
        for (name, version) in [("valkey-9-0-0", "9.0.0"), ("valkey-9-1-2", "9.1.2")] {
            fleet.upsert_image(
                name,
                ValkeyImageSpec {
                    repository: "valkey/valkey".into(),
                    tag: version.into(),
                    version: version.into(),
                },
            );
        }
        let base = ValkeyConfigSpec {
            image_ref: Some("valkey-9-0-0".into()),
            ..Default::default()
        };
        fleet.upsert_config("base", base);
        let child = ValkeyConfigSpec {
            base_ref: Some("base".into()),
            ..Default::default()
        };
        fleet.upsert_config("child", child);
        fleet.upsert_cluster(ClusterKey::new("a", "orders"), "child");
        fleet.upsert_cluster(ClusterKey::new("a", "carts"), "base");
        fleet
    }

    #[test]
    fn an_image_rolls_a_live_setting_does_not_and_the_same_spec_does_nothing() {
        let fleet = fleet();
        let spec = |image: &str, valkey: &[(&str, &str)]| ValkeyConfigSpec {
            image_ref: Some(image.into()),
            valkey: valkey
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let all = |effect| {
            BTreeMap::from([
                (ClusterKey::new("a", "carts"), effect),
                (ClusterKey::new("a", "orders"), effect),
            ])
        };
        assert_eq!(
            effects(&fleet, "base", &spec("valkey-9-1-2", &[])),
            all(Effect::Rolls)
        );
        let tuned = spec("valkey-9-0-0", &[("maxmemory-policy", "allkeys-lru")]);
        assert_eq!(effects(&fleet, "base", &tuned), all(Effect::Live));
        assert_eq!(
            effects(&fleet, "base", &spec("valkey-9-0-0", &[])),
            all(Effect::Nothing)
        );
        let child_only = ValkeyConfigSpec {
            base_ref: Some("base".into()),
            image_ref: Some("valkey-9-1-2".into()),
            ..Default::default()
        };
        assert_eq!(
            effects(&fleet, "child", &child_only),
            BTreeMap::from([(ClusterKey::new("a", "orders"), Effect::Rolls)])
        );
    }
}
