//! The one executor of the planner's steps. The Kubernetes controller and the real-process roll
//! tests and benchmark run the same code: [`membership::introduce`] (MEET and REPLICATE for
//! nodes that answer), [`observe::observe`], the pure planner [`crate::roll::plan`], then
//! [`perform()`] of exactly the one step planned.
//!
//! What differs between the places nodes live is behind [`NodeHost`]: how a node is created,
//! found, marked active and removed, and where the roll's memory is kept. The controller's host
//! is made of ValkeyNodes and Pods (`crate::controller::host`); the tests' host runs local
//! `valkey-server` processes.

pub mod acl;
pub mod membership;
pub mod observe;
mod perform;

use std::future::Future;
use std::time::Duration;

pub use perform::{Outcome, StepInputs, perform};

use crate::roll::{Lifecycle, Location, RollMemory};
use crate::valkey::{EngineError, Expected, NodeAddress};

/// How long each kind of action may take.
#[derive(Clone, Debug)]
pub struct Timeouts {
    /// One engine call (and connecting).
    pub call: Duration,
    /// How long one pass retries `CLUSTER REPLICATE` for a new replica while gossip has not
    /// introduced its primary to it (usually well under a second after the MEET); after that,
    /// a later pass tries again.
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
            start: Duration::from_secs(3),
            join: Duration::from_secs(60),
            failover: Duration::from_secs(10),
            migration: Duration::from_secs(120),
        }
    }
}

/// What the executor knows of one node before asking it anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub shard: u32,
    pub revision: String,
    pub lifecycle: Lifecycle,
    /// A `Joining` node that has been joining for longer than it may (the host's clock).
    pub join_overdue: bool,
    /// Where the node answers, once it has an address: its own server's, while it runs.
    pub address: Option<NodeAddress>,
    /// The Valkey node id, once recorded (recorded once, never overwritten).
    pub id: Option<String>,
    /// It was started with the operator's users: it never admits anyone without credentials
    /// (see [`Expected::closed`]).
    pub closed: bool,
    /// For a node created as a replica: the name of the primary it was created to replicate.
    pub replica_of: Option<String>,
    /// Its Pod is about to be evicted (see [`crate::roll::ObservedNode::handover_requested`]).
    pub handover_requested: bool,
    /// Its server has stopped for good (see [`crate::roll::ObservedNode::terminated`]).
    pub terminated: bool,
    /// Its Pod was removed (see [`crate::roll::ObservedNode::removed`]).
    pub removed: bool,
    /// Someone asked for it to go (see [`crate::roll::ObservedNode::leaving`]).
    pub leaving: bool,
    /// Why its server has not started (see [`crate::roll::ObservedNode::not_started`]).
    pub not_started: Option<String>,
    /// Where its server runs (see [`crate::roll::ObservedNode::location`]).
    pub location: Location,
    /// It answered once and did not at the last observation (a lost machine's, a paused one):
    /// observation still asks it every pass, but introductions and retirements do not wait a
    /// call timeout on it again.
    pub silent: bool,
}

impl Member {
    /// Who the operator expects at the member's address, once it has one.
    pub fn expected(&self) -> Option<Expected<'_>> {
        Some(Expected {
            address: self.address?,
            id: self.id.as_deref(),
            closed: self.closed,
        })
    }
}

/// Where a cluster's nodes live: the only part of executing a step that differs between the
/// Kubernetes controller and the local-process tests.
pub trait NodeHost: Send {
    /// What creating, marking or removing a node can fail with.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Every node of the cluster, as the host knows it now.
    fn members(&self) -> Vec<Member>;

    /// Create a node for `shard` on `revision`, to replicate `replica_of` if given; returns its
    /// name. It returns once the node exists: the node answers later, and
    /// [`membership::introduce`] finishes its join before each plan.
    fn create_node(
        &mut self,
        shard: u32,
        revision: &str,
        replica_of: Option<&str>,
    ) -> impl Future<Output = Result<String, Self::Error>> + Send;

    /// Remember the Valkey node id `id` that `name` answered with at `address`.
    fn record_id(
        &mut self,
        name: &str,
        id: &str,
        address: NodeAddress,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Record that `name` is now an `Active` member of its shard.
    fn mark_active(&mut self, name: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Stop the node for good and delete whatever backs it.
    fn remove_node(&mut self, name: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Keep the roll's memory durably. Called before a failover is issued; an error stops it.
    fn save_memory(
        &mut self,
        memory: &RollMemory,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// Why a step could not be performed.
#[derive(Debug, thiserror::Error)]
pub enum StepError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Host(E),
    #[error("{node} has no address yet")]
    NoAddress { node: String },
    #[error("the planner named {node}, which the host does not know")]
    UnknownNode { node: String },
}
