//! A cluster-aware writer that records every acknowledged write (following MOVED, refreshing
//! its slot map from whichever node answers), and the check that none of them was lost.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::time::{Instant, sleep};
use valkey_operator::valkey::ClusterNode;

use super::apart::Apart;
use super::{key, key_slot};
use crate::eventually;

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
        let login = super::logins::writer_login();
        let client = redis::Client::open(super::logins::url(addr, login.as_ref()))?;
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
        self.run_noting(key, cmd, stop, deadline, &mut Refusals::default())
            .await
    }

    /// [`Router::run`], noting in `refusals` each answer other than a redirection.
    async fn run_noting(
        &mut self,
        key: &str,
        cmd: &redis::Cmd,
        stop: &AtomicBool,
        deadline: Duration,
        refusals: &mut Refusals,
    ) -> Option<Value> {
        let started = Instant::now();
        while !stop.load(Ordering::Relaxed) && started.elapsed() < deadline {
            let addr = self.owners[usize::from(key_slot(key))].clone();
            match self.try_once(key, cmd).await {
                Ok(value) => return Some(value),
                Err(error) if error.code() == Some("MOVED") => {}
                Err(error) => {
                    refusals.note(addr.as_deref().unwrap_or("?"), &error);
                    sleep(Duration::from_millis(5)).await
                }
            }
        }
        None
    }
}

/// The errors a writer met, each stretch of one same error (from one address) between two
/// acknowledged writes once: what a long write gap was made of.
#[derive(Default)]
pub struct Refusals {
    pub stretches: Vec<Stretch>,
    /// The open stretch's error (none once a write went through), readable while the writer
    /// runs.
    last: Arc<Mutex<Option<String>>>,
}

/// One error met again and again, from `began` until a write went through (`ended`) or another
/// error came.
pub struct Stretch {
    pub began: Instant,
    pub ended: Option<Instant>,
    pub what: String,
}

impl Refusals {
    /// Enough for any test's faults; a writer refused more often than this notes no more.
    const MOST: usize = 10_000;

    fn note(&mut self, addr: &str, error: &redis::RedisError) {
        let what = format!("{addr}: {}", error.code().unwrap_or(error.category()));
        let now = Instant::now();
        match self.stretches.last_mut() {
            Some(open) if open.ended.is_none() && open.what == what => return,
            Some(open) => {
                open.ended.get_or_insert(now);
            }
            None => {}
        }
        if let Ok(mut last) = self.last.lock() {
            *last = Some(what.clone());
        }
        if self.stretches.len() < Self::MOST {
            let ended = None;
            self.stretches.push(Stretch {
                began: now,
                ended,
                what,
            });
        }
    }

    /// A write went through: the open stretch, if any, ends.
    fn written(&mut self) {
        if let Some(open) = self.stretches.last_mut() {
            open.ended.get_or_insert_with(Instant::now);
        }
        if let Ok(mut last) = self.last.lock() {
            *last = None;
        }
    }

    /// The stretches that overlap `[from, to]`, as "+1.23 s addr: ERROR" from `origin`.
    pub fn between(&self, origin: Instant, from: Instant, to: Instant) -> Vec<String> {
        (self.stretches.iter())
            .filter(|s| s.began <= to && s.ended.is_none_or(|ended| ended >= from))
            .map(|s| {
                let offset = s.began.saturating_duration_since(origin).as_secs_f64();
                format!("+{offset:.2} s {}", s.what)
            })
            .collect()
    }
}

/// What the writer did: keys `key:0 .. key:{acked-1}` were acknowledged with their index as
/// value, at `ack_times`.
pub struct WriterLog {
    pub acked: u64,
    pub ack_times: Vec<Instant>,
    pub refusals: Refusals,
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
    /// The last error the writer met, for a test that finds it stuck.
    last_refusal: Arc<Mutex<Option<String>>>,
    task: Apart<WriterLog>,
}

impl Writer {
    pub fn start(seeds: Vec<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let refusals = Refusals::default();
        let last_refusal = refusals.last.clone();
        let (flag, counter) = (stop.clone(), acked.clone());
        let task = Apart::spawn("writer", move || async move {
            let mut router = Router::new(&seeds);
            let mut log = WriterLog {
                acked: 0,
                ack_times: Vec::new(),
                refusals,
            };
            while !flag.load(Ordering::Relaxed) {
                let key = key(log.acked);
                let mut cmd = redis::cmd("SET");
                cmd.arg(&key).arg(log.acked);
                let forever = Duration::from_secs(3600);
                if (router.run_noting(&key, &cmd, &flag, forever, &mut log.refusals))
                    .await
                    .is_some()
                {
                    log.acked += 1;
                    log.ack_times.push(Instant::now());
                    log.refusals.written();
                    counter.store(log.acked, Ordering::Relaxed);
                }
            }
            log
        });
        Self {
            stop,
            acked,
            last_refusal,
            task,
        }
    }

    /// Fails the test unless 10 more writes are acknowledged within 10 s: the writer must keep
    /// going through every step of a roll, not just survive it. Also how a test waits for a
    /// fresh writer to be writing.
    pub async fn assert_progressing(&self) {
        let before = self.acked.load(Ordering::Relaxed);
        eventually(
            format!("10 more acknowledged writes after {before}"),
            Duration::from_secs(10),
            async || {
                let now = self.acked.load(Ordering::Relaxed);
                if now >= before + 10 {
                    return Ok(());
                }
                let told = self.last_refusal.lock().ok().and_then(|last| last.clone());
                Err(format!(
                    "the writer is stuck at {now} acknowledged writes, last told {}",
                    told.as_deref().unwrap_or("nothing")
                ))
            },
        )
        .await;
    }

    pub async fn stop(self) -> WriterLog {
        self.stop.store(true, Ordering::Relaxed);
        self.task.join().await
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
