//! The executor: observe every node through the engine protocol, ask the planner for the next
//! step, perform exactly that step through a [`NodeRuntime`] and the engine, and repeat. This is
//! what runs a roll on the local runtime; the Kubernetes controller does the same one step per
//! reconcile.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{NodeAddress, NodeRuntime, NodeSpec, RuntimeError};
use crate::roll::{DesiredShape, Lifecycle, ObservedNode, RollMemory, Step, plan};
use crate::valkey::{EngineError, NodeClient, forget_everywhere};

/// How long each kind of action may take.
#[derive(Clone, Debug)]
pub struct Timeouts {
    /// One engine call (and connecting).
    pub call: Duration,
    /// A new node must answer PING, and be made a replica, within this.
    pub start: Duration,
    /// A joining node must become ready (synced) within this, or the roll stalls on it.
    pub join: Duration,
    /// A failover must complete within this.
    pub failover: Duration,
    /// One slot migration must finish within this.
    pub migration: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            call: Duration::from_secs(2),
            start: Duration::from_secs(10),
            join: Duration::from_secs(60),
            failover: Duration::from_secs(10),
            migration: Duration::from_secs(120),
        }
    }
}

/// Why driving the roll stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error("runtime: {0}")]
    Runtime(#[from] RuntimeError),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("the planner named {node}, which this driver does not run")]
    UnknownNode { node: String },
    #[error("the roll stalled: {reason}")]
    Stalled { reason: crate::roll::StallReason },
    #[error("not converged within {waited:?}; last step: {last}")]
    Deadline { waited: Duration, last: String },
}

/// One step performed, for reports and benchmarks.
#[derive(Clone, Debug)]
pub struct StepRecord {
    pub step: Step,
    pub started: Instant,
    pub finished: Instant,
    /// The error, if the step failed.
    pub error: Option<String>,
}

struct Running {
    spec: NodeSpec,
    address: NodeAddress,
    id: Option<String>,
    lifecycle: Lifecycle,
    joined_at: Instant,
    /// The introductions a join still owes this node (MEET, and REPLICATE of this primary
    /// when `Some(Some(primary))`); retried before every plan until done.
    unfinished_join: Option<Option<String>>,
}

/// Drives one cluster on a runtime.
pub struct Roller<R: NodeRuntime> {
    runtime: R,
    cluster: String,
    members: BTreeMap<String, Running>,
    memory: RollMemory,
    timeouts: Timeouts,
    next_index: u32,
    history: Vec<StepRecord>,
}

impl<R: NodeRuntime> Roller<R> {
    pub fn new(runtime: R, cluster: &str, timeouts: Timeouts) -> Self {
        Self {
            runtime,
            cluster: cluster.to_owned(),
            members: BTreeMap::new(),
            memory: RollMemory::default(),
            timeouts,
            next_index: 0,
            history: Vec::new(),
        }
    }

    /// Change the deadlines for the steps to come.
    pub fn set_timeouts(&mut self, timeouts: Timeouts) {
        self.timeouts = timeouts;
    }

    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// Every step performed so far.
    pub fn history(&self) -> &[StepRecord] {
        &self.history
    }

    /// `ip:port` of every node, for clients.
    pub fn addresses(&self) -> Vec<String> {
        self.members
            .values()
            .map(|m| m.address.to_string())
            .collect()
    }

    /// Node name → `ip:port`.
    pub fn nodes(&self) -> BTreeMap<String, String> {
        self.members
            .iter()
            .map(|(name, m)| (name.clone(), m.address.to_string()))
            .collect()
    }

    /// Kill a node without retiring it, as a crash would (for healing tests).
    pub async fn crash_node(&mut self, name: &str) -> Result<(), DriveError> {
        self.runtime.stop_node(name).await?;
        Ok(())
    }

    async fn client(&self, address: &NodeAddress) -> Result<NodeClient, EngineError> {
        NodeClient::connect(&address.to_string(), self.timeouts.call).await
    }

    async fn member_client(&self, name: &str) -> Result<NodeClient, DriveError> {
        let member = self
            .members
            .get(name)
            .ok_or_else(|| DriveError::UnknownNode {
                node: name.to_owned(),
            })?;
        Ok(self.client(&member.address).await?)
    }

    /// Observe every node (see [`super::observe`]).
    pub async fn observe(&self) -> Vec<ObservedNode> {
        let members: Vec<super::observe::Member> = self
            .members
            .iter()
            .map(|(name, member)| super::observe::Member {
                name: name.clone(),
                shard: member.spec.shard,
                revision: member.spec.revision.clone(),
                lifecycle: member.lifecycle,
                join_overdue: member.lifecycle == Lifecycle::Joining
                    && member.joined_at.elapsed() > self.timeouts.join,
                address: Some(member.address.to_string()),
                id: member.id.clone(),
            })
            .collect();
        super::observe::observe(&members, self.timeouts.call).await
    }

    /// Observe, plan, and perform one step; returns the step (performed or not, on error).
    pub async fn step(&mut self, desired: &DesiredShape) -> (Step, Result<(), DriveError>) {
        let unfinished: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.unfinished_join.is_some())
            .map(|(name, _)| name.clone())
            .collect();
        for name in unfinished {
            if let Err(error) = self.finish_join(&name).await {
                tracing::warn!(node = %name, %error, "join still unfinished");
            }
        }
        let observed = self.observe().await;
        let step = plan(desired, &observed, &self.memory);
        let started = Instant::now();
        let result = self.act(&step, desired).await;
        if !matches!(step, Step::Wait { .. } | Step::Converged) {
            tracing::info!(%step, ok = result.is_ok(), "roll step");
            self.history.push(StepRecord {
                step: step.clone(),
                started,
                finished: Instant::now(),
                error: result.as_ref().err().map(ToString::to_string),
            });
        }
        (step, result)
    }

    /// Step until the planner says [`Step::Converged`]; stop on a stall or at `deadline`. A
    /// failed step is not fatal by itself: the planner decides from what it observes next
    /// (and stalls when a failure must stop the roll).
    pub async fn converge(
        &mut self,
        desired: &DesiredShape,
        deadline: Duration,
    ) -> Result<(), DriveError> {
        let started = Instant::now();
        let mut last_error = None;
        loop {
            let (step, result) = self.step(desired).await;
            match &step {
                Step::Converged => return Ok(()),
                Step::Stalled { reason } => {
                    return Err(DriveError::Stalled {
                        reason: reason.clone(),
                    });
                }
                _ => {}
            }
            let failed = result.is_err();
            if let Err(error) = result {
                last_error = Some(error.to_string());
            }
            if started.elapsed() > deadline {
                return Err(DriveError::Deadline {
                    waited: started.elapsed(),
                    last: match last_error {
                        Some(error) => format!("{step} (last failed step: {error})"),
                        None => step.to_string(),
                    },
                });
            }
            if matches!(step, Step::Wait { .. }) || failed {
                sleep(Duration::from_millis(50)).await;
            }
        }
    }

    async fn act(&mut self, step: &Step, desired: &DesiredShape) -> Result<(), DriveError> {
        match step {
            Step::JoinPrimary { shard } => self.join(*shard, desired, None).await,
            Step::JoinReplica { shard, primary } => {
                self.join(*shard, desired, Some(primary.as_str())).await
            }
            Step::Activate { node, .. } => {
                let member = self
                    .members
                    .get_mut(node)
                    .ok_or_else(|| DriveError::UnknownNode { node: node.clone() })?;
                member.lifecycle = Lifecycle::Active;
                Ok(())
            }
            Step::AssignSlots { assignments } => {
                for (node, slots) in assignments {
                    self.member_client(node)
                        .await?
                        .add_slots_range(slots)
                        .await?;
                }
                Ok(())
            }
            Step::Failover { shard, from, to } => {
                // Remembered before it is issued: whatever happens, never a second one.
                self.memory.record_failover(&desired.revision, *shard);
                let old_primary = self.member_client(from).await?;
                let new_primary = self.member_client(to).await?;
                new_primary
                    .failover(&old_primary, self.timeouts.failover)
                    .await?;
                Ok(())
            }
            Step::MigrateSlots {
                from, to, slots, ..
            } => {
                let target = self.member_client(to).await?.my_id().await?;
                self.member_client(from)
                    .await?
                    .migrate_slots(&target, slots, self.timeouts.migration)
                    .await?;
                Ok(())
            }
            Step::RetireNode { node, .. } => self.retire(node).await,
            Step::Wait { .. } | Step::Stalled { .. } | Step::Converged => Ok(()),
        }
    }

    /// Start a node, introduce it, and (for a replica) attach it to `primary`. The node is a
    /// `Joining` member from the moment it starts, so a failure here leaves it for the planner
    /// to wait on (and stall on, once overdue).
    async fn join(
        &mut self,
        shard: u32,
        desired: &DesiredShape,
        primary: Option<&str>,
    ) -> Result<(), DriveError> {
        let name = format!("{}-{shard}-{}", self.cluster, self.next_index);
        self.next_index += 1;
        let spec = NodeSpec {
            name: name.clone(),
            shard,
            revision: desired.revision.clone(),
        };
        let address = self.runtime.start_node(&spec).await?;
        self.members.insert(
            name.clone(),
            Running {
                spec,
                address,
                id: None,
                lifecycle: Lifecycle::Joining,
                joined_at: Instant::now(),
                unfinished_join: Some(primary.map(str::to_owned)),
            },
        );
        self.finish_join(&name).await
    }

    /// Introduce a started node to the cluster and, for a replica, attach it to its primary.
    /// A slow machine may make this fail; it is retried before the next plans, while the
    /// planner waits for the node (and stalls on it once it is overdue).
    async fn finish_join(&mut self, name: &str) -> Result<(), DriveError> {
        let (address, work) = match self.members.get(name) {
            Some(Running {
                address,
                unfinished_join: Some(work),
                ..
            }) => (address.clone(), work.clone()),
            _ => return Ok(()),
        };
        let client = self.wait_until_answering(&address).await?;
        let id = client.my_id().await?;
        if let Some(peer) = self.live_peer(name).await {
            client.meet(&peer.ip, peer.port).await?;
        }
        if let Some(primary) = work {
            let primary_id = self.member_client(&primary).await?.my_id().await?;
            client.replicate(&primary_id, self.timeouts.start).await?;
        }
        if let Some(member) = self.members.get_mut(name) {
            member.id = Some(id);
            member.unfinished_join = None;
        }
        Ok(())
    }

    async fn wait_until_answering(&self, address: &NodeAddress) -> Result<NodeClient, DriveError> {
        let started = Instant::now();
        loop {
            let attempt = match self.client(address).await {
                Ok(client) => client.ping().await.map(|()| client),
                Err(error) => Err(error),
            };
            match attempt {
                Ok(client) => return Ok(client),
                Err(error) if started.elapsed() > self.timeouts.start => return Err(error.into()),
                Err(_) => sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Some other member that answers, to meet a new node through.
    async fn live_peer(&self, except: &str) -> Option<NodeAddress> {
        for (name, member) in &self.members {
            if name == except || member.lifecycle != Lifecycle::Active {
                continue;
            }
            if let Ok(client) = self.client(&member.address).await
                && client.ping().await.is_ok()
            {
                return Some(member.address.clone());
            }
        }
        None
    }

    /// Stop the node, then make every remaining node forget it.
    async fn retire(&mut self, node: &str) -> Result<(), DriveError> {
        let member = self
            .members
            .remove(node)
            .ok_or_else(|| DriveError::UnknownNode {
                node: node.to_owned(),
            })?;
        match self.runtime.stop_node(node).await {
            // A node that crashed may already be gone from the runtime.
            Ok(()) | Err(RuntimeError::UnknownNode { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        let Some(id) = member.id else {
            return Ok(());
        };
        let mut remaining = Vec::new();
        for other in self.members.values() {
            if let Ok(client) = self.client(&other.address).await
                && client.ping().await.is_ok()
            {
                remaining.push(client);
            }
        }
        forget_everywhere(&remaining, &id).await?;
        Ok(())
    }
}
