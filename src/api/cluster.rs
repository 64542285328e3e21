//! ValkeyCluster: a sharded Valkey cluster that a team asks for (namespaced).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::{CustomResource, KubeSchema, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A sharded Valkey cluster. Its image, resources and settings come from `configRef`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "valkey.gomomento.com",
    version = "v1alpha1",
    kind = "ValkeyCluster",
    namespaced,
    status = "ValkeyClusterStatus",
    shortname = "vkc",
    category = "valkey",
    doc = "A sharded Valkey cluster: shards, replicas per shard, and the ValkeyConfig it runs.",
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Config", type_ = "string", json_path = ".spec.configRef"),
    printcolumn(name = "Shards", type_ = "integer", json_path = ".spec.shards"),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".spec.replicasPerShard"
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(
        name = "Outdated",
        type_ = "integer",
        json_path = ".status.outdatedNodes"
    ),
    printcolumn(
        name = "Progress",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"Progressing\")].message"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[kube(validation = Rule::new(
    "oldSelf.hasValue() || (self.metadata.name.size() <= 50 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$'))"
).optional_old_self(true).message("metadata.name must be at most 50 lowercase letters, digits and '-', starting with a letter and ending with a letter or digit, so that every derived Service, Pod and label name is valid"))]
#[x_kube(validation = Rule::new(
    "self.shards * (1 + (has(self.replicasPerShard) ? self.replicasPerShard : 1)) <= 2000"
).message("spec.shards × (1 + spec.replicasPerShard) must be at most 2000 nodes"))]
#[x_kube(validation = Rule::new(
    "has(self.tls) == has(oldSelf.tls)"
).message("spec.tls is set at creation only and cannot be added or removed; create a new ValkeyCluster to change that. Only spec.tls.secretRef may change: the nodes roll onto the new Secret, whose ca.crt and the old one's must each trust the other's certificate"))]
#[serde(rename_all = "camelCase")]
pub struct ValkeyClusterSpec {
    /// Name of the ValkeyConfig this cluster runs.
    #[schemars(length(min = 1, max = 253))]
    pub config_ref: String,
    /// Number of shards (each owns a share of the 16384 slots).
    #[schemars(range(min = 1, max = 16384))]
    pub shards: i32,
    /// Replicas in each shard besides its primary.
    #[serde(default = "default_replicas_per_shard")]
    #[schemars(range(min = 0, max = 15))]
    pub replicas_per_shard: i32,
    /// Users and their permissions, applied live on every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub acl: Vec<AclUser>,
    /// TLS for clients, replication and the cluster bus: present or absent from creation on;
    /// `secretRef` may be repointed, and the nodes roll onto the new Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClusterTls>,
    /// Where the cluster's pods may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// Annotations put on every pod; keys under `valkey.gomomento.com/` are reserved.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new(
        "self.all(k, !k.startsWith('valkey.gomomento.com/'))"
    ).message("spec.podAnnotations keys under valkey.gomomento.com/ are reserved for the operator; use another prefix"))]
    #[x_kube(validation = Rule::new(
        "self.all(k, k.size() <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))"
    ).message("spec.podAnnotations keys must be valid annotation keys: an optional DNS subdomain prefix and '/', then at most 63 letters, digits, '-', '_' and '.'"))]
    #[schemars(extend("maxProperties" = 64))]
    pub pod_annotations: BTreeMap<String, String>,
    /// Who else may reach the client port (see [`ClusterNetwork`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ClusterNetwork>,
}

impl ValkeyClusterSpec {
    /// A cluster of `shards` shards of one primary and `replicas_per_shard` replicas each on
    /// config `config_ref`, with nothing else set: no users, no TLS, no placement.
    pub fn new(config_ref: &str, shards: i32, replicas_per_shard: i32) -> Self {
        Self {
            config_ref: config_ref.into(),
            shards,
            replicas_per_shard,
            acl: vec![],
            tls: None,
            placement: None,
            pod_annotations: BTreeMap::new(),
            network: None,
        }
    }
}

fn default_replicas_per_shard() -> i32 {
    1
}

/// One ACL user.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AclUser {
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._@-]+$"))]
    pub username: String,
    /// SHA-256 hashes of the user's passwords, as 64 lowercase hex digits.
    #[serde(default)]
    #[schemars(length(max = 8))]
    pub password_hashes: Vec<PasswordHash>,
    /// A password kept in a Secret of the cluster's namespace, hashed by the operator before it
    /// reaches Valkey; a change of the Secret is applied live. Valid beside `passwordHashes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub permissions: Vec<AclPermission>,
}

/// One key of a Secret in the cluster's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// A SHA-256 password hash: 64 lowercase hex digits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(transparent)]
pub struct PasswordHash(#[schemars(regex(pattern = r"^[0-9a-f]{64}$"))] pub String);

/// A role granted to a user on a set of key patterns.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AclPermission {
    /// Name of a ValkeyRole.
    #[schemars(length(min = 1, max = 253))]
    pub role_ref: String,
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub keys: Vec<KeyPermission>,
    /// Pub/Sub channel patterns the permission may use (none when left out); the same
    /// characters as a key pattern.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub channels: Vec<ChannelPattern>,
}

/// A glob over Pub/Sub channel names; no whitespace, quotes, parentheses or control characters.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(transparent)]
pub struct ChannelPattern(
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r#"^[^\x00-\x20\x7f"'()]+$"#)
    )]
    pub String,
);

/// Access to the keys matching one pattern.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyPermission {
    /// A glob over key names; no whitespace, quotes, parentheses or control characters,
    /// which Valkey's ACL parser would read as more rules.
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r#"^[^\x00-\x20\x7f"'()]+$"#)
    )]
    pub pattern: String,
    /// `readwrite` when left out, as Momento's operator has it.
    #[serde(default)]
    pub access: KeyAccess,
}

/// Read, write or both on a key pattern.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyAccess {
    Read,
    Write,
    #[default]
    Readwrite,
}

/// Client TLS; the Secret holds `tls.crt` and `tls.key`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTls {
    #[schemars(length(min = 1, max = 253))]
    pub secret_ref: String,
}

/// Placement of the cluster's pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Zones the pods must run in (a required node affinity on `topology.kubernetes.io/zone`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(
            length(min = 1, max = 63),
            regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
        )
    )]
    pub zones: Vec<String>,
    /// How strictly a shard's nodes are spread over zones; the operator's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_spread: Option<ZoneSpread>,
    /// Whether the operator moves the cluster's primaries apart, over zones and then Nodes,
    /// by planned switchovers once every node is up to date and answers (`Rebalance`, the
    /// default), or leaves them where failovers put them (`Disabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_spread: Option<PrimarySpreadPolicy>,
    /// Node labels the pods require (keys and values as Kubernetes labels).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    #[x_kube(validation = Rule::new(
        "self.all(k, k.size() <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && self[k].size() <= 63)"
    ).message("spec.placement.nodeSelector keys must be valid Kubernetes label keys, and values at most 63 characters"))]
    pub node_selector: BTreeMap<String, String>,
}

/// The cluster's NetworkPolicy: the bus port only from the cluster's own Pods; the client
/// port from Pods of the cluster's namespace, from the operator, and from `allowedClients`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    /// More clients of the client port, each as a NetworkPolicy peer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub allowed_clients: Vec<ClientPeer>,
}

/// Pods allowed to connect, by labels: Pods matching `podSelector` in the namespaces matching
/// `namespaceSelector` (the cluster's own namespace when unset); at least one is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<MatchLabels>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<MatchLabels>,
}

/// Labels an object must carry (`{}` matches every object).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatchLabels {
    #[serde(default)]
    #[schemars(extend("maxProperties" = 16))]
    pub match_labels: BTreeMap<String, String>,
}

/// Zone spreading of a shard's nodes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ZoneSpread {
    #[default]
    BestEffort,
    Required,
}

/// Whether a cluster's primaries are moved apart (see [`crate::roll::PrimarySpread`]). Not
/// `On`/`Off`: YAML reads those as booleans.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PrimarySpreadPolicy {
    #[default]
    Rebalance,
    Disabled,
}

/// What the operator observes of a cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyClusterStatus {
    /// `Creating` until the cluster is first whole (every slot served, every shard with its
    /// replicas), then `Active`, also during rolls; `Invalid` while its spec cannot be acted on
    /// (its TLS Secret unusable), `Creating` again once fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ClusterState>,
    /// What needs a person now, in a sentence (the `Degraded` condition's message, or why a user
    /// is not applied); absent when nothing does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The engine version(s) running, e.g. `9.0.0` or, mid-roll, `9.0.0,9.1.2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Nodes not yet on the desired revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outdated_nodes: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<ClusterNodeStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The revision every node should run; a node with another `spec.revision` is outdated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_revision: Option<String>,
    /// What the roll in progress must remember across steps and operator restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roll: Option<RollStatus>,
    /// Where the cluster stands in its fleet rollout, as the operator's gate decided in its
    /// last pass: `upToDate`, `rolling`, `queued`, `held`, `stalled` or `stuck`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutProgress>,
    /// The shape the operator lets the cluster have: its spec's, or, while growing to it would
    /// take its namespace past a ValkeyNamespacePolicy (counting the other clusters at their
    /// specs), the shape it had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<GrantedShape>,
}

/// A cluster's shards and the replicas of each.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantedShape {
    pub shards: i32,
    pub replicas_per_shard: i32,
}

/// The memory of a roll: the revision it rolls towards and the shards that already had their
/// one failover (recorded before the failover is issued, so it is never issued twice).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollStatus {
    pub revision: String,
    #[serde(default)]
    pub failed_over_shards: Vec<i32>,
    /// How many times each shard's failover was issued in this roll (a failover whose primary
    /// never changed is retried a bounded number of times); a shard in `failedOverShards`
    /// missing here was issued once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failover_attempts: Vec<FailoverAttempts>,
    /// The ValkeyNode each shard's failover in this roll was issued to: where the roll put its
    /// primary, which rebalancing leaves there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failover_targets: Vec<FailoverTarget>,
    /// The last switchover a person asked for (`valkey.gomomento.com/switchover`, as written)
    /// that was carried out: recorded before it is issued, so it is never issued twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub switchover: Option<String>,
}

/// The failover attempts of one shard in a roll.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverAttempts {
    pub shard: i32,
    pub attempts: i32,
}

/// The node a shard's failover in a roll was issued to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverTarget {
    pub shard: i32,
    #[schemars(length(max = 253))]
    pub node: String,
}

/// Where a cluster stands in its fleet rollout, as the operator's gate last saw it (the config's
/// counts in its `status.fleet` are made of the same words). Worst first.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum RolloutProgress {
    /// Stalled on the change itself (its new nodes never came up, a failover onto one never
    /// took effect): a rollout with a policy halts for it.
    Stalled,
    /// Stalled for a cause of its own (its nodes refuse the operator's login, a dead primary, a
    /// switchover its people asked for that cannot be done): it halts nobody and holds no place
    /// under the rollout's cap.
    Stuck,
    /// Started: some node runs the desired revision, some do not yet.
    Rolling,
    /// Outdated and not started: the rollout keeps it waiting (a cap, a wave, a pause, a halt,
    /// a maintenance window).
    Queued,
    /// Outdated, and held on its revision by a person: the rest of its rollout goes on.
    Held,
    /// Every node runs the desired revision.
    UpToDate,
}

impl RolloutProgress {
    /// The word `kubectl valkey fleet` prints.
    pub fn word(self) -> &'static str {
        match self {
            RolloutProgress::Stalled => "stalled",
            RolloutProgress::Stuck => "stuck",
            RolloutProgress::Rolling => "rolling",
            RolloutProgress::Queued => "queued",
            RolloutProgress::Held => "held",
            RolloutProgress::UpToDate => "up to date",
        }
    }
}

/// The cluster's lifecycle as users see it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ClusterState {
    Creating,
    Active,
    Invalid,
}

/// One shard of the cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardStatus {
    pub index: i32,
    /// The ValkeyNode currently primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
}

/// One node of the cluster, as listed in the cluster's status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNodeStatus {
    pub name: String,
    pub shard: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<super::NodeRole>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<super::NodeLifecycle>,
    pub version: String,
    /// Whether the node runs the desired revision.
    pub outdated: bool,
}

/// A person's hold of a cluster on its revision ([`ROLLOUT_HOLD`](super::annotations::ROLLOUT_HOLD)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// `"true"`, or a value that is not a time: until the annotation is removed.
    UntilReleased,
    /// Until this time.
    Until(Timestamp),
}

impl ValkeyCluster {
    /// The hold on this cluster's roll that counts at `now`: none without the annotation or
    /// once its time has passed. A value that is neither `"true"` nor an RFC 3339 time holds
    /// too (whoever wrote it meant to hold), until it is removed.
    pub fn rollout_hold(&self, now: Timestamp) -> Option<Hold> {
        let value = self
            .annotations()
            .get(super::annotations::ROLLOUT_HOLD)?
            .trim();
        match value.parse::<Timestamp>() {
            Ok(until) if until > now => Some(Hold::Until(until)),
            Ok(_) => None,
            Err(_) => Some(Hold::UntilReleased),
        }
    }
}

/// A switchover asked for by annotation ([`SWITCHOVER`](super::annotations::SWITCHOVER)), as
/// JSON: `{"shard": 1}` or `{"shard": 1, "to": "<ValkeyNode>"}`, with `requestedAt` (any
/// string) to tell a request from an earlier one that was the same.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SwitchoverRequest {
    pub shard: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<String>,
}

impl ValkeyCluster {
    /// The switchover asked for on this cluster, with the annotation's value (the request's
    /// identity), or why the value is not one.
    pub fn switchover_request(&self) -> Option<Result<(SwitchoverRequest, &str), String>> {
        let value = self.annotations().get(super::annotations::SWITCHOVER)?;
        Some(
            serde_json::from_str(value)
                .map(|request| (request, value.as_str()))
                .map_err(|error| {
                    format!(
                        "{}: {error}; expected JSON like {{\"shard\": 1}} or \
                         {{\"shard\": 1, \"to\": \"<ValkeyNode>\"}}",
                        super::annotations::SWITCHOVER
                    )
                }),
        )
    }
}

/// A namespaced cluster's identity: how the fleet index, the controller's memories and the
/// messages name a ValkeyCluster.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterKey {
    pub namespace: String,
    pub name: String,
}

impl ClusterKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// A ValkeyCluster's key: the one way to make it from the object.
    pub fn of(cluster: &ValkeyCluster) -> Self {
        let meta = &cluster.metadata;
        Self::new(
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }
}

impl fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod hold_tests {
    use super::*;

    #[test]
    fn a_hold_lasts_until_its_time_or_its_removal() {
        let now: Timestamp = "2026-12-04T12:00:00Z".parse().unwrap();
        let held = |value: Option<&str>| {
            let spec = ValkeyClusterSpec::new("standard", 1, 1);
            let mut cluster = ValkeyCluster::new("orders", spec);
            if let Some(value) = value {
                cluster.metadata.annotations = Some(BTreeMap::from([(
                    super::super::annotations::ROLLOUT_HOLD.to_string(),
                    value.to_string(),
                )]));
            }
            cluster.rollout_hold(now)
        };
        assert_eq!(held(None), None);
        assert_eq!(held(Some("true")), Some(Hold::UntilReleased));
        assert_eq!(held(Some("until friday")), Some(Hold::UntilReleased));
        let later: Timestamp = "2026-12-05T12:00:00Z".parse().unwrap();
        assert_eq!(held(Some("2026-12-05T12:00:00Z")), Some(Hold::Until(later)));
        assert_eq!(held(Some("2026-12-04T11:59:59Z")), None, "expired");
    }
}
