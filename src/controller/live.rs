//! Changes applied to running nodes in place, without a roll: the cluster's ACL users (with
//! their ValkeyRoles from the fleet index), on every pass, during rolls and stalls too; and the
//! Valkey settings `CONFIG SET` can change, once the cluster has converged. A new node also
//! gets the users before it becomes Active (see `crate::execute`).
//!
//! [`AppliedAcl`] remembers what each node was last given, so a pass writes a node's users only
//! when they changed (or the node is new): a converged cluster costs no ACL call.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use super::secrets::PasswordHashes;
use crate::acl::{self, AclError};
use crate::api::ValkeyCluster;
use crate::execute::Member;
use crate::execute::acl::{DesiredAcl, Refusal, apply_users};
use crate::fleet::{ClusterKey, Fleet};
use crate::roll::ObservedNode;
use crate::valkey::{NodeAddress, NodeClient};

/// The cluster's users as `ACL SETUSER` rules, and why each user that could not be built was
/// not (that user is left as it is on the nodes).
pub fn desired_acl(
    fleet: &RwLock<Fleet>,
    cluster: &ValkeyCluster,
    passwords: &PasswordHashes,
) -> (DesiredAcl, Vec<AclError>) {
    let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
    let mut desired = DesiredAcl::none();
    let mut problems = Vec::new();
    for user in &cluster.spec.acl {
        desired.keep.insert(user.username.clone());
        match acl::user_rules(user, |role| fleet.role(role), |s| passwords.get(s)) {
            Ok(rules) => desired.users.push((user.username.clone(), rules)),
            Err(problem) => problems.push(problem),
        }
    }
    (desired, problems)
}

/// A node's refusal of one of its users.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRefusal {
    pub node: String,
    pub refusal: Refusal,
}

/// What each node of each cluster was last given: its address (a new server at a new address
/// starts with no users) and a digest of the users.
#[derive(Debug, Default)]
pub struct AppliedAcl(Mutex<HashMap<ClusterKey, NodeDigests>>);

/// Per node name: the address it was written at and the digest of its users.
type NodeDigests = HashMap<String, (NodeAddress, u64)>;

impl AppliedAcl {
    fn is_current(&self, cluster: &ClusterKey, node: &str, at: NodeAddress, digest: u64) -> bool {
        let applied = self.0.lock().unwrap_or_else(|p| p.into_inner());
        applied
            .get(cluster)
            .and_then(|nodes| nodes.get(node))
            .is_some_and(|entry| *entry == (at, digest))
    }

    fn record(&self, cluster: &ClusterKey, node: &str, at: NodeAddress, digest: u64) {
        let mut applied = self.0.lock().unwrap_or_else(|p| p.into_inner());
        applied
            .entry(cluster.clone())
            .or_default()
            .insert(node.to_owned(), (at, digest));
    }

    /// Keeps only the cluster's current members (retired nodes are forgotten).
    fn keep_only(&self, cluster: &ClusterKey, members: &[Member]) {
        let mut applied = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(nodes) = applied.get_mut(cluster) {
            nodes.retain(|node, _| members.iter().any(|m| &m.name == node));
        }
    }

    /// A deleted cluster's nodes are forgotten.
    pub fn forget(&self, cluster: &ClusterKey) {
        let mut applied = self.0.lock().unwrap_or_else(|p| p.into_inner());
        applied.remove(cluster);
    }
}

fn digest(desired: &DesiredAcl) -> u64 {
    let mut hasher = DefaultHasher::new();
    for (user, rules) in &desired.users {
        user.hash(&mut hasher);
        acl::arguments(rules).hash(&mut hasher);
    }
    desired.keep.hash(&mut hasher);
    hasher.finish()
}

/// The reachable members (answered in this pass's observation) with their addresses.
fn reachable<'a>(
    members: &'a [Member],
    observed: &'a [ObservedNode],
) -> impl Iterator<Item = (&'a str, NodeAddress)> {
    observed.iter().filter(|o| o.reachable).filter_map(|node| {
        let member = members.iter().find(|m| m.name == node.name)?;
        Some((member.name.as_str(), member.address?))
    })
}

/// Writes `users` on every reachable node that does not have them yet; returns what the nodes
/// refused. A node that cannot be reached is tried again next pass.
pub async fn apply_acl(
    applied: &AppliedAcl,
    cluster: &ClusterKey,
    members: &[Member],
    observed: &[ObservedNode],
    users: &DesiredAcl,
    call_timeout: Duration,
) -> Vec<NodeRefusal> {
    applied.keep_only(cluster, members);
    let digest = digest(users);
    let mut refusals = Vec::new();
    for (node, address) in reachable(members, observed) {
        if applied.is_current(cluster, node, address, digest) {
            continue;
        }
        let written = match NodeClient::at(address, call_timeout).await {
            Ok(client) => apply_users(&client, users).await,
            Err(error) => Err(error),
        };
        match written {
            Ok(refused) if refused.is_empty() => applied.record(cluster, node, address, digest),
            Ok(refused) => refusals.extend(refused.into_iter().map(|refusal| NodeRefusal {
                node: node.to_owned(),
                refusal,
            })),
            Err(error) => tracing::warn!(%node, %error, "could not apply the ACL users"),
        }
    }
    refusals
}

/// Applies `settings` on every reachable node.
pub async fn apply_settings(
    members: &[Member],
    observed: &[ObservedNode],
    settings: &BTreeMap<String, String>,
    call_timeout: Duration,
) {
    for (node, address) in reachable(members, observed) {
        let client = match NodeClient::at(address, call_timeout).await {
            Ok(client) => client,
            Err(error) => {
                tracing::warn!(%node, %error, "could not reach a node to apply settings");
                continue;
            }
        };
        for (key, value) in settings {
            if let Err(error) = client.config_set(key, value).await {
                tracing::warn!(%node, %key, %error, "could not apply a setting live");
            }
        }
    }
}
