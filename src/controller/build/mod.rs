//! What the controller builds, purely, from a cluster's spec, its effective config and what a
//! pass saw: the objects it owns and its nodes' revision ([`render`]), and its status
//! ([`status`]). No I/O.

pub mod render;
pub mod status;
