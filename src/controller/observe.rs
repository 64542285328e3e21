//! Step 2 of a pass, observe: everything a pass reads from the API server, in one place. The
//! cluster's status as stored (its roll memory and conditions; from the watch only once it
//! shows the operator's last write, since the roll memory decides whether a shard may fail
//! over; read when the pass begins), its TLS trust, its ValkeyNodes and their Pods (from the
//! controller's cache once it holds the operator's own writes to them), its credentials Secret
//! and its users' password hashes; and the members the executor works with, mapped from those
//! objects.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::context::Context;
use super::error::Error;
use super::events::{ClusterEvent, publish};
use super::reconcile::{Halt, Pass};
use super::render::ClusterRender;
use super::secrets::PasswordHashes;
use super::status::Reason;
use super::{credentials, fence, secrets};
use crate::api::annotations;
use crate::api::{
    FailoverAttempts, NodeLifecycle, RollStatus, ValkeyCluster, ValkeyClusterStatus, ValkeyNode,
    labels,
};
use crate::credentials::secret_name;
use crate::execute::Member;
use crate::fleet::ClusterKey;
use crate::roll::{Lifecycle, RollMemory};
use crate::valkey::{NodeAddress, Reach};

/// What step 2 read, but the nodes (the host takes those).
pub struct Seen {
    /// How the operator reaches the nodes: the TLS trust, its logins, the leadership fence.
    pub reach: Reach,
    /// The version of the TLS certificate's Secret, for reloads.
    pub certificate: Option<String>,
    /// The credentials as the Secret holds them, and whether a rotation was asked for.
    pub login: credentials::Read,
    /// The users' passwords, hashed at once.
    pub passwords: PasswordHashes,
}

/// Reads the cluster's TLS trust, nodes and Pods, credentials and users' passwords; a TLS CA
/// that cannot be read or a credentials Secret that cannot be used stops the pass.
pub async fn observe(
    pass: &Pass<'_>,
    render: &ClusterRender<'_>,
) -> Result<(ClusterNodes, Seen), Halt> {
    let (ctx, cluster, namespace) = (pass.ctx, pass.cluster, &pass.namespace);
    let (mut reach, certificate) =
        secrets::reach(&ctx.client, namespace, cluster, ctx.timeouts.call)
            .await
            .map_err(|message| Halt::Waiting {
                reason: Reason::TlsUnavailable,
                message,
            })?;
    let nodes = read_nodes(ctx, cluster).await?;
    let secret = secret_name(&pass.key.name);
    let started_with_it = nodes.pods.values().any(|pod| pod.mounts(&secret));
    let login = match credentials::ensure(ctx, render, namespace, started_with_it).await {
        Ok(login) => login,
        Err(error @ (Error::NotOurs { .. } | Error::Credentials { .. })) => {
            let problem = error.to_string();
            if matches!(error, Error::NotOurs { .. }) {
                let event = ClusterEvent::NameConflict {
                    problem: problem.clone(),
                };
                publish(&ctx.recorder, cluster, &event).await;
            }
            let reason = Reason::CredentialsUnusable;
            return Err(Halt::Waiting {
                reason,
                message: problem,
            });
        }
        Err(error) => return Err(error.into()),
    };
    reach.credentials = login.credentials.logins();
    reach.fence = Some(fence::valkey_fence(&ctx.leadership));
    let passwords = secrets::read_password_hashes(&ctx.client, namespace, cluster).await;
    let seen = Seen {
        reach,
        certificate,
        login,
        passwords,
    };
    Ok((nodes, seen))
}

/// The cluster's status as stored, with the version it was read at.
pub struct StoredStatus {
    pub status: ValkeyClusterStatus,
    /// The ValkeyCluster's `resourceVersion`: the roll memory is only written over it.
    pub resource_version: Option<String>,
}

/// From the controller's cluster watch when it shows the operator's last write to the cluster
/// (see [`super::cluster_cache`]), else from the API server.
pub async fn read_status(ctx: &Context, cluster: &ValkeyCluster) -> Result<StoredStatus, Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let key = ClusterKey::new(namespace.clone(), cluster.name_any());
    if let Some(current) = ctx.memory.cluster_cache.current(&key) {
        return Ok(StoredStatus {
            resource_version: current.metadata.resource_version.clone(),
            status: current.status.clone().unwrap_or_default(),
        });
    }
    let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let stored = api.get_status(&cluster.name_any()).await?;
    let version = stored.metadata.resource_version.as_deref();
    ctx.memory.cluster_cache.read(&key, version);
    Ok(StoredStatus {
        resource_version: stored.metadata.resource_version.clone(),
        status: stored.status.unwrap_or_default(),
    })
}

/// A cluster's ValkeyNodes and their Pods (by name), as listed now.
pub struct ClusterNodes {
    pub objects: Vec<ValkeyNode>,
    pub pods: BTreeMap<String, PodView>,
}

/// What a pass reads of a Pod: whose it is, where it answers, whether it runs and stays, its
/// labels and annotations, and the Secrets it mounts. The controller's cache keeps this, not
/// the Pod (whose spec alone is several KiB: thousands of clusters' Pods would be most of its
/// memory).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodView {
    pub resource_version: Option<String>,
    /// The uid of its controller (the ValkeyNode it runs), from its ownerReferences.
    pub owner_uid: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// It has a `deletionTimestamp`.
    pub deleting: bool,
    pub phase: Option<String>,
    /// Its container is running now (`containerStatuses[].state.running`).
    pub running: bool,
    pub ip: Option<String>,
    /// The Secrets its volumes mount.
    pub secrets: Vec<String>,
}

impl PodView {
    /// Whether the Pod mounts the Secret `secret` (a Pod made by an older operator has no
    /// credentials Secret).
    pub fn mounts(&self, secret: &str) -> bool {
        self.secrets.iter().any(|name| name == secret)
    }
}

impl From<&Pod> for PodView {
    fn from(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
        let containers = status.and_then(|s| s.container_statuses.as_ref());
        let owner = pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true));
        Self {
            resource_version: pod.metadata.resource_version.clone(),
            owner_uid: owner.map(|o| o.uid.clone()),
            labels: pod.labels().clone(),
            annotations: pod.annotations().clone(),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            phase: status.and_then(|s| s.phase.clone()),
            running: containers.is_some_and(|all| {
                !all.is_empty()
                    && all
                        .iter()
                        .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            }),
            ip: status.and_then(|s| s.pod_ip.clone()),
            secrets: volumes
                .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
                .collect(),
        }
    }
}

/// From the controller's cache when it has every write of the operator's to them (see
/// [`super::node_cache`]), else listed.
pub async fn read_nodes(ctx: &Context, cluster: &ValkeyCluster) -> Result<ClusterNodes, Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let key = ClusterKey::new(namespace.clone(), cluster.name_any());
    let mut nodes = match ctx.memory.node_cache.fresh(&key) {
        Some(cached) => cached,
        None => {
            let listed = list_nodes(ctx, cluster, &namespace).await?;
            ctx.memory.node_cache.listed(&key, &listed);
            listed
        }
    };
    find_unlabelled_pods(ctx, &namespace, &mut nodes).await?;
    Ok(nodes)
}

/// Pods are listed and watched by their labels, which anyone who may edit Pods can change. A
/// node that ran and whose Pod the labels no longer find is asked for its Pod by name: if the
/// Pod of that name is still the one the node owns, the node is running (its labels are put
/// back by the membership step), not gone.
async fn find_unlabelled_pods(
    ctx: &Context,
    namespace: &str,
    nodes: &mut ClusterNodes,
) -> Result<(), Error> {
    let missing: Vec<String> = nodes
        .objects
        .iter()
        .filter(|n| n.status.as_ref().is_some_and(|s| s.node_id.is_some()))
        .map(ResourceExt::name_any)
        .filter(|name| !nodes.pods.contains_key(name))
        .collect();
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    for name in missing {
        if let Some(pod) = pods.get_opt(&name).await? {
            tracing::warn!(%namespace, pod = %name, "a node's Pod no longer carries its labels");
            nodes.pods.insert(name, PodView::from(&pod));
        }
    }
    Ok(())
}

async fn list_nodes(
    ctx: &Context,
    cluster: &ValkeyCluster,
    namespace: &str,
) -> Result<ClusterNodes, Error> {
    let selector =
        ListParams::default().labels(&format!("{}={}", labels::CLUSTER, cluster.name_any()));
    let objects = Api::<ValkeyNode>::namespaced(ctx.client.clone(), namespace)
        .list(&selector)
        .await?
        .items;
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .list(&selector)
        .await?
        .items
        .iter()
        .map(|p| (p.name_any(), PodView::from(p)))
        .collect();
    Ok(ClusterNodes { objects, pods })
}

impl ClusterNodes {
    /// The node's own Pod: the Pod of its name whose controller is this ValkeyNode (by uid,
    /// which no one can edit; labels only find it, and anyone who may edit Pods can change
    /// them). A Pod of that name someone else made is not it.
    pub fn pod_of(&self, node: &ValkeyNode) -> Option<&PodView> {
        let pod = self.pods.get(&node.name_any())?;
        let owned = match (&pod.owner_uid, &node.metadata.uid) {
            (Some(owner), Some(uid)) => owner == uid,
            // An object without a uid is only ever a test's.
            (_, None) => true,
            (None, Some(_)) => false,
        };
        owned.then_some(pod)
    }

    /// Where the node answers: its own Pod's IP while the Pod's server runs. A Pod that has
    /// stopped keeps its IP in its status, but the CNI may already have handed the IP on.
    pub fn address(&self, node: &ValkeyNode) -> Option<NodeAddress> {
        let pod = self.pod_of(node).filter(|p| p.running && !has_stopped(p))?;
        NodeAddress::of_pod_ip(pod.ip.as_deref()?)
    }

    /// The node's server has stopped for good: its Pod ran (the node recorded an id) and is
    /// gone, or its Pod has terminated (Pods are never restarted in place). An unreachable
    /// node whose Pod still runs may be partitioned or paused instead, and come back.
    fn terminated(&self, node: &ValkeyNode) -> bool {
        let ran = node.status.as_ref().is_some_and(|s| s.node_id.is_some());
        match self.pod_of(node) {
            None => ran,
            Some(pod) => has_stopped(pod),
        }
    }

    /// The node was started with the operator's users: its Pod mounts the cluster's
    /// credentials Secret (a Pod made by an operator before them does not).
    fn started_closed(&self, node: &ValkeyNode) -> bool {
        let secret = secret_name(&node.spec.cluster);
        self.pod_of(node)
            .is_some_and(|pod| pod.secrets.contains(&secret))
    }

    pub fn get(&self, name: &str) -> Option<&ValkeyNode> {
        self.objects.iter().find(|n| n.name_any() == name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut ValkeyNode> {
        self.objects.iter_mut().find(|n| n.name_any() == name)
    }

    /// The executor's members; a `Joining` node created before `now - join_timeout` is overdue.
    pub fn members(&self, now: Timestamp, join_timeout: Duration) -> Vec<Member> {
        let limit = SignedDuration::try_from(join_timeout).unwrap_or(SignedDuration::MAX);
        self.objects
            .iter()
            .map(|node| {
                let name = node.name_any();
                let lifecycle = lifecycle(node);
                let created = node.metadata.creation_timestamp.as_ref().map(|t| t.0);
                Member {
                    shard: u32::try_from(node.spec.shard).unwrap_or(0),
                    revision: node.spec.revision.clone(),
                    lifecycle,
                    join_overdue: lifecycle == Lifecycle::Joining
                        && created
                            .is_some_and(|c| c.saturating_add(limit).is_ok_and(|due| due < now)),
                    address: self.address(node),
                    id: node.status.as_ref().and_then(|s| s.node_id.clone()),
                    closed: self.started_closed(node),
                    replica_of: node.annotations().get(annotations::REPLICA_OF).cloned(),
                    handover_requested: node.handover_requested_at(now).is_some(),
                    terminated: self.terminated(node),
                    leaving: node.metadata.deletion_timestamp.is_some(),
                    name,
                }
            })
            .collect()
    }
}

/// The Pod's container has terminated and, since Valkey Pods are never restarted in place,
/// will not run again.
pub fn has_stopped(pod: &PodView) -> bool {
    matches!(pod.phase.as_deref(), Some("Failed" | "Succeeded"))
}

pub fn lifecycle(node: &ValkeyNode) -> Lifecycle {
    match node.status.as_ref().and_then(|s| s.lifecycle) {
        Some(NodeLifecycle::Active) => Lifecycle::Active,
        _ => Lifecycle::Joining,
    }
}

/// The planner's memory of the roll, from the stored status.
pub fn memory_of(status: &ValkeyClusterStatus) -> RollMemory {
    let roll = status.roll.clone().unwrap_or_default();
    let shard = |s: i32| u32::try_from(s).ok();
    let mut failover_attempts: BTreeMap<u32, u32> = roll
        .failed_over_shards
        .iter()
        .filter_map(|s| Some((shard(*s)?, 1)))
        .collect();
    for counted in &roll.failover_attempts {
        if let (Some(s), Ok(attempts)) = (shard(counted.shard), u32::try_from(counted.attempts)) {
            failover_attempts.insert(s, attempts);
        }
    }
    RollMemory {
        revision: roll.revision,
        failover_attempts,
        lost_joins: 0,
    }
}

/// The roll memory as the status stores it.
pub fn roll_status(memory: &RollMemory) -> RollStatus {
    let attempts = &memory.failover_attempts;
    RollStatus {
        revision: memory.revision.clone(),
        failed_over_shards: attempts
            .iter()
            .filter(|(_, n)| **n > 0)
            .filter_map(|(s, _)| i32::try_from(*s).ok())
            .collect(),
        failover_attempts: attempts
            .iter()
            .filter_map(|(s, n)| {
                Some(FailoverAttempts {
                    shard: i32::try_from(*s).ok()?,
                    attempts: i32::try_from(*n).ok()?,
                })
            })
            .collect(),
    }
}
