//! The engine protocol: the commands the operator sends to one Valkey node, over the `redis`
//! crate's async connection. Every call has a timeout; every error names the node and command.
//! Waiting operations (replicate, failover, slot migration) poll until done or a deadline.

pub mod address;
mod bounded;
mod identity;
pub mod migration;
pub mod parse;
pub mod tls;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, Value};
use tokio::time::{Instant, sleep, timeout};

pub use address::{CLIENT_PORT, NodeAddress};
pub use bounded::REPLY_LIMIT;
pub use identity::Expected;
pub use parse::{
    ClusterInfo, ClusterNode, ClusterShard, OpenSlot, ReplicationInfo, ServerInfo, ShardMember,
    SlotDirection, SlotMigration,
};

use crate::credentials::Credentials;
use crate::roll::{Role, SlotRange};

/// How often waiting operations re-check the node.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// An engine call that failed, naming the node (`ip:port`) and the command.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{node}: {command}: {source}")]
    Command {
        node: String,
        command: String,
        source: redis::RedisError,
    },
    #[error("{node}: {command}: no reply within {after:?}")]
    Timeout {
        node: String,
        command: String,
        after: Duration,
    },
    #[error("{node}: {command}: unexpected reply: {reply}")]
    Reply {
        node: String,
        command: String,
        reply: String,
    },
    #[error("{node}: {command}: gave up after {waited:?}: {last}")]
    Deadline {
        node: String,
        command: String,
        waited: Duration,
        last: String,
    },
    #[error("{node}: slot migration {job} ended {state}: {message}")]
    MigrationFailed {
        node: String,
        job: String,
        state: String,
        message: String,
    },
    /// A command that changes a node, not sent: this process may no longer write (see
    /// [`Fence`]).
    #[error("{node}: {command}: not sent: this replica no longer leads")]
    Fenced { node: String, command: String },
    /// The node answered more than [`REPLY_LIMIT`] bytes (see [`bounded`]); the connection is
    /// closed.
    #[error("{node}: {command}: a reply over its {limit}-byte limit")]
    TooLarge {
        node: String,
        command: String,
        limit: usize,
    },
    /// The node's TLS certificate failed the operator's check (expired, not from the cluster's
    /// CA, not naming the node): it answered, so this is not silence.
    #[error("{node}: connect (TLS): its certificate is not trusted: {problem}")]
    Certificate { node: String, problem: String },
    /// Not the node the operator means answers at its address (see [`identity`]).
    #[error("{node}: a stranger answers there: expected {expected}, found {found}")]
    Stranger {
        node: String,
        expected: String,
        found: String,
    },
}

impl EngineError {
    /// The node refused the command itself (`ERR …`), as opposed to not answering or being
    /// busy (`LOADING`, `BUSY`, `TRYAGAIN`, `CLUSTERDOWN` say nothing about the command).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            EngineError::Command { source, .. }
                if matches!(
                    source.kind(),
                    redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
                        | redis::ErrorKind::Extension
                )
        )
    }

    /// The node refused the login itself (a wrong password, an unknown or disabled user).
    pub fn is_auth_refusal(&self) -> bool {
        matches!(
            self,
            EngineError::Command { source, .. }
                if source.kind() == redis::ErrorKind::AuthenticationFailed
                    || source.code() == Some("WRONGPASS")
        )
    }

    /// A small, bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            EngineError::Command { .. } => "command",
            EngineError::Timeout { .. } => "timeout",
            EngineError::Reply { .. } => "reply",
            EngineError::Deadline { .. } => "deadline",
            EngineError::MigrationFailed { .. } => "migration",
            EngineError::Stranger { .. } => "stranger",
            EngineError::TooLarge { .. } => "too_large",
            EngineError::Certificate { .. } => "certificate",
            EngineError::Fenced { .. } => "fenced",
        }
    }

    /// The node's TLS certificate failed the operator's check.
    pub fn is_certificate_refusal(&self) -> bool {
        matches!(self, EngineError::Certificate { .. })
    }

    /// Something other than the node meant answered at its address.
    pub fn is_stranger(&self) -> bool {
        matches!(self, EngineError::Stranger { .. })
    }

    /// The node did not answer (no reply in time, the connection refused or dropped), as
    /// opposed to answering something: what counts as silence.
    pub fn is_silence(&self) -> bool {
        match self {
            EngineError::Timeout { .. } | EngineError::Deadline { .. } => true,
            EngineError::Command { source, .. } => {
                source.is_io_error()
                    || source.is_timeout()
                    || source.is_connection_dropped()
                    || source.is_connection_refusal()
            }
            _ => false,
        }
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;

/// Why the node's certificate failed the check, when that is why a TLS handshake failed.
fn untrusted_certificate(error: &std::io::Error) -> Option<String> {
    let refused = error.get_ref()?.downcast_ref::<rustls::Error>()?;
    matches!(refused, rustls::Error::InvalidCertificate(_)).then(|| refused.to_string())
}

/// How the operator reaches one cluster's nodes: the bound on connecting and on each call, TLS
/// when the cluster serves it, and the logins it tries in order (during a rotation of its
/// password a node may know only the other one). See [`NodeClient::open`] for when each is
/// sent, and to whom.
#[derive(Clone, Debug)]
pub struct Reach {
    pub call_timeout: Duration,
    pub tls: Option<tls::TlsTrust>,
    pub credentials: Vec<Credentials>,
    /// Checked before every command that changes a node (`None`: never fenced).
    pub fence: Option<Fence>,
}

impl Reach {
    /// Plain TCP as the `default` user (a cluster without `spec.tls`), never fenced.
    pub fn plain(call_timeout: Duration) -> Self {
        Self {
            call_timeout,
            tls: None,
            credentials: Vec::new(),
            fence: None,
        }
    }
}

/// Whether this process may still change a node: asked right before each command that writes
/// (every command but the reads of [`is_read`]), so a replica that lost its leadership, or was
/// paused past it, sends none, whatever it read before.
#[derive(Clone)]
pub struct Fence(std::sync::Arc<dyn Fn() -> bool + Send + Sync>);

impl Fence {
    pub fn new(holds: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(holds))
    }

    fn holds(&self) -> bool {
        (self.0)()
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fence(holds: {})", self.holds())
    }
}

/// The commands that change nothing on a node (by their first two words, as [`describe`] gives
/// them): the only ones sent without asking the [`Fence`].
fn is_read(command: &str) -> bool {
    let mut words = command.split(' ');
    matches!(
        (words.next(), words.next()),
        (Some("PING" | "INFO" | "AUTH"), _)
            | (
                Some("CLUSTER"),
                Some(
                    "INFO"
                        | "NODES"
                        | "SHARDS"
                        | "MYID"
                        | "GETSLOTMIGRATIONS"
                        | "GETKEYSINSLOT"
                        | "COUNTKEYSINSLOT"
                )
            )
            | (Some("ACL"), Some("USERS"))
    )
}

/// The handshake settings: the user to authenticate as, if any.
fn handshake(credentials: Option<&Credentials>) -> redis::RedisConnectionInfo {
    let info = redis::RedisConnectionInfo::default();
    match credentials {
        Some(c) => info.set_username(&c.username).set_password(&c.password),
        None => info,
    }
}

/// A connection to one Valkey node.
#[derive(Clone)]
pub struct NodeClient {
    addr: String,
    conn: MultiplexedConnection,
    /// Whether a reply passed [`REPLY_LIMIT`] (and so ended the connection).
    overflow: bounded::Overflow,
    call_timeout: Duration,
    /// Whether the connection logged in as a user (not as `default` without credentials).
    logged_in: bool,
    /// The node's id, once checked against what was expected ([`NodeClient::open`]).
    id: Option<String>,
    fence: Option<Fence>,
}

impl NodeClient {
    /// Connect to `ip:port` as the `default` user; connecting and every later call are bounded
    /// by `call_timeout`.
    pub async fn connect(addr: &str, call_timeout: Duration) -> Result<Self> {
        Self::connect_as(addr, call_timeout, None).await
    }

    /// Connect to `ip:port`, authenticating with `credentials` when given.
    pub async fn connect_as(
        addr: &str,
        call_timeout: Duration,
        credentials: Option<&Credentials>,
    ) -> Result<Self> {
        let failed = |source: redis::RedisError| EngineError::Command {
            node: addr.to_owned(),
            command: "connect".to_owned(),
            source,
        };
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(call_timeout));
        let info = handshake(credentials);
        let connecting = async {
            let tcp = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|error| failed(error.into()))?;
            let (stream, overflow) = bounded::Bounded::new(tcp, REPLY_LIMIT);
            let (conn, driver) = MultiplexedConnection::new_with_config(&info, stream, config)
                .await
                .map_err(failed)?;
            Ok::<_, EngineError>((conn, driver, overflow))
        };
        let (conn, driver, overflow) =
            timeout(call_timeout, connecting)
                .await
                .map_err(|_| EngineError::Timeout {
                    node: addr.to_owned(),
                    command: "connect".to_owned(),
                    after: call_timeout,
                })??;
        tokio::spawn(driver);
        Ok(Self {
            addr: addr.to_owned(),
            conn,
            overflow,
            call_timeout,
            logged_in: credentials.is_some(),
            id: None,
            fence: None,
        })
    }

    async fn at_as(addr: &str, reach: &Reach, credentials: Option<&Credentials>) -> Result<Self> {
        let mut client = match &reach.tls {
            None => Self::connect_as(addr, reach.call_timeout, credentials).await,
            Some(trust) => Self::connect_tls(addr, reach.call_timeout, trust, credentials).await,
        }?;
        client.fence = reach.fence.clone();
        Ok(client)
    }

    /// Connect over TLS, checking the node's certificate against `trust`; the whole handshake
    /// is bounded by `call_timeout`, like every later call.
    pub async fn connect_tls(
        addr: &str,
        call_timeout: Duration,
        trust: &tls::TlsTrust,
        credentials: Option<&Credentials>,
    ) -> Result<Self> {
        let failed = |source: redis::RedisError| EngineError::Command {
            node: addr.to_owned(),
            command: "connect (TLS)".to_owned(),
            source,
        };
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(call_timeout));
        let connecting = async {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let connector = tokio_rustls::TlsConnector::from(trust.config.clone());
            let name = trust.server_name(addr).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("no DNS name to verify {addr} by"),
                )
            })?;
            connector.connect(name, tcp).await
        };
        let stream = timeout(call_timeout, connecting)
            .await
            .map_err(|_| EngineError::Timeout {
                node: addr.to_owned(),
                command: "connect (TLS)".to_owned(),
                after: call_timeout,
            })?
            .map_err(|error| match untrusted_certificate(&error) {
                Some(problem) => EngineError::Certificate {
                    node: addr.to_owned(),
                    problem,
                },
                None => failed(error.into()),
            })?;
        let (stream, overflow) = bounded::Bounded::new(stream, REPLY_LIMIT);
        let (conn, driver) =
            MultiplexedConnection::new_with_config(&handshake(credentials), stream, config)
                .await
                .map_err(failed)?;
        tokio::spawn(driver);
        Ok(Self {
            addr: addr.to_owned(),
            conn,
            overflow,
            call_timeout,
            logged_in: credentials.is_some(),
            id: None,
            fence: None,
        })
    }

    /// Whether the node let this connection in as a user rather than as `default`.
    pub fn is_logged_in(&self) -> bool {
        self.logged_in
    }

    /// `ip:port` of the node.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn call<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let command = describe(cmd);
        if !is_read(&command) && self.fence.as_ref().is_some_and(|f| !f.holds()) {
            return Err(EngineError::Fenced {
                node: self.addr.clone(),
                command,
            });
        }
        count_sent(&command);
        let mut conn = self.conn.clone();
        match timeout(self.call_timeout, cmd.query_async::<T>(&mut conn)).await {
            Err(_) => Err(EngineError::Timeout {
                node: self.addr.clone(),
                command,
                after: self.call_timeout,
            }),
            Ok(Err(_)) if self.overflow.happened() => Err(EngineError::TooLarge {
                node: self.addr.clone(),
                command,
                limit: REPLY_LIMIT,
            }),
            Ok(Err(source)) => Err(EngineError::Command {
                node: self.addr.clone(),
                command,
                source,
            }),
            Ok(Ok(reply)) => Ok(reply),
        }
    }

    fn bad_reply(&self, command: &str, reply: impl Into<String>) -> EngineError {
        EngineError::Reply {
            node: self.addr.clone(),
            command: command.to_owned(),
            reply: reply.into(),
        }
    }

    pub async fn ping(&self) -> Result<()> {
        let _: String = self.call(&redis::cmd("PING")).await?;
        Ok(())
    }

    async fn info(&self, section: &str) -> Result<String> {
        self.call(redis::cmd("INFO").arg(section)).await
    }

    pub async fn server_info(&self) -> Result<ServerInfo> {
        let text = self.info("server").await?;
        ServerInfo::parse(&text).ok_or_else(|| self.bad_reply("INFO server", text))
    }

    /// How many keys the node holds (`INFO keyspace`; the operator's user may not run DBSIZE).
    pub async fn key_count(&self) -> Result<u64> {
        let text = self.info("keyspace").await?;
        parse::keyspace_keys(&text).ok_or_else(|| self.bad_reply("INFO keyspace", text))
    }

    pub async fn replication_info(&self) -> Result<ReplicationInfo> {
        let text = self.info("replication").await?;
        ReplicationInfo::parse(&text).ok_or_else(|| self.bad_reply("INFO replication", text))
    }

    pub async fn cluster_info(&self) -> Result<ClusterInfo> {
        let text: String = self.call(redis::cmd("CLUSTER").arg("INFO")).await?;
        ClusterInfo::parse(&text).ok_or_else(|| self.bad_reply("CLUSTER INFO", text))
    }

    pub async fn cluster_nodes(&self) -> Result<Vec<ClusterNode>> {
        let text: String = self.call(redis::cmd("CLUSTER").arg("NODES")).await?;
        ClusterNode::parse_all(&text).ok_or_else(|| self.bad_reply("CLUSTER NODES", text))
    }

    pub async fn cluster_shards(&self) -> Result<Vec<ClusterShard>> {
        let reply: Value = self.call(redis::cmd("CLUSTER").arg("SHARDS")).await?;
        ClusterShard::parse_all(&reply)
            .ok_or_else(|| self.bad_reply("CLUSTER SHARDS", format!("{reply:?}")))
    }

    /// What a support bundle records of the node, in its own words: `INFO`, `CLUSTER NODES`,
    /// and `CLUSTER SHARDS` written out a value a line.
    pub async fn diagnostics(&self) -> Result<String> {
        let info: String = self.call(&redis::cmd("INFO")).await?;
        let nodes: String = self.call(redis::cmd("CLUSTER").arg("NODES")).await?;
        let shards: Value = self.call(redis::cmd("CLUSTER").arg("SHARDS")).await?;
        let mut shards_text = String::new();
        parse::write_out(&shards, 0, &mut shards_text);
        Ok(format!(
            "# INFO\n{info}\n# CLUSTER NODES\n{nodes}\n# CLUSTER SHARDS\n{shards_text}"
        ))
    }

    /// This node's cluster id.
    pub async fn my_id(&self) -> Result<String> {
        self.call(redis::cmd("CLUSTER").arg("MYID")).await
    }

    /// Introduce the node at `peer` to this node's cluster.
    pub async fn meet(&self, peer: NodeAddress) -> Result<()> {
        let _: String = self
            .call(
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg(peer.ip().to_string())
                    .arg(peer.port()),
            )
            .await?;
        Ok(())
    }

    /// Make this node a replica of `primary_id`, retrying while gossip has not yet introduced
    /// the primary ("Unknown node"), until `deadline`.
    pub async fn replicate(&self, primary_id: &str, deadline: Duration) -> Result<()> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("REPLICATE").arg(primary_id);
        let started = Instant::now();
        loop {
            match self.call::<String>(&cmd).await {
                Ok(_) => return Ok(()),
                Err(EngineError::Command { source, .. })
                    if source.to_string().contains("Unknown node")
                        && started.elapsed() < deadline =>
                {
                    sleep(POLL_INTERVAL).await;
                }
                Err(EngineError::Command { source, .. })
                    if source.to_string().contains("Unknown node") =>
                {
                    return Err(EngineError::Deadline {
                        node: self.addr.clone(),
                        command: describe(&cmd),
                        waited: started.elapsed(),
                        last: source.to_string(),
                    });
                }
                Err(other) => return Err(other),
            }
        }
    }

    pub async fn add_slots_range(&self, slots: &[SlotRange]) -> Result<()> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("ADDSLOTSRANGE");
        for range in slots {
            cmd.arg(range.start).arg(range.end);
        }
        let _: String = self.call(&cmd).await?;
        Ok(())
    }

    /// Forget `node_id` on this node (see [`forget_everywhere`]). A node that never heard of
    /// it (gossip had not reached it yet) has nothing to forget: that is success.
    pub async fn forget(&self, node_id: &str) -> Result<()> {
        match self
            .call::<String>(redis::cmd("CLUSTER").arg("FORGET").arg(node_id))
            .await
        {
            Err(EngineError::Command { source, .. })
                if source.to_string().contains("Unknown node") =>
            {
                Ok(())
            }
            other => other.map(|_| ()),
        }
    }

    /// Promote this replica in place of `primary` with the default `CLUSTER FAILOVER` (a clean
    /// handoff: the primary pauses writes until this replica has caught up), then poll both
    /// nodes until this one is primary and the old one its replica, or `deadline` passes; the
    /// error then says which side had not changed.
    pub async fn failover(&self, primary: &NodeClient, deadline: Duration) -> Result<()> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("FAILOVER");
        let _: String = self.call(&cmd).await?;
        self.await_promotion(&cmd, Some(primary), deadline).await
    }

    /// Promote this replica of a primary that has stopped for good with
    /// `CLUSTER FAILOVER TAKEOVER` (no handshake with the primary, no votes of the others), then
    /// poll until it reports itself primary, or `deadline` passes.
    pub async fn take_over(&self, deadline: Duration) -> Result<()> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("FAILOVER").arg("TAKEOVER");
        let _: String = self.call(&cmd).await?;
        self.await_promotion(&cmd, None, deadline).await
    }

    /// Polls until this node is primary and `old_primary`, if given, its replica; past
    /// `deadline` the error says what each side last reported.
    async fn await_promotion(
        &self,
        cmd: &redis::Cmd,
        old_primary: Option<&NodeClient>,
        deadline: Duration,
    ) -> Result<()> {
        let started = Instant::now();
        loop {
            let promoted = self.replication_info().await.map(|i| i.role);
            let demoted = match old_primary {
                Some(old) => Some(old.replication_info().await.map(|i| i.role)),
                None => None,
            };
            let done = matches!(promoted, Ok(Role::Primary))
                && demoted
                    .as_ref()
                    .is_none_or(|d| matches!(d, Ok(Role::Replica)));
            if done {
                return Ok(());
            }
            if started.elapsed() >= deadline {
                let mut last = format!("{} is {promoted:?}", self.addr);
                if let (Some(old), Some(demoted)) = (old_primary, &demoted) {
                    last.push_str(&format!(", old primary {} is {demoted:?}", old.addr));
                }
                return Err(EngineError::Deadline {
                    node: self.addr.clone(),
                    command: describe(cmd),
                    waited: started.elapsed(),
                    last,
                });
            }
            sleep(POLL_INTERVAL).await;
        }
    }

    pub async fn config_set(&self, key: &str, value: &str) -> Result<()> {
        let _: String = self
            .call(redis::cmd("CONFIG").arg("SET").arg(key).arg(value))
            .await?;
        Ok(())
    }

    /// `ACL SETUSER username rule...` (rules such as `on`, `#<sha256>`, `~pattern`, `+@read`).
    pub async fn acl_set_user(&self, username: &str, rules: &[String]) -> Result<()> {
        let _: String = self
            .call(redis::cmd("ACL").arg("SETUSER").arg(username).arg(rules))
            .await?;
        Ok(())
    }

    /// `ACL USERS`: every user name the node has.
    pub async fn acl_users(&self) -> Result<Vec<String>> {
        self.call(redis::cmd("ACL").arg("USERS")).await
    }

    /// `ACL DELUSER username`.
    pub async fn acl_del_user(&self, username: &str) -> Result<()> {
        let _: i64 = self
            .call(redis::cmd("ACL").arg("DELUSER").arg(username))
            .await?;
        Ok(())
    }
}

/// Forget `node_id` on every one of `remaining` (a node is only gone once all have forgotten
/// it; otherwise gossip reintroduces it). Returns the first error after trying them all.
pub async fn forget_everywhere(remaining: &[NodeClient], node_id: &str) -> Result<()> {
    let results = futures::future::join_all(remaining.iter().map(|n| n.forget(node_id))).await;
    results.into_iter().collect()
}

/// Commands sent to any node since the process started, by [`describe`] (a fixed few: only the
/// operator's own code builds commands, and no address or name is in the words).
static SENT: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

pub(crate) fn count_sent(command: &str) {
    let mut sent = SENT.lock().unwrap_or_else(|p| p.into_inner());
    match sent.get_mut(command) {
        Some(count) => *count += 1,
        None => {
            sent.insert(command.to_owned(), 1);
        }
    }
}

/// How many commands of each kind the process has sent to Valkey nodes (for the metrics).
pub fn commands_sent() -> Vec<(String, u64)> {
    let sent = SENT.lock().unwrap_or_else(|p| p.into_inner());
    sent.iter()
        .map(|(command, n)| (command.clone(), *n))
        .collect()
}

/// Commands whose second word names what they do (`CLUSTER NODES`, `INFO REPLICATION`).
const WITH_SUBCOMMANDS: [&str; 5] = ["CLUSTER", "CONFIG", "ACL", "CLIENT", "INFO"];

/// The command's name, and its subcommand where it has one: for error messages and the
/// metric's label (never a value, an address, a name or a password).
fn describe(cmd: &Cmd) -> String {
    let mut words = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).to_uppercase()),
        _ => None,
    });
    let Some(name) = words.next() else {
        return String::new();
    };
    match words.next() {
        Some(sub) if WITH_SUBCOMMANDS.contains(&name.as_str()) => format!("{name} {sub}"),
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_go_unfenced() {
        for read in [
            "PING",
            "INFO REPLICATION",
            "CLUSTER NODES",
            "CLUSTER MYID",
            "ACL USERS",
        ] {
            assert!(is_read(read), "{read}");
        }
        for write in [
            "CLUSTER FAILOVER",
            "CLUSTER MEET",
            "CLUSTER SETSLOT",
            "MIGRATE",
            "ACL SETUSER",
            "CONFIG SET",
            "SOMETHING NEW",
        ] {
            assert!(!is_read(write), "{write}");
        }
    }
}
