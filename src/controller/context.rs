//! What every reconcile shares, and the per-cluster retry state behind requeue by cause:
//! transient failures back off exponentially, up to a cap, and a success resets the count.

use std::sync::{Arc, RwLock};

use kube::Client;

use crate::execute::Timeouts;
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::settings::OperatorSettings;

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub fleet: Arc<RwLock<Fleet>>,
    pub settings: OperatorSettings,
    pub timeouts: Timeouts,
    pub recorder: crate::controller::events::EventRecorder,
    pub metrics: Arc<Metrics>,
    /// Everything the leader remembers per cluster (see [`crate::controller::memory`]).
    pub memory: crate::controller::memory::Memory,
    /// The Kubernetes Nodes' zones (see [`crate::controller::watches::kube_nodes`]).
    pub kube_nodes: crate::controller::watches::kube_nodes::KubeNodes,
    /// Wakes a cluster (the controller reconciles each key sent), e.g. a queued cluster of a
    /// fleet rollout when a place frees.
    pub wake: tokio::sync::broadcast::Sender<crate::api::ClusterKey>,
    /// The election's word, checked before acting (see [`crate::controller::lead::lease::Leadership`]).
    pub leadership: tokio::sync::watch::Receiver<crate::controller::lead::lease::Leadership>,
}

impl Context {
    /// Fails unless this replica's Lease still holds by its own clock.
    pub fn fence(&self) -> Result<(), crate::controller::error::Error> {
        if crate::controller::lead::lease::holds(&self.leadership.borrow()) {
            Ok(())
        } else {
            Err(crate::controller::error::Error::NotLeading)
        }
    }
}
