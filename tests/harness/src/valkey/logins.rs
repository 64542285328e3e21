//! Who the tests log in to a node as, now that the operator's nodes admit no client without
//! credentials: for reads an application would not do (`CLUSTER NODES`, `ACL LIST`, `INFO`),
//! the operator's own user, its password read from each cluster's credentials Secret
//! ([`learn_admin`], done by `Product::addresses`); for the data the writer writes, a tenant
//! user the harness adds to a cluster like any application would ([`WRITER_USER`]).
//!
//! Nodes started by the tests themselves (no operator) have no users: with nothing learnt,
//! every connection is made without credentials, as before.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use valkey_operator::credentials::Credentials;
use valkey_operator::valkey::NodeClient;

/// The tenant user the harness's writer logs in as, and its ValkeyRole.
pub const WRITER_USER: &str = "harness-writer";

/// The writer's password: this run's own (see [`super::RUN`]), so the writer cannot log in to
/// another test's cluster at an address recycled between them.
pub fn writer_password() -> String {
    format!("harness writer of run {}", *super::RUN)
}

/// Operator logins learnt so far (most recent first), and which one each address took last.
#[derive(Default)]
struct Learnt(Vec<Credentials>, HashMap<String, Credentials>);

static ADMIN: LazyLock<Mutex<Learnt>> = LazyLock::new(Default::default);
/// Whether the writer's user was added to the clusters of this test.
static WRITER: Mutex<bool> = Mutex::new(false);

/// Remembers an operator login (its password from a cluster's credentials Secret).
pub fn learn_admin(credentials: Credentials) {
    let mut admin = ADMIN.lock().unwrap_or_else(|p| p.into_inner());
    admin.0.retain(|known| *known != credentials);
    admin.0.insert(0, credentials);
}

/// Says the clusters of this test have the writer's user.
pub fn writer_granted() {
    *WRITER.lock().unwrap_or_else(|p| p.into_inner()) = true;
}

/// The login the writer uses, if the clusters have its user.
pub fn writer_login() -> Option<Credentials> {
    WRITER
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .then(|| Credentials {
            username: WRITER_USER.into(),
            password: writer_password(),
        })
}

/// `redis://` URL of `address` with `login` in it (percent-encoding what a URL would misread).
pub fn url(address: &str, login: Option<&Credentials>) -> String {
    match login {
        None => format!("redis://{address}/"),
        Some(c) => format!(
            "redis://{}:{}@{address}/",
            encode(&c.username),
            encode(&c.password)
        ),
    }
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What a client without credentials gets for `command` on the node at `address`: `answered …`
/// or Valkey's error, upper-cased as Valkey spells it (`NOAUTH`, `NOPERM`; the client spells
/// its error kinds `NoAuth`, `NoPerm`).
pub async fn anonymous_reply(address: &str, command: &[&str]) -> String {
    let mut conn = redis::Client::open(url(address, None))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let reply: redis::RedisResult<redis::Value> = redis::cmd(command[0])
        .arg(&command[1..])
        .query_async(&mut conn)
        .await;
    match reply {
        Ok(value) => format!("answered {value:?}"),
        Err(error) => error.to_string().to_uppercase(),
    }
}

/// A connection to one node as the operator's user (the login that worked there last, then
/// every one learnt), or without credentials when none is learnt or none is taken.
pub async fn admin(
    address: &str,
    call_timeout: Duration,
) -> valkey_operator::valkey::Result<NodeClient> {
    let login = admin_login(address, call_timeout).await?;
    NodeClient::connect_as(address, call_timeout, login.as_ref()).await
}

/// The operator login `address` takes, or `None` when it takes none learnt (a node the test
/// started itself, which has no users). Like the operator, it asks who answers before it sends
/// a password: a server that answers without credentials gets none (the operator's nodes never
/// do; a stranger at a recycled Pod IP does, and must never see the operator's password, from
/// the operator or from the tests).
pub async fn admin_login(
    address: &str,
    call_timeout: Duration,
) -> valkey_operator::valkey::Result<Option<Credentials>> {
    let (known, last) = {
        let admin = ADMIN.lock().unwrap_or_else(|p| p.into_inner());
        (admin.0.clone(), admin.1.get(address).cloned())
    };
    if known.is_empty() {
        return Ok(None);
    }
    let anonymous = NodeClient::connect(address, call_timeout).await?;
    if anonymous.my_id().await.is_ok() {
        return Ok(None);
    }
    let mut tries: Vec<Credentials> = last.clone().into_iter().collect();
    tries.extend(known.into_iter().filter(|k| Some(k) != last.as_ref()));
    for credentials in tries {
        match NodeClient::connect_as(address, call_timeout, Some(&credentials)).await {
            Ok(_) => {
                let mut admin = ADMIN.lock().unwrap_or_else(|p| p.into_inner());
                admin.1.insert(address.to_owned(), credentials.clone());
                return Ok(Some(credentials));
            }
            Err(error) if error.is_auth_refusal() => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(None)
}
