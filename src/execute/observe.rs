//! Observation, the executor's first look before every plan (the Kubernetes controller's and
//! the local-process tests' alike): ask each node about itself over the engine protocol and turn the answers into
//! the planner's [`ObservedNode`]s. Replicas are read again after every primary, so a replica's
//! offset is never compared with a primary offset read later than it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::future::join_all;

use super::Member;
use crate::roll::slots::compress;
use crate::roll::{ObservedNode, ReplicaSync, Role, UnfinishedMove};
use crate::valkey::{ClusterNode, Expected, NodeClient, Reach, SlotDirection};

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

/// Why a member gave no report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unheard {
    /// No address yet, no answer, or an error.
    Silent,
    /// Something other than the member answers at its address.
    Stranger,
    /// The member answers, but refuses the operator's login.
    LockedOut,
    /// The member let the operator in, then answered what it cannot read.
    Unreadable,
    /// The member's TLS certificate failed the operator's check.
    Untrusted,
}

/// Why a member that let the operator in gave no report: it stopped answering, or it answered
/// what cannot be read (logged, since nothing else says which).
fn after_login(member: &str) -> impl Fn(crate::valkey::EngineError) -> Unheard + '_ {
    move |error| {
        if error.is_silence() {
            Unheard::Silent
        } else {
            tracing::warn!(node = member, %error, "a node's answer cannot be read");
            Unheard::Unreadable
        }
    }
}

async fn report(expected: Expected<'_>, reach: &Reach) -> Result<NodeReport, Unheard> {
    let client = NodeClient::open(&expected, reach).await.map_err(|error| {
        if error.is_stranger() {
            Unheard::Stranger
        } else if error.is_certificate_refusal() {
            tracing::warn!(%error, "a node's certificate is not trusted");
            Unheard::Untrusted
        } else if error.is_auth_refusal() {
            Unheard::LockedOut
        } else {
            Unheard::Silent
        }
    })?;
    let unheard = after_login(client.addr());
    let replication = client.replication_info().await.map_err(&unheard)?;
    let info = client.cluster_info().await.map_err(&unheard)?;
    let view = client.cluster_nodes().await.map_err(&unheard)?;
    let migrating = match replication.role {
        Role::Primary => client
            .slot_migrations()
            .await
            .map_err(&unheard)?
            .iter()
            .any(|job| !job.succeeded() && !job.failed()),
        Role::Replica => false,
    };
    Ok(NodeReport {
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

async fn report_of(member: &Member, reach: &Reach) -> Result<NodeReport, Unheard> {
    report(member.expected().ok_or(Unheard::Silent)?, reach).await
}

/// Observes every member; an unreachable one is reported as the rest of the cluster sees it.
pub async fn observe(members: &[Member], reach: &Reach) -> Vec<ObservedNode> {
    let (reports, unheard) = read_reports(members, reach).await;
    let primaries: HashMap<String, &NodeReport> = reports
        .values()
        .filter(|r| r.role == Role::Primary)
        .filter_map(|r| Some((r.myself.as_ref()?.id.clone(), r)))
        .collect();
    // The cluster's view of the nodes that did not answer: a node that sees every slot served
    // knows the most.
    let view: Vec<ClusterNode> = reports
        .values()
        .find(|r| r.cluster_ok)
        .or_else(|| reports.values().next())
        .map(|r| r.view.clone())
        .unwrap_or_default();
    let mut moves = unfinished_moves(members, &reports);
    members
        .iter()
        .map(|member| match reports.get(member.name.as_str()) {
            Some(report) => ObservedNode {
                unfinished_moves: moves.remove(member.name.as_str()).unwrap_or_default(),
                ..answered(member, report, &primaries)
            },
            None => ObservedNode {
                stranger: unheard.get(member.name.as_str()) == Some(&Unheard::Stranger),
                locked_out: unheard.get(member.name.as_str()) == Some(&Unheard::LockedOut),
                unreadable: matches!(
                    unheard.get(member.name.as_str()),
                    Some(Unheard::Unreadable | Unheard::Untrusted)
                ),
                untrusted: unheard.get(member.name.as_str()) == Some(&Unheard::Untrusted),
                alive_to_peers: member
                    .id
                    .as_deref()
                    .is_some_and(|id| alive_to_peers(id, reports.values())),
                ..unanswered(member, &view)
            },
        })
        .collect()
}

/// Whether the node `id` is up in the eyes of the nodes that answered: each that lists it
/// sees it up (no `fail` or `fail?` flag, its link connected), and a primary owning slots is
/// among them (only those count in Valkey's failure detection).
fn alive_to_peers<'a>(id: &str, reports: impl Iterator<Item = &'a NodeReport>) -> bool {
    let mut seen_by_a_voter = false;
    for report in reports {
        let Some(seen) = report.view.iter().find(|n| n.id == id) else {
            continue;
        };
        if seen.failed || seen.suspected || !seen.link_connected {
            return false;
        }
        seen_by_a_voter |= report
            .myself
            .as_ref()
            .is_some_and(|me| !me.slots.is_empty());
    }
    seen_by_a_voter
}

/// Slots left open by key-by-key migrations between members, by the name of the source: what
/// each answering node says of its own open slots (the source `MIGRATING` to the target, the
/// target `IMPORTING` from the source; either may be the only one that says so).
fn unfinished_moves<'a>(
    members: &'a [Member],
    reports: &HashMap<&'a str, NodeReport>,
) -> HashMap<&'a str, Vec<UnfinishedMove>> {
    let name_of = |id: &str| -> Option<&'a str> {
        members.iter().find_map(|m| {
            let recorded = m.id.as_deref() == Some(id);
            let answered = reports
                .get(m.name.as_str())
                .and_then(|r| r.myself.as_ref())
                .is_some_and(|me| me.id == id);
            (recorded || answered).then_some(m.name.as_str())
        })
    };
    let mut open: BTreeMap<(&str, &str), BTreeSet<u16>> = BTreeMap::new();
    for member in members {
        let Some(me) = reports
            .get(member.name.as_str())
            .and_then(|r| r.myself.as_ref())
        else {
            continue;
        };
        for slot in &me.open_slots {
            let Some(peer) = name_of(&slot.peer) else {
                continue;
            };
            let pair = match slot.direction {
                SlotDirection::Migrating => (member.name.as_str(), peer),
                SlotDirection::Importing => (peer, member.name.as_str()),
            };
            open.entry(pair).or_default().insert(slot.slot);
        }
    }
    let mut moves: HashMap<&str, Vec<UnfinishedMove>> = HashMap::new();
    for ((from, to), slots) in open {
        moves.entry(from).or_default().push(UnfinishedMove {
            to: to.to_owned(),
            slots: compress(slots.into_iter()),
        });
    }
    moves
}

/// Every member's report, replicas read a second time after every primary; and why the
/// others gave none.
async fn read_reports<'a>(
    members: &'a [Member],
    reach: &Reach,
) -> (HashMap<&'a str, NodeReport>, HashMap<&'a str, Unheard>) {
    let first = join_all(members.iter().map(|m| report_of(m, reach))).await;
    let mut reports: HashMap<&str, NodeReport> = HashMap::new();
    let mut unheard = HashMap::new();
    for (member, report) in members.iter().zip(first) {
        match report {
            Ok(report) => {
                reports.insert(member.name.as_str(), report);
            }
            Err(why) => {
                unheard.insert(member.name.as_str(), why);
            }
        }
    }
    let replicas: Vec<&Member> = members
        .iter()
        .filter(|m| {
            reports
                .get(m.name.as_str())
                .is_some_and(|r| r.role == Role::Replica)
        })
        .collect();
    for member in replicas {
        match report_of(member, reach).await {
            Ok(fresh) => {
                reports.insert(member.name.as_str(), fresh);
            }
            Err(why) => {
                reports.remove(member.name.as_str());
                unheard.insert(member.name.as_str(), why);
            }
        }
    }
    (reports, unheard)
}

/// What is known of a member before it answers: unreachable, no role, no slots.
fn unheard(member: &Member) -> ObservedNode {
    ObservedNode {
        name: member.name.clone(),
        shard: member.shard,
        revision: member.revision.clone(),
        lifecycle: member.lifecycle,
        join_overdue: member.join_overdue,
        reachable: false,
        role: Role::Replica,
        sync: None,
        slots: Vec::new(),
        cluster_ok: false,
        migrating: false,
        unfinished_moves: Vec::new(),
        stranger: false,
        locked_out: false,
        unreadable: false,
        untrusted: false,
        handover_requested: member.handover_requested,
        terminated: member.terminated,
        removed: member.removed,
        // The caller's clock decides (see `ObservedNode::hung`).
        hung: false,
        alive_to_peers: false,
        leaving: member.leaving,
        not_started: member.not_started.clone(),
        location: member.location.clone(),
    }
}

/// A member that did not answer, as `view` (another node's `CLUSTER NODES`) shows it.
fn unanswered(member: &Member, view: &[ClusterNode]) -> ObservedNode {
    let seen = member
        .id
        .as_ref()
        .and_then(|id| view.iter().find(|n| &n.id == id));
    ObservedNode {
        role: match seen {
            Some(n) if n.primary => Role::Primary,
            _ => Role::Replica,
        },
        slots: seen.map(|n| n.slots.clone()).unwrap_or_default(),
        ..unheard(member)
    }
}

/// A member that answered, its replication judged against its primary's report.
fn answered(
    member: &Member,
    report: &NodeReport,
    primaries: &HashMap<String, &NodeReport>,
) -> ObservedNode {
    let myself = report.myself.as_ref();
    let primary = myself
        .and_then(|m| Some((m, m.replica_of.as_ref()?)))
        .and_then(|(m, id)| Some((m, id, primaries.get(id)?)));
    let sync = match (report.role, primary) {
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
        // Its primary does not answer: what it has applied still ranks it for a takeover.
        (Role::Replica, None) => Some(ReplicaSync {
            link_up: report.link_up,
            sync_in_progress: report.sync_in_progress,
            offset: report.replica_offset,
            primary_offset: 0,
            known_to_primaries: false,
        }),
        _ => None,
    };
    ObservedNode {
        reachable: true,
        role: report.role,
        sync,
        slots: myself.map(|m| m.slots.clone()).unwrap_or_default(),
        cluster_ok: report.cluster_ok,
        migrating: report.migrating,
        ..unheard(member)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of a node whose `CLUSTER NODES` is `text` (its own line flagged `myself`).
    fn report(text: &str) -> NodeReport {
        let view = ClusterNode::parse_all(text).unwrap_or_default();
        NodeReport {
            role: Role::Primary,
            link_up: false,
            sync_in_progress: false,
            replica_offset: 0,
            master_repl_offset: 0,
            cluster_ok: true,
            migrating: false,
            myself: view.iter().find(|n| n.myself).cloned(),
            view,
        }
    }

    #[test]
    fn a_node_is_alive_to_its_peers_only_if_every_one_that_lists_it_sees_it_up() {
        let p1_sees_p0_up = report(
            "p0 127.0.9.1:6379@16379 master - 0 0 1 connected 0-8191\n\
             p1 127.0.9.2:6379@16379 myself,master - 0 0 2 connected 8192-16383\n",
        );
        let r1_sees_p0_up = report(
            "p0 127.0.9.1:6379@16379 master - 0 0 1 connected 0-8191\n\
             r1 127.0.9.3:6379@16379 myself,slave p1 0 0 2 connected\n",
        );
        assert!(alive_to_peers(
            "p0",
            [&p1_sees_p0_up, &r1_sees_p0_up].into_iter()
        ));
        // A replica's word alone is not Valkey's failure detection: a voter must see it.
        assert!(!alive_to_peers("p0", [&r1_sees_p0_up].into_iter()));
        // Suspected, failed, or its link down in any view: not alive to its peers.
        for flags in ["master,fail?", "master,fail"] {
            let doubts = report(&format!(
                "p0 127.0.9.1:6379@16379 {flags} - 0 0 1 connected 0-8191\n\
                 p2 127.0.9.4:6379@16379 myself,master - 0 0 3 connected\n"
            ));
            assert!(!alive_to_peers("p0", [&p1_sees_p0_up, &doubts].into_iter()));
        }
        let link_down = report(
            "p0 127.0.9.1:6379@16379 master - 0 0 1 disconnected 0-8191\n\
             p1 127.0.9.2:6379@16379 myself,master - 0 0 2 connected 8192-16383\n",
        );
        assert!(!alive_to_peers("p0", [&link_down].into_iter()));
        // Nobody lists it: nobody vouches for it.
        assert!(!alive_to_peers("p9", [&p1_sees_p0_up].into_iter()));
    }
}
