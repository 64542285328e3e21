//! What the controller sees of a cluster's nodes: its ValkeyNodes and a slim view of their
//! Pods, and the planner's memory as the cluster's status keeps it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use crate::api::annotations;
use crate::api::{
    FailoverAttempts, FailoverTarget, NodeLifecycle, RollStatus, ValkeyClusterStatus, ValkeyNode,
};
use crate::credentials::secret_name;
use crate::execute::Member;
use crate::roll::{Lifecycle, Location, RollMemory};
use crate::valkey::NodeAddress;
use crate::words::clip;

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
    /// Why its container does not run, as Kubernetes says it ([`why_not_started`]).
    pub not_started: Option<String>,
    /// The Kubernetes Node it was scheduled to (`spec.nodeName`).
    pub host: Option<String>,
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
            not_started: why_not_started(pod),
            host: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        }
    }
}

/// The longest account of why a Pod has not started that a status carries, in bytes.
const MAX_NOT_STARTED: usize = 300;

/// Kubernetes' words for why a Pod's server has not started, where they say something a
/// person can act on: not schedulable (the scheduler's message, "0/6 nodes are available: 6
/// Insufficient cpu"), or its container waiting for a reason other than being created (an image
/// not pulled, a container failing to start). `None` while it runs or is only being started.
pub fn why_not_started(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let unschedulable = (status.conditions.iter().flatten())
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| {
            let said = c.message.as_deref().or(c.reason.as_deref()).unwrap_or("");
            format!("not schedulable: {said}")
        });
    let waiting = (status.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .filter(|w| {
            w.reason
                .as_deref()
                .is_some_and(|r| r != "ContainerCreating")
        })
        .map(|w| {
            let reason = w.reason.as_deref().unwrap_or_default();
            match w.message.as_deref() {
                Some(message) if !message.is_empty() => format!("{reason}: {message}"),
                _ => reason.to_string(),
            }
        })
        .next();
    unschedulable
        .or(waiting)
        .map(|why| clip(why.trim().to_string(), MAX_NOT_STARTED))
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

    /// The node's Pod ran and was removed (it is gone, or being deleted), rather than its
    /// server failing (see [`crate::roll::ObservedNode::removed`]). A Pod being deleted counts
    /// even once its server has stopped: a real kubelet stops it (SIGTERM, the server exits)
    /// before the Pod is gone, and that stop is the deletion's, not the server's failure.
    fn removed(&self, node: &ValkeyNode) -> bool {
        let ran = node.status.as_ref().is_some_and(|s| s.node_id.is_some());
        match self.pod_of(node) {
            None => ran,
            Some(pod) => pod.deleting,
        }
    }

    /// Where the node's own Pod was scheduled, and that Node's zone.
    fn location(&self, node: &ValkeyNode, zone_of: impl Fn(&str) -> Option<String>) -> Location {
        let host = self.pod_of(node).and_then(|pod| pod.host.clone());
        Location {
            zone: host.as_deref().and_then(zone_of),
            host,
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
    /// `zone_of` names a Kubernetes Node's zone.
    pub fn members(
        &self,
        now: Timestamp,
        join_timeout: Duration,
        zone_of: impl Fn(&str) -> Option<String>,
    ) -> Vec<Member> {
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
                    removed: self.removed(node),
                    leaving: node.metadata.deletion_timestamp.is_some(),
                    not_started: self
                        .pod_of(node)
                        .filter(|pod| !pod.running)
                        .and_then(|pod| pod.not_started.clone()),
                    location: self.location(node, &zone_of),
                    silent: false,
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
        // A node being retired still serves until it is gone.
        Some(NodeLifecycle::Active | NodeLifecycle::Leaving) => Lifecycle::Active,
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
    let failover_targets = (roll.failover_targets.iter())
        .filter_map(|t| Some((shard(t.shard)?, t.node.clone())))
        .collect();
    RollMemory {
        revision: roll.revision,
        failover_attempts,
        failover_targets,
        lost_joins: 0,
        removed_joins: 0,
        switchover_done: roll.switchover,
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
        failover_targets: (memory.failover_targets.iter())
            .filter_map(|(s, node)| {
                Some(FailoverTarget {
                    shard: i32::try_from(*s).ok()?,
                    node: node.clone(),
                })
            })
            .collect(),
        switchover: memory.switchover_done.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status}))
            .unwrap_or_default()
    }

    #[test]
    fn a_pod_says_why_it_has_not_started_only_when_a_person_can_act() {
        let unschedulable = pod(serde_json::json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/6 nodes are available: 6 Insufficient cpu."}]}));
        assert_eq!(
            why_not_started(&unschedulable).as_deref(),
            Some("not schedulable: 0/6 nodes are available: 6 Insufficient cpu.")
        );
        let waiting = |reason: &str, message: &str| {
            pod(
                serde_json::json!({"phase": "Pending", "containerStatuses": [{
                "name": "valkey", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}]}),
            )
        };
        let pull = waiting(
            "ImagePullBackOff",
            "Back-off pulling image \"valkey/valkey:9.9\"",
        );
        assert_eq!(
            why_not_started(&pull).as_deref(),
            Some("ImagePullBackOff: Back-off pulling image \"valkey/valkey:9.9\"")
        );
        // Being created is not a problem yet; running is none at all.
        assert_eq!(why_not_started(&waiting("ContainerCreating", "")), None);
        let running = pod(
            serde_json::json!({"phase": "Running", "containerStatuses": [{
            "name": "valkey", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {}}}]}),
        );
        assert_eq!(why_not_started(&running), None);
        // A message of any length is clipped.
        let long = waiting("CreateContainerError", &"x".repeat(10_000));
        let said = why_not_started(&long).unwrap_or_default();
        assert!(
            said.len() <= MAX_NOT_STARTED && said.ends_with('…'),
            "{}",
            said.len()
        );
    }

    /// A joiner whose Pod a person deleted: a real kubelet stops its server first (phase
    /// `Succeeded` while the Pod is still being deleted). That is a removal, not a failure of
    /// the revision, before and after the stop, and once the Pod is gone.
    #[test]
    fn a_deleted_pods_stopped_server_is_removed_not_failed() {
        let spec = crate::api::ValkeyNodeSpec {
            cluster: "orders".into(),
            shard: 0,
            image: "valkey/valkey:9.1.2".into(),
            version: "9.1.2".into(),
            revision: "r2".into(),
        };
        let mut node = ValkeyNode::new("orders-0-a1b2c", spec);
        node.status = Some(crate::api::ValkeyNodeStatus {
            node_id: Some("abc".into()),
            ..Default::default()
        });
        let view = |pod: Option<PodView>| ClusterNodes {
            objects: vec![node.clone()],
            pods: pod
                .map(|pod| ("orders-0-a1b2c".to_string(), pod))
                .into_iter()
                .collect(),
        };
        let stopping = PodView {
            deleting: true,
            phase: Some("Running".into()),
            ..Default::default()
        };
        let stopped = PodView {
            phase: Some("Succeeded".into()),
            ..stopping.clone()
        };
        for pods in [view(Some(stopping)), view(Some(stopped)), view(None)] {
            assert!(pods.removed(&node), "{:?}", pods.pods);
        }
        // A server that stopped in a Pod nobody deleted failed.
        let failed = view(Some(PodView {
            phase: Some("Failed".into()),
            ..Default::default()
        }));
        assert!(failed.terminated(&node) && !failed.removed(&node));
    }
}
