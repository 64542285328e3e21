//! Performing one planned [`Step`]: one small function per kind of step, every write to a node
//! through [`crate::valkey`] and every change of what backs a node through the [`NodeHost`].

use futures::future::join_all;

use super::acl::{DesiredAcl, apply_users};
use super::{Member, NodeHost, StepError, Timeouts};
use crate::roll::{DesiredShape, RollMemory, SlotRange, Step};
use crate::valkey::migration::{KeyMove, Protocol, move_keys};
use crate::valkey::{Expected, NodeAddress, NodeClient, Reach, forget_everywhere};

/// What a step needs besides the host and the roll memory.
pub struct StepInputs<'a> {
    pub desired: &'a DesiredShape,
    /// The users a node gets before it becomes `Active`, so a primary promoted mid-roll serves
    /// them.
    pub acl: &'a DesiredAcl,
    pub timeouts: &'a Timeouts,
    /// How to reach the cluster's nodes (TLS or not).
    pub reach: &'a Reach,
}

/// What performing a step did, for events and reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A join created this node.
    Created { node: String },
    /// Slots moved; the target gained `keys` keys meanwhile, if both counts could be read.
    Migrated { keys: Option<u64> },
    /// The step was carried out (or needed nothing: wait, stall, converged).
    Done,
}

type Result<T, H> = std::result::Result<T, StepError<<H as NodeHost>::Error>>;

/// Performs exactly `step`. A failover (and a switchover's request) is recorded in `memory` (and
/// saved by the host) before it is issued, so one whose outcome is unknown is never issued twice.
pub async fn perform<H: NodeHost>(
    host: &mut H,
    step: &Step,
    memory: &mut RollMemory,
    inputs: &StepInputs<'_>,
) -> Result<Outcome, H> {
    let timeouts = inputs.timeouts;
    match step {
        Step::JoinPrimary { shard } => join(host, *shard, &inputs.desired.revision, None).await,
        Step::JoinReplica { shard, primary } => {
            join(host, *shard, &inputs.desired.revision, Some(primary)).await
        }
        Step::Activate { node, .. } => activate(host, node, inputs).await,
        Step::AssignSlots { assignments } => assign_slots(host, assignments, inputs).await,
        Step::Failover { shard, from, to } => {
            memory.record_failover(&inputs.desired.revision, *shard, to);
            host.save_memory(memory).await.map_err(StepError::Host)?;
            fail_over(host, from, to, inputs).await
        }
        Step::HandOver { from, to, .. } | Step::Rebalance { from, to, .. } => {
            fail_over(host, from, to, inputs).await
        }
        Step::Switchover {
            from, to, request, ..
        } => {
            memory.switchover_done = Some(request.clone());
            host.save_memory(memory).await.map_err(StepError::Host)?;
            fail_over(host, from, to, inputs).await
        }
        Step::TakeOver { to, .. } => {
            client(host, to, inputs)
                .await?
                .take_over(timeouts.failover)
                .await?;
            Ok(Outcome::Done)
        }
        Step::MigrateSlots {
            from, to, slots, ..
        } => migrate(host, from, to, slots, inputs).await,
        Step::RetireNode { node, .. } => retire(host, node, inputs).await,
        Step::Wait { .. } | Step::Stalled { .. } | Step::Converged => Ok(Outcome::Done),
    }
}

/// Moves `slots` from `from` to `to` by the protocol both ends' versions allow (see
/// [`Protocol`]): atomically between 9.1 nodes, key by key (as the replication user) otherwise.
async fn migrate<H: NodeHost>(
    host: &H,
    from: &str,
    to: &str,
    slots: &[SlotRange],
    inputs: &StepInputs<'_>,
) -> Result<Outcome, H> {
    let (_, source) = connect(host, from, inputs).await?;
    let (target_address, target) = connect(host, to, inputs).await?;
    let deadline = inputs.timeouts.migration;
    let versions = (source.server_info().await?, target.server_info().await?);
    match Protocol::between(&versions.0.version, &versions.1.version) {
        Protocol::Atomic => {
            let target_id = target.my_id().await?;
            // Only a figure for the metrics: a failed read of it never fails the migration.
            let before = target.key_count().await.ok();
            source.migrate_slots(&target_id, slots, deadline).await?;
            let after = target.key_count().await.ok();
            Ok(Outcome::Migrated {
                keys: after.zip(before).map(|(a, b)| a.saturating_sub(b)),
            })
        }
        Protocol::KeyByKey => {
            let login = inputs.acl.system.as_ref().map(|s| &s.replication);
            let source_member = member(host, from)?;
            let source_expected = expected(&source_member)?;
            let mover = match login {
                Some(login) => NodeClient::open_as(&source_expected, inputs.reach, login).await?,
                None => NodeClient::open(&source_expected, inputs.reach).await?,
            };
            let target_member = member(host, to)?;
            let source_pool = more_connections(&source_expected, inputs.reach).await?;
            let target_pool = more_connections(&expected(&target_member)?, inputs.reach).await?;
            let ends = KeyMove {
                source: &source,
                source_pool: &source_pool,
                target_pool: &target_pool,
                mover: &mover,
                target: &target,
                target_address,
                login,
            };
            let moved = move_keys(&ends, slots, deadline).await?;
            Ok(Outcome::Migrated { keys: Some(moved) })
        }
    }
}

/// Connections beside the first to one end of a key-by-key migration: its `SETSLOT`s wait for
/// the node's replicas, and go faster side by side (see [`crate::valkey::migration`]).
const SETSLOT_LANES: usize = 15;

async fn more_connections<E: std::error::Error + 'static>(
    expected: &Expected<'_>,
    reach: &Reach,
) -> std::result::Result<Vec<NodeClient>, StepError<E>> {
    let connecting = (0..SETSLOT_LANES).map(|_| NodeClient::open(expected, reach));
    Ok(futures::future::try_join_all(connecting).await?)
}

/// Valkey's default `CLUSTER FAILOVER`, sent to `to`: it waits for `to` to catch up with `from`.
async fn fail_over<H: NodeHost>(
    host: &H,
    from: &str,
    to: &str,
    inputs: &StepInputs<'_>,
) -> Result<Outcome, H> {
    let old_primary = client(host, from, inputs).await?;
    let new_primary = client(host, to, inputs).await?;
    new_primary
        .failover(&old_primary, inputs.timeouts.failover)
        .await?;
    Ok(Outcome::Done)
}

/// A client of the node `name`, once the host knows its address.
async fn client<H: NodeHost>(
    host: &H,
    name: &str,
    inputs: &StepInputs<'_>,
) -> Result<NodeClient, H> {
    Ok(connect(host, name, inputs).await?.1)
}

/// The address of the node `name` and a client of it, checked to be that node.
async fn connect<H: NodeHost>(
    host: &H,
    name: &str,
    inputs: &StepInputs<'_>,
) -> Result<(NodeAddress, NodeClient), H> {
    let member = member(host, name)?;
    let expected = expected(&member)?;
    Ok((
        expected.address,
        NodeClient::open(&expected, inputs.reach).await?,
    ))
}

/// The member the host knows as `name`.
fn member<H: NodeHost>(host: &H, name: &str) -> Result<Member, H> {
    host.members()
        .into_iter()
        .find(|m| m.name == name)
        .ok_or_else(|| StepError::UnknownNode {
            node: name.to_owned(),
        })
}

/// Who is expected at the member's address, once it has one.
fn expected<E: std::error::Error + 'static>(
    member: &Member,
) -> std::result::Result<Expected<'_>, StepError<E>> {
    member.expected().ok_or_else(|| StepError::NoAddress {
        node: member.name.clone(),
    })
}

async fn join<H: NodeHost>(
    host: &mut H,
    shard: u32,
    revision: &str,
    replica_of: Option<&str>,
) -> Result<Outcome, H> {
    let node = host
        .create_node(shard, revision, replica_of)
        .await
        .map_err(StepError::Host)?;
    Ok(Outcome::Created { node })
}

/// Every `Active` node serves the cluster's users: they are written before it is marked.
async fn activate<H: NodeHost>(
    host: &mut H,
    node: &str,
    inputs: &StepInputs<'_>,
) -> Result<Outcome, H> {
    // A user the node refuses does not keep it from serving: the controller's next pass says
    // so in `AclApplied` and keeps trying, and the roll of healthy nodes goes on.
    let refused = apply_users(&client(host, node, inputs).await?, inputs.acl).await?;
    if !refused.is_empty() {
        tracing::warn!(%node, refused = refused.len(), "node refused some ACL users");
    }
    host.mark_active(node).await.map_err(StepError::Host)?;
    Ok(Outcome::Done)
}

async fn assign_slots<H: NodeHost>(
    host: &H,
    assignments: &[(String, Vec<SlotRange>)],
    inputs: &StepInputs<'_>,
) -> Result<Outcome, H> {
    for (node, slots) in assignments {
        client(host, node, inputs)
            .await?
            .add_slots_range(slots)
            .await?;
    }
    Ok(Outcome::Done)
}

/// Removes the node, then makes every remaining node that answers forget it (otherwise gossip
/// would reintroduce it).
async fn retire<H: NodeHost>(
    host: &mut H,
    node: &str,
    inputs: &StepInputs<'_>,
) -> Result<Outcome, H> {
    let id = host
        .members()
        .into_iter()
        .find(|m| m.name == node)
        .and_then(|m| m.id);
    host.remove_node(node).await.map_err(StepError::Host)?;
    let Some(id) = id else {
        return Ok(Outcome::Done);
    };
    // Side by side: the others of a lost machine do not answer either, and each would cost
    // a whole call timeout in turn.
    let others = host.members();
    let opening = (others.iter())
        .filter(|m| m.name != node && !m.silent)
        .filter_map(|m| m.expected())
        .map(|expected| async move { NodeClient::open(&expected, inputs.reach).await.ok() });
    let remaining: Vec<NodeClient> = join_all(opening).await.into_iter().flatten().collect();
    forget_everywhere(&remaining, &id).await?;
    Ok(Outcome::Done)
}
