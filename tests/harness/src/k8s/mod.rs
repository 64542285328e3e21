//! The operator on a real Kubernetes control plane (testenv's etcd, kube-apiserver and
//! kube-controller-manager, built by `hack/build-k8s.sh`):
//!
//! - [`chart`]: helm and kubectl, the chart installed, the operator binary as a local process
//!   under the chart's identity;
//! - [`local`]: the operator as `make dev` runs it, with the admin kubeconfig;
//! - [`product`]: all of it plus the test kubelet, for end-to-end tests, and a watch on one
//!   cluster through a change.

pub mod chart;
pub mod local;
pub mod manifest;
pub mod product;

pub use chart::{ChartIdentity, Helm, Operator};
pub use local::LocalOperator;
pub use product::{
    ClusterWatch, IMAGES, Nodes, Product, ProductOptions, WatchReport, condition, condition_field,
    converged,
};

/// The last `lines` lines of `text` (of a log, for a failure message).
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
