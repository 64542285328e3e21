//! A stranger: a real valkey-server in cluster mode, with no password, started by a test at an
//! address a Pod of the operator's had (as a CNI hands a freed IP to the next Pod), and what it
//! saw of the operator.

use std::net::Ipv4Addr;
use std::time::Duration;

use testenv::IpLease;
use valkey_operator::valkey::NodeClient;

use crate::eventually;

/// A valkey-server the operator must never mistake for one of its nodes. Dropping it stops it.
pub struct Stranger {
    address: String,
    process: std::process::Child,
    _dir: tempfile::TempDir,
    _lease: IpLease,
}

/// What a stranger saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Connections it accepted (from anyone: the operator, the cluster's nodes' bus is apart).
    pub connections: u64,
    /// `AUTH` commands it received: a login sent to it, with its password (by anyone: the
    /// operator, or a client following a topology that still lists the address).
    pub auth_commands: u64,
    /// Of those, logins as the operator's own users (`valkey-operator`, `valkey-replication`):
    /// its passwords, which only the operator (and the tests, as it) would send.
    pub operator_logins: u64,
    /// Logins it refused.
    pub auth_refused: u64,
    /// Nodes its own `CLUSTER NODES` lists (itself included).
    pub known_nodes: usize,
}

impl Stranger {
    /// Starts valkey-server `version` at `lease`'s address, port 6379 (cluster bus 16379), and
    /// waits until it answers. The lease keeps the address from being handed to a Pod.
    pub async fn start(lease: IpLease, version: &str) -> Self {
        let ip: Ipv4Addr = lease.ip();
        let dir = tempfile::Builder::new()
            .prefix("stranger-")
            .tempdir()
            .unwrap();
        let server = testenv::valkey_bin_root()
            .join(version)
            .join("valkey-server");
        let process = std::process::Command::new(server)
            .args(["--bind", &ip.to_string(), "--port", "6379"])
            .args([
                "--cluster-enabled",
                "yes",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--protected-mode", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stranger = Self {
            address: format!("{ip}:6379"),
            process,
            _dir: dir,
            _lease: lease,
        };
        eventually(
            "the stranger to answer",
            Duration::from_secs(10),
            async || stranger.client().await.ok()?.ping().await.ok(),
        )
        .await;
        stranger
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    async fn client(&self) -> valkey_operator::valkey::Result<NodeClient> {
        NodeClient::connect(&self.address, Duration::from_secs(2)).await
    }

    /// Its own node id.
    pub async fn id(&self) -> String {
        self.client().await.unwrap().my_id().await.unwrap()
    }

    /// What it saw so far.
    pub async fn seen(&self) -> Seen {
        let mut conn = redis::Client::open(format!("redis://{}/", self.address))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("everything")
            .query_async(&mut conn)
            .await
            .unwrap();
        let field = |name: &str| -> u64 {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let auth_commands = info
            .lines()
            .find_map(|line| line.strip_prefix("cmdstat_auth:calls="))
            .and_then(|v| v.split(',').next()?.parse().ok())
            .unwrap_or(0);
        let nodes = self.client().await.unwrap().cluster_nodes().await.unwrap();
        // It has only `default`: a login as any other user fails and is in its ACL LOG, with
        // the user's name and how many times.
        let log: redis::Value = redis::cmd("ACL")
            .arg("LOG")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let operator_logins = failed_logins(&log, &["valkey-operator", "valkey-replication"]);
        Seen {
            connections: field("total_connections_received"),
            auth_commands,
            operator_logins,
            auth_refused: field("acl_access_denied_auth"),
            known_nodes: nodes.len(),
        }
    }
}

/// How many failed logins an `ACL LOG` reply holds for `users`.
fn failed_logins(log: &redis::Value, users: &[&str]) -> u64 {
    let redis::Value::Array(entries) = log else {
        return 0;
    };
    let text = |value: &redis::Value| match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(text) => text.clone(),
        redis::Value::Int(n) => n.to_string(),
        _ => String::new(),
    };
    entries
        .iter()
        .filter_map(|entry| {
            let fields: Vec<(String, String)> = match entry {
                redis::Value::Array(flat) => flat
                    .chunks(2)
                    .filter_map(|kv| Some((text(kv.first()?), text(kv.get(1)?))))
                    .collect(),
                redis::Value::Map(pairs) => pairs.iter().map(|(k, v)| (text(k), text(v))).collect(),
                _ => return None,
            };
            let get = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            (get("reason") == Some("auth") && users.contains(&get("username")?))
                .then(|| get("count")?.parse::<u64>().ok())?
        })
        .sum()
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
