//! The network plugin's firewall on a real node: kube-router with its firewall only
//! (`--run-firewall`, router and service proxy off), as platform teams run it for
//! NetworkPolicies, programming iptables and ipsets in the host's network namespace, where
//! every Pod's packets pass (the bridge's too: `bridge-nf-call-iptables`).
//!
//! kube-router syncs the whole filter table and deletes the Pod chains it does not know, so two
//! of them in one network namespace undo each other's rules. The real nodes of this machine
//! share one, hence one firewall at a time on the machine (a lock on a file), and it guards the
//! Pods of one node: those whose `hostIP` is that node's address. Dropping it stops kube-router
//! and removes its chains and ipsets, then lets the next one in.

use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::ProcessGuard;
use crate::{ControlPlane, Error};

use super::RealNode;

/// The file whose lock is the machine's one firewall.
const LOCK: &str = "/run/valkey-testenv-firewall.lock";

/// kube-router enforcing NetworkPolicies for one node's Pods.
#[derive(Debug)]
pub struct Firewall {
    process: Option<ProcessGuard>,
    // Released last, once the rules are gone.
    _lock: File,
}

impl Firewall {
    /// Waits for the machine's firewall to be free, starts kube-router for `node` and waits
    /// until its chains are in the filter table.
    pub async fn start(plane: &ControlPlane, node: &RealNode) -> Result<Self, Error> {
        let binary = tokio::task::spawn_blocking(binary)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        let lock = tokio::task::spawn_blocking(take_lock)
            .await
            .map_err(|e| Error::Binaries(e.to_string()))??;
        // Rules a killed test left behind would guard Pods that are gone, at addresses reused.
        cleanup();
        let mut command = Command::new(&binary);
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
            process: Some(process),
            _lock: lock,
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
            if forward_jumps_to_kube_router() {
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
}

impl Drop for Firewall {
    fn drop(&mut self) {
        drop(self.process.take());
        cleanup();
    }
}

/// Whether a TCP connection from the network namespace of process `pid` (a container's) to
/// `to` is accepted within `timeout`: what a Pod reaches, asked from inside it.
pub fn connects_from(pid: u32, to: SocketAddr, timeout: Duration) -> io::Result<bool> {
    let namespace = File::open(format!("/proc/{pid}/ns/net"))?;
    // A thread of its own enters the namespace, so the test's other threads stay where they are.
    std::thread::spawn(move || {
        // SAFETY: setns on this thread only, with a descriptor that lives until it returns.
        if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        match TcpStream::connect_timeout(&to, timeout) {
            Ok(_) => Ok(true),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::HostUnreachable
                        | io::ErrorKind::NetworkUnreachable
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    })
    .join()
    .map_err(|_| io::Error::other("the connecting thread panicked"))?
}

fn binary() -> Result<PathBuf, Error> {
    // The script prints the binary's path on its last line.
    crate::folder_from_script("hack/build-kube-router.sh")
}

/// Blocks until this process holds the machine's firewall lock.
fn take_lock() -> Result<File, Error> {
    let file = lock_file()?;
    // SAFETY: flock on a descriptor this function owns; the lock goes with the file.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(Error::io(format!("locking {LOCK}"))(
            io::Error::last_os_error(),
        ));
    }
    Ok(file)
}

/// Removes what a firewall killed without its `Drop` left behind, unless one is running: a
/// node that starts without a firewall must not inherit rules for addresses it hands out again.
pub(crate) fn clear_unless_running() -> Result<(), Error> {
    let file = lock_file()?;
    // SAFETY: as in `take_lock`; not blocking: a running firewall keeps its rules.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        cleanup();
    }
    Ok(())
}

fn lock_file() -> Result<File, Error> {
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)
        .map_err(Error::io(format!("opening {LOCK}")))
}

/// The prefixes of the filter chains kube-router's firewall makes, and of its ipsets.
const CHAIN_PREFIXES: [&str; 3] = ["KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-"];
const IPSET_PREFIXES: [&str; 3] = ["KUBE-SRC-", "KUBE-DST-", "kube-router-"];

/// Removes kube-router's jumps, chains and ipsets from the host; best effort (it runs in `Drop`).
/// Ours, not `kube-router --cleanup-config`: in v2.1.0 that removes no firewall rule and then
/// panics in the service proxy's part. Left behind, the rules of Pods that are gone would
/// guard the next test's Pods at the same addresses.
fn cleanup() {
    let rules = iptables_rules();
    let ours = |chain: &str| {
        CHAIN_PREFIXES
            .iter()
            .any(|prefix| chain.starts_with(prefix))
    };
    // First the jumps from the built-in chains, then every chain of ours emptied, then removed.
    for rule in &rules {
        let words: Vec<&str> = rule.split_whitespace().collect();
        if let ["-A", chain, ..] = words[..]
            && !ours(chain)
            && words
                .windows(2)
                .any(|pair| pair[0] == "-j" && ours(pair[1]))
        {
            let delete: Vec<String> = shell_words(rule)
                .into_iter()
                .enumerate()
                .map(|(i, word)| if i == 0 { "-D".into() } else { word })
                .collect();
            iptables(&delete);
        }
    }
    let chains: Vec<&str> = rules
        .iter()
        .filter_map(|rule| rule.strip_prefix("-N "))
        .filter(|chain| ours(chain))
        .collect();
    for chain in &chains {
        iptables(&["-F".to_string(), chain.to_string()]);
    }
    for chain in &chains {
        iptables(&["-X".to_string(), chain.to_string()]);
    }
    let sets = Command::new("ipset").args(["list", "-n"]).output();
    let sets = sets.map(|out| String::from_utf8_lossy(&out.stdout).into_owned());
    for set in sets.unwrap_or_default().lines() {
        if IPSET_PREFIXES.iter().any(|prefix| set.starts_with(prefix)) {
            let _ = Command::new("ipset").args(["destroy", set]).status();
        }
    }
}

/// The filter table as `iptables -S` prints it.
fn iptables_rules() -> Vec<String> {
    Command::new("iptables")
        .args(["-w", "-S"])
        .stderr(Stdio::null())
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn iptables(args: &[String]) {
    let _ = Command::new("iptables")
        .arg("-w")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A rule of `iptables -S` as its arguments: words, and the double-quoted comments whole.
fn shell_words(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in rule.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

fn forward_jumps_to_kube_router() -> bool {
    Command::new("iptables")
        .args(["-w", "-S", "FORWARD"])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("-j KUBE-ROUTER-FORWARD"))
}
