//! Parsers for Valkey's replies: `INFO` sections, `CLUSTER INFO`, `CLUSTER NODES`,
//! `CLUSTER SHARDS` and `CLUSTER GETSLOTMIGRATIONS`, into typed structs.

use std::collections::HashMap;

use redis::Value;

use crate::roll::{Role, SlotRange};

/// `key:value` lines of an `INFO` or `CLUSTER INFO` reply.
pub fn info_fields(text: &str) -> HashMap<&str, &str> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.trim_end().split_once(':'))
        .collect()
}

/// `INFO keyspace`: the keys of every database together (`db0:keys=1502,expires=0,...`); an
/// empty node lists no database, which is 0 keys.
pub fn keyspace_keys(text: &str) -> Option<u64> {
    info_fields(text)
        .into_iter()
        .filter(|(name, _)| name.starts_with("db"))
        .map(|(_, fields)| {
            fields
                .split(',')
                .find_map(|field| field.strip_prefix("keys="))
                .and_then(|keys| keys.parse::<u64>().ok())
        })
        .sum()
}

/// `INFO server`: which engine runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// `valkey_version` (falls back to `redis_version`, which Valkey reports for compatibility).
    pub version: String,
}

impl ServerInfo {
    pub fn parse(text: &str) -> Option<Self> {
        let fields = info_fields(text);
        let version = fields
            .get("valkey_version")
            .or_else(|| fields.get("redis_version"))?;
        Some(Self {
            version: (*version).to_owned(),
        })
    }
}

/// A reply written out for a person, a value a line, nested values indented.
pub fn write_out(value: &Value, depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth);
    match value {
        Value::Array(items) | Value::Set(items) => {
            for item in items {
                write_out(item, depth + 1, out);
            }
        }
        Value::Map(pairs) => {
            for (key, item) in pairs {
                write_out(key, depth + 1, out);
                write_out(item, depth + 2, out);
            }
        }
        Value::BulkString(bytes) => {
            out.push_str(&format!("{indent}{}\n", String::from_utf8_lossy(bytes)))
        }
        Value::SimpleString(text) => out.push_str(&format!("{indent}{text}\n")),
        Value::Int(number) => out.push_str(&format!("{indent}{number}\n")),
        Value::Nil => out.push_str(&format!("{indent}(nil)\n")),
        other => out.push_str(&format!("{indent}{other:?}\n")),
    }
}

/// `INFO replication`, as the node itself sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicationInfo {
    pub role: Role,
    /// Replica only: `master_link_status:up`.
    pub link_up: bool,
    /// Replica only: `master_sync_in_progress:1`.
    pub sync_in_progress: bool,
    /// Replica only: `slave_repl_offset`, how far it has applied its primary's stream.
    pub replica_offset: u64,
    /// `master_repl_offset`: on a primary, how much it has produced.
    pub master_repl_offset: u64,
}

impl ReplicationInfo {
    pub fn parse(text: &str) -> Option<Self> {
        let fields = info_fields(text);
        let number = |key: &str| fields.get(key).and_then(|v| v.parse().ok()).unwrap_or(0);
        let role = match *fields.get("role")? {
            "master" => Role::Primary,
            "slave" | "replica" => Role::Replica,
            _ => return None,
        };
        Some(Self {
            role,
            link_up: fields.get("master_link_status") == Some(&"up"),
            sync_in_progress: fields.get("master_sync_in_progress") == Some(&"1"),
            replica_offset: number("slave_repl_offset"),
            master_repl_offset: number("master_repl_offset"),
        })
    }
}

/// `CLUSTER INFO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterInfo {
    pub state_ok: bool,
    pub slots_assigned: u32,
    pub known_nodes: u32,
}

impl ClusterInfo {
    pub fn parse(text: &str) -> Option<Self> {
        let fields = info_fields(text);
        Some(Self {
            state_ok: *fields.get("cluster_state")? == "ok",
            slots_assigned: fields.get("cluster_slots_assigned")?.parse().ok()?,
            known_nodes: fields.get("cluster_known_nodes")?.parse().ok()?,
        })
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    pub ip: String,
    pub port: u16,
    pub myself: bool,
    pub primary: bool,
    /// The primary's id, for a replica.
    pub replica_of: Option<String>,
    /// `fail`: the cluster agreed the node is down.
    pub failed: bool,
    /// `fail?`: this node suspects it is down.
    pub suspected: bool,
    /// `handshake` or `noaddr`: not yet (or no longer) a proper member.
    pub handshake: bool,
    pub link_connected: bool,
    /// Owned slots; slots being imported or migrated (`[..]` entries) are left out.
    pub slots: Vec<SlotRange>,
    /// Slots the key-by-key migration protocol left open on this node (`[5->-id]`: being
    /// migrated to `id`; `[5-<-id]`: being imported from `id`). Valkey lists them on the
    /// `myself` line only.
    pub open_slots: Vec<OpenSlot>,
}

/// A slot in the middle of a key-by-key migration, as one end of it sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenSlot {
    pub slot: u16,
    /// Which end this node is.
    pub direction: SlotDirection,
    /// The id of the other end.
    pub peer: String,
}

/// Whether a node is sending or receiving an open slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotDirection {
    /// `CLUSTER SETSLOT … MIGRATING`: this node owns the slot and sends its keys to the peer.
    Migrating,
    /// `CLUSTER SETSLOT … IMPORTING`: this node takes the slot's keys from the peer.
    Importing,
}

impl OpenSlot {
    /// `[5->-id]` or `[5-<-id]`.
    fn parse(text: &str) -> Option<Self> {
        let inner = text.strip_prefix('[')?.strip_suffix(']')?;
        let (slot, direction, peer) = if let Some((slot, peer)) = inner.split_once("->-") {
            (slot, SlotDirection::Migrating, peer)
        } else {
            let (slot, peer) = inner.split_once("-<-")?;
            (slot, SlotDirection::Importing, peer)
        };
        Some(Self {
            slot: slot.parse().ok()?,
            direction,
            peer: peer.to_owned(),
        })
    }
}

impl ClusterNode {
    /// Where the node says it serves clients, when its announced IP parses.
    pub fn address(&self) -> Option<super::NodeAddress> {
        Some(super::NodeAddress::new(self.ip.parse().ok()?, self.port))
    }

    /// Every line of a `CLUSTER NODES` reply; `None` if any line is malformed.
    pub fn parse_all(text: &str) -> Option<Vec<Self>> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(Self::parse)
            .collect()
    }

    pub fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return None;
        }
        let address = fields[1].split([',', '@']).next()?;
        let (ip, port) = address.rsplit_once(':')?;
        let flags: Vec<&str> = fields[2].split(',').collect();
        let has = |flag: &str| flags.contains(&flag);
        let slots = fields[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .map(|s| parse_range(s, '-'))
            .collect::<Option<Vec<_>>>()?;
        let open_slots = fields[8..]
            .iter()
            .filter_map(|s| OpenSlot::parse(s))
            .collect();
        Some(Self {
            id: fields[0].to_owned(),
            ip: ip.to_owned(),
            port: port.parse().unwrap_or(0),
            myself: has("myself"),
            primary: has("master"),
            replica_of: (fields[3] != "-").then(|| fields[3].to_owned()),
            failed: has("fail"),
            suspected: has("fail?"),
            handshake: has("handshake") || has("noaddr"),
            link_connected: fields[7] == "connected",
            slots,
            open_slots,
        })
    }
}

/// `"5"` or `"0-100"` (with `separator` between the ends).
fn parse_range(text: &str, separator: char) -> Option<SlotRange> {
    match text.split_once(separator) {
        Some((start, end)) => {
            let (start, end): (u16, u16) = (start.parse().ok()?, end.parse().ok()?);
            // A range written backwards is no range (and would count below zero).
            (start <= end).then(|| SlotRange::new(start, end))
        }
        None => {
            let slot = text.parse().ok()?;
            Some(SlotRange::new(slot, slot))
        }
    }
}

/// One shard of `CLUSTER SHARDS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterShard {
    pub slots: Vec<SlotRange>,
    pub members: Vec<ShardMember>,
}

/// One node of a `CLUSTER SHARDS` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMember {
    pub id: String,
    pub ip: String,
    pub primary: bool,
    pub replication_offset: u64,
    /// `online`, `failed` or `loading`.
    pub health: String,
}

impl ClusterShard {
    pub fn parse_all(reply: &Value) -> Option<Vec<Self>> {
        let Value::Array(shards) = reply else {
            return None;
        };
        shards.iter().map(Self::parse).collect()
    }

    fn parse(shard: &Value) -> Option<Self> {
        let fields = pairs(shard)?;
        let slot_bounds: Vec<u16> = match fields.get("slots")? {
            Value::Array(bounds) => bounds.iter().map(integer).collect::<Option<_>>()?,
            _ => return None,
        };
        let slots = slot_bounds
            .chunks(2)
            .filter_map(|pair| match pair {
                [start, end] => Some(SlotRange::new(*start, *end)),
                _ => None,
            })
            .collect();
        let members = match fields.get("nodes")? {
            Value::Array(nodes) => nodes
                .iter()
                .map(ShardMember::parse)
                .collect::<Option<_>>()?,
            _ => return None,
        };
        Some(Self { slots, members })
    }
}

impl ShardMember {
    fn parse(node: &Value) -> Option<Self> {
        let fields = pairs(node)?;
        Some(Self {
            id: text(fields.get("id")?)?,
            ip: text(fields.get("ip")?)?,
            primary: text(fields.get("role")?)? == "master",
            replication_offset: fields.get("replication-offset").and_then(|v| integer(v))?,
            health: text(fields.get("health")?)?,
        })
    }
}

/// One job of `CLUSTER GETSLOTMIGRATIONS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotMigration {
    pub name: String,
    /// `EXPORT` on the source, `IMPORT` on the target.
    pub operation: String,
    pub slot_ranges: String,
    pub source_node: String,
    pub target_node: String,
    pub state: String,
    pub message: String,
}

impl SlotMigration {
    pub fn parse_all(reply: &Value) -> Option<Vec<Self>> {
        let Value::Array(jobs) = reply else {
            return None;
        };
        jobs.iter().map(Self::parse).collect()
    }

    fn parse(job: &Value) -> Option<Self> {
        let fields = pairs(job)?;
        let get = |key: &str| fields.get(key).and_then(|v| text(v)).unwrap_or_default();
        Some(Self {
            name: text(fields.get("name")?)?,
            operation: get("operation"),
            slot_ranges: get("slot_ranges"),
            source_node: get("source_node"),
            target_node: get("target_node"),
            state: text(fields.get("state")?)?,
            message: get("message"),
        })
    }

    pub fn succeeded(&self) -> bool {
        self.state == "success"
    }

    /// Finished without success (`failed`, `cancelled`, ...).
    pub fn failed(&self) -> bool {
        matches!(self.state.as_str(), "failed" | "cancelled" | "canceled")
    }
}

/// A RESP3 map, or a RESP2 array of alternating keys and values, by key.
fn pairs(value: &Value) -> Option<HashMap<String, &Value>> {
    match value {
        Value::Map(entries) => entries.iter().map(|(k, v)| Some((text(k)?, v))).collect(),
        Value::Array(items) if items.len() % 2 == 0 => items
            .chunks(2)
            .map(|kv| Some((text(&kv[0])?, &kv[1])))
            .collect(),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

fn integer<T: TryFrom<i64>>(value: &Value) -> Option<T> {
    match value {
        Value::Int(n) => T::try_from(*n).ok(),
        other => T::try_from(text(other)?.parse::<i64>().ok()?).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyspace_keys_add_up_every_database_and_an_empty_node_has_none() {
        let text = "# Keyspace\r\ndb0:keys=1502,expires=0,avg_ttl=0,keys_with_volatile_items=0\r\ndb1:keys=3,expires=1\r\n";
        assert_eq!(keyspace_keys(text), Some(1505));
        assert_eq!(keyspace_keys("# Keyspace\r\n"), Some(0));
        assert_eq!(keyspace_keys("db0:keys=x"), None);
    }

    #[test]
    fn a_slot_range_written_backwards_is_no_range() {
        let line = "abc 127.0.0.1:6379@16379 myself,master - 0 0 1 connected 100-5";
        assert_eq!(ClusterNode::parse(line), None);
        assert_eq!(parse_range("5-100", '-').map(|r| r.count()), Some(96));
    }

    #[test]
    fn cluster_nodes_lines() {
        let text = "\
89983d02 127.0.9.3:6379@16379 master - 0 1795970000954 2 connected 0-100 8001-16383 [5->-abc]
5ea03a67 127.0.9.2:6379@16379,host myself,slave 89983d02 0 0 1 connected
aa 127.0.9.4:6379@16379 master,fail - 1 1 3 disconnected
";
        let nodes = ClusterNode::parse_all(text).unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(
            nodes[0].slots,
            vec![SlotRange::new(0, 100), SlotRange::new(8001, 16383)]
        );
        assert!(nodes[0].primary && !nodes[0].myself && nodes[0].link_connected);
        assert_eq!(nodes[1].ip, "127.0.9.2");
        assert_eq!(nodes[1].replica_of.as_deref(), Some("89983d02"));
        assert!(nodes[1].myself && !nodes[1].primary);
        assert!(nodes[2].failed && !nodes[2].link_connected);
        assert_eq!(
            nodes[0].open_slots,
            [OpenSlot {
                slot: 5,
                direction: SlotDirection::Migrating,
                peer: "abc".into()
            }]
        );
    }

    #[test]
    fn open_slots_of_both_ends_and_a_malformed_one() {
        let line =
            "a 127.0.9.3:6379@16379 myself,master - 0 0 2 connected 0-99 [100-<-bb] [7->-cc]";
        let node = ClusterNode::parse(line).unwrap();
        assert_eq!(node.slots, [SlotRange::new(0, 99)]);
        assert_eq!(
            node.open_slots,
            [
                OpenSlot {
                    slot: 100,
                    direction: SlotDirection::Importing,
                    peer: "bb".into()
                },
                OpenSlot {
                    slot: 7,
                    direction: SlotDirection::Migrating,
                    peer: "cc".into()
                },
            ]
        );
        // A bracketed entry of another form is not an open slot, and spoils nothing else.
        let odd = ClusterNode::parse("a 1.2.3.4:6379@16379 master - 0 0 2 connected 1-2 [x->-y]");
        assert_eq!(
            odd.map(|n| (n.slots, n.open_slots)),
            Some((vec![SlotRange::new(1, 2)], vec![]))
        );
    }

    #[test]
    fn replication_info_on_a_replica() {
        let text = "# Replication\r\nrole:slave\r\nmaster_link_status:up\r\n\
                    master_sync_in_progress:0\r\nslave_repl_offset:1234\r\nmaster_repl_offset:1234\r\n";
        let info = ReplicationInfo::parse(text).unwrap();
        assert_eq!(info.role, Role::Replica);
        assert!(info.link_up && !info.sync_in_progress);
        assert_eq!(info.replica_offset, 1234);
    }

    #[test]
    fn slot_migrations_in_resp2() {
        let s = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            s("name"),
            s("abc"),
            s("operation"),
            s("EXPORT"),
            s("state"),
            s("success"),
            s("create_time"),
            Value::Int(5),
        ])]);
        let jobs = SlotMigration::parse_all(&reply).unwrap();
        assert_eq!(jobs[0].name, "abc");
        assert!(jobs[0].succeeded());
    }
}
