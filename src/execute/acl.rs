//! A cluster's ACL users as the executor writes them on a node: first the operator's own
//! users and the replication login (`masteruser`/`masterauth`), then every user the spec names,
//! each whole in one `ACL SETUSER`, then every other user deleted but the reserved ones
//! ([`crate::acl::RESERVED_USERS`]), and `default` closed last, so nothing that still logs in as
//! `default` loses it before the users that replace it are there. The rules are
//! built purely in [`crate::acl`]; this is the part that talks to a node. A user the node
//! refuses is reported, not fatal: the node's other users, and the roll, go on.

use std::collections::BTreeSet;
use std::fmt;

use crate::acl::{self, DEFAULT_USER, Rule, is_reserved};
use crate::credentials::SystemUsers;
use crate::valkey::{self, NodeClient};

/// The users a cluster's nodes should have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredAcl {
    /// Each user's name and its `ACL SETUSER` rules.
    pub users: Vec<(String, Vec<Rule>)>,
    /// Users the spec names, even those that could not be built (left as they are): every
    /// other user but `default` (which [`apply_users`] never deletes) is deleted.
    pub keep: BTreeSet<String>,
    /// The operator's own users, the replication login and `default`.
    pub system: Option<SystemUsers>,
}

impl DesiredAcl {
    /// No users but `default` (a cluster whose spec names none).
    pub fn none() -> Self {
        Self::default()
    }

    /// The same users with `default` left as it is: for a pass in which some node still let
    /// the operator in only as `default` (a cluster made before the operator closed it), so
    /// no node closes before every node has the replication login.
    pub fn leaving_default_open(&self) -> Self {
        let mut open = self.clone();
        if let Some(system) = &mut open.system {
            system.default.clear();
        }
        open
    }
}

/// A user a node would not take, with the node's own words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub user: String,
    pub error: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user {}: {}", self.user, self.error)
    }
}

/// Writes the users on one node and deletes the ones the spec no longer names. Returns the
/// users the node refused; fails only when the node cannot be talked to.
pub async fn apply_users(
    client: &NodeClient,
    desired: &DesiredAcl,
) -> valkey::Result<Vec<Refusal>> {
    let mut refused = Vec::new();
    if let Some(system) = &desired.system {
        for (username, rules) in &system.users {
            set_user(client, username, rules, &mut refused).await?;
        }
        client
            .config_set("masteruser", &system.replication.username)
            .await?;
        client
            .config_set("masterauth", &system.replication.password)
            .await?;
    }
    for (username, rules) in &desired.users {
        set_user(client, username, rules, &mut refused).await?;
    }
    for stale in client
        .acl_users()
        .await?
        .iter()
        .filter(|user| !desired.keep.contains(*user) && !is_reserved(user))
    {
        client.acl_del_user(stale).await?;
    }
    if let Some(system) = desired.system.as_ref().filter(|s| !s.default.is_empty()) {
        set_user(client, DEFAULT_USER, &system.default, &mut refused).await?;
    }
    Ok(refused)
}

/// One `ACL SETUSER`; a refusal is noted, any other failure ends the node's write.
async fn set_user(
    client: &NodeClient,
    username: &str,
    rules: &[Rule],
    refused: &mut Vec<Refusal>,
) -> valkey::Result<()> {
    match client.acl_set_user(username, &acl::arguments(rules)).await {
        Ok(()) => Ok(()),
        Err(error) if error.is_refusal() => {
            refused.push(Refusal {
                user: username.to_owned(),
                error: error.to_string(),
            });
            Ok(())
        }
        Err(error) => Err(error),
    }
}
