//! `kubectl valkey status <cluster>`: one screen on a cluster. Its state and version, the roll
//! and why it waits, a hold, every node by shard (role, lifecycle, version, revision, Pod, IP,
//! replication lag asked of the nodes themselves), the conditions and the last events.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;
use kube::{Client, ResourceExt};

use super::nodes::{ClusterObjects, NodeAccess, Operator, event_time};
use crate::api::annotations::ROLLOUT_HOLD;
use crate::api::{NodeLifecycle, NodeRole, ValkeyNode};
use crate::roll::Role;

/// How many of the latest events are shown.
const EVENTS_SHOWN: usize = 10;

/// What a node said of its replication, or why it said nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replication {
    Primary { offset: u64 },
    Replica { offset: u64, link_up: bool },
    Unreachable(String),
}

/// Reads the cluster and asks its nodes; the screen as text.
pub async fn status(
    client: &Client,
    namespace: &str,
    operator: &Operator,
    name: &str,
) -> anyhow::Result<String> {
    let objects = ClusterObjects::read(client, namespace, name).await?;
    let replication = match NodeAccess::of(client, operator, &objects).await {
        Ok(access) => ask_nodes(&access, &objects.nodes).await,
        Err(error) => {
            let why = format!("{error:#}");
            let unreachable =
                |node: &ValkeyNode| (node.name_any(), Replication::Unreachable(why.clone()));
            objects.nodes.iter().map(unreachable).collect()
        }
    };
    Ok(render(&objects, &replication, Timestamp::now()))
}

async fn ask_nodes(access: &NodeAccess, nodes: &[ValkeyNode]) -> BTreeMap<String, Replication> {
    let mut said = BTreeMap::new();
    for node in nodes {
        let answer = match access.open(node).await {
            Ok(client) => match client.replication_info().await {
                Ok(info) if info.role == Role::Primary => Replication::Primary {
                    offset: info.master_repl_offset,
                },
                Ok(info) => Replication::Replica {
                    offset: info.replica_offset,
                    link_up: info.link_up,
                },
                Err(error) => Replication::Unreachable(error.to_string()),
            },
            Err(error) => Replication::Unreachable(error.to_string()),
        };
        said.insert(node.name_any(), answer);
    }
    said
}

/// The screen, from what was read (pure, for its tests).
pub fn render(
    objects: &ClusterObjects,
    replication: &BTreeMap<String, Replication>,
    now: Timestamp,
) -> String {
    let mut out = String::new();
    headline(&mut out, objects, now);
    node_table(&mut out, objects, replication);
    conditions(&mut out, objects);
    events(&mut out, objects, now);
    out
}

fn headline(out: &mut String, objects: &ClusterObjects, now: Timestamp) {
    let cluster = &objects.cluster;
    let status = cluster.status.clone().unwrap_or_default();
    let state = status
        .state
        .map_or("Creating".to_string(), |s| format!("{s:?}"));
    let spec = &cluster.spec;
    let _ = writeln!(
        out,
        "valkeycluster {}/{}: {state}, config {}, {} shards x {} replicas, version {}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any(),
        spec.config_ref,
        spec.shards,
        spec.replicas_per_shard,
        status.version.as_deref().unwrap_or("-"),
    );
    let revision = status.desired_revision.as_deref().unwrap_or("-");
    let outdated = status.outdated_nodes.unwrap_or(0);
    let step = condition(objects, "Progressing").map_or("-".to_string(), |(_, _, m)| m);
    let _ = writeln!(
        out,
        "roll: revision {revision}, {outdated} nodes outdated; step: {step}"
    );
    if let Some(hold) = cluster.rollout_hold(now) {
        let raw = cluster
            .annotations()
            .get(ROLLOUT_HOLD)
            .cloned()
            .unwrap_or_default();
        let _ = writeln!(out, "hold: {hold:?} ({ROLLOUT_HOLD}={raw})");
    }
    if let Some(message) = &status.message {
        let _ = writeln!(out, "message: {message}");
    }
}

fn node_table(
    out: &mut String,
    objects: &ClusterObjects,
    replication: &BTreeMap<String, Replication>,
) {
    let status = objects.cluster.status.clone().unwrap_or_default();
    let mut primary_offsets: BTreeMap<i32, u64> = BTreeMap::new();
    for node in &objects.nodes {
        if let Some(Replication::Primary { offset }) = replication.get(&node.name_any()) {
            primary_offsets.insert(node.spec.shard, *offset);
        }
    }
    let mut rows = vec![
        [
            "SHARD",
            "NODE",
            "ROLE",
            "LIFECYCLE",
            "VERSION",
            "REVISION",
            "IP",
            "READY",
            "LAG",
        ]
        .map(String::from),
    ];
    for node in &objects.nodes {
        let name = node.name_any();
        let listed = status.nodes.iter().find(|n| n.name == name);
        let node_status = node.status.clone().unwrap_or_default();
        let pod = objects.pod_of(node);
        let ready = pod
            .and_then(|p| p.status.as_ref()?.conditions.clone())
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let lag = match replication.get(&name) {
            Some(Replication::Primary { .. }) => "-".to_string(),
            Some(Replication::Replica { offset, link_up }) => {
                match (primary_offsets.get(&node.spec.shard), link_up) {
                    (_, false) => "link down".to_string(),
                    (Some(primary), true) => format!("{} B", primary.saturating_sub(*offset)),
                    (None, true) => "?".to_string(),
                }
            }
            Some(Replication::Unreachable(_)) => "unreachable".to_string(),
            None => "?".to_string(),
        };
        rows.push([
            node.spec.shard.to_string(),
            name.clone(),
            node_status.role.map_or("-", role_word).to_string(),
            node_status
                .lifecycle
                .map_or("-", lifecycle_word)
                .to_string(),
            listed.map_or("-".to_string(), |n| n.version.clone()),
            node.spec.revision.clone(),
            node_status.address.unwrap_or_else(|| "-".into()),
            ready.to_string(),
            lag,
        ]);
    }
    out.push('\n');
    out.push_str(&table(&rows));
    let unreachable: Vec<String> = replication
        .iter()
        .filter_map(|(node, said)| match said {
            Replication::Unreachable(why) => Some(format!("  {node}: {why}")),
            _ => None,
        })
        .collect();
    if !unreachable.is_empty() {
        out.push_str("not asked:\n");
        out.push_str(&unreachable.join("\n"));
        out.push('\n');
    }
}

fn conditions(out: &mut String, objects: &ClusterObjects) {
    let status = objects.cluster.status.clone().unwrap_or_default();
    out.push_str("\nconditions:\n");
    for c in &status.conditions {
        let _ = writeln!(
            out,
            "  {}={} {}: {}",
            c.type_, c.status, c.reason, c.message
        );
    }
}

fn events(out: &mut String, objects: &ClusterObjects, now: Timestamp) {
    let _ = writeln!(out, "\nevents (latest {EVENTS_SHOWN}):");
    let start = objects.events.len().saturating_sub(EVENTS_SHOWN);
    for event in &objects.events[start..] {
        let age = event_time(event).map_or("-".to_string(), |at| {
            let seconds = now.duration_since(at).as_secs().max(0);
            format!("{seconds}s")
        });
        let _ = writeln!(
            out,
            "  {age:>6} {} {} {}: {}",
            event.type_.as_deref().unwrap_or("-"),
            event.reason.as_deref().unwrap_or("-"),
            event.involved_object.name.as_deref().unwrap_or("-"),
            event.message.as_deref().unwrap_or(""),
        );
    }
}

/// The condition `type_` of the cluster: status, reason, message.
pub fn condition(objects: &ClusterObjects, type_: &str) -> Option<(String, String, String)> {
    let status = objects.cluster.status.as_ref()?;
    let c = status.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn role_word(role: NodeRole) -> &'static str {
    match role {
        NodeRole::Primary => "primary",
        NodeRole::Replica => "replica",
    }
}

fn lifecycle_word(lifecycle: NodeLifecycle) -> &'static str {
    match lifecycle {
        NodeLifecycle::Joining => "Joining",
        NodeLifecycle::Active => "Active",
        NodeLifecycle::Leaving => "Leaving",
    }
}

/// Rows as columns padded to their widest cell, two spaces apart.
pub fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_pads_each_column_to_its_widest_cell() {
        let rows = [
            ["SHARD", "NODE"].map(String::from),
            ["0", "orders-0-1eda6"].map(String::from),
        ];
        assert_eq!(table(&rows), "SHARD  NODE\n0      orders-0-1eda6\n");
    }
}
