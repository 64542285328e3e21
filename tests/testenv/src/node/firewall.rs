//! The network plugin's firewall on a real node: kube-router with its firewall only
//! (`--run-firewall`, router and service proxy off), as platform teams run it for
//! NetworkPolicies, programming iptables and ipsets in the node's network namespace, where its
//! Pods' packets pass (the bridge's too: `bridge-nf-call-iptables`). Each node has its own
//! namespace, so each can have its firewall: kube-router syncs the whole filter table and
//! deletes the Pod chains it does not know, which two in one namespace would do to each other.
//! Dropping it stops kube-router and empties the node's filter table and ipsets (kube-router's
//! own `--cleanup-config` removes no firewall rule in v2.1.0, then panics). What a Pod then
//! reaches is asked from inside it (`super::from_pod`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::process::ProcessGuard;
use crate::{ControlPlane, Error};

use super::{RealNode, host};

/// kube-router enforcing NetworkPolicies for one node's Pods.
#[derive(Debug)]
pub struct Firewall {
    subnet: u8,
    process: Option<ProcessGuard>,
}

impl Firewall {
    /// Starts kube-router in `node`'s network namespace and waits until its chains are in the
    /// node's filter table.
    pub async fn start(plane: &ControlPlane, node: &RealNode) -> Result<Self, Error> {
        let binary = tokio::task::spawn_blocking(binary)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        let mut command = node.command(&binary);
        command
            .arg("--run-firewall=true")
            .arg("--run-router=false")
            .arg("--run-service-proxy=false")
            .arg(format!(
                "--kubeconfig={}",
                plane.kubeconfig_path().display()
            ))
            .arg(format!("--hostname-override={}", node.name()))
            .arg("--health-port=0")
            .arg("--metrics-port=0")
            .arg("--v=1");
        let log = node.dir().join("kube-router.log");
        let process = ProcessGuard::spawn("kube-router", command, &log)
            .map_err(Error::io("starting kube-router"))?;
        let mut firewall = Self {
            subnet: node.subnet,
            process: Some(process),
        };
        firewall
            .wait_programmed(&log, Duration::from_secs(60))
            .await?;
        Ok(firewall)
    }

    /// Until kube-router's top-level chain is jumped to from `FORWARD`.
    async fn wait_programmed(&mut self, log: &Path, timeout: Duration) -> Result<(), Error> {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Some(process) = self.process.as_mut()
                && let Ok(Some(status)) = process.try_exit_status()
            {
                return Err(Error::Exited {
                    name: "kube-router".into(),
                    status,
                    log_tail: process.log_tail(30),
                });
            }
            if self.forward_jumps_to_kube_router() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(Error::NotReady {
            what: "kube-router's firewall".into(),
            waited_secs: timeout.as_secs(),
            last_error: crate::process::log_tail(log, 30),
        })
    }

    fn forward_jumps_to_kube_router(&self) -> bool {
        host::in_node_network(self.subnet, "iptables")
            .args(["-w", "-S", "FORWARD"])
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|out| {
                String::from_utf8_lossy(&out.stdout).contains("-j KUBE-ROUTER-FORWARD")
            })
    }
}

impl Drop for Firewall {
    /// Every rule and set in the node's namespace is the firewall's; best effort (the node
    /// may be gone already, and its rules with it).
    fn drop(&mut self) {
        drop(self.process.take());
        for args in [&["-w", "-F"][..], &["-w", "-X"]] {
            let _ = host::in_node_network(self.subnet, "iptables")
                .args(args)
                .stderr(Stdio::null())
                .status();
        }
        let _ = host::in_node_network(self.subnet, "ipset")
            .arg("destroy")
            .stderr(Stdio::null())
            .status();
    }
}

fn binary() -> Result<PathBuf, Error> {
    // The script prints the binary's path on its last line.
    crate::folder_from_script("hack/build-kube-router.sh")
}
