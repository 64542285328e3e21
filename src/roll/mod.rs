//! The roll planner: given the desired shape of a cluster and what was observed of its nodes,
//! decide the one next step (join, activate, fail over, migrate slots, retire, wait, stall).
//!
//! The planner is pure: no I/O, no clock, no Kubernetes. The rules live in [`rules`]; the
//! inputs and the steps are described in [`model`], why it waits or stalls in [`reasons`];
//! slot arithmetic is in [`slots`]. The one executor of the steps is [`crate::execute`]
//! (driven by the Kubernetes controller, and by the real-process roll tests): it observes,
//! calls [`plan`], performs exactly that one step, and plans again.
//!
//! # Driving it from a controller
//! - [`DesiredShape`]: `spec.shards`, `spec.replicasPerShard`, and a revision string that
//!   changes exactly when nodes must be replaced (image version + replacement-forcing hash).
//! - One [`ObservedNode`] per `ValkeyNode`: name, `spec.shard`, the revision it was created
//!   with, `status.lifecycle`, `join_overdue` from its creation time, and what the pod's
//!   Valkey answered (`INFO replication`, `CLUSTER INFO`, its own `CLUSTER NODES` line, and
//!   `CLUSTER GETSLOTMIGRATIONS` on primaries). Read every primary before any replica, so a
//!   replica's offset is compared with an earlier primary offset; see
//!   [`crate::execute::observe`].
//! - [`RollMemory`] is persisted (e.g. in the ValkeyCluster status) and updated with
//!   [`RollMemory::record_failover`] *before* a failover is issued.
//! - Performing a step: see [`crate::execute::perform`]. A failover should be polled to
//!   completion (or its deadline) before planning again; the next plan stalls if it did not
//!   complete, and resumes by itself if Valkey completes it later.

pub mod model;
pub mod reasons;
pub mod rollout_waits;
pub mod rules;
pub mod slots;
pub mod spread;

pub use model::{
    DesiredShape, Lifecycle, Location, MAX_FAILOVER_ATTEMPTS, ObservedNode, PrimarySpread,
    PrimaryUpdate, ReplicaSync, Role, RollMemory, SlotRange, Step, StepWords, Switchover,
    UnfinishedMove,
};
pub use reasons::{JoinBlocker, StallReason, SwitchoverBlocker, WaitReason};
pub use rules::plan;
