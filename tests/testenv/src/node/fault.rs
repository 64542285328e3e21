//! Faults on the real nodes: a node's Pods cut off from every other node's, as a failed
//! switch or a zone's uplink would cut them, both ways or one way ([`Cut`]); a node's link
//! congested ([`Congested`]); a whole node lost at once, as a machine whose power fails is
//! ([`Lost`]); one process (the operator) cut off from the nodes or from its API server
//! ([`ProcessCut`]). The Pods of a node reach other nodes' only through
//! the host, which forwards between the bridges, so dropping forwarded packets between one
//! node's subnet and the rest of the Pod networks is the cut; the host itself (the operator, the
//! API server, a client running on it) still reaches both sides, as a control plane outside
//! the cut zone would. Each cut is a chain of its own, jumped to first from `FORWARD`, so it
//! never touches another's rules (a firewall's included) and goes whole when dropped.

use std::process::{Command, Stdio};

use crate::Error;

/// Every Pod network of the machine's real nodes.
const POD_NETWORKS: &str = "198.18.0.0/16";

/// Which of a node's packets a [`Cut`] drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// To and from the other nodes' Pods.
    Both,
    /// From the node's Pods to the others' only (what it sends is lost, what it is sent arrives).
    Outbound,
    /// To the node's Pods from the others' only.
    Inbound,
}

/// A node's Pods cut off from the other nodes' Pods, until dropped.
#[derive(Debug)]
pub struct Cut {
    chain: String,
}

impl Cut {
    /// Cuts `subnet` (a node's Pod network, `198.18.N.0/24`) off from every other Pod network
    /// in `direction`.
    pub(crate) fn start(subnet: u8, pod_subnet: &str, direction: Direction) -> Result<Self, Error> {
        let chain = format!("VO-CUT-{subnet}");
        // One a killed test left on this subnet goes first.
        remove(&chain);
        let cut = Self { chain };
        let chain = cut.chain.as_str();
        let mut rules: Vec<Vec<&str>> = vec![
            vec!["-N", chain],
            // A node's own Pods still reach each other across its bridge.
            vec![
                "-A", chain, "-s", pod_subnet, "-d", pod_subnet, "-j", "RETURN",
            ],
        ];
        if direction != Direction::Inbound {
            rules.push(vec![
                "-A",
                chain,
                "-s",
                pod_subnet,
                "-d",
                POD_NETWORKS,
                "-j",
                "DROP",
            ]);
        }
        if direction != Direction::Outbound {
            rules.push(vec![
                "-A",
                chain,
                "-s",
                POD_NETWORKS,
                "-d",
                pod_subnet,
                "-j",
                "DROP",
            ]);
        }
        rules.push(vec!["-I", "FORWARD", "1", "-j", chain]);
        for rule in &rules {
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

/// A node's link congested both ways, as an overloaded uplink is: at most `rate` a second
/// leaves either end, what waits longer than the queue's latency bound is dropped. Every
/// packet of the node's is slowed (its Pods', its kubelet's, what the host sends it). The
/// kernel here has no `netem`, so this, not a fixed delay, is how the tests slow a link.
#[derive(Debug)]
pub struct Congested {
    subnet: u8,
}

impl Congested {
    pub(crate) fn start(subnet: u8, rate: &str) -> Result<Self, Error> {
        let congested = Self { subnet };
        congested.clear();
        let shape = [
            "root", "tbf", "rate", rate, "burst", "16kbit", "latency", "500ms",
        ];
        let host_end = Command::new("tc")
            .args(["qdisc", "add", "dev", &super::host::host_link(subnet)])
            .args(shape)
            .status();
        let node_end = super::host::in_node_network(subnet, "tc")
            .args(["qdisc", "add", "dev", "eth0"])
            .args(shape)
            .status();
        match (host_end, node_end) {
            (Ok(a), Ok(b)) if a.success() && b.success() => Ok(congested),
            (a, b) => Err(Error::Binaries(format!(
                "tc qdisc add tbf on node {subnet}'s link: {a:?}, {b:?}"
            ))),
        }
    }

    /// Removes both ends' queues; best effort.
    fn clear(&self) {
        let _ = Command::new("tc")
            .args([
                "qdisc",
                "del",
                "dev",
                &super::host::host_link(self.subnet),
                "root",
            ])
            .stderr(Stdio::null())
            .status();
        let _ = super::host::in_node_network(self.subnet, "tc")
            .args(["qdisc", "del", "dev", "eth0", "root"])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Congested {
    /// The link runs free again.
    fn drop(&mut self) {
        self.clear();
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

/// One process cut off from some destinations, as a partition between it and them would cut
/// it, while everything else on the machine still reaches them: what a control plane outside a
/// cut zone loses when the cut runs between it and the nodes, or between it and its API
/// server. The process must run in a cgroup (v2) of its own ([`process_cgroup`]): the rule
/// drops what its sockets send there (what it was sent then goes unanswered).
#[derive(Debug)]
pub struct ProcessCut {
    chain: String,
}

/// Where a [`ProcessCut`] drops packets to: a network (`198.18.3.0/24`) or an address, and
/// one TCP port of it or all.
#[derive(Clone, Copy, Debug)]
pub struct Destination<'a> {
    pub network: &'a str,
    pub tcp_port: Option<u16>,
}

impl ProcessCut {
    /// Cuts the processes of `cgroup` (a path under the cgroup v2 root, as
    /// [`process_cgroup`] gives it) off from `destinations` until dropped.
    pub fn start(cgroup: &str, destinations: &[Destination<'_>]) -> Result<Self, Error> {
        // A chain of its own per cut: two cuts of one process that overlap must not end
        // each other.
        static CUTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let number = CUTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 1000;
        let chain = format!("VO-PCUT{number}-{}", cgroup.replace(['/', '.'], "-"));
        let chain = chain.chars().take(28).collect::<String>();
        remove(&chain);
        let cut = Self { chain };
        let chain = cut.chain.as_str();
        let ports: Vec<String> = (destinations.iter())
            .map(|d| d.tcp_port.map(|p| p.to_string()).unwrap_or_default())
            .collect();
        let mut rules: Vec<Vec<&str>> = vec![vec!["-N", chain]];
        for (destination, port) in destinations.iter().zip(&ports) {
            let mut rule = vec!["-A", chain, "-d", destination.network];
            if destination.tcp_port.is_some() {
                rule.extend(["-p", "tcp", "--dport", port.as_str()]);
            }
            rule.extend(["-j", "DROP"]);
            rules.push(rule);
        }
        rules.push(vec![
            "-I", "OUTPUT", "1", "-m", "cgroup", "--path", cgroup, "-j", chain,
        ]);
        for rule in &rules {
            if !iptables(rule) {
                return Err(Error::Binaries(format!(
                    "iptables {} failed: cutting the processes of cgroup {cgroup} off",
                    rule.join(" ")
                )));
            }
        }
        Ok(cut)
    }
}

impl Drop for ProcessCut {
    /// Heals the cut.
    fn drop(&mut self) {
        remove(&self.chain);
    }
}

/// A cgroup (v2) of its own for a process about to be started, named `name`: its path under
/// the v2 root (for [`ProcessCut`]) and its `cgroup.procs` file (a process writes its own pid
/// there to join it). `None` where there is no v2 hierarchy or it cannot be written (not
/// root): the process then cannot be cut off, and runs as before.
pub fn process_cgroup(name: &str) -> Option<(String, std::path::PathBuf)> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let root = mounts
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.get(2) == Some(&"cgroup2"))
        .and_then(|fields| fields.get(1).map(|p| std::path::PathBuf::from(*p)))?;
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).ok()?;
    Some((name.to_string(), dir.join("cgroup.procs")))
}

/// The jumps to `chain`, then the chain; best effort.
fn remove(chain: &str) {
    for hook in ["OUTPUT", "INPUT"] {
        iptables(&["-D", hook, "-j", chain]);
    }
    // A process cut's jump matches its cgroup: the rule is found by listing.
    for rule in jumps_to(chain) {
        let args: Vec<&str> = rule.split_whitespace().collect();
        if let [_append, hook, rest @ ..] = args.as_slice() {
            let mut delete = vec!["-D", *hook];
            delete.extend(rest);
            iptables(&delete);
        }
    }
    iptables(&["-D", "FORWARD", "-j", chain]);
    iptables(&["-F", chain]);
    iptables(&["-X", chain]);
}

/// The rules (as `iptables -S` prints them) that jump to `chain`.
fn jumps_to(chain: &str) -> Vec<String> {
    let listed = Command::new("iptables")
        .args(["-w", "-S", "OUTPUT"])
        .stderr(Stdio::null())
        .output();
    let Ok(listed) = listed else {
        return Vec::new();
    };
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter(|line| line.ends_with(&format!("-j {chain}")) && line.contains("--path"))
        .map(str::to_string)
        .collect()
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
