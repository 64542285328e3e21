//! Property tests of the planner's heal paths: a converged cluster (any shape) meets a random
//! schedule of faults between plans (a server killed for good, a server paused for a few
//! plans or for long, another server answering at a node's address while its Pod's status is
//! stale), its replicas joining throughout. Checked after every step: nothing is aimed at a node
//! that does not answer; a takeover promotes the most caught-up live replica; slots are served
//! again empty only when no copy of them can come back; and once the faults stop, every heal
//! path finishes: the cluster converges without a person. `ROLL_TRACE=1` prints every plan (a
//! failing case is kept in `roll_heal_props.proptest-regressions` and replayed first).

use std::collections::BTreeMap;

use proptest::prelude::*;
use valkey_operator::roll::slots::{bootstrap_range, target_count};
use valkey_operator::roll::{
    DesiredShape, Lifecycle, ObservedNode, ReplicaSync, Role, RollMemory, Step, plan,
};

const REVISION: &str = "9.1.2";
const MAX_STEPS: usize = 800;
/// Plans a paused node stays unanswered before the simulated controller calls it hung.
const HUNG_AFTER: u32 = 4;
/// Plans a joiner may take before it is overdue.
const JOIN_PATIENCE: u32 = 6;

/// A fault, drawn between two plans.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The node's server is killed: its Pod stops for good.
    Kill(usize),
    /// The node's server is paused for this many plans (past [`HUNG_AFTER`] it is hung).
    Pause(usize, u32),
    /// The node's server is killed and, while its Pod's status still says running for this
    /// many plans, another server answers at its address.
    Stranger(usize, u32),
}

fn fault_strategy() -> impl Strategy<Value = Option<Fault>> {
    prop_oneof![
        6 => Just(None),
        1 => any::<usize>().prop_map(|n| Some(Fault::Kill(n))),
        2 => (any::<usize>(), 1u32..=8).prop_map(|(n, plans)| Some(Fault::Pause(n, plans))),
        1 => (any::<usize>(), 1u32..=4).prop_map(|(n, plans)| Some(Fault::Stranger(n, plans))),
    ]
}

/// What the simulation knows of a node beyond what the planner observes.
#[derive(Clone, Debug, Default)]
struct Hidden {
    /// Plans left paused.
    paused_for: u32,
    /// Plans paused so far.
    silent: u32,
    /// Plans left until its stopped Pod is reported (a stranger answers meanwhile).
    stale_for: u32,
    /// Its server is gone for good.
    dead: bool,
    /// Plans since it was created, for a joiner.
    age: u32,
}

struct Sim {
    nodes: Vec<ObservedNode>,
    hidden: BTreeMap<String, Hidden>,
    memory: RollMemory,
    next_id: u32,
    /// Replication offsets grow as writes come in.
    writes: u64,
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

fn node(
    name: String,
    shard: u32,
    role: Role,
    slots: Vec<valkey_operator::roll::SlotRange>,
) -> ObservedNode {
    ObservedNode {
        sync: (role == Role::Replica).then(|| synced(100)),
        slots,
        ..ObservedNode::settled(&name, shard, REVISION, role)
    }
}

impl Sim {
    fn converged(shards: u32, replicas: u32) -> Self {
        let mut nodes = Vec::new();
        for shard in 0..shards {
            nodes.push(node(
                format!("s{shard}-p"),
                shard,
                Role::Primary,
                vec![bootstrap_range(shard, shards)],
            ));
            for r in 0..replicas {
                nodes.push(node(format!("s{shard}-r{r}"), shard, Role::Replica, vec![]));
            }
        }
        let hidden = nodes
            .iter()
            .map(|n| (n.name.clone(), Hidden::default()))
            .collect();
        Self {
            nodes,
            hidden,
            memory: RollMemory::default(),
            next_id: 0,
            writes: 100,
        }
    }

    fn get(&mut self, name: &str) -> &mut ObservedNode {
        self.nodes.iter_mut().find(|n| n.name == name).unwrap()
    }

    fn strike(&mut self, fault: Fault) {
        let alive: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| !self.hidden[&n.name].dead && self.hidden[&n.name].paused_for == 0)
            .map(|n| n.name.clone())
            .collect();
        if alive.is_empty() {
            return;
        }
        let pick = |index: usize| alive[index % alive.len()].clone();
        match fault {
            Fault::Kill(index) => {
                let name = pick(index);
                let hidden = self.hidden.get_mut(&name).unwrap();
                hidden.dead = true;
            }
            Fault::Pause(index, plans) => {
                let name = pick(index);
                let hidden = self.hidden.get_mut(&name).unwrap();
                hidden.paused_for = plans;
                hidden.silent = 0;
            }
            Fault::Stranger(index, plans) => {
                let name = pick(index);
                let hidden = self.hidden.get_mut(&name).unwrap();
                hidden.dead = true;
                hidden.stale_for = plans;
            }
        }
        self.observe();
    }

    /// What the planner sees of every node now.
    fn observe(&mut self) {
        for n in self.nodes.iter_mut() {
            let hidden = &self.hidden[&n.name];
            let stale = hidden.dead && hidden.stale_for > 0;
            n.reachable = !hidden.dead && hidden.paused_for == 0;
            n.terminated = hidden.dead && !stale;
            n.stranger = stale;
            n.hung = !n.reachable && !n.terminated && hidden.silent >= HUNG_AFTER;
        }
    }

    /// Time passes: writes, pauses run out, stale statuses catch up, joiners sync (if their
    /// shard has a live primary), Valkey demotes a resumed primary whose shard was taken over.
    fn tick(&mut self) {
        self.writes += 10;
        for hidden in self.hidden.values_mut() {
            if hidden.paused_for > 0 {
                hidden.paused_for -= 1;
                hidden.silent += 1;
            } else {
                hidden.silent = 0;
            }
            hidden.stale_for = hidden.stale_for.saturating_sub(1);
            hidden.age += 1;
        }
        self.observe();
        let writes = self.writes;
        // Per shard: whether its slot owner answers.
        let owners: BTreeMap<u32, bool> = (self.nodes.iter())
            .filter(|n| !n.slots.is_empty())
            .map(|n| (n.shard, n.reachable))
            .collect();
        for n in self.nodes.iter_mut() {
            if !n.reachable {
                continue;
            }
            let owner_answers = owners.get(&n.shard).copied();
            match (n.role, owner_answers) {
                (Role::Replica, Some(true)) => {
                    // Live replicas keep up with their (new) primary.
                    n.sync = Some(synced(writes));
                }
                (Role::Primary, Some(answers)) if n.slots.is_empty() => {
                    // A primary taken over while it was silent learns from the others' views
                    // that another owns its slots now: it follows that one (dead or not).
                    n.role = Role::Replica;
                    let offset = n.sync.map_or(writes - 10, |s| s.offset);
                    n.sync = Some(if answers {
                        synced(writes)
                    } else {
                        ReplicaSync {
                            link_up: false,
                            ..synced(offset)
                        }
                    });
                }
                _ => {}
            }
            if n.lifecycle == Lifecycle::Joining {
                n.cluster_ok = true;
                n.join_overdue = self.hidden[&n.name].age > JOIN_PATIENCE;
            }
        }
        // A silent replica falls behind.
        for n in self.nodes.iter_mut().filter(|n| !n.reachable) {
            if let Some(sync) = n.sync.as_mut() {
                sync.primary_offset = writes;
            }
        }
    }

    fn apply(&mut self, step: &Step) {
        match step {
            Step::JoinPrimary { shard } | Step::JoinReplica { shard, .. } => {
                let role = match step {
                    Step::JoinPrimary { .. } => Role::Primary,
                    _ => Role::Replica,
                };
                let name = format!("n{:03}", self.next_id);
                self.next_id += 1;
                let mut joiner = node(name.clone(), *shard, role, vec![]);
                joiner.lifecycle = Lifecycle::Joining;
                joiner.cluster_ok = false;
                if let Some(sync) = joiner.sync.as_mut() {
                    *sync = ReplicaSync {
                        sync_in_progress: true,
                        ..synced(0)
                    };
                }
                self.nodes.push(joiner);
                self.hidden.insert(name, Hidden::default());
            }
            Step::Activate { node, .. } => self.get(node).lifecycle = Lifecycle::Active,
            Step::AssignSlots { assignments } => {
                for (node, slots) in assignments {
                    self.get(node).slots.extend(slots.iter().copied());
                }
            }
            Step::Failover { from, to, shard } => {
                self.memory.record_failover(REVISION, *shard, to);
                self.swap(from, to);
            }
            Step::HandOver { from, to, .. }
            | Step::Rebalance { from, to, .. }
            | Step::Switchover { from, to, .. } => self.swap(from, to),
            Step::TakeOver { from, to, .. } => {
                let slots = std::mem::take(&mut self.get(from).slots);
                let heir = self.get(to);
                heir.slots = slots;
                heir.role = Role::Primary;
                heir.sync = None;
            }
            Step::MigrateSlots { .. } => panic!("no slot moves in a fixed shape: {step}"),
            Step::RetireNode { node, .. } => {
                self.nodes.retain(|n| &n.name != node);
                self.hidden.remove(node);
            }
            Step::Wait { .. } | Step::Stalled { .. } | Step::Converged => {}
        }
    }

    fn swap(&mut self, from: &str, to: &str) {
        let slots = std::mem::take(&mut self.get(from).slots);
        let writes = self.writes;
        let old = self.get(from);
        old.role = Role::Replica;
        old.sync = Some(synced(writes));
        let new = self.get(to);
        new.role = Role::Primary;
        new.sync = None;
        new.slots = slots;
    }
}

/// What must hold of a step, given the nodes as planned from.
fn check_step(step: &Step, before: &[ObservedNode], hidden: &BTreeMap<String, Hidden>) {
    let find = |name: &str| before.iter().find(|n| n.name == name).unwrap();
    match step {
        Step::TakeOver { shard, to, .. } => {
            let heir = find(to);
            assert!(
                heir.reachable && !heir.stranger,
                "took over onto a silent node: {step}"
            );
            let best = before
                .iter()
                .filter(|n| n.shard == *shard && n.reachable && n.role == Role::Replica)
                .filter(|n| n.lifecycle == Lifecycle::Active)
                .map(|n| n.sync.map_or(0, |s| s.offset))
                .max();
            assert_eq!(
                Some(heir.sync.map_or(0, |s| s.offset)),
                best,
                "a takeover promoted a replica behind a live one: {step}"
            );
        }
        Step::Failover { to, from, .. }
        | Step::HandOver { to, from, .. }
        | Step::Rebalance { to, from, .. } => {
            assert!(find(to).reachable && find(from).reachable, "{step}");
        }
        Step::Activate { node, .. } => assert!(find(node).reachable, "{step}"),
        Step::RetireNode { node, shard, .. } => {
            let retired = find(node);
            if !retired.slots.is_empty() {
                // Its slots are served again, empty: no copy may be able to come back.
                let copy = before.iter().find(|n| {
                    n.shard == *shard
                        && n.name != *node
                        && n.lifecycle == Lifecycle::Active
                        && !hidden[&n.name].dead
                });
                assert!(
                    retired.terminated && copy.is_none(),
                    "gave up {node}'s slots while a copy may come back ({copy:?}): {step}"
                );
            }
        }
        _ => {}
    }
}

fn run(shards: u32, replicas: u32, faults: &[Option<Fault>]) {
    let desired = DesiredShape {
        shards,
        replicas_per_shard: replicas,
        revision: REVISION.into(),
        switchover: None,
        primary_update: Default::default(),
        primary_spread: Default::default(),
    };
    let mut sim = Sim::converged(shards, replicas);
    let mut schedule = faults.iter();
    let mut quiet_since = None;
    for i in 0..MAX_STEPS {
        match schedule.next() {
            Some(Some(fault)) => sim.strike(*fault),
            Some(None) => {}
            None => {
                quiet_since.get_or_insert(i);
            }
        }
        let step = plan(&desired, &sim.nodes, &sim.memory);
        if quiet_since.is_some() {
            if step == Step::Converged {
                // Whole again: every shard a primary with its slots and its replicas.
                for shard in 0..shards {
                    let members: Vec<&ObservedNode> =
                        sim.nodes.iter().filter(|n| n.shard == shard).collect();
                    let primaries = members.iter().filter(|n| n.role == Role::Primary).count();
                    assert_eq!(primaries, 1, "shard {shard}: {members:?}");
                    let owned: u32 = members.iter().map(|n| n.slot_count()).sum();
                    assert_eq!(owned, target_count(shard, shards));
                    assert!(members.iter().all(|n| n.reachable));
                    assert_eq!(members.len() as u32, 1 + replicas);
                }
                return;
            }
            // A pause or a stale status still running out may stall a moment; nothing else.
            let transient = sim
                .hidden
                .values()
                .any(|h| h.paused_for > 0 || h.stale_for > 0);
            assert!(
                transient || !matches!(step, Step::Stalled { .. }),
                "a heal path stopped once the faults had ended: {step}\n{:#?}",
                sim.nodes
            );
        }
        if std::env::var_os("ROLL_TRACE").is_some() {
            println!("{i:3} {step}");
        }
        check_step(&step, &sim.nodes, &sim.hidden);
        sim.apply(&step);
        sim.tick();
    }
    panic!(
        "not whole again {} plans after the last fault: {:#?}\n{:?}",
        MAX_STEPS - quiet_since.unwrap_or(0),
        sim.nodes,
        sim.hidden
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn every_heal_path_finishes_and_no_copy_is_given_up(
        shards in 1u32..=3,
        replicas in 1u32..=2,
        faults in prop::collection::vec(fault_strategy(), 0..30),
    ) {
        run(shards, replicas, &faults);
    }
}

#[test]
fn a_replica_paused_while_its_primary_dies_is_waited_for_then_takes_over() {
    let faults = [Some(Fault::Pause(1, 3)), Some(Fault::Kill(0))];
    run(1, 1, &faults);
}

/// Found by the property above: s0-p dies, s0-r1 takes over and is paused for long, s0-r0 takes
/// over from it and dies. s0-r1, a primary without slots now, still holds the data: the planner
/// waits for it (it must not serve the slots again, empty) and it takes the shard back.
#[test]
fn a_primary_taken_over_while_paused_takes_the_shard_back_when_its_heir_dies() {
    let faults = [
        Some(Fault::Pause(5124885124923691804, 3)),
        Some(Fault::Kill(1185050608303151817)),
        Some(Fault::Pause(1319375245241555845, 4)),
        Some(Fault::Pause(0, 1)),
        None,
        Some(Fault::Pause(2957773078877932817, 6)),
        None,
        None,
        Some(Fault::Pause(6688281528813140659, 3)),
        None,
        Some(Fault::Kill(0)),
    ];
    run(1, 2, &faults);
}
