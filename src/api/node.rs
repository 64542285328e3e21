//! ValkeyNode: one Valkey server of a cluster, created and owned by the operator (namespaced).

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{CustomResource, KubeSchema, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::annotations::{HANDOVER_REQUESTED, HANDOVER_WINDOW};

/// One Valkey server, named after its cluster and shard. Never created by users.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "valkey.gomomento.com",
    version = "v1alpha1",
    kind = "ValkeyNode",
    namespaced,
    status = "ValkeyNodeStatus",
    shortname = "vkn",
    category = "valkey",
    doc = "One Valkey server of a ValkeyCluster; created, owned and retired by the operator.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.cluster"),
    printcolumn(name = "Shard", type_ = "integer", json_path = ".spec.shard"),
    printcolumn(name = "Role", type_ = "string", json_path = ".status.role"),
    printcolumn(name = "Lifecycle", type_ = "string", json_path = ".status.lifecycle"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(
        name = "Address",
        type_ = "string",
        priority = 1,
        json_path = ".status.address"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self == oldSelf").message(
    "spec is immutable: a ValkeyNode runs what it was created with; the operator replaces nodes instead of changing them"
))]
#[serde(rename_all = "camelCase")]
pub struct ValkeyNodeSpec {
    /// The ValkeyCluster this node belongs to.
    #[schemars(length(min = 1))]
    pub cluster: String,
    /// The shard index, from 0.
    #[schemars(range(min = 0, max = 16383))]
    pub shard: i32,
    /// The container image, `repository:tag`.
    #[schemars(length(min = 1))]
    pub image: String,
    /// The engine version of the image.
    #[schemars(length(min = 1))]
    pub version: String,
    /// Hash of everything in the effective config that forces a replacement; a node whose
    /// revision differs from the cluster's desired one is outdated.
    #[schemars(length(min = 1))]
    pub revision: String,
}

/// What the operator observes of a node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyNodeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<NodeLifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<NodeRole>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// The pod IP the node announces to the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The Valkey cluster node id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
}

/// `Joining` when created, `Active` once it is a synced member of its shard, `Leaving` when the
/// operator retires it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NodeLifecycle {
    Joining,
    Active,
    Leaving,
}

/// How a node joined its cluster, on its ValkeyNode as [`labels::JOIN_TYPE`](super::labels::JOIN_TYPE)
/// (Momento's label). A cluster's first nodes have none.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum JoinType {
    /// A new replica of a shard (a roll's replacement, a scale-up, a heal).
    Replica,
    /// The new primary of a shard that had slots and lost every node.
    Primary,
    /// The first node of a shard added by a scale-out; the label goes once it is `Active`.
    Shard,
}

impl JoinType {
    /// The label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            JoinType::Replica => "replica",
            JoinType::Primary => "primary",
            JoinType::Shard => "shard",
        }
    }
}

/// The node's role in its shard.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeRole {
    Primary,
    Replica,
}

impl ValkeyNode {
    /// When a handover of this node's shard was asked for ([`HANDOVER_REQUESTED`]), if that
    /// request still counts at `now` (within [`HANDOVER_WINDOW`]), judged on the operator's
    /// clock: a time ahead of `now` counts as `now` (the controller writes it back as `now`,
    /// see [`Self::handover_time_ahead`], so a request dated in the future still expires). An
    /// unreadable value is no request: it is not the webhook's.
    pub fn handover_requested_at(&self, now: Timestamp) -> Option<Timestamp> {
        let window = SignedDuration::try_from(HANDOVER_WINDOW).unwrap_or(SignedDuration::MAX);
        self.handover_annotation()
            .map(|at| at.min(now))
            .filter(|at| at.checked_add(window).is_ok_and(|until| until >= now))
    }

    /// Whether the handover request's time lies ahead of `now` (a clock apart, or a hand-made
    /// value): such a request would never expire.
    pub fn handover_time_ahead(&self, now: Timestamp) -> bool {
        self.handover_annotation().is_some_and(|at| at > now)
    }

    fn handover_annotation(&self) -> Option<Timestamp> {
        self.annotations()
            .get(HANDOVER_REQUESTED)
            .and_then(|value| value.parse::<Timestamp>().ok())
    }
}
