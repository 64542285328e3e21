//! The rolling upgrade on real valkey-server processes: bootstrap 3 shards × 1 replica on
//! 9.0.0, then roll to 9.1.2 and back to 9.0.0 under a continuous writer, while a sampler reads
//! `CLUSTER NODES` from outside every 100 ms.

use std::time::Duration;

use harness::valkey::roller::{converge, roller, shape};
use harness::valkey::{
    NEW, OLD, Sampler, Writer, assert_no_lost_writes, fewest_replicas, layout, primary_changes,
    versions,
};
use valkey_operator::roll::Step;

/// The first slot of each shard in a bootstrapped 3-shard cluster: one probe per shard.
const PROBES: [u16; 3] = [0, 5462, 10923];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roll_up_and_back_down_keeps_every_acknowledged_write() {
    let mut roller = roller(42, "upgrade");
    converge(&mut roller, &shape(3, 1, OLD), Duration::from_secs(60)).await;
    assert_eq!(versions(&roller.addresses()).await, vec![OLD; 6]);

    let writer = Writer::start(roller.addresses());
    for (version, name) in [(NEW, "upgrade"), (OLD, "downgrade")] {
        let sampler = Sampler::start(roller.addresses());
        let before = roller.history().len();
        converge(&mut roller, &shape(3, 1, version), Duration::from_secs(180)).await;
        writer.assert_progressing().await;
        let samples = sampler.stop().await;
        assert!(samples.len() > 10, "{name}: too few samples");

        let steps = &roller.history()[before..];
        for shard in 0..3 {
            let failovers = steps
                .iter()
                .filter(|r| matches!(r.step, Step::Failover { shard: s, .. } if s == shard))
                .count();
            assert_eq!(failovers, 1, "{name}: planned failovers of shard {shard}");
        }
        for (shard, slot) in PROBES.iter().enumerate() {
            assert_eq!(
                primary_changes(&samples, *slot),
                1,
                "{name}: primary changes seen from outside in shard {shard}"
            );
            assert!(
                fewest_replicas(&samples, *slot) >= 1,
                "{name}: shard {shard} dropped below its replica target"
            );
        }
        assert_eq!(versions(&roller.addresses()).await, vec![version; 6]);
        assert_eq!(layout(&roller.addresses()).await.len(), 3);
    }
    let log = writer.stop().await;
    assert!(log.acked > 100, "the writer barely wrote: {}", log.acked);
    assert_no_lost_writes(&roller.addresses(), &log, "the cluster").await;
}
