//! A cluster's ACL users as the executor writes them on a node: every user the spec names,
//! each whole in one `ACL SETUSER`, and every other user deleted but the reserved ones
//! ([`crate::acl::RESERVED_USERS`]). The rules are
//! built purely in [`crate::acl`]; this is the part that talks to a node. A user the node
//! refuses is reported, not fatal: the node's other users, and the roll, go on.

use std::collections::BTreeSet;
use std::fmt;

use crate::acl::{self, Rule, is_reserved};
use crate::valkey::{self, NodeClient};

/// The users a cluster's nodes should have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredAcl {
    /// Each user's name and its `ACL SETUSER` rules.
    pub users: Vec<(String, Vec<Rule>)>,
    /// Users the spec names, even those that could not be built (left as they are): every
    /// other user but `default` (which [`apply_users`] never deletes) is deleted.
    pub keep: BTreeSet<String>,
}

impl DesiredAcl {
    /// No users but `default` (a cluster whose spec names none).
    pub fn none() -> Self {
        Self::default()
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
    for (username, rules) in &desired.users {
        match client.acl_set_user(username, &acl::arguments(rules)).await {
            Ok(()) => {}
            Err(error) if error.is_refusal() => refused.push(Refusal {
                user: username.clone(),
                error: error.to_string(),
            }),
            Err(error) => return Err(error),
        }
    }
    for stale in client
        .acl_users()
        .await?
        .iter()
        .filter(|user| !desired.keep.contains(*user) && !is_reserved(user))
    {
        client.acl_del_user(stale).await?;
    }
    Ok(refused)
}
