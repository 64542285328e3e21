//! The roller the roll tests and benchmark drive: [`super::runtime`]'s driver (the product's
//! executor) over the local process runtime, with timeouts roomy enough for a busy test
//! machine.

use std::time::Duration;

/// Re-exported so tests name the driver and the runtime through this module only.
pub use super::runtime::driver::{DriveError, Roller, StepRecord, Timeouts};
pub use super::runtime::local::LocalRuntime;
use valkey_operator::roll::DesiredShape;

/// `shards` × `replicas` on `revision` (a Valkey version, for the local runtime).
pub fn shape(shards: u32, replicas: u32, revision: &str) -> DesiredShape {
    DesiredShape {
        shards,
        replicas_per_shard: replicas,
        revision: revision.into(),
        switchover: None,
        primary_update: Default::default(),
        primary_spread: Default::default(),
    }
}

/// A roller on its own loopback subnet, so tests can run in parallel. Its timeouts are
/// roomy: the machine running the tests may be busy compiling (a node was seen taking 11 s to
/// initialise under a load of 16 on 2 cores).
pub fn roller(subnet: u8, cluster: &str) -> Roller<LocalRuntime> {
    let runtime = LocalRuntime::new(subnet).unwrap();
    Roller::new(runtime, cluster, test_timeouts())
}

/// The timeouts of [`roller`].
pub fn test_timeouts() -> Timeouts {
    Timeouts {
        call: Duration::from_secs(5),
        start: Duration::from_secs(30),
        join: Duration::from_secs(120),
        failover: Duration::from_secs(15),
        migration: Duration::from_secs(120),
    }
}

/// Converge or panic with every step taken, for a readable failure.
pub async fn converge(
    roller: &mut Roller<LocalRuntime>,
    desired: &DesiredShape,
    deadline: Duration,
) {
    if let Err(error) = roller.converge(desired, deadline).await {
        let steps: Vec<String> = roller
            .history()
            .iter()
            .map(|r| {
                format!(
                    "{} ({:?}){}",
                    r.step,
                    r.finished - r.started,
                    r.error
                        .as_ref()
                        .map(|e| format!(" FAILED: {e}"))
                        .unwrap_or_default()
                )
            })
            .collect();
        panic!("{error}\nsteps:\n{}", steps.join("\n"));
    }
}
