//! The roll loop on local processes: [`Roller`] keeps a cluster's nodes in a [`LocalHost`] and
//! runs the product's executor on it (`valkey_operator::execute`: membership, observe, plan, perform),
//! exactly as the Kubernetes controller does with ValkeyNodes and Pods.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{NodeRuntime, NodeSpec, RuntimeError};
pub use valkey_operator::execute::Timeouts;
use valkey_operator::execute::acl::DesiredAcl;
use valkey_operator::execute::{
    Member, NodeHost, Outcome, StepError, StepInputs, membership, observe, perform,
};
use valkey_operator::roll::{
    DesiredShape, Lifecycle, ObservedNode, RollMemory, StallReason, Step, plan,
};
use valkey_operator::valkey::{NodeAddress, Reach};

/// Why driving the roll stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error(transparent)]
    Step(#[from] StepError<RuntimeError>),
    #[error("the roll stalled: {reason}")]
    Stalled { reason: StallReason },
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
    replica_of: Option<String>,
}

/// A cluster's nodes as local processes: the tests' [`NodeHost`].
pub struct LocalHost<R: NodeRuntime> {
    runtime: R,
    cluster: String,
    members: BTreeMap<String, Running>,
    next_index: u32,
    join_timeout: Duration,
}

impl<R: NodeRuntime> NodeHost for LocalHost<R> {
    type Error = RuntimeError;

    fn members(&self) -> Vec<Member> {
        self.members
            .iter()
            .map(|(name, node)| Member {
                name: name.clone(),
                shard: node.spec.shard,
                revision: node.spec.revision.clone(),
                lifecycle: node.lifecycle,
                join_overdue: node.lifecycle == Lifecycle::Joining
                    && node.joined_at.elapsed() > self.join_timeout,
                address: Some(node.address),
                id: node.id.clone(),
                // Local processes have no users.
                closed: false,
                replica_of: node.replica_of.clone(),
                // Local processes are never evicted, and a stopped one is only unreachable.
                handover_requested: false,
                terminated: false,
                removed: false,
                leaving: false,
                not_started: None,
                location: Default::default(),
                silent: false,
            })
            .collect()
    }

    async fn create_node(
        &mut self,
        shard: u32,
        revision: &str,
        replica_of: Option<&str>,
    ) -> Result<String, RuntimeError> {
        let name = format!("{}-{shard}-{}", self.cluster, self.next_index);
        self.next_index += 1;
        let spec = NodeSpec {
            name: name.clone(),
            shard,
            revision: revision.to_owned(),
        };
        let address = self.runtime.start_node(&spec).await?;
        let node = Running {
            spec,
            address,
            id: None,
            lifecycle: Lifecycle::Joining,
            joined_at: Instant::now(),
            replica_of: replica_of.map(str::to_owned),
        };
        self.members.insert(name.clone(), node);
        Ok(name)
    }

    async fn record_id(
        &mut self,
        name: &str,
        id: &str,
        _address: NodeAddress,
    ) -> Result<(), RuntimeError> {
        self.running(name)?.id = Some(id.to_owned());
        Ok(())
    }

    async fn mark_active(&mut self, name: &str) -> Result<(), RuntimeError> {
        self.running(name)?.lifecycle = Lifecycle::Active;
        Ok(())
    }

    async fn remove_node(&mut self, name: &str) -> Result<(), RuntimeError> {
        self.members.remove(name);
        match self.runtime.stop_node(name).await {
            // A node that crashed may already be gone from the runtime.
            Ok(()) | Err(RuntimeError::UnknownNode { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// The roll memory lives in the [`Roller`], as long as the process.
    async fn save_memory(&mut self, _memory: &RollMemory) -> Result<(), RuntimeError> {
        Ok(())
    }
}

impl<R: NodeRuntime> LocalHost<R> {
    fn running(&mut self, name: &str) -> Result<&mut Running, RuntimeError> {
        self.members
            .get_mut(name)
            .ok_or_else(|| RuntimeError::UnknownNode {
                node: name.to_owned(),
            })
    }
}

/// Drives one cluster on a runtime with the product's executor.
pub struct Roller<R: NodeRuntime> {
    host: LocalHost<R>,
    memory: RollMemory,
    timeouts: Timeouts,
    history: Vec<StepRecord>,
}

impl<R: NodeRuntime> Roller<R> {
    pub fn new(runtime: R, cluster: &str, timeouts: Timeouts) -> Self {
        let host = LocalHost {
            runtime,
            cluster: cluster.to_owned(),
            members: BTreeMap::new(),
            next_index: 0,
            join_timeout: timeouts.join,
        };
        Self {
            host,
            memory: RollMemory::default(),
            timeouts,
            history: Vec::new(),
        }
    }

    /// Change the deadlines for the steps to come.
    pub fn set_timeouts(&mut self, timeouts: Timeouts) {
        self.host.join_timeout = timeouts.join;
        self.timeouts = timeouts;
    }

    pub fn runtime(&self) -> &R {
        &self.host.runtime
    }

    /// Every step performed so far.
    pub fn history(&self) -> &[StepRecord] {
        &self.history
    }

    /// `ip:port` of every node, for clients.
    pub fn addresses(&self) -> Vec<String> {
        self.nodes().into_values().collect()
    }

    /// Node name → `ip:port`.
    pub fn nodes(&self) -> BTreeMap<String, String> {
        self.host
            .members
            .iter()
            .map(|(name, node)| (name.clone(), node.address.to_string()))
            .collect()
    }

    /// Kill a node without retiring it, as a crash would (for healing tests).
    pub async fn crash_node(&mut self, name: &str) -> Result<(), RuntimeError> {
        self.host.runtime.stop_node(name).await
    }

    /// Observe every node, as the executor does before planning.
    pub async fn observe(&self) -> Vec<ObservedNode> {
        observe::observe(&self.host.members(), &Reach::plain(self.timeouts.call)).await
    }

    /// Membership, observe, plan, and perform one step; returns the step (performed or not,
    /// on error).
    pub async fn step(&mut self, desired: &DesiredShape) -> (Step, Result<(), DriveError>) {
        let reach = Reach::plain(self.timeouts.call);
        if let Err(error) = membership::introduce(&mut self.host, &self.timeouts, &reach).await {
            tracing::warn!(%error, "membership unfinished");
        }
        let observed = self.observe().await;
        let step = plan(desired, &observed, &self.memory);
        let started = Instant::now();
        let acl = DesiredAcl::none();
        let inputs = StepInputs {
            desired,
            acl: &acl,
            timeouts: &self.timeouts,
            reach: &reach,
        };
        let result = perform(&mut self.host, &step, &mut self.memory, &inputs).await;
        if !matches!(step, Step::Wait { .. } | Step::Converged) {
            tracing::info!(%step, ok = result.is_ok(), "roll step");
            self.history.push(StepRecord {
                step: step.clone(),
                started,
                finished: Instant::now(),
                error: result.as_ref().err().map(ToString::to_string),
            });
        }
        (step, result.map(|_: Outcome| ()).map_err(DriveError::from))
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
                let last = match last_error {
                    Some(error) => format!("{step} (last failed step: {error})"),
                    None => step.to_string(),
                };
                let waited = started.elapsed();
                return Err(DriveError::Deadline { waited, last });
            }
            if matches!(step, Step::Wait { .. }) || failed {
                sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
