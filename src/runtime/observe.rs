//! Observation, shared by every executor of the planner (the local driver and the Kubernetes
//! controller): ask each node about itself over the engine protocol and turn the answers into
//! the planner's [`ObservedNode`]s. Replicas are read again after every primary, so a replica's
//! offset is never compared with a primary offset read later than it.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;

use crate::roll::{Lifecycle, ObservedNode, ReplicaSync, Role};
use crate::valkey::{ClusterNode, NodeClient};

/// What the executor knows of one node before asking it anything.
#[derive(Clone, Debug)]
pub struct Member {
    pub name: String,
    pub shard: u32,
    pub revision: String,
    pub lifecycle: Lifecycle,
    /// A `Joining` node that has been joining for longer than it may (the executor's clock).
    pub join_overdue: bool,
    /// `ip:port`, once the node has an address.
    pub address: Option<String>,
    /// The Valkey node id, once known.
    pub id: Option<String>,
}

/// What one reachable node said about itself.
struct NodeReport {
    role: Role,
    link_up: bool,
    sync_in_progress: bool,
    replica_offset: u64,
    master_repl_offset: u64,
    cluster_ok: bool,
    migrating: bool,
    myself: Option<ClusterNode>,
    view: Vec<ClusterNode>,
}

async fn report(address: &str, call_timeout: Duration) -> Option<NodeReport> {
    let client = NodeClient::connect(address, call_timeout).await.ok()?;
    let replication = client.replication_info().await.ok()?;
    let info = client.cluster_info().await.ok()?;
    let view = client.cluster_nodes().await.ok()?;
    let migrating = match replication.role {
        Role::Primary => client
            .slot_migrations()
            .await
            .ok()?
            .iter()
            .any(|job| !job.succeeded() && !job.failed()),
        Role::Replica => false,
    };
    Some(NodeReport {
        role: replication.role,
        link_up: replication.link_up,
        sync_in_progress: replication.sync_in_progress,
        replica_offset: replication.replica_offset,
        master_repl_offset: replication.master_repl_offset,
        cluster_ok: info.state_ok,
        migrating,
        myself: view.iter().find(|n| n.myself).cloned(),
        view,
    })
}

async fn report_of(member: &Member, call_timeout: Duration) -> Option<NodeReport> {
    report(member.address.as_deref()?, call_timeout).await
}

/// Observes every member; an unreachable one is reported as the rest of the cluster sees it.
pub async fn observe(members: &[Member], call_timeout: Duration) -> Vec<ObservedNode> {
    let first = join_all(members.iter().map(|m| report_of(m, call_timeout))).await;
    let mut reports: HashMap<&str, NodeReport> = members
        .iter()
        .map(|m| m.name.as_str())
        .zip(first)
        .filter_map(|(name, report)| Some((name, report?)))
        .collect();
    let replicas: Vec<&Member> = members
        .iter()
        .filter(|m| {
            reports
                .get(m.name.as_str())
                .is_some_and(|r| r.role == Role::Replica)
        })
        .collect();
    for member in replicas {
        match report_of(member, call_timeout).await {
            Some(fresh) => reports.insert(member.name.as_str(), fresh),
            None => reports.remove(member.name.as_str()),
        };
    }
    let primaries: HashMap<String, &NodeReport> = reports
        .values()
        .filter(|r| r.role == Role::Primary)
        .filter_map(|r| Some((r.myself.as_ref()?.id.clone(), r)))
        .collect();
    let view: Vec<ClusterNode> = reports
        .values()
        .find(|r| r.cluster_ok)
        .or_else(|| reports.values().next())
        .map(|r| r.view.clone())
        .unwrap_or_default();
    members
        .iter()
        .map(|member| {
            let seen = member
                .id
                .as_ref()
                .and_then(|id| view.iter().find(|n| &n.id == id));
            let base = ObservedNode {
                name: member.name.clone(),
                shard: member.shard,
                revision: member.revision.clone(),
                lifecycle: member.lifecycle,
                join_overdue: member.join_overdue,
                reachable: false,
                role: match seen {
                    Some(n) if n.primary => Role::Primary,
                    _ => Role::Replica,
                },
                sync: None,
                slots: seen.map(|n| n.slots.clone()).unwrap_or_default(),
                cluster_ok: false,
                migrating: false,
            };
            let Some(report) = reports.get(member.name.as_str()) else {
                return base;
            };
            let myself = report.myself.as_ref();
            let primary = myself
                .and_then(|m| Some((m, m.replica_of.as_ref()?)))
                .and_then(|(m, id)| Some((m, id, primaries.get(id)?)));
            ObservedNode {
                reachable: true,
                role: report.role,
                sync: match (report.role, primary) {
                    (Role::Replica, Some((me, primary_id, primary))) => Some(ReplicaSync {
                        link_up: report.link_up,
                        sync_in_progress: report.sync_in_progress,
                        offset: report.replica_offset,
                        primary_offset: primary.master_repl_offset,
                        known_to_primaries: primaries.values().all(|p| {
                            p.view
                                .iter()
                                .any(|n| n.id == me.id && n.replica_of.as_ref() == Some(primary_id))
                        }),
                    }),
                    _ => None,
                },
                slots: myself.map(|m| m.slots.clone()).unwrap_or_default(),
                cluster_ok: report.cluster_ok,
                migrating: report.migrating,
                ..base
            }
        })
        .collect()
}
