//! Faults on the real nodes: a node's Pods cut off from every other node's, as a failed
//! switch or a zone's uplink would cut them ([`Cut`]); a whole node lost at once, as a machine
//! whose power fails is ([`Lost`]). The Pods of a node reach other nodes' only through
//! the host, which forwards between the bridges, so dropping forwarded packets between one
//! node's subnet and the rest of the Pod networks is the cut; the host itself (the operator, the
//! API server, a client running on it) still reaches both sides, as a control plane outside
//! the cut zone would. Each cut is a chain of its own, jumped to first from `FORWARD`, so it
//! never touches another's rules (a firewall's included) and goes whole when dropped.

use std::process::{Command, Stdio};

use crate::Error;

/// Every Pod network of the machine's real nodes.
const POD_NETWORKS: &str = "198.18.0.0/16";

/// A node's Pods cut off from the other nodes' Pods, both ways, until dropped.
#[derive(Debug)]
pub struct Cut {
    chain: String,
}

impl Cut {
    /// Cuts `subnet` (a node's Pod network, `198.18.N.0/24`) off from every other Pod network.
    pub(crate) fn start(subnet: u8, pod_subnet: &str) -> Result<Self, Error> {
        let chain = format!("VO-CUT-{subnet}");
        // One a killed test left on this subnet goes first.
        remove(&chain);
        let cut = Self { chain };
        let rules: [&[&str]; 5] = [
            &["-N", &cut.chain],
            // A node's own Pods still reach each other across its bridge.
            &[
                "-A", &cut.chain, "-s", pod_subnet, "-d", pod_subnet, "-j", "RETURN",
            ],
            &[
                "-A",
                &cut.chain,
                "-s",
                pod_subnet,
                "-d",
                POD_NETWORKS,
                "-j",
                "DROP",
            ],
            &[
                "-A",
                &cut.chain,
                "-s",
                POD_NETWORKS,
                "-d",
                pod_subnet,
                "-j",
                "DROP",
            ],
            &["-I", "FORWARD", "1", "-j", &cut.chain],
        ];
        for rule in rules {
            if !iptables(rule) {
                return Err(Error::Binaries(format!(
                    "iptables {} failed: cutting {pod_subnet} off",
                    rule.join(" ")
                )));
            }
        }
        Ok(cut)
    }
}

impl Drop for Cut {
    /// Heals the cut.
    fn drop(&mut self) {
        remove(&self.chain);
    }
}

/// A node lost: every packet to or from its Pods and its end of the host link dropped, from
/// the host (the API server, the operator, clients) and from every other node, so that what
/// asks it waits for its timeout, as it would of a dead machine, rather than being refused.
/// The node's processes are killed beside it ([`crate::node::RealNode::lose`]). Dropping it
/// removes the rules; the node stays dead.
#[derive(Debug)]
pub struct Lost {
    chain: String,
}

impl Lost {
    pub(crate) fn start(subnet: u8, pod_subnet: &str, link_address: &str) -> Result<Self, Error> {
        let chain = format!("VO-LOST-{subnet}");
        remove(&chain);
        let lost = Self { chain };
        let mut rules: Vec<Vec<&str>> = vec![vec!["-N", &lost.chain]];
        for address in [pod_subnet, link_address] {
            rules.push(vec!["-A", &lost.chain, "-d", address, "-j", "DROP"]);
            rules.push(vec!["-A", &lost.chain, "-s", address, "-j", "DROP"]);
        }
        for hook in ["FORWARD", "OUTPUT", "INPUT"] {
            rules.push(vec!["-I", hook, "1", "-j", &lost.chain]);
        }
        for rule in &rules {
            if !iptables(rule) {
                return Err(Error::Binaries(format!(
                    "iptables {} failed: losing {pod_subnet}",
                    rule.join(" ")
                )));
            }
        }
        Ok(lost)
    }
}

impl Drop for Lost {
    fn drop(&mut self) {
        remove(&self.chain);
    }
}

/// The jumps to `chain`, then the chain; best effort.
fn remove(chain: &str) {
    for hook in ["OUTPUT", "INPUT"] {
        iptables(&["-D", hook, "-j", chain]);
    }
    iptables(&["-D", "FORWARD", "-j", chain]);
    iptables(&["-F", chain]);
    iptables(&["-X", chain]);
}

fn iptables(args: &[&str]) -> bool {
    Command::new("iptables")
        .arg("-w")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
