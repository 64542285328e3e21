//! ValkeyImage: one entry of the menu of approved engine images (cluster-scoped).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An approved Valkey engine image. Configs point at images by name; an image that a config
/// references cannot change or be deleted (register a new one and repoint the config instead).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "valkey.gomomento.com",
    version = "v1alpha1",
    kind = "ValkeyImage",
    shortname = "vki",
    category = "valkey",
    doc = "An approved Valkey engine image (repository, tag and the engine version it runs).",
    status = "crate::api::FleetStatus",
    printcolumn(name = "Repository", type_ = "string", json_path = ".spec.repository"),
    printcolumn(name = "Tag", type_ = "string", json_path = ".spec.tag"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Clusters", type_ = "integer", json_path = ".status.clusters"),
    printcolumn(name = "Up-to-date", type_ = "integer", json_path = ".status.upToDate"),
    printcolumn(name = "Rolling", type_ = "integer", json_path = ".status.rolling"),
    printcolumn(name = "Queued", type_ = "integer", json_path = ".status.queued"),
    printcolumn(name = "Stalled", type_ = "integer", json_path = ".status.stalled"),
    printcolumn(name = "Rollout", type_ = "string", json_path = ".status.rollout"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyImageSpec {
    /// Container image repository, e.g. `valkey/valkey`.
    #[schemars(length(min = 1, max = 255))]
    pub repository: String,
    /// Container image tag, e.g. `"9.0.1"`.
    #[schemars(length(min = 1, max = 128))]
    pub tag: String,
    /// The engine version this image runs, `MAJOR.MINOR.PATCH`; at least 9.0.0.
    #[schemars(length(min = 1, max = 64))]
    pub version: String,
}

impl ValkeyImageSpec {
    /// The image reference a Pod runs, `repository:tag`.
    pub fn reference(&self) -> String {
        format!("{}:{}", self.repository, self.tag)
    }
}
