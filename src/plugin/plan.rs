//! `kubectl valkey plan <file>`: what applying a file of ValkeyConfigs would do, per cluster,
//! before it is applied. Each config is first sent as a server-side dry run, so admission
//! judges it as it would the real change (its refusal stops the plan; its warnings are
//! printed). Then every cluster resolving through a changed config is resolved before and
//! after, and [`crate::fleet::change`] (the rule the controller and admission call) says what
//! happens to it: it `rolls` (and why), changes `live` (which settings, users), sees `nothing`,
//! or is `unresolved` (its chain stops or starts resolving).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde::Deserialize;

use super::status::table;
use crate::api::ClusterKey;
use crate::api::{ValkeyCluster, ValkeyConfig, ValkeyImage};
use crate::fleet::Fleet;
use crate::fleet::change::{Change, changes_through};

/// Reads `file`, dry-runs each config on the server, and prints each cluster's effect.
pub async fn plan(client: &Client, file: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut changed: Vec<(ValkeyConfig, serde_json::Value)> = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
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
    let configs: Vec<&ValkeyConfig> = changed.iter().map(|(config, _)| config).collect();
    out.push_str(&table(&rows(&fleet, &configs)));
    Ok(out)
}

/// The plan's table: a header, then a row per cluster resolving through each of `configs`
/// (as the file has them), with what the change does to it.
pub fn rows(fleet: &Fleet, configs: &[&ValkeyConfig]) -> Vec<[String; 5]> {
    let mut rows = vec![["NAMESPACE", "CLUSTER", "CONFIG", "EFFECT", "WHY"].map(String::from)];
    for config in configs {
        for (key, change) in changes_through(fleet, &config.name_any(), Some(&config.spec)) {
            let config_ref = fleet
                .cluster_config_ref(&key)
                .unwrap_or_default()
                .to_owned();
            rows.push([
                key.namespace,
                key.name,
                config_ref,
                change.word().to_owned(),
                why(&change),
            ]);
        }
    }
    rows
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

/// The WHY column: what rolls or changes live, or how the chain stops or starts resolving.
fn why(change: &Change) -> String {
    match change {
        Change::Rolls(reason) => reason.to_string(),
        Change::Nothing => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::change::RollReason;

    #[test]
    fn the_why_column_says_what_rolls_and_what_is_set_live() {
        let image = Change::Rolls(RollReason::Image {
            from: "valkey-9-0-0".into(),
            to: "valkey-9-1-2".into(),
        });
        assert_eq!(why(&image), "image valkey-9-0-0 → valkey-9-1-2");
        let live = Change::Live {
            set: vec!["maxmemory-policy".into()],
            removed: vec![],
            users: false,
        };
        assert_eq!(why(&live), "CONFIG SET maxmemory-policy live");
        assert_eq!(why(&Change::Nothing), "");
    }
}
