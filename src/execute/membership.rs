//! Membership, before every plan: the nodes that answer are made one Valkey cluster. Each
//! node's id is recorded with its host the first time it answers (and never overwritten: a
//! different id at its address later is a stranger, refused by [`NodeClient::open`]), a node
//! that knows no live member yet meets one that does (see [`meetings`]), a node the cluster
//! still lists but no member is (its ValkeyNode was deleted by hand) is forgotten once that
//! loses nothing (see [`strangers`]), and a `Joining` replica is attached to its shard's
//! primary: the one it was created for, or the one that took the shard over since (`CLUSTER
//! REPLICATE`, retried while gossip has not introduced the primary).
//!
//! This runs outside the planner because it is idempotent housekeeping that must also finish a
//! join interrupted by a restart or a slow start: the planner only sees its result (a node
//! that is a synced replica, or not yet).

use std::cmp::Reverse;
use std::collections::BTreeSet;

use futures::future::join_all;

use super::{Member, NodeHost, StepError, Timeouts};
use crate::roll::Lifecycle;
use crate::valkey::{ClusterNode, EngineError, NodeAddress, NodeClient, Reach, forget_everywhere};

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
    for node in live.iter().filter(|n| n.member.id.is_none()) {
        host.record_id(&node.member.name, &node.id, node.address)
            .await
            .map_err(StepError::Host)?;
    }
    let mut views = Vec::with_capacity(live.len());
    for node in &live {
        views.push(node.client.cluster_nodes().await?);
    }
    meet_the_cluster(&live, &views).await?;
    let known: BTreeSet<&str> = members
        .iter()
        .filter_map(|m| m.id.as_deref())
        .chain(live.iter().map(|n| n.id.as_str()))
        .collect();
    // Before any forgetting: a replica refuses to forget its own primary.
    repoint_orphans(&live, &views, timeouts).await?;
    let clients: Vec<NodeClient> = live.iter().map(|n| n.client.clone()).collect();
    for stranger in strangers(&views, &known) {
        tracing::info!(node_id = %stranger, "forgetting a node no member is");
        forget_everywhere(&clients, &stranger).await?;
    }
    attach_joining_replicas(&live, &views, timeouts).await
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

/// Re-points each active replica left following a primary that owns no slots while another
/// node of its shard serves them (see [`orphans`]) at that node.
async fn repoint_orphans<E: std::error::Error + 'static>(
    live: &[Live<'_>],
    views: &[Vec<ClusterNode>],
    timeouts: &Timeouts,
) -> Result<(), StepError<E>> {
    let shards: Vec<u32> = live.iter().map(|n| n.member.shard).collect();
    let joining: Vec<bool> = (live.iter())
        .map(|n| n.member.lifecycle == Lifecycle::Joining)
        .collect();
    for (orphan, owner) in orphans(&shards, &joining, views) {
        let (node, primary) = (&live[orphan], &live[owner]);
        tracing::info!(node = %node.member.name, primary = %primary.member.name, "re-pointing a replica whose primary serves nothing at its shard's primary");
        node.client.replicate(&primary.id, timeouts.start).await?;
    }
    Ok(())
}

/// The replicas (by index into `views`, each node's own `CLUSTER NODES`, beside its shard and
/// whether it is still joining) that follow a primary owning no slots while another settled
/// node of their shard owns slots, each with that node's index. A replica that was joining
/// when its primary's machine was lost, or that missed its shard's failover, is left following
/// the old primary: Valkey moves a replica to its primary's successor only within a failover
/// it takes part in (`cluster-allow-replica-migration no`), so it would never sync again, and
/// its old primary could never be forgotten. A replica of a primary that still owns slots is
/// left alone, even if that primary is down: it may be the heir.
fn orphans(shards: &[u32], joining: &[bool], views: &[Vec<ClusterNode>]) -> Vec<(usize, usize)> {
    let own_line = |index: usize| views[index].iter().find(|n| n.myself);
    let serving = |index: usize| {
        !joining[index] && own_line(index).is_some_and(|l| l.primary && !l.slots.is_empty())
    };
    let mut found = Vec::new();
    for (index, view) in views.iter().enumerate() {
        let Some(follows) = own_line(index).and_then(|line| line.replica_of.as_deref()) else {
            continue;
        };
        let followed_owns_slots = view
            .iter()
            .find(|n| n.id == follows)
            .is_some_and(|n| !n.slots.is_empty());
        if joining[index] || followed_owns_slots {
            continue;
        }
        let owner = (0..views.len()).find(|&other| {
            other != index
                && shards[other] == shards[index]
                && serving(other)
                && own_line(other).is_some_and(|l| l.id != follows)
        });
        if let Some(owner) = owner {
            found.push((index, owner));
        }
    }
    found
}

/// The members that answer as themselves. A member not yet recorded that answers with another
/// member's recorded id is a node of the cluster at someone else's old address: not it.
async fn answering<'a>(members: &'a [Member], reach: &Reach) -> Vec<Live<'a>> {
    // A member silent at the last observation is asked by the next one, not here: a lost
    // machine's nodes would cost every pass a call timeout twice.
    let attempts = members.iter().filter(|m| !m.silent).filter_map(|member| {
        let expected = member.expected()?;
        Some(async move {
            let client = match NodeClient::open(&expected, reach).await {
                Ok(client) => client,
                Err(error) => {
                    if error.is_stranger() {
                        tracing::warn!(node = %member.name, %error, "not the node recorded");
                    }
                    return None;
                }
            };
            let id = client.id()?.to_owned();
            let taken = members
                .iter()
                .any(|other| other.name != member.name && other.id.as_deref() == Some(&id));
            if member.id.is_none() && taken {
                tracing::warn!(node = %member.name, %id, "answers with another member's id");
                return None;
            }
            Some(Live {
                member,
                address: expected.address,
                client,
                id,
            })
        })
    });
    join_all(attempts).await.into_iter().flatten().collect()
}

async fn meet_the_cluster<E: std::error::Error + 'static>(
    live: &[Live<'_>],
    views: &[Vec<ClusterNode>],
) -> Result<(), StepError<E>> {
    let peers: Vec<Peer<'_>> = live
        .iter()
        .zip(views)
        .map(|(node, view)| Peer {
            id: &node.id,
            name: &node.member.name,
            established: node.member.lifecycle == Lifecycle::Active,
            view,
        })
        .collect();
    for (from, to) in meetings(&peers) {
        tracing::info!(node = %live[from].member.name, peer = %live[to].member.name, "meeting the cluster");
        live[from].client.meet(live[to].address).await?;
    }
    Ok(())
}

/// One answering node, as [`meetings`] sees it.
pub struct Peer<'a> {
    pub id: &'a str,
    pub name: &'a str,
    /// Its ValkeyNode is `Active` (it has joined before).
    pub established: bool,
    /// Its own `CLUSTER NODES`.
    pub view: &'a [ClusterNode],
}

/// Who meets whom, as `(from, to)` indexes into `peers`: each node whose view lists no other
/// answering node meets the hub, the node that knows the most of them (then an established
/// one, then a serving primary, then the first by name); no other node meets anyone.
///
/// `CLUSTER MEET` names an address, not a node: whoever answers there when the handshake runs
/// is taken in, and learns from the meeting node's gossip every node it knows. An address can
/// change hands between the pass that saw its node answer and the handshake (seen: a joiner told
/// to meet a replica killed 0.1 s earlier handed a stranger the whole cluster's ids and
/// addresses). So the only node that meets is one that knows nobody to tell, and only one
/// address is named; the others learn the new node from gossip, which names nodes by id and
/// never takes in whoever answers at an address.
pub fn meetings(peers: &[Peer<'_>]) -> Vec<(usize, usize)> {
    let knows = |peer: &Peer<'_>, id: &str| {
        peer.view
            .iter()
            .any(|n| n.id == id && !n.myself && !n.handshake)
    };
    let known_peers = |index: usize| {
        let peer = &peers[index];
        peers
            .iter()
            .filter(|other| other.id != peer.id && knows(peer, other.id))
            .count()
    };
    let serving = |peer: &Peer<'_>| {
        peer.view
            .iter()
            .any(|n| n.myself && n.primary && !n.slots.is_empty())
    };
    let hub = (0..peers.len()).max_by_key(|&index| {
        let peer = &peers[index];
        (
            known_peers(index),
            peer.established,
            serving(peer),
            Reverse(peer.name),
        )
    });
    let Some(hub) = hub else {
        return Vec::new();
    };
    (0..peers.len())
        .filter(|&index| index != hub && known_peers(index) == 0)
        .map(|index| (index, hub))
        .collect()
}

/// Makes each `Joining` replica replicate its shard's primary: the node it was created for
/// while that one is still a primary, else the shard's primary now (the one that took the
/// shard over when it died). A joiner left replicating a dead primary would never sync.
async fn attach_joining_replicas<E: std::error::Error + 'static>(
    live: &[Live<'_>],
    views: &[Vec<ClusterNode>],
    timeouts: &Timeouts,
) -> Result<(), StepError<E>> {
    let own_line = |index: usize| views[index].iter().find(|n| n.myself);
    let is_primary = |index: usize| own_line(index).is_some_and(|n| n.primary);
    for (index, node) in live.iter().enumerate() {
        if node.member.lifecycle != Lifecycle::Joining {
            continue;
        }
        let Some(created_for) = &node.member.replica_of else {
            continue;
        };
        let shard = node.member.shard;
        let owns_slots = |i: usize| own_line(i).is_some_and(|l| !l.slots.is_empty());
        // Another node of the shard only if it serves the shard's slots: a node just started
        // is a primary of nothing too (another joiner), and following it syncs nothing.
        let primary = live
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != index && is_primary(*i))
            .filter(|(i, n)| {
                &n.member.name == created_for
                    || (n.member.shard == shard
                        && n.member.lifecycle != Lifecycle::Joining
                        && owns_slots(*i))
            })
            .max_by_key(|(i, n)| (&n.member.name == created_for, owns_slots(*i)))
            .map(|(_, n)| n);
        let Some(primary) = primary else {
            continue;
        };
        let follows = own_line(index).and_then(|line| line.replica_of.as_deref());
        if follows != Some(primary.id.as_str()) {
            if follows.is_some() {
                tracing::info!(node = %node.member.name, primary = %primary.member.name, "re-pointing a joining replica at its shard's primary");
            }
            match node.client.replicate(&primary.id, timeouts.start).await {
                Ok(()) => {}
                // Gossip has not introduced the primary to the joiner yet (a cut can hold it
                // off for as long as it lasts): a later pass attaches it, rather than this one
                // holding every other step of the cluster meanwhile.
                Err(EngineError::Deadline { last, .. }) => tracing::info!(
                    node = %node.member.name,
                    primary = %primary.member.name,
                    answer = %last,
                    "the joining replica does not know its primary yet"
                ),
                Err(other) => return Err(other.into()),
            }
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
    fn a_replica_following_a_primary_that_serves_nothing_is_repointed_at_its_shards_owner() {
        // r1 joined shard 0 as gone's replica; gone's machine was lost and p0 took its slots.
        let orphan = view(
            "gone 127.0.9.1:6379@16379 master,fail - 1 1 3 connected\n\
             p0 127.0.9.2:6379@16379 master - 0 0 6 connected 0-16383\n\
             r1 127.0.9.3:6379@16379 myself,slave gone 0 0 3 connected\n",
        );
        let owner = view(
            "p0 127.0.9.2:6379@16379 myself,master - 0 0 6 connected 0-16383\n\
             r1 127.0.9.3:6379@16379 slave - 0 0 3 connected\n",
        );
        let views = [orphan.clone(), owner.clone()];
        assert_eq!(orphans(&[0, 0], &[false, false], &views), vec![(0, 1)]);
        // Not while it joins (the join attaches it), nor to another shard's owner.
        assert!(orphans(&[0, 0], &[true, false], &views).is_empty());
        assert!(orphans(&[0, 1], &[false, false], &views).is_empty());
        // Nor while the primary it follows still owns slots, even down: it may be the heir.
        let heir = view(
            "gone 127.0.9.1:6379@16379 master,fail - 1 1 3 connected 0-16383\n\
             r1 127.0.9.3:6379@16379 myself,slave gone 0 0 3 connected\n",
        );
        assert!(orphans(&[0, 0], &[false, false], &[heir, owner]).is_empty());
        // A replica of its shard's owner is where it should be.
        let home = view(
            "p0 127.0.9.2:6379@16379 master - 0 0 6 connected 0-16383\n\
             r1 127.0.9.3:6379@16379 myself,slave p0 0 0 6 connected\n",
        );
        assert!(orphans(&[0, 0], &[false, false], &[home, orphan_owner()]).is_empty());
    }

    fn orphan_owner() -> Vec<ClusterNode> {
        view("p0 127.0.9.2:6379@16379 myself,master - 0 0 6 connected 0-16383\n")
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

    fn peer<'a>(
        id: &'a str,
        name: &'a str,
        established: bool,
        view: &'a [ClusterNode],
    ) -> Peer<'a> {
        Peer {
            id,
            name,
            established,
            view,
        }
    }

    /// The views of a serving primary `p` and its replica `r`, which know each other.
    fn established_shard() -> (Vec<ClusterNode>, Vec<ClusterNode>) {
        let primary = view(
            "p 127.0.9.2:6379@16379 myself,master - 0 0 1 connected 0-16383\n\
             r 127.0.9.3:6379@16379 slave p 0 0 1 connected\n",
        );
        let replica = view(
            "r 127.0.9.3:6379@16379 myself,slave p 0 0 1 connected\n\
             p 127.0.9.2:6379@16379 master - 0 0 1 connected 0-16383\n",
        );
        (primary, replica)
    }

    #[test]
    fn a_bootstrap_meets_one_node_and_every_other_meets_it() {
        let views = [
            view("a 127.0.9.2:6379@16379 myself,master - 0 0 0 connected\n"),
            view("b 127.0.9.3:6379@16379 myself,master - 0 0 0 connected\n"),
            view("c 127.0.9.4:6379@16379 myself,master - 0 0 0 connected\n"),
        ];
        let peers = [
            peer("b", "n-1", false, &views[1]),
            peer("a", "n-0", false, &views[0]),
            peer("c", "n-2", false, &views[2]),
        ];
        assert_eq!(meetings(&peers), [(0, 1), (2, 1)]);
    }

    #[test]
    fn a_joiner_meets_a_serving_primary_and_nobody_meets_the_joiner() {
        let (primary, replica) = established_shard();
        let joiner = view("j 127.0.9.4:6379@16379 myself,master - 0 0 0 connected\n");
        let peers = [
            peer("r", "n-0-a", true, &replica),
            peer("j", "n-0-b", false, &joiner),
            peer("p", "n-0-c", true, &primary),
        ];
        assert_eq!(meetings(&peers), [(1, 2)]);
    }

    #[test]
    fn a_node_that_knows_a_live_member_meets_nobody() {
        // The joiner knows the primary but not yet the replica: gossip introduces them by id.
        let (primary, replica) = established_shard();
        let joiner = view(
            "j 127.0.9.4:6379@16379 myself,master - 0 0 0 connected\n\
             p 127.0.9.2:6379@16379 master - 0 0 1 connected 0-16383\n",
        );
        let peers = [
            peer("p", "n-0-a", true, &primary),
            peer("r", "n-0-b", true, &replica),
            peer("j", "n-0-c", false, &joiner),
        ];
        assert!(meetings(&peers).is_empty());
    }

    #[test]
    fn a_handshake_under_way_is_no_acquaintance() {
        let primary = view("p 127.0.9.2:6379@16379 myself,master - 0 0 1 connected 0-16383\n");
        let joiner = view(
            "j 127.0.9.4:6379@16379 myself,master - 0 0 0 connected\n\
             tmp 127.0.9.2:6379@16379 handshake - 0 0 0 disconnected\n",
        );
        let peers = [
            peer("p", "n-0-a", true, &primary),
            peer("j", "n-0-b", false, &joiner),
        ];
        assert_eq!(meetings(&peers), [(1, 0)]);
    }
}
