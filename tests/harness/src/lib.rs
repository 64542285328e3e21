//! What the operator's integration tests (`tests/*.rs`) and benchmarks share, in one crate so a
//! test says `use harness::...` instead of declaring the right combination of `mod` folders:
//!
//! - [`https`]: the real admission server on a loopback port, certificates, AdmissionReviews;
//! - [`k8s`]: a test control plane with the chart installed, kubectl and helm, the operator
//!   binary as a local process, and the whole product with a watch on a cluster (end to end);
//! - [`valkey`]: a cluster-aware writer and an outside sampler on real valkey-server processes,
//!   what the samples show, and the roller the roll tests drive;
//! - [`eventually`]: waiting for a condition (from testenv, which needs it too);
//! - [`nemesis`]: the dice, seeds and loss windows of the tests that draw faults at random;
//! - [`metric`]: one value from the operator's `/metrics` text;
//! - [`prometheus`]: a real Prometheus scraping the operator, queried with PromQL, and promtool;
//! - [`signal`]: a signal to a local process (a Pod's server, the API server), for faults.

pub mod https;
pub mod k8s;
pub mod metrics;
pub mod nemesis;
pub mod prometheus;
pub mod valkey;

use std::path::PathBuf;

pub use metrics::metric;
pub use testenv::{Outcome, eventually};
pub use valkey_operator::api::GROUP;

/// The repository's root, for files the tests read (the chart, the samples).
pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Overrides where [`operator_binary`] looks.
pub const OPERATOR_BIN_VAR: &str = "VALKEY_OPERATOR_BIN";

/// The `valkey-operator` binary: `$VALKEY_OPERATOR_BIN` if set, else the one beside the running
/// test. `env!("CARGO_BIN_EXE_valkey-operator")` is only given to the root package's own test
/// targets, not to this library; but Cargo builds a package's binaries before running its
/// integration tests and benchmarks, and puts them in `target/<profile>/`, the parent of the
/// `deps/` folder the test executable runs from.
pub fn operator_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(OPERATOR_BIN_VAR).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut dir = exe.parent().expect("the test executable's folder");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target/<profile>");
    }
    let binary = dir.join("valkey-operator");
    assert!(
        binary.is_file(),
        "{} does not exist: run the test through `cargo test` (which builds the operator \
         binary for integration tests), or point {OPERATOR_BIN_VAR} at one",
        binary.display()
    );
    binary
}

/// Sends `which` (`-KILL`, `-STOP`, `-CONT`) to process `pid` with `kill`; returns when it was
/// sent, the moment a fault struck.
pub fn signal(pid: u32, which: &str) -> tokio::time::Instant {
    let at = tokio::time::Instant::now();
    let sent = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success(), "kill {which} {pid}");
    at
}

/// The text without terminal colour codes (the operator's log, read back).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
