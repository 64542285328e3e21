//! Scaling on real valkey-server processes under a continuous writer: shards 3 → 5 → 2 with
//! atomic slot migration, and replicas per shard 1 → 2 → 0 → 1. No acknowledged write is lost,
//! slots end balanced, and every shard has the asked-for replicas.

use std::time::Duration;

use harness::valkey::roller::{converge, roller, shape};
use harness::valkey::{OLD, Writer, assert_no_lost_writes, primaries, wait_for_layout};
use valkey_operator::roll::Step;
use valkey_operator::roll::slots::target_count;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_three_to_five_to_two_under_writes() {
    let mut roller = roller(43, "shards");
    converge(&mut roller, &shape(3, 1, OLD), Duration::from_secs(60)).await;
    let writer = Writer::start(roller.addresses());
    writer.assert_progressing().await;
    for shards in [5, 2] {
        let before = roller.history().len();
        converge(
            &mut roller,
            &shape(shards, 1, OLD),
            Duration::from_secs(180),
        )
        .await;
        writer.assert_progressing().await;
        let migrations = roller.history()[before..]
            .iter()
            .filter(|r| matches!(r.step, Step::MigrateSlots { .. }))
            .count();
        assert!(migrations > 0, "no slot moved going to {shards} shards");
        let mut expected: Vec<(usize, u32)> =
            (0..shards).map(|s| (1, target_count(s, shards))).collect();
        expected.sort();
        wait_for_layout(&roller.addresses(), &expected).await;
        assert_eq!(roller.addresses().len(), 2 * shards as usize);
    }
    let log = writer.stop().await;
    assert!(log.acked > 100, "the writer barely wrote: {}", log.acked);
    assert_no_lost_writes(&roller.addresses(), &log, "the cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_one_to_two_to_none_to_one_under_writes() {
    let mut roller = roller(44, "replicas");
    converge(&mut roller, &shape(3, 1, OLD), Duration::from_secs(60)).await;
    let primaries_before = primaries(&roller.addresses()).await;
    let writer = Writer::start(roller.addresses());
    writer.assert_progressing().await;
    for replicas in [2, 0, 1] {
        converge(
            &mut roller,
            &shape(3, replicas, OLD),
            Duration::from_secs(120),
        )
        .await;
        writer.assert_progressing().await;
        let expected: Vec<(usize, u32)> = [5461, 5461, 5462]
            .into_iter()
            .map(|slots| (replicas as usize, slots))
            .collect();
        wait_for_layout(&roller.addresses(), &expected).await;
        assert_eq!(roller.addresses().len(), 3 * (1 + replicas as usize));
        // Scaling replicas never retires (or fails over) a primary.
        assert_eq!(primaries(&roller.addresses()).await, primaries_before);
    }
    let log = writer.stop().await;
    assert!(log.acked > 100, "the writer barely wrote: {}", log.acked);
    assert_no_lost_writes(&roller.addresses(), &log, "the cluster").await;
}
