//! The controller: reconciles each ValkeyCluster into ValkeyNodes, Pods, a headless Service and
//! a PodDisruptionBudget, and rolls it one shard at a time through the planner in
//! [`crate::roll`]. [`render`] holds what it creates, as pure functions of the cluster and its
//! effective config.

pub mod leader;
pub mod render;
pub mod status;
