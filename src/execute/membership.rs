//! Membership, before every plan: the nodes that answer are made one Valkey cluster. Each node's
//! id is recorded with its host, every node meets every member it does not know yet (two
//! primaries created in one bootstrap must meet whichever came up first), a node the cluster
//! still lists but no member is (its ValkeyNode was deleted by hand) is forgotten once that
//! loses nothing (see [`strangers`]), and a `Joining` replica is attached to the primary it was
//! created for (`CLUSTER REPLICATE`, retried while gossip has not introduced the primary).
//!
//! This runs outside the planner because it is idempotent housekeeping that must also finish a
//! join interrupted by a restart or a slow start: the planner only sees its result (a node
//! that is a synced replica, or not yet).

use std::collections::BTreeSet;

use futures::future::join_all;

use super::{Member, NodeHost, StepError, Timeouts};
use crate::roll::{Lifecycle, Role};
use crate::valkey::{ClusterNode, NodeAddress, NodeClient, Reach, forget_everywhere};

/// A member that answered just now.
struct Live<'a> {
    member: &'a Member,
    address: NodeAddress,
    client: NodeClient,
    id: String,
}

/// Records ids, meets unknown peers and attaches joining replicas; nodes that do not answer
/// are left for the next pass.
pub async fn introduce<H: NodeHost>(
    host: &mut H,
    timeouts: &Timeouts,
    reach: &Reach,
) -> Result<(), StepError<H::Error>> {
    let members = host.members();
    let live = answering(&members, reach).await;
    for node in &live {
        if node.member.id.as_deref() != Some(node.id.as_str()) {
            host.record_id(&node.member.name, &node.id, node.address)
                .await
                .map_err(StepError::Host)?;
        }
    }
    let mut views = Vec::with_capacity(live.len());
    for node in &live {
        views.push(node.client.cluster_nodes().await?);
    }
    meet_unknown_peers(&live, &views).await?;
    let known: BTreeSet<&str> = members
        .iter()
        .filter_map(|m| m.id.as_deref())
        .chain(live.iter().map(|n| n.id.as_str()))
        .collect();
    let clients: Vec<NodeClient> = live.iter().map(|n| n.client.clone()).collect();
    for stranger in strangers(&views, &known) {
        tracing::info!(node_id = %stranger, "forgetting a node no member is");
        forget_everywhere(&clients, &stranger).await?;
    }
    attach_joining_replicas(&live, timeouts).await
}

/// The ids the cluster lists that no member is and that can be forgotten without losing a
/// slot, once they are down (failed, suspected, or their link is down): a node with no slots (a
/// hand-deleted replica, or a primary whose replica Valkey has promoted), or a primary that no
/// live node replicates (no failover will ever serve its slots, so they can be served again
/// only once it is gone). A primary with a replica is left to Valkey's own failover. A node
/// still in its handshake is left alone: its id is temporary.
pub fn strangers(views: &[Vec<ClusterNode>], known: &BTreeSet<&str>) -> BTreeSet<String> {
    let listed = || views.iter().flatten();
    let replicated = |id: &str| listed().any(|n| n.replica_of.as_deref() == Some(id) && !n.failed);
    listed()
        .filter(|n| !known.contains(n.id.as_str()) && !n.myself && !n.handshake)
        .filter(|n| {
            let down = n.failed || n.suspected || !n.link_connected;
            down && (n.slots.is_empty() || !replicated(&n.id))
        })
        .map(|n| n.id.clone())
        .collect()
}

async fn answering<'a>(members: &'a [Member], reach: &Reach) -> Vec<Live<'a>> {
    let attempts = members.iter().filter_map(|member| {
        let address = member.address?;
        Some(async move {
            let client = NodeClient::at(address, reach).await.ok()?;
            let id = client.my_id().await.ok()?;
            Some(Live {
                member,
                address,
                client,
                id,
            })
        })
    });
    join_all(attempts).await.into_iter().flatten().collect()
}

async fn meet_unknown_peers<E: std::error::Error + 'static>(
    live: &[Live<'_>],
    views: &[Vec<ClusterNode>],
) -> Result<(), StepError<E>> {
    for (node, view) in live.iter().zip(views) {
        for peer in live {
            if peer.id != node.id && !view.iter().any(|n| n.id == peer.id) {
                node.client.meet(peer.address).await?;
            }
        }
    }
    Ok(())
}

async fn attach_joining_replicas<E: std::error::Error + 'static>(
    live: &[Live<'_>],
    timeouts: &Timeouts,
) -> Result<(), StepError<E>> {
    let joining = live
        .iter()
        .filter(|n| n.member.lifecycle == Lifecycle::Joining);
    for node in joining {
        let Some(primary) = &node.member.replica_of else {
            continue;
        };
        let Some(primary) = live.iter().find(|n| &n.member.name == primary) else {
            continue;
        };
        if node.client.replication_info().await?.role != Role::Replica {
            node.client.replicate(&primary.id, timeouts.start).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(text: &str) -> Vec<ClusterNode> {
        ClusterNode::parse_all(text).unwrap_or_default()
    }

    fn known<'a>(ids: &[&'a str]) -> BTreeSet<&'a str> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_hand_deleted_replica_is_forgotten_once_it_is_down() {
        let views = [view(
            "p0 127.0.9.2:6379@16379 myself,master - 0 0 1 connected 0-16383\n\
             ghost 127.0.9.3:6379@16379 slave,fail? p0 1 1 1 disconnected\n",
        )];
        assert_eq!(
            strangers(&views, &known(&["p0"])),
            BTreeSet::from(["ghost".into()])
        );
        let still_up = [view(
            "p0 127.0.9.2:6379@16379 myself,master - 0 0 1 connected 0-16383\n\
             ghost 127.0.9.3:6379@16379 slave p0 0 0 1 connected\n",
        )];
        assert!(strangers(&still_up, &known(&["p0"])).is_empty());
    }

    #[test]
    fn a_failed_primary_is_left_to_valkeys_failover_while_a_replica_follows_it() {
        let before = [view(
            "r0 127.0.9.4:6379@16379 myself,slave ghost 0 0 1 connected\n\
             ghost 127.0.9.2:6379@16379 master,fail - 1 1 1 disconnected 0-8191\n\
             p1 127.0.9.3:6379@16379 master - 0 0 2 connected 8192-16383\n",
        )];
        assert!(strangers(&before, &known(&["r0", "p1"])).is_empty());
        let promoted = [view(
            "r0 127.0.9.4:6379@16379 myself,master - 0 0 3 connected 0-8191\n\
             ghost 127.0.9.2:6379@16379 slave,fail r0 1 1 1 disconnected\n\
             p1 127.0.9.3:6379@16379 master - 0 0 2 connected 8192-16383\n",
        )];
        assert_eq!(
            strangers(&promoted, &known(&["r0", "p1"])),
            BTreeSet::from(["ghost".into()])
        );
    }

    #[test]
    fn a_down_primary_nobody_replicates_is_forgotten_so_its_slots_can_be_served() {
        let confirmed = [view(
            "p1 127.0.9.3:6379@16379 myself,master - 0 0 2 connected 8192-16383\n\
             ghost 127.0.9.2:6379@16379 master,fail - 1 1 1 disconnected 0-8191\n",
        )];
        assert_eq!(
            strangers(&confirmed, &known(&["p1"])),
            BTreeSet::from(["ghost".into()])
        );
        let only_suspected = [view(
            "p1 127.0.9.3:6379@16379 myself,master - 0 0 2 connected 8192-16383\n\
             ghost 127.0.9.2:6379@16379 master,fail? - 1 1 1 disconnected 0-8191\n",
        )];
        // One primary left cannot confirm a failure alone: suspected is as far as it gets.
        assert_eq!(
            strangers(&only_suspected, &known(&["p1"])),
            BTreeSet::from(["ghost".into()])
        );
        let answering = [view(
            "p1 127.0.9.3:6379@16379 myself,master - 0 0 2 connected 8192-16383\n\
             ghost 127.0.9.2:6379@16379 master - 0 0 1 connected 0-8191\n",
        )];
        assert!(strangers(&answering, &known(&["p1"])).is_empty());
        let followed = [view(
            "r0 127.0.9.4:6379@16379 myself,slave ghost 0 0 1 connected\n\
             ghost 127.0.9.2:6379@16379 master,fail? - 1 1 1 disconnected 0-8191\n",
        )];
        assert!(strangers(&followed, &known(&["r0"])).is_empty());
    }

    #[test]
    fn members_and_handshakes_are_never_strangers() {
        let views = [view(
            "p0 127.0.9.2:6379@16379 myself,master - 0 0 1 connected 0-16383\n\
             r0 127.0.9.3:6379@16379 slave,fail p0 1 1 1 disconnected\n\
             tmp 127.0.9.5:6379@16379 handshake - 0 0 0 disconnected\n",
        )];
        assert!(strangers(&views, &known(&["p0", "r0"])).is_empty());
    }
}
