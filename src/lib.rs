//! The Valkey operator: admission webhooks over the fleet's configuration, and the machinery to
//! roll Valkey clusters one shard at a time. `main.rs` is a thin shell over [`cli`].
//!
//! The modules, in layers; each uses only its own and the ones above it. `tests/house.rs`
//! checks both that and that no two files import each other, however indirectly; it reads the
//! layers from the blocks of `pub mod` lines below:
//! - the API and pure rules, no I/O: [`api`] (the kinds and every name the operator owns),
//!   [`acl`] and [`credentials`] (the users on a cluster's nodes), [`words`] (lists in
//!   messages), [`roll`] (the planner), [`settings`] (the operator's own, parsed);
//! - the fleet index: [`fleet`] (every image, config, role and cluster, the watches that feed
//!   it, a config's resolution, what a config change does, the rules of a fleet rollout);
//! - the engine: [`valkey`] (the protocol to one node, TLS to it), [`access`] (how a
//!   cluster's nodes are reached, by the controller and the plugin alike) and [`execute`]
//!   (the one executor of the planner's steps);
//! - the two halves of the product: [`controller`] and [`admission`], with [`metrics`];
//! - the process shell: [`server`] (HTTPS, its certificate), [`cli`] (the commands and the
//!   supervisor of `serve`);
//! - beside the product: [`plugin`], `kubectl valkey` (`src/bin/kubectl-valkey.rs`).

pub mod acl;
pub mod api;
pub mod credentials;
pub mod roll;
pub mod settings;
pub mod words;

pub mod fleet;

pub mod access;
pub mod execute;
pub mod valkey;

pub mod admission;
pub mod controller;
pub mod metrics;

pub mod cli;
pub mod server;

pub mod plugin;
