//! Reaching the node the operator means, not whatever answers at its address.
//!
//! A Pod's IP is the CNI's to hand out again once the Pod is gone, and a Pod's status keeps
//! showing it for a while after: an address says where a node *was*. So before the operator
//! sends a password to an address, and before it acts on what answers there, it checks who
//! answers ([`NodeClient::open`]):
//!
//! 1. It connects (over TLS where the cluster serves it: then the certificate already proves
//!    the server holds the cluster's key) and asks `CLUSTER MYID` *without* credentials.
//! 2. A node started with the operator's users answers `NOAUTH`: only then are credentials
//!    sent, the current login first and the other of a rotation only if that one is refused.
//!    A node that answers with an id has `default` open: if the node was started closed, or
//!    its recorded id is another, it is a stranger and gets no credentials at all. (A node
//!    made by an older operator, recorded with this very id, is let in as `default` while its
//!    users are being given to it.)
//! 3. Logged in, it asks `CLUSTER MYID` again: an id other than the recorded one is a
//!    stranger too (a node of the same cluster now at another node's old address).
//!
//! What this cannot tell apart: an impostor that answers `NOAUTH` to the probe without being
//! Valkey (a listener that wants the password) receives the first login. Against that only
//! TLS proves identity (`spec.tls`: the certificate is checked before anything is sent); the
//! operator also takes addresses only from a node's own Pod while its server runs, which
//! leaves such a listener the moments between a Pod's end and its status saying so.

use super::{Credentials, EngineError, NodeAddress, NodeClient, Reach, Result};

/// Who the operator expects at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected<'a> {
    pub address: NodeAddress,
    /// The node id recorded for the node, once it has answered once.
    pub id: Option<&'a str>,
    /// The node was started with the operator's users (its Pod mounts the credentials
    /// Secret): it never lets anyone in without credentials, so one that does is a stranger,
    /// and no login is ever replaced by none.
    pub closed: bool,
}

/// What the unauthenticated `CLUSTER MYID` said about the server at an address.
enum Probe {
    /// `NOAUTH` (or `NOPERM`): the server admits no one without credentials.
    Closed,
    /// `default` is open there, and this is its id.
    Open(String),
}

impl NodeClient {
    /// A connection to the node `expected` describes, logged in with the first of `reach`'s
    /// logins it takes, checked to be that node (see the module's steps); a stranger is
    /// [`EngineError::Stranger`] and has been sent no credentials unless it first refused
    /// access without them.
    pub async fn open(expected: &Expected<'_>, reach: &Reach) -> Result<Self> {
        let addr = expected.address.to_string();
        let mut client = Self::at_as(&addr, reach, None).await?;
        match client.probe().await? {
            Probe::Open(id) => {
                if expected.closed || expected.id.is_some_and(|recorded| recorded != id) {
                    return Err(client.stranger(expected, &id, "answers without credentials"));
                }
                // Made before the operator closed `default`: its users may be there already.
                // Only the node recorded with this very id is sent a password; one whose id
                // is not recorded yet is used as `default` until it is.
                if let Some(login) = reach.credentials.first()
                    && expected.id == Some(id.as_str())
                {
                    match client.auth(login).await {
                        Ok(()) => client.logged_in = true,
                        Err(error) if error.is_auth_refusal() => {}
                        Err(error) => return Err(error),
                    }
                }
            }
            Probe::Closed => client.log_in(&reach.credentials).await?,
        }
        let id = client.my_id().await?;
        if expected.id.is_some_and(|recorded| recorded != id) {
            return Err(client.stranger(expected, &id, "logged in"));
        }
        client.id = Some(id);
        Ok(client)
    }

    /// Like [`Self::open`], logged in with exactly `login` (the replication user, for
    /// `MIGRATE`), which must be taken.
    pub async fn open_as(
        expected: &Expected<'_>,
        reach: &Reach,
        login: &Credentials,
    ) -> Result<Self> {
        let only = Reach {
            credentials: vec![login.clone()],
            ..reach.clone()
        };
        let client = Self::open(expected, &only).await?;
        if !client.logged_in {
            // An older node, `default` still open, that does not have the user yet.
            return Err(EngineError::Reply {
                node: client.addr.clone(),
                command: "AUTH".into(),
                reply: format!("the node does not take the login {} yet", login.username),
            });
        }
        Ok(client)
    }

    /// The node id the connection was checked against, for one made by [`Self::open`].
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    async fn probe(&self) -> Result<Probe> {
        match self.my_id().await {
            Ok(id) => Ok(Probe::Open(id)),
            Err(EngineError::Command { source, .. })
                if matches!(source.code(), Some("NOAUTH" | "NOPERM")) =>
            {
                Ok(Probe::Closed)
            }
            Err(other) => Err(other),
        }
    }

    /// Logs in with the first of `logins` taken, trying the next only after a refusal.
    async fn log_in(&mut self, logins: &[Credentials]) -> Result<()> {
        let mut refused = None;
        for login in logins {
            match self.auth(login).await {
                Ok(()) => {
                    self.logged_in = true;
                    return Ok(());
                }
                Err(error) if error.is_auth_refusal() => refused = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(refused.unwrap_or_else(|| EngineError::Reply {
            node: self.addr.clone(),
            command: "AUTH".into(),
            reply: "the node admits no one without credentials, and none are known".into(),
        }))
    }

    async fn auth(&self, login: &Credentials) -> Result<()> {
        let mut cmd = redis::cmd("AUTH");
        cmd.arg(&login.username).arg(&login.password);
        let _: String = self.call(&cmd).await?;
        Ok(())
    }

    fn stranger(&self, expected: &Expected<'_>, found: &str, how: &str) -> EngineError {
        EngineError::Stranger {
            node: self.addr.clone(),
            expected: match expected.id {
                Some(id) => format!("node {id}"),
                None => "a node started with the operator's users".into(),
            },
            found: format!("node {found} ({how})"),
        }
    }
}
