//! Membership, before every plan: the nodes that answer are made one Valkey cluster. Each node's
//! id is recorded with its host, every node meets every member it does not know yet (two
//! primaries created in one bootstrap must meet whichever came up first), and a `Joining`
//! replica is attached to the primary it was created for (`CLUSTER REPLICATE`, retried while
//! gossip has not introduced the primary).
//!
//! This runs outside the planner because it is idempotent housekeeping that must also finish a
//! join interrupted by a restart or a slow start: the planner only sees its result (a node
//! that is a synced replica, or not yet).

use futures::future::join_all;

use super::{Member, NodeHost, StepError, Timeouts};
use crate::roll::{Lifecycle, Role};
use crate::valkey::{NodeAddress, NodeClient};

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
) -> Result<(), StepError<H::Error>> {
    let members = host.members();
    let live = answering(&members, timeouts).await;
    for node in &live {
        if node.member.id.as_deref() != Some(node.id.as_str()) {
            host.record_id(&node.member.name, &node.id, node.address)
                .await
                .map_err(StepError::Host)?;
        }
    }
    meet_unknown_peers(&live).await?;
    attach_joining_replicas(&live, timeouts).await
}

async fn answering<'a>(members: &'a [Member], timeouts: &Timeouts) -> Vec<Live<'a>> {
    let attempts = members.iter().filter_map(|member| {
        let address = member.address?;
        Some(async move {
            let client = NodeClient::at(address, timeouts.call).await.ok()?;
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
) -> Result<(), StepError<E>> {
    for node in live {
        let known: Vec<String> = node
            .client
            .cluster_nodes()
            .await?
            .into_iter()
            .map(|n| n.id)
            .collect();
        for peer in live {
            if peer.id != node.id && !known.contains(&peer.id) {
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
