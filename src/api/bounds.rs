//! How much a tenant may ask for, checked in three layers with the same numbers: the CRD schema
//! carries the hard limits below (so the API server refuses the worst before anyone sees it),
//! admission checks them again with messages that name the field and the limit, plus the
//! operator's lower [`Caps`], and the controller checks [`cluster_problems`] before it does
//! anything per shard, so a spec that slipped past both costs nothing.
//!
//! The checks, in order: the cluster's name (every derived name must stay valid), the shape
//! (shards, replicas, nodes), then each list's length and each entry's format.

use std::collections::BTreeMap;
use std::fmt;

use super::names;
use super::{
    AclUser, ClusterNetwork, Placement, ValkeyClusterSpec, ValkeyConfigSpec, ValkeyImageSpec,
    ValkeyRoleSpec,
};
use crate::acl;

/// Every shard owns at least one of Valkey's 16384 slots.
pub const MAX_SHARDS: i32 = 16384;
/// Replicas besides the primary; more only multiplies full syncs.
pub const MAX_REPLICAS_PER_SHARD: i32 = 15;
/// Nodes in one cluster: the largest cluster size Valkey 9 is tested at.
pub const MAX_NODES: i32 = 2000;
/// A node is named `<cluster>-<shard, up to 5 digits>-<5 hex>` and that name is also a label
/// value and a hostname (at most 63): 63 − 12 leaves 51; 50 keeps a round margin.
pub const MAX_CLUSTER_NAME: usize = 50;
/// Object names referenced from a spec (configs, roles, Secrets).
pub const MAX_REF: usize = names::MAX_SUBDOMAIN;
pub const MAX_ACL_USERS: usize = 64;
pub const MAX_USERNAME: usize = 128;
pub const MAX_PASSWORD_HASHES: usize = 8;
pub const MAX_PERMISSIONS: usize = 32;
pub const MAX_KEY_PATTERNS: usize = 64;
pub const MAX_KEY_PATTERN: usize = 256;
pub const MAX_CHANNELS: usize = 16;
pub const MAX_CHANNEL: usize = 128;
pub const MAX_ZONES: usize = 16;
pub const MAX_NODE_SELECTOR: usize = 32;
/// Peers in `spec.network.allowedClients`, and labels in one of their selectors.
pub const MAX_CLIENT_PEERS: usize = 16;
pub const MAX_SELECTOR_LABELS: usize = 16;
pub const MAX_POD_ANNOTATIONS: usize = 64;
/// Keys and values together; Kubernetes allows 256 KiB of annotations per object in all.
pub const MAX_POD_ANNOTATION_BYTES: usize = 64 * 1024;

/// Valkey settings in one config, and the length of one name and one value.
pub const MAX_SETTINGS: usize = 256;
pub const MAX_SETTING_NAME: usize = 64;
pub const MAX_SETTING_VALUE: usize = 4096;
/// Categories or commands in one role, and the length of one name.
pub const MAX_ROLE_ENTRIES: usize = 256;
pub const MAX_ROLE_NAME: usize = 64;
/// An image's repository (Docker's limit), tag (Docker's limit) and version.
pub const MAX_REPOSITORY: usize = 255;
pub const MAX_TAG: usize = 128;
pub const MAX_VERSION: usize = 64;

/// The operator's own, lower limits on new growth (ConfigMap `maxShards`,
/// `maxReplicasPerShard`); a cluster already above a lowered cap keeps its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub max_shards: i32,
    pub max_replicas_per_shard: i32,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            max_shards: 128,
            max_replicas_per_shard: 5,
        }
    }
}

/// One thing wrong with a spec: the field (as a user writes it) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Collects problems under field paths.
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            field: field.into(),
            message: message.into(),
        });
    }

    fn check(&mut self, field: impl Into<String>, result: Result<(), String>) {
        if let Err(message) = result {
            self.add(field, message);
        }
    }

    fn at_most(&mut self, field: &str, count: usize, limit: usize, what: &str) -> bool {
        if count > limit {
            self.add(
                field,
                format!("has {count} {what}; at most {limit} are allowed"),
            );
            return false;
        }
        true
    }

    /// Characters, as the schema's `maxLength` counts them.
    fn length(&mut self, field: impl Into<String>, value: &str, limit: usize) {
        let characters = value.chars().count();
        if characters > limit {
            self.add(
                field,
                format!("is {characters} characters long; at most {limit} are allowed"),
            );
        }
    }
}

/// Everything the hard limits and Kubernetes' name rules refuse in a cluster named `name`.
pub fn cluster_problems(name: &str, spec: &ValkeyClusterSpec) -> Vec<Problem> {
    let mut problems = Problems::default();
    check_name(name, &mut problems);
    check_shape(spec, &mut problems);
    check_refs(spec, &mut problems);
    check_acl(&spec.acl, &mut problems);
    if let Some(placement) = &spec.placement {
        check_placement(placement, &mut problems);
    }
    check_pod_annotations(spec, &mut problems);
    if let Some(network) = &spec.network {
        check_network(network, &mut problems);
    }
    problems.0
}

/// ACL text Valkey would not read as the rule it seems to be: key patterns with whitespace,
/// quotes or parentheses, and password hashes that are not 64 hex digits. Kept apart from
/// [`cluster_problems`] because the controller does not stop a cluster for them: it leaves
/// that user as it is and says so in `AclApplied` (see [`crate::acl`]).
pub fn acl_syntax_problems(users: &[AclUser]) -> Vec<Problem> {
    let mut problems = Problems::default();
    for (index, user) in users.iter().enumerate().take(MAX_ACL_USERS) {
        let at = format!("spec.acl[{index}]");
        for (h, hash) in user
            .password_hashes
            .iter()
            .enumerate()
            .take(MAX_PASSWORD_HASHES)
        {
            problems.check(
                format!("{at}.passwordHashes[{h}]"),
                acl::check_password_hash(&hash.0),
            );
        }
        for (granted, permission) in user.permissions.iter().enumerate().take(MAX_PERMISSIONS) {
            for (k, key) in permission.keys.iter().enumerate().take(MAX_KEY_PATTERNS) {
                problems.check(
                    format!("{at}.permissions[{granted}].keys[{k}].pattern"),
                    acl::check_key_pattern(&key.pattern),
                );
            }
            for (c, channel) in permission.channels.iter().enumerate().take(MAX_CHANNELS) {
                problems.check(
                    format!("{at}.permissions[{granted}].channels[{c}]"),
                    acl::check_channel_pattern(&channel.0),
                );
            }
        }
    }
    problems.0
}

/// What the bounds on the expanded ACL refuse (see [`acl::Cost`]): a user whose rules expand
/// past [`acl::MAX_USER_TOKENS`], or users whose rules together would write more than
/// [`acl::MAX_NODE_BYTES`] on each node. `role` gives what each role costs a permission.
pub fn acl_expansion_problems(
    users: &[AclUser],
    role: impl Fn(&str) -> Option<acl::Cost>,
) -> Vec<Problem> {
    let costs: Vec<acl::UserCost> = users.iter().map(acl::UserCost::of).collect();
    acl::cost_problems(&costs, role)
        .into_iter()
        .map(|(index, message)| Problem {
            field: match index {
                Some(index) => format!("spec.acl[{index}]"),
                None => "spec.acl".into(),
            },
            message,
        })
        .collect()
}

/// What the limits refuse in a ValkeyConfig: too many settings, or a value too long.
pub fn config_problems(spec: &ValkeyConfigSpec) -> Vec<Problem> {
    let mut problems = Problems::default();
    for (field, reference) in [
        ("spec.imageRef", &spec.image_ref),
        ("spec.baseRef", &spec.base_ref),
    ] {
        if let Some(reference) = reference {
            problems.check(field, names::dns1123_subdomain(reference));
        }
    }
    if let Some(rollout) = &spec.rollout {
        for (index, wave) in rollout.waves.iter().enumerate() {
            for (entry, cluster) in wave.clusters.iter().enumerate() {
                problems.check(
                    format!("spec.rollout.waves[{index}].clusters[{entry}]"),
                    wave_entry(cluster),
                );
            }
        }
    }
    if let Some(users) = &spec.acl {
        check_acl(users, &mut problems);
    }
    if problems.at_most("spec.valkey", spec.valkey.len(), MAX_SETTINGS, "settings") {
        for (name, value) in &spec.valkey {
            problems.length(
                format!("spec.valkey: the setting name {name:?}"),
                name,
                MAX_SETTING_NAME,
            );
            problems.length(format!("spec.valkey[{name:?}]"), value, MAX_SETTING_VALUE);
        }
    }
    problems.0
}

/// `namespace/name` or `namespace/*`.
fn wave_entry(entry: &str) -> Result<(), String> {
    let Some((namespace, name)) = entry.split_once('/') else {
        return Err(format!(
            "{entry:?} is not namespace/name (or namespace/* for every cluster of a namespace)"
        ));
    };
    names::dns1123_label(namespace).map_err(|problem| format!("the namespace {problem}"))?;
    if name == "*" {
        return Ok(());
    }
    names::dns1035_label(name).map_err(|problem| format!("the cluster name {problem}"))
}

/// A check of one name, saying why it is refused.
type NameCheck = fn(&str) -> Result<(), String>;

/// What the limits refuse in a ValkeyRole: too many entries, or a name too long or not a
/// plain category or command name.
pub fn role_problems(spec: &ValkeyRoleSpec) -> Vec<Problem> {
    let mut problems = Problems::default();
    let lists: [(&str, _, NameCheck); 2] = [
        ("spec.categories", &spec.categories, acl::check_category),
        ("spec.commands", &spec.commands, acl::check_command),
    ];
    for (field, entries, check) in lists {
        if problems.at_most(field, entries.len(), MAX_ROLE_ENTRIES, "entries") {
            for (index, entry) in entries.iter().enumerate() {
                let at = format!("{field}[{index}].name");
                problems.length(at.clone(), &entry.name, MAX_ROLE_NAME);
                problems.check(at, check(&entry.acl_name()));
            }
        }
    }
    problems.0
}

/// What the limits refuse in a ValkeyImage: a field too long.
pub fn image_problems(spec: &ValkeyImageSpec) -> Vec<Problem> {
    let mut problems = Problems::default();
    problems.length("spec.repository", &spec.repository, MAX_REPOSITORY);
    problems.length("spec.tag", &spec.tag, MAX_TAG);
    problems.length("spec.version", &spec.version, MAX_VERSION);
    problems.0
}

/// What the operator's [`Caps`] refuse: growth past a cap (a create, or an update that raises
/// the number); an unchanged or shrinking cluster above a lowered cap is left alone.
pub fn cap_problems(
    spec: &ValkeyClusterSpec,
    old: Option<&ValkeyClusterSpec>,
    caps: &Caps,
) -> Vec<Problem> {
    let mut problems = Problems::default();
    let grows = |new: i32, old: Option<i32>| old.is_none_or(|old| new > old);
    if spec.shards > caps.max_shards && grows(spec.shards, old.map(|o| o.shards)) {
        problems.add(
            "spec.shards",
            format!(
                "{} is above this operator's cap of {} shards (ConfigMap valkey-operator-config, maxShards)",
                spec.shards, caps.max_shards
            ),
        );
    }
    let replicas = spec.replicas_per_shard;
    if replicas > caps.max_replicas_per_shard && grows(replicas, old.map(|o| o.replicas_per_shard))
    {
        problems.add(
            "spec.replicasPerShard",
            format!(
                "{replicas} is above this operator's cap of {} replicas per shard (ConfigMap valkey-operator-config, maxReplicasPerShard)",
                caps.max_replicas_per_shard
            ),
        );
    }
    problems.0
}

fn check_name(name: &str, problems: &mut Problems) {
    let characters = name.chars().count();
    if characters > MAX_CLUSTER_NAME {
        problems.add(
            "metadata.name",
            format!(
                "is {characters} characters long; at most {MAX_CLUSTER_NAME} are allowed, so that every node's name (<cluster>-<shard>-<5 characters>) fits a 63-character label"
            ),
        );
        return;
    }
    problems.check(
        "metadata.name",
        names::dns1035_label(name)
            .map_err(|problem| format!("{problem} (it is also the name of the cluster's Service)")),
    );
}

fn check_shape(spec: &ValkeyClusterSpec, problems: &mut Problems) {
    if !(1..=MAX_SHARDS).contains(&spec.shards) {
        problems.add(
            "spec.shards",
            format!(
                "is {}; it must be 1 to {MAX_SHARDS} (each shard owns at least one of the 16384 slots)",
                spec.shards
            ),
        );
    }
    let replicas = spec.replicas_per_shard;
    if !(0..=MAX_REPLICAS_PER_SHARD).contains(&replicas) {
        problems.add(
            "spec.replicasPerShard",
            format!("is {replicas}; it must be 0 to {MAX_REPLICAS_PER_SHARD}"),
        );
    }
    let nodes = i64::from(spec.shards) * (1 + i64::from(replicas));
    if nodes > i64::from(MAX_NODES) {
        problems.add(
            "spec.shards",
            format!(
                "{} shards of {} nodes each make {nodes} nodes; a cluster has at most {MAX_NODES}",
                spec.shards,
                1 + i64::from(replicas)
            ),
        );
    }
}

fn check_refs(spec: &ValkeyClusterSpec, problems: &mut Problems) {
    problems.check("spec.configRef", names::dns1123_subdomain(&spec.config_ref));
    if let Some(tls) = &spec.tls {
        problems.check(
            "spec.tls.secretRef",
            names::dns1123_subdomain(&tls.secret_ref),
        );
    }
}

fn check_acl(users: &[AclUser], problems: &mut Problems) {
    if !problems.at_most("spec.acl", users.len(), MAX_ACL_USERS, "users") {
        return;
    }
    for (index, user) in users.iter().enumerate() {
        let at = format!("spec.acl[{index}]");
        problems.length(format!("{at}.username"), &user.username, MAX_USERNAME);
        problems.at_most(
            &format!("{at}.passwordHashes"),
            user.password_hashes.len(),
            MAX_PASSWORD_HASHES,
            "hashes",
        );
        if let Some(secret) = &user.password_secret_ref {
            problems.check(
                format!("{at}.passwordSecretRef.name"),
                names::dns1123_subdomain(&secret.name),
            );
            problems.check(
                format!("{at}.passwordSecretRef.key"),
                names::secret_key(&secret.key),
            );
        }
        if !problems.at_most(
            &format!("{at}.permissions"),
            user.permissions.len(),
            MAX_PERMISSIONS,
            "permissions",
        ) {
            continue;
        }
        for (granted, permission) in user.permissions.iter().enumerate() {
            let at = format!("{at}.permissions[{granted}]");
            problems.check(
                format!("{at}.roleRef"),
                names::dns1123_subdomain(&permission.role_ref),
            );
            if problems.at_most(
                &format!("{at}.channels"),
                permission.channels.len(),
                MAX_CHANNELS,
                "channel patterns",
            ) {
                for (c, channel) in permission.channels.iter().enumerate() {
                    problems.length(format!("{at}.channels[{c}]"), &channel.0, MAX_CHANNEL);
                }
            }
            if !problems.at_most(
                &format!("{at}.keys"),
                permission.keys.len(),
                MAX_KEY_PATTERNS,
                "key patterns",
            ) {
                continue;
            }
            for (k, key) in permission.keys.iter().enumerate() {
                problems.length(
                    format!("{at}.keys[{k}].pattern"),
                    &key.pattern,
                    MAX_KEY_PATTERN,
                );
            }
        }
    }
}

fn check_placement(placement: &Placement, problems: &mut Problems) {
    let zones = &placement.zones;
    if problems.at_most("spec.placement.zones", zones.len(), MAX_ZONES, "zones") {
        for (index, zone) in zones.iter().enumerate() {
            // A zone is a value of the `topology.kubernetes.io/zone` node label.
            let result = if zone.is_empty() {
                Err("must not be empty".to_string())
            } else {
                names::label_value(zone)
            };
            problems.check(format!("spec.placement.zones[{index}]"), result);
        }
    }
    check_labels(
        "spec.placement.nodeSelector",
        &placement.node_selector,
        MAX_NODE_SELECTOR,
        problems,
    );
}

/// Label keys and values as Kubernetes takes them, at most `limit` of them.
fn check_labels(
    field: &str,
    labels: &BTreeMap<String, String>,
    limit: usize,
    problems: &mut Problems,
) {
    if problems.at_most(field, labels.len(), limit, "entries") {
        for (key, value) in labels {
            problems.check(
                format!("{field}[{key:?}]"),
                names::qualified_name(key).map_err(|p| format!("the key {p}")),
            );
            problems.check(
                format!("{field}[{key:?}]"),
                names::label_value(value).map_err(|p| format!("the value {p}")),
            );
        }
    }
}

fn check_network(network: &ClusterNetwork, problems: &mut Problems) {
    let field = "spec.network.allowedClients";
    let peers = &network.allowed_clients;
    if !problems.at_most(field, peers.len(), MAX_CLIENT_PEERS, "peers") {
        return;
    }
    for (index, peer) in peers.iter().enumerate() {
        let at = format!("{field}[{index}]");
        if peer.namespace_selector.is_none() && peer.pod_selector.is_none() {
            problems.add(
                at.clone(),
                "set namespaceSelector, podSelector or both (`{}` matches everything)",
            );
        }
        for (name, selector) in [
            ("namespaceSelector", &peer.namespace_selector),
            ("podSelector", &peer.pod_selector),
        ] {
            if let Some(selector) = selector {
                let field = format!("{at}.{name}.matchLabels");
                check_labels(
                    &field,
                    &selector.match_labels,
                    MAX_SELECTOR_LABELS,
                    problems,
                );
            }
        }
    }
}

fn check_pod_annotations(spec: &ValkeyClusterSpec, problems: &mut Problems) {
    let annotations = &spec.pod_annotations;
    let field = "spec.podAnnotations";
    if !problems.at_most(field, annotations.len(), MAX_POD_ANNOTATIONS, "entries") {
        return;
    }
    for key in annotations.keys() {
        problems.check(
            format!("{field}[{key:?}]"),
            names::qualified_name(key).map_err(|p| format!("is not a valid annotation key: {p}")),
        );
    }
    let bytes: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_POD_ANNOTATION_BYTES {
        problems.add(
            field,
            format!(
                "holds {bytes} bytes of keys and values; at most {MAX_POD_ANNOTATION_BYTES} are allowed"
            ),
        );
    }
}

#[cfg(test)]
#[path = "bounds_tests.rs"]
mod tests;
