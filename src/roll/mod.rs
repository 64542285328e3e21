//! The roll planner: given the desired shape of a cluster and what was observed of its nodes,
//! decide the one next step (join, activate, fail over, migrate slots, retire, wait, stall).
//!
//! The planner is pure: no I/O, no clock, no Kubernetes. The rules live in [`rules`]; the
//! inputs and the steps are described in [`model`]; slot arithmetic is in [`slots`]. Whoever
//! executes the steps (the local driver in `crate::runtime::driver`, or the Kubernetes
//! controller) observes, calls [`plan`], performs exactly that one step, and plans again.

pub mod model;
pub mod rules;
pub mod slots;

pub use model::{
    DesiredShape, Lifecycle, ObservedNode, ReplicaSync, Role, RollMemory, SlotRange, Step,
};
pub use rules::plan;
