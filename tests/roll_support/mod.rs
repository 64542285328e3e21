//! Shared by the roll integration tests and the roll benchmark: a cluster-aware writer that
//! records every acknowledged write (following MOVED, refreshing its slot map from whichever
//! node answers), and a sampler that reads `CLUSTER NODES` from outside every 100 ms.
// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use valkey_operator::roll::DesiredShape;
use valkey_operator::runtime::driver::{Roller, Timeouts};
use valkey_operator::runtime::local::LocalRuntime;
use valkey_operator::valkey::{ClusterNode, NodeClient};

pub const OLD: &str = "9.0.0";
pub const NEW: &str = "9.1.2";

pub fn shape(shards: u32, replicas: u32, revision: &str) -> DesiredShape {
    DesiredShape {
        shards,
        replicas_per_shard: replicas,
        revision: revision.into(),
    }
}

/// A roller on its own loopback subnet, so tests can run in parallel. Its timeouts are
/// roomy: the machine running the tests may be busy compiling (a node was seen taking 11 s to
/// initialise under a load of 16 on 2 cores).
pub fn roller(subnet: u8, cluster: &str) -> Roller<LocalRuntime> {
    let runtime = LocalRuntime::new(subnet).unwrap();
    Roller::new(runtime, cluster, test_timeouts())
}

pub fn test_timeouts() -> Timeouts {
    Timeouts {
        call: Duration::from_secs(5),
        start: Duration::from_secs(30),
        join: Duration::from_secs(120),
        failover: Duration::from_secs(15),
        migration: Duration::from_secs(120),
    }
}

/// The hash slot of a key (CRC16/XMODEM of the key, or of its `{hash tag}`).
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

pub fn key(index: u64) -> String {
    format!("key:{index}")
}

/// Routes commands to slot owners, learning the topology from any node that answers.
pub struct Router {
    known: BTreeSet<String>,
    owners: Vec<Option<String>>,
    conns: HashMap<String, MultiplexedConnection>,
}

impl Router {
    pub fn new(seeds: &[String]) -> Self {
        Self {
            known: seeds.iter().cloned().collect(),
            owners: vec![None; 16384],
            conns: HashMap::new(),
        }
    }

    async fn conn(&mut self, addr: &str) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(conn) = self.conns.get(addr) {
            return Ok(conn.clone());
        }
        let client = redis::Client::open(format!("redis://{addr}/"))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_secs(2)));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        self.conns.insert(addr.to_owned(), conn.clone());
        Ok(conn)
    }

    /// Reload the slot map from the first known node that answers.
    pub async fn refresh(&mut self) -> bool {
        let known: Vec<String> = self.known.iter().cloned().collect();
        for addr in known {
            let Ok(mut conn) = self.conn(&addr).await else {
                self.conns.remove(&addr);
                continue;
            };
            let reply: redis::RedisResult<String> = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut conn)
                .await;
            let Some(nodes) = reply.ok().and_then(|t| ClusterNode::parse_all(&t)) else {
                self.conns.remove(&addr);
                continue;
            };
            for node in nodes.iter().filter(|n| !n.failed && !n.handshake) {
                let node_addr = format!("{}:{}", node.ip, node.port);
                self.known.insert(node_addr.clone());
                for range in &node.slots {
                    for slot in range.start..=range.end {
                        self.owners[usize::from(slot)] = Some(node_addr.clone());
                    }
                }
            }
            return true;
        }
        false
    }

    /// Run `cmd` for `key` on its slot owner, once; MOVED updates the map.
    async fn try_once(&mut self, key: &str, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        let slot = usize::from(key_slot(key));
        if self.owners[slot].is_none() {
            self.refresh().await;
        }
        let Some(addr) = self.owners[slot].clone() else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "no owner known for slot",
            )));
        };
        let result = match self.conn(&addr).await {
            Ok(mut conn) => cmd.query_async::<Value>(&mut conn).await,
            Err(error) => Err(error),
        };
        if let Err(error) = &result {
            match error.redirect_node() {
                Some((owner, _)) if error.code() == Some("MOVED") => {
                    // The topology changed: learn all of it, not one slot per MOVED.
                    self.refresh().await;
                    self.owners[slot] = Some(owner.to_owned());
                }
                _ => {
                    if error.is_io_error() || error.is_connection_dropped() || error.is_timeout() {
                        self.conns.remove(&addr);
                    }
                    self.refresh().await;
                }
            }
        }
        result
    }

    /// Run `cmd` for `key` until it succeeds, `stop` is set, or `deadline` passes.
    pub async fn run(
        &mut self,
        key: &str,
        cmd: &redis::Cmd,
        stop: &AtomicBool,
        deadline: Duration,
    ) -> Option<Value> {
        let started = Instant::now();
        while !stop.load(Ordering::Relaxed) && started.elapsed() < deadline {
            match self.try_once(key, cmd).await {
                Ok(value) => return Some(value),
                Err(error) if error.code() == Some("MOVED") => {}
                Err(_) => sleep(Duration::from_millis(5)).await,
            }
        }
        None
    }
}

/// What the writer did: keys `key:0 .. key:{acked-1}` were acknowledged with their index as
/// value, at `ack_times`.
pub struct WriterLog {
    pub acked: u64,
    pub ack_times: Vec<Instant>,
}

impl WriterLog {
    /// The longest time between two acknowledged writes within `[from, to]`.
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        self.longest_gap_at(from, to).0
    }

    /// The longest gap within `[from, to]` and when it began.
    pub fn longest_gap_at(&self, from: Instant, to: Instant) -> (Duration, Instant) {
        let mut longest = (Duration::ZERO, from);
        let mut previous = from;
        for &t in self.ack_times.iter().filter(|t| **t >= from && **t <= to) {
            if t - previous > longest.0 {
                longest = (t - previous, previous);
            }
            previous = t;
        }
        if to.saturating_duration_since(previous) > longest.0 {
            longest = (to - previous, previous);
        }
        longest
    }
}

/// A writer that writes `key:N = N` one after another, each until acknowledged.
pub struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    task: JoinHandle<WriterLog>,
}

impl Writer {
    pub fn start(seeds: Vec<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let (flag, counter) = (stop.clone(), acked.clone());
        let task = tokio::spawn(async move {
            let mut router = Router::new(&seeds);
            let mut log = WriterLog {
                acked: 0,
                ack_times: Vec::new(),
            };
            while !flag.load(Ordering::Relaxed) {
                let key = key(log.acked);
                let mut cmd = redis::cmd("SET");
                cmd.arg(&key).arg(log.acked);
                if router
                    .run(&key, &cmd, &flag, Duration::from_secs(3600))
                    .await
                    .is_some()
                {
                    log.acked += 1;
                    log.ack_times.push(Instant::now());
                    counter.store(log.acked, Ordering::Relaxed);
                }
            }
            log
        });
        Self { stop, acked, task }
    }

    /// Fails the test if no write is acknowledged within 10 s: the writer must keep going
    /// through every step of a roll, not just survive it.
    pub async fn assert_progressing(&self) {
        let before = self.acked.load(Ordering::Relaxed);
        let started = Instant::now();
        while self.acked.load(Ordering::Relaxed) < before + 10 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the writer is stuck at {before} acknowledged writes"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) -> WriterLog {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Every key of `0..acked` whose value is missing or wrong, read through a fresh router.
pub async fn lost_writes(seeds: &[String], acked: u64) -> Vec<u64> {
    let mut router = Router::new(seeds);
    let never = AtomicBool::new(false);
    let mut lost = Vec::new();
    for index in 0..acked {
        let key = key(index);
        let mut cmd = redis::cmd("GET");
        cmd.arg(&key);
        let value = router.run(&key, &cmd, &never, Duration::from_secs(5)).await;
        let read: Option<u64> = value.and_then(|v| redis::from_redis_value(v).ok());
        if read != Some(index) {
            lost.push(index);
        }
    }
    lost
}

/// Fails the test, naming `cluster`, if any of the `log`'s acknowledged writes is not readable
/// from the cluster `seeds` lead to.
pub async fn assert_no_lost_writes(seeds: &[String], log: &WriterLog, cluster: &str) {
    let lost = lost_writes(seeds, log.acked).await;
    assert!(
        lost.is_empty(),
        "{cluster} lost {} of {} acknowledged writes, first {:?}",
        lost.len(),
        log.acked,
        &lost[..lost.len().min(5)]
    );
}

/// One `CLUSTER NODES` read from outside.
pub struct Sample {
    pub at: Instant,
    pub nodes: Vec<ClusterNode>,
}

/// Reads `CLUSTER NODES` every 100 ms from a slot-owning primary, and records only such views
/// where one can be found: the planner activates a replica only once every primary lists it,
/// so a primary's view is complete. A replica's view may lag (gossip reaches it later), and a
/// sample of it could show a shard with fewer replicas than it has. Moves on when the node
/// stops answering or is no longer a slot-owning primary.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    pub fn start(seeds: Vec<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut known: Vec<String> = seeds;
            let mut samples = Vec::new();
            let mut current = 0;
            while !flag.load(Ordering::Relaxed) {
                let tick = Instant::now();
                // First pass: if the node answering is not a slot-owning primary, its view is
                // not recorded; the second pass reads the primary it names (or whatever answers).
                'pass: for pass in 0..2 {
                    for attempt in 0..known.len() {
                        let addr = known[(current + attempt) % known.len()].clone();
                        let read = async {
                            let client =
                                NodeClient::connect(&addr, Duration::from_millis(300)).await?;
                            client.cluster_nodes().await
                        };
                        let Ok(Ok(nodes)) = timeout(Duration::from_millis(500), read).await else {
                            continue;
                        };
                        current = (current + attempt) % known.len();
                        for node in &nodes {
                            let a = format!("{}:{}", node.ip, node.port);
                            if !node.failed && !known.contains(&a) {
                                known.push(a);
                            }
                        }
                        let owns_slots = |n: &ClusterNode| n.primary && !n.slots.is_empty();
                        if pass == 0
                            && !nodes.iter().any(|n| n.myself && owns_slots(n))
                            && let Some(primary) = nodes.iter().find(|n| !n.failed && owns_slots(n))
                        {
                            let a = format!("{}:{}", primary.ip, primary.port);
                            current = known.iter().position(|k| *k == a).unwrap_or(current);
                            continue 'pass;
                        }
                        samples.push(Sample { at: tick, nodes });
                        break 'pass;
                    }
                }
                sleep(Duration::from_millis(100).saturating_sub(tick.elapsed())).await;
            }
            samples
        });
        Self { stop, task }
    }

    pub async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// The owner of `slot` in each sample where some live node owns it.
fn owners(samples: &[Sample], slot: u16) -> Vec<Option<&ClusterNode>> {
    samples
        .iter()
        .map(|s| {
            s.nodes
                .iter()
                .find(|n| !n.failed && n.slots.iter().any(|r| r.start <= slot && slot <= r.end))
        })
        .collect()
}

/// How many times the primary owning `slot` changed across the samples.
pub fn primary_changes(samples: &[Sample], slot: u16) -> usize {
    let sequence: Vec<&str> = owners(samples, slot)
        .into_iter()
        .flatten()
        .map(|n| n.id.as_str())
        .collect();
    sequence.windows(2).filter(|w| w[0] != w[1]).count()
}

/// The fewest replicas the shard owning `slot` had in any sample: live nodes replicating the
/// owner, plus a former owner still shown as a slotless primary (a demotion in flight: it is
/// the new primary's replica-to-be, not a lost node).
pub fn fewest_replicas(samples: &[Sample], slot: u16) -> usize {
    fewest_replicas_at(samples, slot).0
}

/// [`fewest_replicas`], and the first sample that showed it (to print when it is too few).
pub fn fewest_replicas_at(samples: &[Sample], slot: u16) -> (usize, Option<&Sample>) {
    let mut former_owners: BTreeSet<String> = BTreeSet::new();
    let mut fewest = usize::MAX;
    let mut at = None;
    for (sample, owner) in samples.iter().zip(owners(samples, slot)) {
        let Some(owner) = owner else { continue };
        let replicas = sample
            .nodes
            .iter()
            .filter(|n| !n.failed && !n.handshake && n.id != owner.id)
            .filter(|n| {
                n.replica_of.as_deref() == Some(owner.id.as_str())
                    || (n.primary && n.slots.is_empty() && former_owners.contains(&n.id))
            })
            .count();
        if replicas < fewest {
            fewest = replicas;
            at = Some(sample);
        }
        former_owners.insert(owner.id.clone());
    }
    (fewest, at)
}

/// Every node's engine version, read with `INFO server`.
pub async fn versions(addresses: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for addr in addresses {
        let client = NodeClient::connect(addr, Duration::from_secs(2))
            .await
            .unwrap();
        out.push(client.server_info().await.unwrap().version);
    }
    out
}

/// Per desired shard: how many primaries and replicas the cluster shows, and slots owned.
pub async fn layout(addresses: &[String]) -> Vec<(usize, u32)> {
    let client = NodeClient::connect(&addresses[0], Duration::from_secs(2))
        .await
        .unwrap();
    let shards = client.cluster_shards().await.unwrap();
    let mut out: Vec<(usize, u32)> = shards
        .iter()
        .filter(|s| !s.slots.is_empty())
        .map(|s| {
            let replicas = s
                .members
                .iter()
                .filter(|m| !m.primary && m.health == "online")
                .count();
            (replicas, s.slots.iter().map(|r| r.count()).sum())
        })
        .collect();
    out.sort();
    out
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

/// The ids of the nodes owning slots, sorted.
pub async fn primaries(addresses: &[String]) -> Vec<String> {
    let client = NodeClient::connect(&addresses[0], Duration::from_secs(2))
        .await
        .unwrap();
    let mut ids: Vec<String> = client
        .cluster_nodes()
        .await
        .unwrap()
        .into_iter()
        .filter(|n| !n.slots.is_empty())
        .map(|n| n.id)
        .collect();
    ids.sort();
    ids
}

/// [`layout`], polled until every node's view has caught up with `expected` or 10 s passed
/// (gossip spreads a new replica's role and health within moments, not instantly).
pub async fn settled_layout(addresses: &[String], expected: &[(usize, u32)]) -> Vec<(usize, u32)> {
    let started = Instant::now();
    loop {
        let seen = layout(addresses).await;
        if seen == expected || started.elapsed() > Duration::from_secs(10) {
            return seen;
        }
        sleep(Duration::from_millis(100)).await;
    }
}
