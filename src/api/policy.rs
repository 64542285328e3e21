//! ValkeyNamespacePolicy: what the platform allows the ValkeyClusters of some namespaces
//! (cluster-scoped, so a tenant with rights in its own namespace cannot loosen it). The rules
//! that apply it are [`crate::fleet::policy`]'s.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The configs a namespace's clusters may name, and how much each namespace may run.
#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "valkey.gomomento.com",
    version = "v1alpha1",
    kind = "ValkeyNamespacePolicy",
    shortname = "vkpolicy",
    category = "valkey",
    doc = "What the ValkeyClusters of the namespaces named may use (configs) and how much each of those namespaces may run (clusters, shards, nodes). Refused at admission, naming the policy; a cluster the controller finds past it before it has started is not created.",
    printcolumn(name = "Namespaces", type_ = "string", json_path = ".spec.namespaces"),
    printcolumn(name = "Configs", type_ = "string", json_path = ".spec.allowedConfigs"),
    printcolumn(
        name = "Max-Clusters",
        type_ = "integer",
        json_path = ".spec.maxClusters"
    ),
    printcolumn(name = "Max-Shards", type_ = "integer", json_path = ".spec.maxShards"),
    printcolumn(name = "Max-Nodes", type_ = "integer", json_path = ".spec.maxNodes"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyNamespacePolicySpec {
    /// The namespaces it governs, by name. Every cap holds for each namespace on its own, as a
    /// ResourceQuota does; where several policies name a namespace, each of them holds.
    #[schemars(length(min = 1, max = 256), inner(length(min = 1, max = 63)))]
    pub namespaces: Vec<String>,
    /// The only ValkeyConfigs a cluster of those namespaces may name in `spec.configRef`.
    /// Absent or empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 253)))]
    pub allowed_configs: Vec<String>,
    /// At most this many ValkeyClusters in each namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_clusters: Option<u32>,
    /// At most this many shards, all the namespace's clusters together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_shards: Option<u32>,
    /// At most this many Valkey nodes (shards × (1 + replicasPerShard)), all the namespace's
    /// clusters together. The extra node a roll surges for a moment is not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_nodes: Option<u32>,
}

impl ValkeyNamespacePolicySpec {
    /// Whether it governs `namespace`.
    pub fn governs(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|name| name == namespace)
    }
}
