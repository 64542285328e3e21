//! Test tooling: a real Kubernetes control plane (etcd, kube-apiserver,
//! kube-controller-manager built from source by `hack/build-k8s.sh`) and a test kubelet
//! that runs Valkey Pods as local `valkey-server` processes, each on its own loopback IP.
//!
//! ```no_run
//! # async fn demo() -> Result<(), testenv::Error> {
//! let control_plane = testenv::ControlPlane::start().await?;
//! let client = control_plane.client().await?;
//! let kubelet = testenv::TestKubelet::start(client.clone(), Default::default()).await?;
//! // ... create Pods through `client`, run `control_plane.kubectl()` ...
//! # Ok(()) }
//! ```
//! Dropping either handle kills every process it started, also while a test panics.

mod certs;
mod controlplane;
mod kubelet;
pub mod node;
mod process;
pub mod wait;

use std::path::PathBuf;
use std::process::ExitStatus;

pub use controlplane::{AUDIT_LOG_VAR, ControlPlane, ControlPlaneOptions};
pub use kubelet::ip::IpLease;
pub use kubelet::{KubeletOptions, PodProcess, TestKubelet};
pub use node::firewall::Firewall;
pub use node::from_pod::{Flood, connects_from};
pub use node::image::ImageSpec;
pub use node::{NodeOptions, RealNode, nodes_in_zones};
pub use process::{peak_resident_kib, reset_peak_resident, resident_kib};
pub use wait::{Outcome, eventually};

/// The Kubernetes release the binaries are built from (see `hack/build-k8s.sh`).
pub const KUBERNETES_VERSION: &str = "v1.35.4";

/// Everything that can go wrong while bringing up or running the test environment.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("generating the control plane's certificates: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("locating the Kubernetes binaries: {0}")]
    Binaries(String),
    #[error("{name} exited during start-up ({status}); last log lines:\n{log_tail}")]
    Exited {
        name: String,
        status: ExitStatus,
        log_tail: String,
    },
    #[error("{what} not ready after {waited_secs}s: {last_error}")]
    NotReady {
        what: String,
        waited_secs: u64,
        last_error: String,
    },
    #[error("encoding {0}")]
    Encoding(String),
    #[error("reading the kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("Kubernetes API call ({action}): {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }

    /// A server that exited because the port it was given had been taken meanwhile.
    fn is_port_taken(&self) -> bool {
        matches!(self, Error::Exited { log_tail, .. } if log_tail.contains("address already in use"))
    }
}

/// Where `valkey-server` binaries live, one folder per version: `$VALKEY_BIN_ROOT`, else
/// `~/.cache/valkey-operator/valkey` (filled by `hack/fetch-valkey.sh`).
pub fn valkey_bin_root() -> PathBuf {
    match std::env::var_os("VALKEY_BIN_ROOT") {
        Some(root) if !root.is_empty() => PathBuf::from(root),
        _ => home().join(".cache/valkey-operator/valkey"),
    }
}

/// The folder holding etcd, kube-apiserver, kube-controller-manager, kubectl and helm:
/// `$TESTENV_K8S_BIN_DIR` if set, else what `hack/build-k8s.sh` prints (it builds the
/// binaries on first use and reuses them afterwards).
pub fn k8s_bin_dir() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("TESTENV_K8S_BIN_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    folder_from_script("hack/build-k8s.sh")
}

/// Runs one of the project's `hack/` scripts that install or build something on first use
/// and print its folder on their last line; that folder.
pub(crate) fn folder_from_script(script: &str) -> Result<PathBuf, Error> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(script);
    let output = std::process::Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(Error::io(format!("running {}", script.display())))?;
    if !output.status.success() {
        return Err(Error::Binaries(format!(
            "{} failed ({})",
            script.display(),
            output.status
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout.lines().last() {
        Some(dir) if !dir.trim().is_empty() => Ok(PathBuf::from(dir.trim())),
        _ => Err(Error::Binaries(format!(
            "{} printed no folder",
            script.display()
        ))),
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

#[cfg(test)]
mod error_tests {
    use std::os::unix::process::ExitStatusExt;

    use super::Error;

    #[test]
    fn only_a_server_that_lost_its_port_is_started_again() {
        let exited = |log_tail: &str| Error::Exited {
            name: "kube-apiserver".into(),
            status: std::process::ExitStatus::from_raw(256),
            log_tail: log_tail.into(),
        };
        let taken = "failed to listen on 127.0.0.1:35213: bind: address already in use";
        assert!(exited(taken).is_port_taken());
        assert!(!exited("invalid flag --foo").is_port_taken());
        assert!(!Error::Binaries(taken.into()).is_port_taken());
    }
}
