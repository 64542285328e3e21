//! A failed step stops the roll on real valkey-server processes: a new node that does not
//! become ready in time stalls the roll with the reason, every existing node keeps serving,
//! and the roll resumes by itself once the node is ready.

use std::time::Duration;

use harness::valkey::roller::{DriveError, Timeouts, converge, roller, shape, test_timeouts};
use harness::valkey::{NEW, OLD, Writer, assert_no_lost_writes, versions};
use valkey_operator::roll::StallReason;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_is_not_ready_in_time_stalls_then_resumes() {
    let mut roller = roller(48, "stall");
    converge(&mut roller, &shape(2, 1, OLD), Duration::from_secs(60)).await;
    let before = roller.nodes();
    let writer = Writer::start(roller.addresses());

    // No joining node can be ready within zero seconds: the first join of the roll is overdue.
    roller.set_timeouts(Timeouts {
        join: Duration::ZERO,
        ..test_timeouts()
    });
    let stalled = roller
        .converge(&shape(2, 1, NEW), Duration::from_secs(60))
        .await;
    let Err(DriveError::Stalled { reason }) = stalled else {
        panic!("expected a stall, got {stalled:?}");
    };
    assert!(
        matches!(reason, StallReason::JoinOverdue { .. }),
        "{reason}"
    );
    // Nothing was retired and nothing failed over: the new node is the only change.
    let now = roller.nodes();
    assert_eq!(now.len(), before.len() + 1);
    assert!(before.keys().all(|name| now.contains_key(name)));
    writer.assert_progressing().await;

    // Once the node has synced, planning again resumes the roll by itself.
    roller.set_timeouts(test_timeouts());
    converge(&mut roller, &shape(2, 1, NEW), Duration::from_secs(120)).await;
    assert_eq!(versions(&roller.addresses()).await, vec![NEW; 4]);
    let log = writer.stop().await;
    assert_no_lost_writes(&roller.addresses(), &log, "the cluster").await;
}
