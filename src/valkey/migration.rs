//! Moving slots from one primary to another, by one of two protocols ([`Protocol`]):
//!
//! - **atomic** (`CLUSTER MIGRATESLOTS`), where both ends run Valkey 9.1 or later;
//! - **key by key** (`CLUSTER SETSLOT … IMPORTING`/`MIGRATING`, `MIGRATE … AUTH2`,
//!   `SETSLOT … NODE`) wherever an end runs 9.0.
//!
//! Why not atomic on 9.0: its source runs the messages the target sends back over the
//! migration's link as the `default` user, so `default` would have to keep `CLUSTER
//! SYNCSLOTS`, and with it any client without credentials could make any node import any
//! shard's slots (`SYNCSLOTS ESTABLISH SOURCE <id> …`, then the protocol's replies): the slots
//! change owner and their keys are gone from every client's view. With the key-by-key protocol
//! `default` has no rights at all on any node: the operator moves the keys with `MIGRATE` sent
//! to the source as the replication user, which logs in to the target with `AUTH2`.
//!
//! The key-by-key protocol is resumable: a slot it left open (the operator stopped in the
//! middle) shows in both ends' `CLUSTER NODES` and [`move_keys`] finishes it from wherever it
//! stands; clients meanwhile follow `ASK` redirections, so no write is refused or lost.
//!
//! Since Valkey 8 a primary answers `CLUSTER SETSLOT` only once its replicas have taken it,
//! about 2 ms on this machine; pipelined on one connection, each waits for the one before to be
//! released (about 23 ms each, measured), so they are sent one at a time on each of several
//! connections ([`KeyMove::source_pool`], [`KeyMove::target_pool`]).

use std::collections::BTreeSet;
use std::time::Duration;

use redis::Value;
use semver::Version;
use tokio::time::{Instant, sleep};

use super::parse::{ClusterNode, SlotDirection};
use super::{Credentials, EngineError, NodeAddress, NodeClient, POLL_INTERVAL, Result, describe};
use crate::roll::SlotRange;

/// How slots move between two primaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `CLUSTER MIGRATESLOTS`: both ends run 9.1 or later.
    Atomic,
    /// `SETSLOT`/`MIGRATE`: an end runs an earlier version (or one that cannot be read).
    KeyByKey,
}

impl Protocol {
    /// The first version whose atomic slot migration needs nothing of `default`.
    const ATOMIC_SINCE: Version = Version::new(9, 1, 0);

    /// The protocol for a source and a target reporting these versions (`INFO server`).
    pub fn between(source: &str, target: &str) -> Self {
        let atomic = |v: &str| {
            Version::parse(v)
                .is_ok_and(|v| Version::new(v.major, v.minor, v.patch) >= Self::ATOMIC_SINCE)
        };
        if atomic(source) && atomic(target) {
            Self::Atomic
        } else {
            Self::KeyByKey
        }
    }
}

/// Slots set up (or finished) in one round.
const SLOTS_PER_ROUND: usize = 256;
/// Keys asked for (`GETKEYSINSLOT`) and moved (`MIGRATE … KEYS`) at a time.
const KEYS_PER_MIGRATE: usize = 256;
/// The I/O timeout `MIGRATE` gets for talking to the target, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 10_000;

/// The two ends of a key-by-key migration and what the source needs to send keys.
pub struct KeyMove<'a> {
    /// The source primary, as the operator.
    pub source: &'a NodeClient,
    /// More connections to the source and the target, as the operator, over which `SETSLOT`s
    /// are sent side by side (empty: one at a time on `source` and `target`).
    pub source_pool: &'a [NodeClient],
    pub target_pool: &'a [NodeClient],
    /// The source primary, logged in as a user that may run `MIGRATE` on every key (the
    /// replication user; `default` where nodes have no users, as in tests).
    pub mover: &'a NodeClient,
    /// The target primary, as the operator.
    pub target: &'a NodeClient,
    /// Where the source reaches the target.
    pub target_address: NodeAddress,
    /// The login `MIGRATE` passes to the target (`AUTH2`), if nodes have users.
    pub login: Option<&'a Credentials>,
}

/// Where one slot stands between the two ends, as their own `CLUSTER NODES` say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    /// The source owns it: set it up (what is not yet), move its keys, hand it over.
    AtSource { importing: bool, migrating: bool },
    /// The target owns it already; either end may still call it open.
    AtTarget { importing: bool, migrating: bool },
    /// Neither end owns it: nothing to move; whatever is open about it is closed.
    Elsewhere { importing: bool, migrating: bool },
}

/// Moves `slots` from the source to the target key by key, finishing any of them a previous
/// attempt left open; returns how many keys moved. Past `deadline` it stops (between rounds, or
/// between two `MIGRATE`s of a slot with many keys) with an error, leaving the slots in hand
/// open (a later call finishes them).
pub async fn move_keys(ends: &KeyMove<'_>, slots: &[SlotRange], deadline: Duration) -> Result<u64> {
    let started = Instant::now();
    let until = Until {
        started,
        at: started + deadline,
    };
    let source_id = ends.source.my_id().await?;
    let target_id = ends.target.my_id().await?;
    let wanted: Vec<u16> = slots.iter().flat_map(|r| r.start..=r.end).collect();
    let mut moved = 0;
    for round in wanted.chunks(SLOTS_PER_ROUND) {
        if started.elapsed() >= deadline {
            return Err(EngineError::Deadline {
                node: ends.source.addr().to_owned(),
                command: "MIGRATE".into(),
                waited: started.elapsed(),
                last: format!(
                    "{} of {} slots left",
                    remaining(&wanted, round),
                    wanted.len()
                ),
            });
        }
        let states = states(ends, &source_id, &target_id, round).await?;
        moved += move_round(ends, &source_id, &target_id, &states, until).await?;
    }
    Ok(moved)
}

fn remaining(wanted: &[u16], round: &[u16]) -> usize {
    let done = round
        .first()
        .and_then(|first| wanted.iter().position(|s| s == first));
    wanted.len() - done.unwrap_or(0)
}

/// When a [`move_keys`] began, and when it must stop.
#[derive(Clone, Copy)]
struct Until {
    started: Instant,
    at: Instant,
}

/// Each slot's state, from both ends' own lines of `CLUSTER NODES`.
async fn states(
    ends: &KeyMove<'_>,
    source_id: &str,
    target_id: &str,
    round: &[u16],
) -> Result<Vec<(u16, SlotState)>> {
    let source = myself(ends.source).await?;
    let target = myself(ends.target).await?;
    let owns = |node: &ClusterNode, slot: u16| {
        node.slots.iter().any(|r| (r.start..=r.end).contains(&slot))
    };
    let open = |node: &ClusterNode, direction: SlotDirection, peer: &str| -> BTreeSet<u16> {
        node.open_slots
            .iter()
            .filter(|o| o.direction == direction && o.peer == peer)
            .map(|o| o.slot)
            .collect()
    };
    let importing = open(&target, SlotDirection::Importing, source_id);
    let migrating = open(&source, SlotDirection::Migrating, target_id);
    Ok(round
        .iter()
        .map(|&slot| {
            let (importing, migrating) = (importing.contains(&slot), migrating.contains(&slot));
            let state = if owns(&source, slot) {
                SlotState::AtSource {
                    importing,
                    migrating,
                }
            } else if owns(&target, slot) {
                SlotState::AtTarget {
                    importing,
                    migrating,
                }
            } else {
                SlotState::Elsewhere {
                    importing,
                    migrating,
                }
            };
            (slot, state)
        })
        .collect())
}

async fn myself(node: &NodeClient) -> Result<ClusterNode> {
    let view = node.cluster_nodes().await?;
    view.into_iter()
        .find(|n| n.myself)
        .ok_or_else(|| node.bad_reply("CLUSTER NODES", "no line for the node itself"))
}

/// One round: open what is not open (the target importing before the source migrating, so
/// the source's `ASK` redirections always find a target that takes them), move every key,
/// then give the slots to the target (the target first, so it never redirects back).
async fn move_round(
    ends: &KeyMove<'_>,
    source_id: &str,
    target_id: &str,
    states: &[(u16, SlotState)],
    until: Until,
) -> Result<u64> {
    let mut import = Vec::new();
    let mut migrate = Vec::new();
    let mut hand_over = Vec::new();
    let mut source_done = Vec::new();
    let mut target_done = Vec::new();
    let mut close_target = Vec::new();
    let mut close_source = Vec::new();
    for &(slot, state) in states {
        match state {
            SlotState::AtSource {
                importing,
                migrating,
            } => {
                if !importing {
                    import.push(slot);
                }
                if !migrating {
                    migrate.push(slot);
                }
                hand_over.push(slot);
            }
            SlotState::AtTarget {
                importing,
                migrating,
            } => {
                // `SETSLOT … NODE` to itself closes the target's side; to the target, the
                // source's.
                if importing {
                    target_done.push(slot);
                }
                if migrating {
                    source_done.push(slot);
                }
            }
            SlotState::Elsewhere {
                importing,
                migrating,
            } => {
                if importing {
                    close_target.push(slot);
                }
                if migrating {
                    close_source.push(slot);
                }
            }
        }
    }
    let target = pool(ends.target, ends.target_pool);
    let source = pool(ends.source, ends.source_pool);
    set_slots(&target, &import, &["IMPORTING", source_id]).await?;
    set_slots(&source, &migrate, &["MIGRATING", target_id]).await?;
    let mut moved = 0;
    for &slot in &hand_over {
        moved += move_slot_keys(ends, slot, until).await?;
    }
    target_done.extend(&hand_over);
    set_slots(&target, &target_done, &["NODE", target_id]).await?;
    source_done.extend(&hand_over);
    set_slots(&source, &source_done, &["NODE", target_id]).await?;
    set_slots(&target, &close_target, &["STABLE"]).await?;
    set_slots(&source, &close_source, &["STABLE"]).await?;
    Ok(moved)
}

/// The connections to send one end's `SETSLOT`s over.
fn pool<'a>(first: &'a NodeClient, more: &'a [NodeClient]) -> Vec<&'a NodeClient> {
    std::iter::once(first).chain(more).collect()
}

/// `CLUSTER SETSLOT <slot> <what…>` for every slot: one at a time on each connection of
/// `pool`, the connections side by side (see the module's note on replicas).
async fn set_slots(pool: &[&NodeClient], slots: &[u16], what: &[&str]) -> Result<()> {
    let lanes = pool.iter().enumerate().map(|(lane, node)| async move {
        for slot in slots.iter().skip(lane).step_by(pool.len()) {
            let _: Value = node
                .call(redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg(what))
                .await?;
        }
        Ok::<(), EngineError>(())
    });
    futures::future::try_join_all(lanes).await?;
    Ok(())
}

/// Moves every key of `slot` from the source to the target; how many. Stops with an error
/// past `until`, the slot left open.
async fn move_slot_keys(ends: &KeyMove<'_>, slot: u16, until: Until) -> Result<u64> {
    let mut moved = 0;
    loop {
        if Instant::now() >= until.at {
            return Err(EngineError::Deadline {
                node: ends.source.addr().to_owned(),
                command: "MIGRATE".into(),
                waited: until.started.elapsed(),
                last: format!("slot {slot} still holds keys after {moved} moved"),
            });
        }
        let keys: Vec<Vec<u8>> = ends
            .source
            .call(
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(KEYS_PER_MIGRATE),
            )
            .await?;
        if keys.is_empty() {
            return Ok(moved);
        }
        let mut cmd = redis::cmd("MIGRATE");
        cmd.arg(ends.target_address.ip().to_string())
            .arg(ends.target_address.port())
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS)
            // The source's copy is the one clients write to until the slot is handed over:
            // a key a broken earlier attempt left on both ends is taken from the source.
            .arg("REPLACE");
        if let Some(login) = ends.login {
            cmd.arg("AUTH2").arg(&login.username).arg(&login.password);
        }
        cmd.arg("KEYS").arg(&keys);
        let _: Value = ends.mover.call(&cmd).await?;
        moved += keys.len() as u64;
    }
}

impl NodeClient {
    pub async fn slot_migrations(&self) -> Result<Vec<super::SlotMigration>> {
        let reply: Value = self
            .call(redis::cmd("CLUSTER").arg("GETSLOTMIGRATIONS"))
            .await?;
        super::SlotMigration::parse_all(&reply)
            .ok_or_else(|| self.bad_reply("CLUSTER GETSLOTMIGRATIONS", format!("{reply:?}")))
    }

    /// Cancel every running slot migration of this node; nothing running is not an error.
    pub async fn cancel_slot_migrations(&self) -> Result<()> {
        match self
            .call::<Value>(redis::cmd("CLUSTER").arg("CANCELSLOTMIGRATIONS"))
            .await
        {
            Err(EngineError::Command { source, .. })
                if source.to_string().contains("No migrations ongoing") =>
            {
                Ok(())
            }
            other => other.map(|_| ()),
        }
    }

    /// Move `slots` from this primary to `target_id` with atomic slot migration (both ends on
    /// 9.1 or later: see [`Protocol`]), polling `CLUSTER GETSLOTMIGRATIONS` until the job
    /// succeeds, fails, or `deadline` passes (then the migration is cancelled, which leaves
    /// the slots with this node).
    pub async fn migrate_slots(
        &self,
        target_id: &str,
        slots: &[SlotRange],
        deadline: Duration,
    ) -> Result<()> {
        let earlier: Vec<String> = self
            .slot_migrations()
            .await?
            .into_iter()
            .map(|job| job.name)
            .collect();
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("MIGRATESLOTS").arg("SLOTSRANGE");
        for range in slots {
            cmd.arg(range.start).arg(range.end);
        }
        cmd.arg("NODE").arg(target_id);
        let _: String = self.call(&cmd).await?;
        let started = Instant::now();
        let mut last = String::from("job not listed yet");
        while started.elapsed() < deadline {
            let jobs = self.slot_migrations().await?;
            if let Some(job) = jobs.into_iter().find(|j| !earlier.contains(&j.name)) {
                if job.succeeded() {
                    return Ok(());
                }
                if job.failed() {
                    return Err(EngineError::MigrationFailed {
                        node: self.addr.clone(),
                        job: job.name,
                        state: job.state,
                        message: job.message,
                    });
                }
                last = format!("job {} is {}", job.name, job.state);
            }
            sleep(POLL_INTERVAL).await;
        }
        self.cancel_slot_migrations().await?;
        Err(EngineError::Deadline {
            node: self.addr.clone(),
            command: describe(&cmd),
            waited: started.elapsed(),
            last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_only_when_both_ends_run_9_1_or_later() {
        assert_eq!(Protocol::between("9.1.2", "9.1.0"), Protocol::Atomic);
        assert_eq!(Protocol::between("10.0.0", "9.1.0-rc1"), Protocol::Atomic);
        assert_eq!(Protocol::between("9.0.0", "9.1.2"), Protocol::KeyByKey);
        assert_eq!(Protocol::between("9.1.2", "9.0.3"), Protocol::KeyByKey);
        assert_eq!(
            Protocol::between("9.1.2", "nine"),
            Protocol::KeyByKey,
            "what cannot be read is taken as older"
        );
    }

    #[test]
    fn a_deadline_reports_the_slots_left() {
        let wanted: Vec<u16> = (0..600).collect();
        assert_eq!(remaining(&wanted, &wanted[256..512]), 344);
        assert_eq!(remaining(&wanted, &wanted[..256]), 600);
    }
}
