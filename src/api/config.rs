//! ValkeyConfig: a named configuration profile (image, resources, Valkey settings) that may
//! inherit from another through `baseRef` (cluster-scoped).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::AclUser;

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
    status = "FleetStatus",
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.imageRef"),
    printcolumn(name = "Base", type_ = "string", json_path = ".spec.baseRef"),
    printcolumn(name = "Clusters", type_ = "integer", json_path = ".status.clusters"),
    printcolumn(name = "Up-to-date", type_ = "integer", json_path = ".status.upToDate"),
    printcolumn(name = "Rolling", type_ = "integer", json_path = ".status.rolling"),
    printcolumn(name = "Queued", type_ = "integer", json_path = ".status.queued"),
    printcolumn(name = "Stalled", type_ = "integer", json_path = ".status.stalled"),
    printcolumn(name = "Held", type_ = "integer", json_path = ".status.held"),
    printcolumn(name = "Rollout", type_ = "string", json_path = ".status.rollout"),
    printcolumn(
        name = "Next-Window",
        type_ = "string",
        json_path = ".status.nextWindow"
    ),
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
    /// How a change rolls the clusters resolving through this config (directly or through
    /// `baseRef`) that have no nearer config with a policy of its own. Unset: all at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutPolicy>,
    /// Platform-level users, on every cluster resolving through this config: a config's own
    /// list replaces its base's (leave it out to inherit; `[]` for none). Passwords by hash
    /// only (a config is in no namespace a Secret could be read from). A cluster's `spec.acl`
    /// adds users beside these and may not reuse their names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub acl: Option<Vec<AclUser>>,
}

/// A fleet rollout policy, the platform's: which clusters go first (`waves`), how many roll at
/// once; a wave starts once every earlier one is up to date, and a stall of the change itself
/// (its new nodes never come up, or a failover onto one never takes effect) halts the rollout
/// until it is fixed. A cluster stalled for a cause of its own halts nobody.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// At most this many clusters of the rollout rolling at once. Unset: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_concurrent: Option<u32>,
    /// The early waves, first to last, each naming its clusters; every other cluster is in the
    /// last wave, after them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub waves: Vec<RolloutWave>,
    /// Also place clusters by the `valkey.gomomento.com/rollout-wave` annotation their owners put
    /// on them (an integer, lowest first), after the waves above. Off (the default): a
    /// cluster's owner cannot make it lead a rollout.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_wave_annotation: bool,
    /// Who fails over an outdated primary in a roll: `Automatic` (the default), or
    /// `Supervised`: the roll surges the shard's up-to-date replicas, then waits for a person's
    /// switchover (`kubectl valkey switchover`, or the `valkey.gomomento.com/switchover`
    /// annotation).
    #[serde(default, skip_serializing_if = "PrimaryUpdatePolicy::is_automatic")]
    pub primary_update: PrimaryUpdatePolicy,
    /// When a cluster may start rolling (UTC): a roll starts only inside one of these windows, a
    /// shard in flight finishes; healing never waits. Unset: any time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub maintenance_windows: Vec<MaintenanceWindow>,
}

/// Who fails over an outdated primary in a roll.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PrimaryUpdatePolicy {
    #[default]
    Automatic,
    Supervised,
}

impl PrimaryUpdatePolicy {
    fn is_automatic(&self) -> bool {
        *self == PrimaryUpdatePolicy::Automatic
    }
}

/// A weekly maintenance window in UTC: it opens at `start` on each of `days` (every day when
/// empty) and stays open `durationMinutes`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// The days it opens on, `Mon` to `Sun`; empty: every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub days: Vec<Weekday>,
    /// When it opens, `HH:MM` in UTC.
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub start: String,
    /// How long it stays open, in minutes (at most a week).
    #[schemars(range(min = 1, max = 10080))]
    pub duration_minutes: u32,
}

/// A day of the week.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum Weekday {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

/// One early wave of a rollout.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutWave {
    /// Clusters as `namespace/name`, or `namespace/*` for every cluster of a namespace.
    #[schemars(length(min = 1, max = 256))]
    pub clusters: Vec<String>,
}

impl RolloutWave {
    /// Whether the wave names the cluster `name` of `namespace`.
    pub fn names(&self, namespace: &str, name: &str) -> bool {
        self.clusters
            .iter()
            .any(|entry| match entry.split_once('/') {
                Some((ns, "*")) => ns == namespace,
                Some((ns, n)) => ns == namespace && n == name,
                None => false,
            })
    }
}

/// How far a change has got across the clusters that resolve through a config (or run an
/// image): written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetStatus {
    /// Clusters resolving through it.
    pub clusters: u32,
    /// Of those, how many run their desired revision on every node.
    pub up_to_date: u32,
    /// Rolling now.
    pub rolling: u32,
    /// Outdated and waiting for their turn (a cap, a wave, a pause, a halt).
    pub queued: u32,
    /// Stalled: on the change itself (which halts a rollout with a policy), or for a cause of
    /// the cluster's own (which halts nobody).
    pub stalled: u32,
    /// Outdated and held on their revision by a person (`valkey.gomomento.com/rollout-hold`).
    #[serde(default)]
    pub held: u32,
    /// When the config's next maintenance window opens (RFC 3339), when its rollout policy has
    /// windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<String>,
    /// `Complete`, `Rolling`, `Paused`, `Halted`, or `Held` (every cluster up to date but the
    /// held ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
    /// `Halted`: True (reason `RollStalled`) while a cluster stalled on the change holds the
    /// rollout back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
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
