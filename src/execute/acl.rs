//! A cluster's ACL users as the executor writes them on a node: every user the spec names,
//! each whole in one `ACL SETUSER`, and every other user but `default` deleted. The rules are
//! rendered purely in [`crate::acl`]; this is the part that talks to a node.

use std::collections::BTreeSet;

use crate::acl::DEFAULT_USER;
use crate::valkey::{self, NodeClient};

/// The users a cluster's nodes should have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredAcl {
    /// Each user's name and its `ACL SETUSER` rules.
    pub users: Vec<(String, Vec<String>)>,
    /// Users the spec names, even those that could not be rendered (left as they are): every
    /// other user but `default` (which [`apply_users`] never deletes) is deleted.
    pub keep: BTreeSet<String>,
}

impl DesiredAcl {
    /// No users but `default` (a cluster whose spec names none).
    pub fn none() -> Self {
        Self::default()
    }
}

/// Writes the users on one node and deletes the ones the spec no longer names.
pub async fn apply_users(client: &NodeClient, desired: &DesiredAcl) -> valkey::Result<()> {
    for (username, rules) in &desired.users {
        client.acl_set_user(username, rules).await?;
    }
    for stale in client
        .acl_users()
        .await?
        .iter()
        .filter(|user| !desired.keep.contains(*user) && user.as_str() != DEFAULT_USER)
    {
        client.acl_del_user(stale).await?;
    }
    Ok(())
}
