//! Node runtimes for the real-process roll tests and benchmark: the local runtime ([`local`])
//! runs Valkey servers as processes on loopback addresses, and [`driver`] runs the product's
//! executor (`valkey_operator::execute`) on it, the same code the Kubernetes controller runs with Pods.

pub mod driver;
pub mod local;

use std::future::Future;
use std::path::PathBuf;

use valkey_operator::valkey::NodeAddress;

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
