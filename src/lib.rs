//! The Valkey operator: admission webhooks over the fleet's configuration, and the machinery to
//! roll Valkey clusters one shard at a time. `main.rs` is a thin shell over [`cli`].

pub mod acl;
pub mod admission;
pub mod api;
pub mod caches;
pub mod certs;
pub mod cli;
pub mod controller;
pub mod credentials;
pub mod execute;
pub mod fleet;
pub mod metrics;
pub mod resolve;
pub mod roll;
pub mod rollout;
pub mod server;
pub mod setting_impact;
pub mod settings;
pub mod supervise;
pub mod tls;
pub mod valkey;
pub mod webhook_config;
pub mod words;
