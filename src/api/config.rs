//! ValkeyConfig: a named configuration profile (image, resources, Valkey settings) that may
//! inherit from another through `baseRef` (cluster-scoped).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A configuration profile. The effective config is the `baseRef` chain merged root first: a
/// child's field overrides its base's and `valkey` settings merge key by key.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "valkey.gomomento.com",
    version = "v1alpha1",
    kind = "ValkeyConfig",
    shortname = "vkcfg",
    category = "valkey",
    doc = "A named Valkey configuration profile: image, resources and settings, optionally inheriting from another config.",
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.imageRef"),
    printcolumn(name = "Base", type_ = "string", json_path = ".spec.baseRef"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyConfigSpec {
    /// Name of the ValkeyImage to run. Optional when a base config names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub image_ref: Option<String>,
    /// Name of another ValkeyConfig to inherit from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub base_ref: Option<String>,
    /// CPU and memory of each Valkey node (requests and limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<NodeResources>,
    /// Valkey settings, e.g. `maxmemory: "1500mb"`. Settings the operator owns are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 256))]
    pub valkey: BTreeMap<String, String>,
}

/// Resources of one Valkey node; each field overrides the base config's independently.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeResources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}
