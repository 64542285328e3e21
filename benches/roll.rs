//! Roll benchmark on real valkey-server processes (not a test: it prints figures).
//!
//! A 3 shards × 1 replica cluster on 9.0.0 is loaded with `BENCH_KEYS` keys (default 200000,
//! `BENCH_VALUE_BYTES` each, default 100), then rolled to 9.1.2 under a continuous writer. It
//! prints, per shard: the roll's total time, the replicas' full-sync time, the overhead beyond
//! them, and the write-unavailability window of its failover (the longest gap between
//! acknowledged writes around it); the same for the whole cluster; and the time slot migration
//! takes to move slot ranges holding a known number of keys, atomically (9.1) and key by key
//! (what 9.0 nodes get).
//!
//! Run: `cargo bench --bench roll` (needs `hack/fetch-valkey.sh 9.0.0 9.1.2`).

use std::collections::HashMap;
use std::time::Duration;

use harness::eventually;
use harness::valkey::roller::{LocalRuntime, Roller, StepRecord, converge, roller, shape};
use harness::valkey::runtime::{NodeRuntime, NodeSpec};
use harness::valkey::{NEW, OLD, Writer, key_slot, lost_writes, primaries};
use tokio::time::Instant;
use valkey_operator::roll::slots::SLOT_COUNT;
use valkey_operator::roll::{SlotRange, Step};
use valkey_operator::valkey::migration::{KeyMove, move_keys};
use valkey_operator::valkey::{Expected, NodeAddress, NodeClient, Reach, forget_everywhere};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// Load `count` keys `bench:N` with pipelines sent straight to each slot's owner.
async fn preload(addresses: &[String], count: u64, value_bytes: usize) {
    let client = NodeClient::connect(&addresses[0], Duration::from_secs(2))
        .await
        .unwrap();
    let mut owners: Vec<String> = vec![String::new(); SLOT_COUNT as usize];
    for node in client.cluster_nodes().await.unwrap() {
        for range in &node.slots {
            for slot in range.start..=range.end {
                owners[usize::from(slot)] = format!("{}:{}", node.ip, node.port);
            }
        }
    }
    let value = "v".repeat(value_bytes);
    let mut batches: HashMap<String, redis::Pipeline> = HashMap::new();
    let mut conns = HashMap::new();
    for index in 0..count {
        let key = format!("bench:{index}");
        let owner = owners[usize::from(key_slot(&key))].clone();
        let pipe = batches.entry(owner.clone()).or_default();
        pipe.cmd("SET").arg(&key).arg(&value).ignore();
        if pipe.len() >= 2000 || index + 1 == count {
            let batch = batches.remove(&owner).unwrap_or_default();
            if !conns.contains_key(&owner) {
                let conn = redis::Client::open(format!("redis://{owner}/"))
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                conns.insert(owner.clone(), conn);
            }
            let conn = conns.get_mut(&owner).unwrap();
            let _: () = batch.query_async(conn).await.unwrap();
        }
    }
    for (owner, batch) in batches {
        if batch.is_empty() {
            continue;
        }
        let mut conn = redis::Client::open(format!("redis://{owner}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = batch.query_async(&mut conn).await.unwrap();
    }
}

/// Time for a fresh node to become a synced replica of shard 0's primary: from `CLUSTER
/// REPLICATE` answering to link up, no sync in progress, offset caught up. The probe node is
/// removed afterwards.
async fn bare_full_sync(roller: &Roller<LocalRuntime>, name: &str) -> Duration {
    let spec = NodeSpec {
        name: name.into(),
        shard: 0,
        revision: NEW.into(),
    };
    let addr = roller
        .runtime()
        .start_node(&spec)
        .await
        .unwrap()
        .to_string();
    let probe = eventually(
        "the probe node to answer",
        Duration::from_secs(10),
        async || {
            let client = NodeClient::connect(&addr, Duration::from_secs(2))
                .await
                .ok()?;
            client.ping().await.ok()?;
            Some(client)
        },
    )
    .await;
    let mut others = Vec::new();
    for other in roller.addresses() {
        others.push(
            NodeClient::connect(&other, Duration::from_secs(2))
                .await
                .unwrap(),
        );
    }
    let view = others[0].cluster_nodes().await.unwrap();
    let primary = view
        .iter()
        .find(|n| n.slots.iter().any(|r| r.start == 0))
        .unwrap();
    let primary_client = NodeClient::connect(
        &format!("{}:{}", primary.ip, primary.port),
        Duration::from_secs(2),
    )
    .await
    .unwrap();
    probe
        .meet(primary.address().expect("the primary announces an IP"))
        .await
        .unwrap();
    probe
        .replicate(&primary.id, Duration::from_secs(10))
        .await
        .unwrap();
    // Polled every 10 ms rather than with `eventually`'s growing pauses: the time is the figure.
    let started = Instant::now();
    loop {
        let target = primary_client
            .replication_info()
            .await
            .unwrap()
            .master_repl_offset;
        let info = probe.replication_info().await.unwrap();
        if info.link_up && !info.sync_in_progress && info.replica_offset >= target {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "probe never synced"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    let probe_id = probe.my_id().await.unwrap();
    roller.runtime().stop_node(name).await.unwrap();
    forget_everywhere(&others, &probe_id).await.unwrap();
    took
}

/// Time of the joins in `steps`: from each JoinReplica starting to its Activate.
fn sync_time(steps: &[&StepRecord]) -> Duration {
    let mut total = Duration::ZERO;
    let mut joined: Option<Instant> = None;
    for record in steps {
        match &record.step {
            Step::JoinReplica { .. } => joined = Some(record.started),
            Step::Activate { .. } => {
                if let Some(start) = joined.take() {
                    total += record.finished - start;
                }
            }
            _ => {}
        }
    }
    total
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo test --all-targets` runs bench targets too, without `--bench`: figures come only
    // from `cargo bench`.
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("roll benchmark: run it with `cargo bench --bench roll`");
        return;
    }
    let keys = env_number("BENCH_KEYS", 200_000);
    let value_bytes = env_number("BENCH_VALUE_BYTES", 100) as usize;
    let mut roller = roller(47, "bench");
    converge(&mut roller, &shape(3, 1, OLD), Duration::from_secs(60)).await;
    let loading = Instant::now();
    preload(&roller.addresses(), keys, value_bytes).await;
    println!(
        "cluster: 3 shards x 1 replica, {keys} keys of {value_bytes} B loaded in {}",
        secs(loading.elapsed())
    );

    let writer = Writer::start(roller.addresses());
    writer.assert_progressing().await;
    // The yardstick for a shard's roll: a bare full sync of shard 0 under the same writes,
    // before the roll and after it (the writer's keys make the data grow meanwhile).
    let sync_before = bare_full_sync(&roller, "probe-before").await;
    let before = roller.history().len();
    let started = Instant::now();
    converge(&mut roller, &shape(3, 1, NEW), Duration::from_secs(600)).await;
    let finished = Instant::now();
    let sync_after = bare_full_sync(&roller, "probe-after").await;
    let bare_sync = (sync_before + sync_after) / 2;
    println!(
        "bare full sync of a new replica of shard 0 under the writer (REPLICATE -> synced): \
         {} before the roll, {} after, {} on average",
        secs(sync_before),
        secs(sync_after),
        secs(bare_sync)
    );
    let log = writer.stop().await;
    let steps: Vec<&StepRecord> = roller.history()[before..].iter().collect();

    println!("roll 9.0.0 -> 9.1.2, one shard at a time:");
    let mut worst_gap = Duration::ZERO;
    for shard in 0..3 {
        let of_shard: Vec<&StepRecord> = steps
            .iter()
            .copied()
            .filter(|r| r.step.shard() == Some(shard))
            .collect();
        let (Some(first), Some(last)) = (of_shard.first(), of_shard.last()) else {
            continue;
        };
        let total = last.finished - first.started;
        let syncs = sync_time(&of_shard);
        let failover = of_shard
            .iter()
            .find(|r| matches!(r.step, Step::Failover { .. }))
            .map(|r| (r.finished - r.started, r.started, r.finished));
        let (failover_time, gap) = match failover {
            Some((took, from, to)) => (
                took,
                log.longest_gap(
                    from - Duration::from_millis(50),
                    to + Duration::from_secs(1),
                ),
            ),
            None => (Duration::ZERO, Duration::ZERO),
        };
        worst_gap = worst_gap.max(gap);
        println!(
            "  shard {shard}: total {}; 2 joins from start to ready {}; overhead beyond 2 bare \
             full syncs {}; failover command {}; write gap around the failover {}",
            secs(total),
            secs(syncs),
            secs(total.saturating_sub(bare_sync * 2)),
            secs(failover_time),
            secs(gap)
        );
    }
    println!(
        "  whole cluster: {} for {} steps; longest write gap during the roll {}; \
         worst failover gap {}; {} writes acknowledged",
        secs(finished - started),
        steps.len(),
        secs(log.longest_gap(started, finished)),
        secs(worst_gap),
        log.acked
    );
    let lost = lost_writes(&roller.addresses(), log.acked).await;
    println!("  acknowledged writes lost: {}", lost.len());

    // Atomic slot migration of ranges holding a known number of the preloaded keys.
    let nodes = roller.nodes();
    let primaries = primaries(&roller.addresses()).await;
    let mut by_id = HashMap::new();
    for addr in nodes.values() {
        let client = NodeClient::connect(addr, Duration::from_secs(2))
            .await
            .unwrap();
        by_id.insert(client.my_id().await.unwrap(), client);
    }
    let view = by_id
        .values()
        .next()
        .unwrap()
        .cluster_nodes()
        .await
        .unwrap();
    let shard0 = view
        .iter()
        .find(|n| n.slots.iter().any(|r| r.start == 0))
        .unwrap();
    let target = primaries.iter().find(|id| **id != shard0.id).unwrap();
    let source = &by_id[&shard0.id];
    println!("atomic slot migration (CLUSTER MIGRATESLOTS, polled until done):");
    for last_slot in [255u16, 2047] {
        let range = SlotRange::new(0, last_slot);
        let held = keys_in(source.addr(), range).await;
        let took = Instant::now();
        source
            .migrate_slots(target, &[range], Duration::from_secs(300))
            .await
            .unwrap();
        let moved = took.elapsed();
        println!(
            "  slots {range} holding {held} keys (preloaded and written by the writer): {}",
            secs(moved)
        );
        by_id[target]
            .migrate_slots(&shard0.id, &[range], Duration::from_secs(300))
            .await
            .unwrap();
    }
    // The protocol 9.0 clusters move slots with (`SETSLOT`, `MIGRATE`), on the same nodes.
    println!("key-by-key slot migration (SETSLOT, MIGRATE; what a 9.0 node gets):");
    let target_address: NodeAddress = nodes
        .values()
        .find(|a| by_id[target].addr() == a.as_str())
        .unwrap()
        .parse()
        .unwrap();
    let source_address: NodeAddress = source.addr().parse().unwrap();
    for last_slot in [255u16, 2047, 5460] {
        let range = SlotRange::new(0, last_slot);
        let held = keys_in(source.addr(), range).await;
        let took = Instant::now();
        let moved = move_keys(
            &key_move(source_address, target_address).await,
            &[range],
            Duration::from_secs(300),
        )
        .await
        .unwrap();
        println!(
            "  slots {range} holding {held} keys ({moved} moved): {}",
            secs(took.elapsed())
        );
        move_keys(
            &key_move(target_address, source_address).await,
            &[range],
            Duration::from_secs(300),
        )
        .await
        .unwrap();
    }
}

/// Connections for a key-by-key move from `from` to `to` (nodes without users), kept alive for
/// the length of the program (a benchmark's few).
async fn key_move(from: NodeAddress, to: NodeAddress) -> KeyMove<'static> {
    let reach = Reach::plain(Duration::from_secs(5));
    let connect = async |address| {
        let node = Expected {
            address,
            id: None,
            closed: false,
        };
        NodeClient::open(&node, &reach).await.unwrap()
    };
    let mut source_pool = Vec::new();
    let mut target_pool = Vec::new();
    for _ in 0..15 {
        source_pool.push(connect(from).await);
        target_pool.push(connect(to).await);
    }
    KeyMove {
        source: Box::leak(Box::new(connect(from).await)),
        source_pool: Box::leak(source_pool.into_boxed_slice()),
        target_pool: Box::leak(target_pool.into_boxed_slice()),
        mover: Box::leak(Box::new(connect(from).await)),
        target: Box::leak(Box::new(connect(to).await)),
        target_address: to,
        login: None,
    }
}

/// Keys in `range` on the node at `addr` (`CLUSTER COUNTKEYSINSLOT`, slot by slot).
async fn keys_in(addr: &str, range: SlotRange) -> u64 {
    let mut conn = redis::Client::open(format!("redis://{addr}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut total = 0;
    for slot in range.start..=range.end {
        let count: u64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query_async(&mut conn)
            .await
            .unwrap();
        total += count;
    }
    total
}
