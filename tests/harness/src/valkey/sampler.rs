//! An outside sampler of `CLUSTER NODES`, and what its samples show: how often a shard's
//! primary changed and the fewest replicas it had.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};
use valkey_operator::valkey::ClusterNode;

use super::apart::Apart;

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
    /// How many samples it has recorded so far.
    recorded: Arc<AtomicUsize>,
    task: Apart<Vec<Sample>>,
}

impl Sampler {
    pub fn start(seeds: Vec<String>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let recorded = Arc::new(AtomicUsize::new(0));
        let count = recorded.clone();
        let task = Apart::spawn("sampler", move || async move {
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
                                super::logins::admin(&addr, Duration::from_millis(300)).await?;
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
                        count.store(samples.len(), Ordering::Relaxed);
                        break 'pass;
                    }
                }
                sleep(Duration::from_millis(100).saturating_sub(tick.elapsed())).await;
            }
            samples
        });
        Self {
            stop,
            recorded,
            task,
        }
    }

    /// Waits for its first sample, so that a change made from now on is seen from before it
    /// (on a loaded machine the first read can come late).
    pub async fn first_sample(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.recorded.load(Ordering::Relaxed) == 0 {
            assert!(
                Instant::now() < deadline,
                "no CLUSTER NODES sample within {within:?}"
            );
            sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.join().await
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

/// One sampled `CLUSTER NODES` view, a line per node, and how long into the watch it was taken.
pub fn describe_sample(sample: &Sample) -> String {
    sample
        .nodes
        .iter()
        .map(|n| {
            format!(
                "{} {}:{} {}{} of {:?} slots {:?}{}{}",
                &n.id[..n.id.len().min(8)],
                n.ip,
                n.port,
                if n.myself { "myself," } else { "" },
                if n.primary { "primary" } else { "replica" },
                n.replica_of.as_deref().map(|id| &id[..id.len().min(8)]),
                n.slots.iter().map(ToString::to_string).collect::<Vec<_>>(),
                if n.failed { " FAILED" } else { "" },
                if n.handshake { " HANDSHAKE" } else { "" },
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
