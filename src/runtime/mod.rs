//! Node runtimes: what the roll's steps use to start and stop Valkey servers. The local
//! runtime ([`local`]) runs them as processes on loopback addresses, and [`driver`] runs the
//! observe → plan → act loop on it; the Kubernetes controller (`crate::controller`) runs the
//! same loop with Pods. Both observe nodes through [`observe`].

pub mod driver;
pub mod local;
pub mod observe;

use std::future::Future;
use std::path::PathBuf;

/// What to start: one Valkey node of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// Unique, stable name of the node.
    pub name: String,
    /// The shard the node is created for.
    pub shard: u32,
    /// The revision to run; the local runtime reads it as the engine version.
    pub revision: String,
}

/// Where a started node serves clients (its cluster bus is `port + 10000`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeAddress {
    pub ip: String,
    pub port: u16,
}

impl std::fmt::Display for NodeAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.ip, self.port)
    }
}

/// A runtime failure, naming the node.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{node}: no valkey-server for revision {revision} at {}", path.display())]
    MissingBinary {
        node: String,
        revision: String,
        path: PathBuf,
    },
    #[error("{node}: {action}: {source}")]
    Io {
        node: String,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("{node}: no loopback address left in 127.0.{subnet}.0/24")]
    AddressesExhausted { node: String, subnet: u8 },
    #[error("{node}: a node of that name already runs")]
    AlreadyRunning { node: String },
    #[error("{node}: no such node")]
    UnknownNode { node: String },
}

/// Starts and stops Valkey nodes. Starting returns as soon as the node has an address; the
/// caller waits for it to answer.
pub trait NodeRuntime: Send + Sync {
    fn start_node(
        &self,
        spec: &NodeSpec,
    ) -> impl Future<Output = Result<NodeAddress, RuntimeError>> + Send;

    /// Stop the node for good (it is being retired, or a test kills it).
    fn stop_node(&self, name: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;
}
