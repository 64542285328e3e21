//! Real valkey-server clusters from outside, as the roll and end-to-end tests see them: a
//! cluster-aware [`Writer`] that records every acknowledged write, an outside [`Sampler`] of
//! `CLUSTER NODES`, and what a cluster looks like now (versions, layout, primaries).

mod apart;
pub mod attacks;
pub mod logins;
pub mod roller;
pub mod runtime;
mod sampler;
pub mod stranger;
mod writer;

use std::sync::LazyLock;
use std::time::Duration;

use valkey_operator::valkey::NodeClient;

pub use sampler::{
    Sample, Sampler, describe_sample, fewest_replicas, fewest_replicas_at, primary_changes,
};
pub use writer::{Router, Writer, WriterLog, assert_no_lost_writes, lost_writes};

use crate::eventually;

/// The version the test clusters start on, and the one they roll to.
pub const OLD: &str = "9.0.0";
pub const NEW: &str = "9.1.2";

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

/// What sets this test process apart from every other run on the machine: its writer's keys
/// and password carry it. Test processes run side by side and a deleted Pod's address goes to
/// the next Pod of any of them, so a client still holding that address (the writer mid-heal)
/// may reach another test's cluster; with its own password it is refused there, and with its
/// own keys nothing another run wrote reads back as this run's.
pub static RUN: LazyLock<String> = LazyLock::new(|| {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    format!("{:x}{nanos:08x}", std::process::id())
});

/// The key the [`Writer`] writes `index` to: unique to this run (see [`RUN`]).
pub fn key(index: u64) -> String {
    format!("key:{}:{index}", *RUN)
}

/// A plain (not cluster-aware) connection to one node, as the operator's user where the
/// harness learnt its password (see [`logins`]), else without credentials.
pub async fn connect(address: &str) -> redis::aio::MultiplexedConnection {
    let login = logins::admin_login(address, Duration::from_secs(2))
        .await
        .unwrap();
    redis::Client::open(logins::url(address, login.as_ref()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A setting as one node runs it (`CONFIG GET`, as the operator's user), or why it could not
/// be read.
pub async fn config_get(address: &str, setting: &str) -> Result<String, String> {
    let login = logins::admin_login(address, Duration::from_secs(2))
        .await
        .map_err(|e| e.to_string())?;
    let client =
        redis::Client::open(logins::url(address, login.as_ref())).map_err(|e| e.to_string())?;
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let reply: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(setting)
        .query_async(&mut connection)
        .await
        .map_err(|e| e.to_string())?;
    reply
        .get(1)
        .cloned()
        .ok_or_else(|| format!("{address} has no setting {setting}"))
}

/// A connection to one node for the harness's own reads (see [`logins::admin`]).
pub async fn admin(address: &str) -> NodeClient {
    logins::admin(address, Duration::from_secs(2))
        .await
        .unwrap()
}

/// Every node's engine version, read with `INFO server`.
pub async fn versions(addresses: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for addr in addresses {
        let client = admin(addr).await;
        out.push(client.server_info().await.unwrap().version);
    }
    out
}

/// Per desired shard: how many primaries and replicas the cluster shows, and slots owned.
pub async fn layout(addresses: &[String]) -> Vec<(usize, u32)> {
    try_layout(addresses).await.unwrap()
}

/// [`layout`], or why it could not be read (a node down or paused answers with an error, not
/// a panic, for tests that poll through faults).
pub async fn try_layout(
    addresses: &[String],
) -> valkey_operator::valkey::Result<Vec<(usize, u32)>> {
    let client = logins::admin(&addresses[0], Duration::from_secs(2)).await?;
    let shards = client.cluster_shards().await?;
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
    Ok(out)
}

/// The ids of the nodes owning slots, sorted.
pub async fn primaries(addresses: &[String]) -> Vec<String> {
    let client = admin(&addresses[0]).await;
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

/// Waits until [`layout`] shows `expected`, for up to 30 s: gossip spreads a new replica's role
/// and health (`online` once its offset is known) within moments, not instantly, and on a
/// loaded 2-core CI machine a node may go a few node-timeout halves between pings of it
/// (10 s was once not enough there).
pub async fn wait_for_layout(addresses: &[String], expected: &[(usize, u32)]) {
    eventually(
        format!("(replicas, slots) per shard to be {expected:?}"),
        Duration::from_secs(30),
        async || {
            let seen = layout(addresses).await;
            if seen == expected {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn key_slots_are_valkeys() {
        // `CLUSTER KEYSLOT` answers, from a real server.
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("key:0"), 2592);
        assert_eq!(key_slot("{user1000}.following"), 3443);
        assert_eq!(key_slot("{user1000}.followers"), 3443);
        // An empty hash tag is no tag: the whole key is hashed.
        assert_eq!(key_slot("{}foo"), 9500);
    }
}
