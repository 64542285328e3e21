//! Changes applied to running nodes in place, without a roll: the Valkey settings `CONFIG SET`
//! can change, and the cluster's ACL users (with their ValkeyRoles from the fleet index). Both
//! are applied once the cluster has converged; a new node also gets the users before it becomes
//! Active (see `crate::execute`). A node that refuses is logged and tried again next pass.

use std::sync::RwLock;

use super::events::ClusterEvent;
use crate::acl;
use crate::api::ValkeyCluster;
use crate::execute::Member;
use crate::execute::acl::{DesiredAcl, apply_users};
use crate::fleet::Fleet;
use crate::roll::ObservedNode;
use crate::valkey::NodeClient;

/// The cluster's users as `ACL SETUSER` rules, and an event for each user that names a role
/// that does not exist (that user is left as it is).
pub fn desired_acl(
    fleet: &RwLock<Fleet>,
    cluster: &ValkeyCluster,
) -> (DesiredAcl, Vec<ClusterEvent>) {
    let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
    let mut desired = DesiredAcl::none();
    let mut problems = Vec::new();
    for user in &cluster.spec.acl {
        desired.keep.insert(user.username.clone());
        match acl::user_rules(user, |role| fleet.role(role)) {
            Ok(rules) => desired.users.push((user.username.clone(), rules)),
            Err(problem) => problems.push(ClusterEvent::AclRoleMissing { problem }),
        }
    }
    (desired, problems)
}

/// Clients of the members that answered in this pass's observation.
async fn reachable_clients(
    members: &[Member],
    observed: &[ObservedNode],
    call_timeout: std::time::Duration,
) -> Vec<(String, NodeClient)> {
    let mut clients = Vec::new();
    for node in observed.iter().filter(|o| o.reachable) {
        let address = members
            .iter()
            .find(|m| m.name == node.name)
            .and_then(|m| m.address);
        let Some(address) = address else {
            continue;
        };
        if let Ok(client) = NodeClient::at(address, call_timeout).await {
            clients.push((node.name.clone(), client));
        }
    }
    clients
}

/// Applies `settings` and `users` on every reachable node.
pub async fn apply(
    members: &[Member],
    observed: &[ObservedNode],
    settings: &std::collections::BTreeMap<String, String>,
    users: &DesiredAcl,
    call_timeout: std::time::Duration,
) {
    for (node, client) in reachable_clients(members, observed, call_timeout).await {
        for (key, value) in settings {
            if let Err(error) = client.config_set(key, value).await {
                tracing::warn!(%node, %key, %error, "could not apply a setting live");
            }
        }
        if let Err(error) = apply_users(&client, users).await {
            tracing::warn!(%node, %error, "could not apply the ACL users");
        }
    }
}
