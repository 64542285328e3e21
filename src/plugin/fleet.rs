//! `kubectl valkey fleet [config]`: every config's rollout (its status as the operator writes
//! it) and, under it, each cluster resolving through it (its own config or a base of it), with
//! where it stands: `stalled`, `rolling`, `queued`, `held` or `up to date`, and why, as its
//! `Progressing` condition says. `-o json` for scripts.

use std::collections::BTreeMap;

use anyhow::Context;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use super::status::table;
use crate::api::ClusterKey;
use crate::api::annotations::ROLLOUT_PAUSED;
use crate::api::{FleetStatus, RolloutProgress, ValkeyCluster, ValkeyConfig};
use crate::fleet::Fleet;

/// How `fleet` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// One config and its clusters.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigView {
    pub name: String,
    pub image: Option<String>,
    pub base: Option<String>,
    pub paused: bool,
    pub status: Option<FleetStatus>,
    pub clusters: Vec<ClusterView>,
}

/// One cluster as the fleet view shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    pub namespace: String,
    pub name: String,
    /// As the operator's gate last wrote it (`status.rollout`); `None` before its first pass.
    pub standing: Option<RolloutProgress>,
    pub state: String,
    pub version: String,
    pub outdated_nodes: i32,
    /// The `Progressing` condition's message: the step, or why it waits.
    pub why: String,
}

/// Lists the configs and clusters; the view as a table or JSON.
pub async fn fleet(client: &Client, only: Option<&str>, output: Output) -> anyhow::Result<String> {
    let configs: Api<ValkeyConfig> = Api::all(client.clone());
    let configs = (configs.list(&ListParams::default()).await)
        .context("listing ValkeyConfigs")?
        .items;
    let clusters: Api<ValkeyCluster> = Api::all(client.clone());
    let clusters = (clusters.list(&ListParams::default()).await)
        .context("listing ValkeyClusters")?
        .items;
    if let Some(name) = only
        && !configs.iter().any(|c| c.name_any() == name)
    {
        anyhow::bail!("ValkeyConfig {name} not found");
    }
    let views = view(&configs, &clusters, only);
    Ok(match output {
        Output::Json => serde_json::to_string_pretty(&views).context("writing JSON")? + "\n",
        Output::Table => render(&views),
    })
}

/// The configs (only `only`, if given) with their clusters, worst standing first (pure).
pub fn view(
    configs: &[ValkeyConfig],
    clusters: &[ValkeyCluster],
    only: Option<&str>,
) -> Vec<ConfigView> {
    // The fleet index answers which clusters resolve through a config, as admission asks it.
    let mut fleet = Fleet::default();
    for config in configs {
        fleet.upsert_config(&config.name_any(), config.spec.clone());
    }
    let by_key: BTreeMap<ClusterKey, &ValkeyCluster> = clusters
        .iter()
        .map(|cluster| {
            fleet.upsert_cluster(ClusterKey::of(cluster), &cluster.spec.config_ref);
            (ClusterKey::of(cluster), cluster)
        })
        .collect();
    let mut views: Vec<ConfigView> = configs
        .iter()
        .filter(|c| only.is_none_or(|name| c.name_any() == name))
        .map(|config| {
            let name = config.name_any();
            let mut clusters: Vec<ClusterView> = (fleet.clusters_resolving_through(&name))
                .iter()
                .filter_map(|key| Some(cluster_view(by_key.get(key)?)))
                .collect();
            // Worst first; clusters the operator has not judged yet last.
            let order = |c: &ClusterView| (c.standing.is_none(), c.standing);
            clusters.sort_by(|a, b| {
                (order(a), &a.namespace, &a.name).cmp(&(order(b), &b.namespace, &b.name))
            });
            ConfigView {
                name,
                image: config.spec.image_ref.clone(),
                base: config.spec.base_ref.clone(),
                paused: config.annotations().get(ROLLOUT_PAUSED).map(String::as_str)
                    == Some("true"),
                status: config.status.clone(),
                clusters,
            }
        })
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    views
}

/// Where `cluster` stands, as its status says: the gate's word, the state, the running
/// versions and why (the `Progressing` condition's message). Nothing is worked out again here.
pub fn cluster_view(cluster: &ValkeyCluster) -> ClusterView {
    let status = cluster.status.clone().unwrap_or_default();
    let condition = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    ClusterView {
        namespace: cluster.namespace().unwrap_or_default(),
        name: cluster.name_any(),
        standing: status.rollout,
        state: status.state.map_or("Creating".into(), |s| format!("{s:?}")),
        version: status.version.unwrap_or_else(|| "-".into()),
        outdated_nodes: status.outdated_nodes.unwrap_or(0),
        why: condition("Progressing").map_or(String::new(), |c| c.message.clone()),
    }
}

/// The table: a line per config, then its clusters indented.
pub fn render(views: &[ConfigView]) -> String {
    let mut out = String::new();
    for view in views {
        let status = view.status.clone().unwrap_or_default();
        let header = [
            "CONFIG",
            "IMAGE",
            "BASE",
            "CLUSTERS",
            "UP-TO-DATE",
            "ROLLING",
            "QUEUED",
            "STALLED",
            "HELD",
            "ROLLOUT",
            "PAUSED",
            "NEXT-WINDOW",
        ]
        .map(String::from);
        let row = [
            view.name.clone(),
            view.image.clone().unwrap_or_else(|| "-".into()),
            view.base.clone().unwrap_or_else(|| "-".into()),
            status.clusters.to_string(),
            status.up_to_date.to_string(),
            status.rolling.to_string(),
            status.queued.to_string(),
            status.stalled.to_string(),
            status.held.to_string(),
            status.rollout.clone().unwrap_or_else(|| "-".into()),
            view.paused.to_string(),
            status.next_window.clone().unwrap_or_else(|| "-".into()),
        ];
        out.push_str(&table(&[header, row]));
        let mut rows = vec![
            [
                "  NAMESPACE",
                "CLUSTER",
                "STANDING",
                "STATE",
                "VERSION",
                "OUTDATED",
                "WHY",
            ]
            .map(String::from),
        ];
        rows.extend(view.clusters.iter().map(|c| {
            [
                format!("  {}", c.namespace),
                c.name.clone(),
                c.standing.map_or("-", RolloutProgress::word).to_string(),
                c.state.clone(),
                c.version.clone(),
                c.outdated_nodes.to_string(),
                c.why.clone(),
            ]
        }));
        out.push_str(&table(&rows));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ValkeyClusterSpec, ValkeyClusterStatus, ValkeyConfigSpec};

    fn config(name: &str, base: Option<&str>) -> ValkeyConfig {
        ValkeyConfig::new(
            name,
            ValkeyConfigSpec {
                image_ref: base.is_none().then(|| "valkey-9-1-2".into()),
                base_ref: base.map(String::from),
                ..Default::default()
            },
        )
    }

    /// A cluster on `config` whose status says `rollout`.
    fn cluster(name: &str, config: &str, rollout: Option<RolloutProgress>) -> ValkeyCluster {
        let mut cluster = ValkeyCluster::new(name, ValkeyClusterSpec::new(config, 1, 1));
        cluster.metadata.namespace = Some("team-a".into());
        cluster.status = Some(ValkeyClusterStatus {
            rollout,
            ..Default::default()
        });
        cluster
    }

    #[test]
    fn each_cluster_shows_under_every_config_of_its_chain_worst_first_as_its_status_says() {
        let configs = [config("base", None), config("child", Some("base"))];
        let clusters = [
            cluster("done", "base", Some(RolloutProgress::UpToDate)),
            cluster("moving", "child", Some(RolloutProgress::Rolling)),
            cluster("new", "child", None),
            cluster("waiting", "child", Some(RolloutProgress::Queued)),
            cluster("held", "child", Some(RolloutProgress::Held)),
            cluster("locked", "child", Some(RolloutProgress::Stuck)),
        ];
        let views = view(&configs, &clusters, None);
        let names = |i: usize| -> Vec<(&str, Option<RolloutProgress>)> {
            views[i]
                .clusters
                .iter()
                .map(|c| (c.name.as_str(), c.standing))
                .collect()
        };
        assert_eq!(
            names(0),
            [
                ("locked", Some(RolloutProgress::Stuck)),
                ("moving", Some(RolloutProgress::Rolling)),
                ("waiting", Some(RolloutProgress::Queued)),
                ("held", Some(RolloutProgress::Held)),
                ("done", Some(RolloutProgress::UpToDate)),
                ("new", None),
            ]
        );
        assert_eq!(names(1).len(), 5, "the child's clusters only");
        let only = view(&configs, &clusters, Some("child"));
        assert_eq!(only.len(), 1);
        let text = render(&only);
        assert!(text.contains("CONFIG") && text.contains("held"), "{text}");
        assert!(text.contains("stuck"), "{text}");
    }
}
