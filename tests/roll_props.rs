//! Property tests of the roll planner: from random clusters (mixed revisions, dead replicas,
//! dead primaries, any shape) towards a random desired shape, step the plan against a
//! simulated cluster whose outcomes may fail (a failover that does not complete, a new node
//! that never becomes ready) and check the roll's invariants after every step.

use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;
use valkey_operator::roll::slots::{bootstrap_range, target_count};
use valkey_operator::roll::{
    DesiredShape, Lifecycle, MAX_FAILOVER_ATTEMPTS, ObservedNode, ReplicaSync, Role, RollMemory,
    SlotRange, StallReason, Step, plan,
};

const OLD: &str = "9.0.0";
const NEW: &str = "9.1.2";
const MAX_STEPS: usize = 600;
/// Plans a joining node may wait before the simulated controller marks it overdue.
const JOIN_PATIENCE: u32 = 3;

/// The simulated cluster: the observed nodes plus what the simulation knows about the future.
struct Sim {
    nodes: Vec<ObservedNode>,
    memory: RollMemory,
    next_id: u32,
    never_ready: HashSet<String>,
    join_age: BTreeMap<String, u32>,
    dice: Vec<bool>,
    failures_allowed: bool,
    failed: bool,
    /// The shard whose failover failed, if one did: its retries fail too.
    broken_shard: Option<u32>,
}

impl Sim {
    /// Draw an outcome: `true` means the step fails. Never fails when failures are off.
    fn fails(&mut self) -> bool {
        self.failures_allowed && self.dice.pop().unwrap_or(false)
    }

    fn node(&mut self, name: &str) -> &mut ObservedNode {
        self.nodes.iter_mut().find(|n| n.name == name).unwrap()
    }

    fn new_node(&mut self, shard: u32, desired: &DesiredShape, role: Role) {
        let name = format!("n{:03}", self.next_id);
        self.next_id += 1;
        if self.fails() {
            self.never_ready.insert(name.clone());
            self.failed = true;
        }
        self.join_age.insert(name.clone(), 0);
        self.nodes.push(ObservedNode {
            lifecycle: Lifecycle::Joining,
            sync: (role == Role::Replica).then_some(ReplicaSync {
                link_up: false,
                sync_in_progress: true,
                offset: 0,
                primary_offset: 100,
                known_to_primaries: false,
            }),
            cluster_ok: false,
            ..ObservedNode::settled(&name, shard, &desired.revision, role)
        });
    }

    /// Time passes between plans: joining nodes become ready (or overdue); Valkey fails a dead
    /// primary over to its most caught-up live replica.
    fn tick(&mut self) {
        for node in self.nodes.iter_mut() {
            if node.lifecycle != Lifecycle::Joining {
                continue;
            }
            let age = self.join_age.entry(node.name.clone()).or_default();
            *age += 1;
            if self.never_ready.contains(&node.name) {
                node.join_overdue = *age > JOIN_PATIENCE;
            } else {
                node.cluster_ok = true;
                if let Some(sync) = node.sync.as_mut() {
                    *sync = synced(100 + u64::from(*age));
                }
            }
        }
        let dead_owner = self
            .nodes
            .iter()
            .find(|n| !n.reachable && !n.slots.is_empty())
            .map(|n| (n.name.clone(), n.shard));
        if let Some((dead, shard)) = dead_owner {
            let heir = self
                .nodes
                .iter()
                .filter(|n| {
                    n.shard == shard
                        && n.reachable
                        && n.role == Role::Replica
                        && n.lifecycle == Lifecycle::Active
                })
                .max_by_key(|n| n.sync.map_or(0, |s| s.offset))
                .map(|n| n.name.clone());
            if let Some(heir) = heir {
                let slots = std::mem::take(&mut self.node(&dead).slots);
                let heir = self.node(&heir);
                heir.slots = slots;
                heir.role = Role::Primary;
                heir.sync = None;
            }
        }
    }

    /// A clean failover: `to` becomes the primary with `from`'s slots, `from` its replica.
    fn swap(&mut self, from: &str, to: &str) {
        let slots = std::mem::take(&mut self.node(from).slots);
        let from_node = self.node(from);
        from_node.role = Role::Replica;
        from_node.sync = Some(synced(100));
        let to_node = self.node(to);
        to_node.role = Role::Primary;
        to_node.sync = None;
        to_node.slots = slots;
    }

    fn apply(&mut self, step: &Step, desired: &DesiredShape) {
        match step {
            Step::JoinPrimary { shard } => self.new_node(*shard, desired, Role::Primary),
            Step::JoinReplica { shard, .. } => self.new_node(*shard, desired, Role::Replica),
            Step::Activate { node, .. } => self.node(node).lifecycle = Lifecycle::Active,
            Step::AssignSlots { assignments } => {
                for (node, slots) in assignments {
                    self.node(node).slots.extend(slots.iter().copied());
                }
                for node in self.nodes.iter_mut() {
                    node.cluster_ok = true;
                }
            }
            Step::Failover { shard, from, to } => {
                self.memory.record_failover(&desired.revision, *shard, to);
                // A shard whose failover failed keeps failing: every retry must fail too.
                if self.broken_shard == Some(*shard) || self.fails() {
                    self.failed = true;
                    self.broken_shard = Some(*shard);
                    return;
                }
                self.swap(from, to);
            }
            Step::HandOver { from, to, .. }
            | Step::Rebalance { from, to, .. }
            | Step::Switchover { from, to, .. } => self.swap(from, to),
            Step::TakeOver { from, to, .. } => {
                let slots = std::mem::take(&mut self.node(from).slots);
                let heir = self.node(to);
                heir.slots = slots;
                heir.role = Role::Primary;
                heir.sync = None;
            }
            Step::MigrateSlots {
                from, to, slots, ..
            } => {
                // A failed migration changes nothing and may be retried: it is atomic.
                if self.dice.pop().unwrap_or(false) && self.failures_allowed {
                    return;
                }
                let moved: HashSet<u16> = slots.iter().flat_map(|r| r.start..=r.end).collect();
                let source = self.node(from);
                let kept: Vec<u16> = source
                    .slots
                    .iter()
                    .flat_map(|r| r.start..=r.end)
                    .filter(|s| !moved.contains(s))
                    .collect();
                source.slots = kept.into_iter().map(|s| SlotRange::new(s, s)).collect();
                self.node(to).slots.extend(slots.iter().copied());
            }
            Step::RetireNode { node, .. } => self.nodes.retain(|n| &n.name != node),
            Step::Wait { .. } | Step::Stalled { .. } | Step::Converged => {}
        }
    }
}

fn synced(offset: u64) -> ReplicaSync {
    ReplicaSync {
        link_up: true,
        sync_in_progress: false,
        offset,
        primary_offset: offset,
        known_to_primaries: true,
    }
}

fn live_replicas(nodes: &[ObservedNode], shard: u32) -> usize {
    nodes
        .iter()
        .filter(|n| {
            n.shard == shard
                && n.reachable
                && n.role == Role::Replica
                && n.lifecycle == Lifecycle::Active
        })
        .count()
}

fn is_acting(step: &Step) -> bool {
    !matches!(
        step,
        Step::Wait { .. } | Step::Stalled { .. } | Step::Converged
    )
}

/// A cluster as it may be found: every shard has a primary owning its bootstrap range.
#[derive(Debug, Clone)]
struct Start {
    shards: Vec<Vec<(bool, bool)>>, // per shard, per node: (is new revision, is reachable)
    primary_dead: bool,
}

fn start_strategy() -> impl Strategy<Value = Start> {
    (
        prop::collection::vec(
            prop::collection::vec((any::<bool>(), prop::bool::weighted(0.85)), 1..=4),
            1..=4,
        ),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(shards, primary_dead)| Start {
            shards,
            primary_dead,
        })
}

fn build(start: &Start) -> Vec<ObservedNode> {
    let count = start.shards.len() as u32;
    let mut nodes = Vec::new();
    for (shard, members) in start.shards.iter().enumerate() {
        let shard = shard as u32;
        for (i, &(new, reachable)) in members.iter().enumerate() {
            let primary = i == 0;
            let has_live_replica = members.iter().skip(1).any(|&(_, r)| r);
            let role = if primary {
                Role::Primary
            } else {
                Role::Replica
            };
            let revision = if new { NEW } else { OLD };
            nodes.push(ObservedNode {
                // A primary starts dead only when Valkey has a replica to fail over to.
                reachable: if primary {
                    !(start.primary_dead && shard == 0 && has_live_replica)
                } else {
                    reachable
                },
                sync: (!primary).then(|| synced(50 + i as u64)),
                slots: if primary {
                    vec![bootstrap_range(shard, count)]
                } else {
                    vec![]
                },
                ..ObservedNode::settled(&format!("s{shard}-{i}"), shard, revision, role)
            });
        }
    }
    nodes
}

fn check_converged(nodes: &[ObservedNode], desired: &DesiredShape) {
    for shard in 0..desired.shards {
        let members: Vec<&ObservedNode> = nodes.iter().filter(|n| n.shard == shard).collect();
        let primaries: Vec<&&ObservedNode> =
            members.iter().filter(|n| n.role == Role::Primary).collect();
        assert_eq!(primaries.len(), 1, "shard {shard}: {members:?}");
        let owned: u32 = primaries[0].slot_count();
        assert_eq!(owned, target_count(shard, desired.shards));
        assert_eq!(
            live_replicas(nodes, shard),
            desired.replicas_per_shard as usize
        );
        assert!(
            members
                .iter()
                .all(|n| n.revision == desired.revision && n.reachable)
        );
    }
    assert!(nodes.iter().all(|n| n.shard < desired.shards));
}

fn run(start: &Start, desired: &DesiredShape, dice: Vec<bool>, failures_allowed: bool) {
    let mut sim = Sim {
        nodes: build(start),
        memory: RollMemory::default(),
        next_id: 0,
        never_ready: HashSet::new(),
        join_age: BTreeMap::new(),
        dice,
        failures_allowed,
        failed: false,
        broken_shard: None,
    };
    let mut failovers: BTreeMap<u32, u32> = BTreeMap::new();
    let mut failed_at: Option<usize> = None;
    for i in 0..MAX_STEPS {
        let step = plan(desired, &sim.nodes, &sim.memory);
        if step == Step::Converged {
            assert!(failed_at.is_none(), "converged past a failed step");
            check_converged(&sim.nodes, desired);
            return;
        }
        if failed_at.is_some() {
            // Only the failed failover may be retried (its primary never changed), and only
            // a bounded number of times (counted below).
            let retry =
                matches!(step, Step::Failover { shard, .. } if sim.broken_shard == Some(shard));
            assert!(
                !is_acting(&step) || retry,
                "acted past a failed step: {step}"
            );
        }
        let before = sim.nodes.clone();
        match &step {
            Step::RetireNode { node, .. } => {
                let n = before.iter().find(|n| &n.name == node).unwrap();
                assert!(
                    n.slots.is_empty(),
                    "retired {node}, which owns slots: {step}"
                );
                // A second primary beside the shard's slot owner is a stray, not its primary.
                let owner_beside = before.iter().any(|m| {
                    m.shard == n.shard
                        && m.name != n.name
                        && m.reachable
                        && m.role == Role::Primary
                        && !m.slots.is_empty()
                });
                assert!(
                    !(n.reachable
                        && n.role == Role::Primary
                        && n.shard < desired.shards
                        && !owner_beside),
                    "retired the primary of a kept shard: {step}"
                );
            }
            Step::Failover { shard, from, to } => {
                *failovers.entry(*shard).or_default() += 1;
                assert!(
                    failovers[shard] == 1 || sim.broken_shard == Some(*shard),
                    "second failover of shard {shard} after one that took effect"
                );
                assert!(
                    failovers[shard] <= MAX_FAILOVER_ATTEMPTS,
                    "too many attempts: {step}"
                );
                let to = before.iter().find(|n| &n.name == to).unwrap();
                assert!(to.sync.is_some_and(|s| s.is_synced()));
                assert_eq!(to.revision, desired.revision);
                let from = before.iter().find(|n| &n.name == from).unwrap();
                assert!(!from.slots.is_empty());
            }
            _ => {}
        }
        sim.apply(&step, desired);
        for shard in 0..desired.shards {
            let was = live_replicas(&before, shard);
            let now = live_replicas(&sim.nodes, shard);
            let floor = was.min(desired.replicas_per_shard as usize);
            assert!(
                now >= floor,
                "shard {shard} fell to {now} replicas (was {was}) after: {step}"
            );
        }
        // Valkey's own failover of a dead primary happens here, outside the plan.
        sim.tick();
        if sim.failed && failed_at.is_none() {
            failed_at = Some(i);
        }
    }
    assert!(
        failed_at.is_some(),
        "did not converge in {MAX_STEPS} steps: {:?}",
        sim.nodes
    );
    let last = plan(desired, &sim.nodes, &sim.memory);
    // The simulation fails only failovers and joins: the stall must name that failure.
    assert!(
        matches!(
            last,
            Step::Stalled {
                reason: StallReason::FailoverIncomplete { .. } | StallReason::JoinOverdue { .. }
            }
        ),
        "a failed step must end in a stall, got {last}"
    );
}

fn desired_strategy() -> impl Strategy<Value = DesiredShape> {
    (1u32..=5, 0u32..=3, any::<bool>()).prop_map(|(shards, replicas, new)| DesiredShape {
        shards,
        replicas_per_shard: replicas,
        revision: if new { NEW } else { OLD }.into(),
        switchover: None,
        primary_update: Default::default(),
        primary_spread: Default::default(),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn rolls_converge_when_every_step_succeeds(start in start_strategy(), desired in desired_strategy()) {
        run(&start, &desired, vec![], false);
    }

    #[test]
    fn failed_steps_stall_without_breaking_invariants(
        start in start_strategy(),
        desired in desired_strategy(),
        dice in prop::collection::vec(prop::bool::weighted(0.2), 0..40),
    ) {
        run(&start, &desired, dice, true);
    }
}

#[test]
fn bootstrap_from_nothing_converges() {
    let start = Start {
        shards: vec![],
        primary_dead: false,
    };
    for shards in 1..=4 {
        for replicas in 0..=2 {
            let desired = DesiredShape {
                shards,
                replicas_per_shard: replicas,
                revision: OLD.into(),
                switchover: None,
                primary_update: Default::default(),
                primary_spread: Default::default(),
            };
            run(&start, &desired, vec![], false);
        }
    }
}

#[test]
fn one_shard_roll_follows_the_guide_order() {
    let start = Start {
        shards: vec![vec![(false, true), (false, true)]],
        primary_dead: false,
    };
    let desired = DesiredShape {
        shards: 1,
        replicas_per_shard: 1,
        revision: NEW.into(),
        switchover: None,
        primary_update: Default::default(),
        primary_spread: Default::default(),
    };
    let mut nodes = build(&start);
    let mut memory = RollMemory::default();
    let mut kinds = Vec::new();
    let mut sim_id = 0;
    loop {
        let step = plan(&desired, &nodes, &memory);
        let kind = match &step {
            Step::JoinReplica { .. } => "join",
            Step::Activate { .. } => "activate",
            Step::RetireNode { .. } => "retire",
            Step::Failover { .. } => "failover",
            Step::Converged => break,
            other => panic!("unexpected {other}"),
        };
        kinds.push(kind);
        let mut sim = Sim {
            nodes,
            memory,
            next_id: sim_id,
            never_ready: HashSet::new(),
            join_age: BTreeMap::new(),
            dice: vec![],
            failures_allowed: false,
            failed: false,
            broken_shard: None,
        };
        sim.apply(&step, &desired);
        sim.tick();
        (nodes, memory, sim_id) = (sim.nodes, sim.memory, sim.next_id);
    }
    assert_eq!(
        kinds,
        [
            "join", "activate", "retire", "failover", "join", "activate", "retire"
        ]
    );
}

#[test]
fn a_stalled_join_is_abandoned_once_the_spec_moves_past_it() {
    let start = Start {
        shards: vec![vec![(false, true), (false, true)]],
        primary_dead: false,
    };
    let broken = DesiredShape {
        shards: 1,
        replicas_per_shard: 1,
        revision: "9.2.0-never-starts".into(),
        switchover: None,
        primary_update: Default::default(),
        primary_spread: Default::default(),
    };
    let mut sim = Sim {
        nodes: build(&start),
        memory: RollMemory::default(),
        next_id: 0,
        never_ready: HashSet::new(),
        join_age: BTreeMap::new(),
        // The first new node never becomes ready.
        dice: vec![true],
        failures_allowed: true,
        failed: false,
        broken_shard: None,
    };
    let mut stalled = None;
    for _ in 0..20 {
        let step = plan(&broken, &sim.nodes, &sim.memory);
        if let Step::Stalled { reason } = step {
            stalled = Some(reason);
            break;
        }
        sim.apply(&step, &broken);
        sim.tick();
    }
    let stuck: Vec<String> = sim.never_ready.iter().cloned().collect();
    match stalled {
        Some(StallReason::JoinOverdue { node, .. }) => assert_eq!([node], stuck.as_slice()),
        other => panic!("expected the broken join to stall the roll, got {other:?}"),
    }

    // The fix: a revision that starts. The stuck node goes first, then the roll proceeds.
    let fixed = DesiredShape {
        revision: NEW.into(),
        ..broken
    };
    match plan(&fixed, &sim.nodes, &sim.memory) {
        Step::RetireNode { node, .. } => assert_eq!([node], stuck.as_slice()),
        other => panic!("expected the stuck node to be retired, got {other}"),
    }
    sim.failures_allowed = false;
    for _ in 0..MAX_STEPS {
        let step = plan(&fixed, &sim.nodes, &sim.memory);
        if step == Step::Converged {
            check_converged(&sim.nodes, &fixed);
            return;
        }
        sim.apply(&step, &fixed);
        sim.tick();
    }
    panic!("the fixed roll did not converge");
}
