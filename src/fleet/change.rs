//! What a config change does to a cluster resolving through it, decided once. Two halves of
//! one rule:
//! - [`RollingInputs`]: the config's share of a node's revision, what replaces the nodes when it
//!   changes (the image and its engine version, the resources, the settings Valkey reads only at
//!   start). The renderer folds it into each node's revision; the controller's gate compares the
//!   clusters of a rollout by its [`digest`](RollingInputs::digest).
//! - [`change`]: how a cluster moves from one resolution to another ([`Change`]): it rolls
//!   (because its rolling inputs differ), gets settings or users live, nothing, or its chain
//!   stops or starts resolving. Admission's warnings and `kubectl valkey plan` word it, each
//!   their own way; neither decides it.
//!
//! No I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::api::ClusterKey;
use crate::api::ValkeyConfigSpec;
use crate::api::setting_impact::needs_restart;
use crate::fleet::Fleet;
use crate::fleet::resolve::{self, EffectiveConfig, WithConfig};

/// The config's share of a node's revision: when any of these changes, the nodes are replaced.
/// Serialized into the revision in this field order: reordering or renaming a field changes
/// every node's revision, and an operator upgrade would roll the fleet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RollingInputs<'a> {
    pub image: String,
    pub version: &'a str,
    pub cpu: Option<&'a str>,
    pub memory: Option<&'a str>,
    pub restart_settings: BTreeMap<&'a str, &'a str>,
}

impl<'a> RollingInputs<'a> {
    pub fn of(effective: &'a EffectiveConfig) -> Self {
        let resources = &effective.resources;
        Self {
            image: effective.image.spec.reference(),
            version: &effective.image.spec.version,
            cpu: resources.cpu.as_ref().map(|q| q.0.as_str()),
            memory: resources.memory.as_ref().map(|q| q.0.as_str()),
            restart_settings: (effective.valkey.iter())
                .filter(|(name, _)| needs_restart(name))
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect(),
        }
    }

    /// A short digest: two resolutions roll their clusters onto the same nodes exactly when
    /// their digests are equal.
    pub fn digest(&self) -> String {
        digest_of(self)
    }
}

/// The first 6 bytes of the SHA-256 of `inputs` as JSON, in hex (a node's revision is one).
pub fn digest_of(inputs: &impl Serialize) -> String {
    // Serializing plain strings and maps cannot fail; an empty input still hashes.
    let encoded = serde_json::to_vec(inputs).unwrap_or_default();
    let digest = Sha256::digest(&encoded);
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// Why a cluster's nodes are replaced, in the order [`change`] checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RollReason {
    /// Another image, or the same one declaring another engine version.
    Image {
        from: String,
        to: String,
    },
    Resources,
    /// Settings Valkey reads only at start, changed, added or removed.
    StartOnly(Vec<String>),
}

/// What a change does to one cluster's nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// They are replaced, one shard at a time.
    Rolls(RollReason),
    /// Set on every node as it runs: settings by `CONFIG SET` and, when `users`, the config's
    /// users. A `removed` setting keeps its value until the nodes are replaced (the operator
    /// sets what a config names; it does not unset).
    Live {
        set: Vec<String>,
        removed: Vec<String>,
        users: bool,
    },
    Nothing,
    /// The chain stops resolving: the operator leaves the nodes as they are and the cluster
    /// waits (`ConfigUnresolved`) until it resolves again.
    StopsResolving,
    /// The chain resolves again: the cluster is brought onto what it resolves to, a roll if its
    /// nodes run anything else.
    ResolvesAgain,
}

impl Change {
    /// One word for a table's column.
    pub fn word(&self) -> &'static str {
        match self {
            Change::Rolls(_) => "rolls",
            Change::Live { .. } => "live",
            Change::Nothing => "nothing",
            Change::StopsResolving | Change::ResolvesAgain => "unresolved",
        }
    }
}

/// How a cluster moves from `before` to `after` (each `None` when its chain does not resolve).
pub fn change(before: Option<&EffectiveConfig>, after: Option<&EffectiveConfig>) -> Change {
    match (before, after) {
        (Some(before), Some(after)) => between(before, after),
        (Some(_), None) => Change::StopsResolving,
        (None, Some(_)) => Change::ResolvesAgain,
        (None, None) => Change::Nothing,
    }
}

/// The rule between two resolutions: rolling inputs first, then what is applied live.
fn between(before: &EffectiveConfig, after: &EffectiveConfig) -> Change {
    if let Some(reason) = roll_reason(before, after) {
        return Change::Rolls(reason);
    }
    let names: BTreeSet<&String> = before.valkey.keys().chain(after.valkey.keys()).collect();
    let (set, removed): (Vec<String>, Vec<String>) = names
        .into_iter()
        .filter(|name| before.valkey.get(*name) != after.valkey.get(*name))
        .cloned()
        .partition(|name| after.valkey.contains_key(name));
    let users = before.acl != after.acl;
    if set.is_empty() && removed.is_empty() && !users {
        return Change::Nothing;
    }
    Change::Live {
        set,
        removed,
        users,
    }
}

/// Why `before` and `after` put different nodes in place: exactly when their
/// [`RollingInputs`] differ.
fn roll_reason(before: &EffectiveConfig, after: &EffectiveConfig) -> Option<RollReason> {
    let (old, new) = (RollingInputs::of(before), RollingInputs::of(after));
    if old == new {
        return None;
    }
    if (&old.image, old.version) != (&new.image, new.version) {
        return Some(RollReason::Image {
            from: before.image.name.clone(),
            to: after.image.name.clone(),
        });
    }
    if (old.cpu, old.memory) != (new.cpu, new.memory) {
        return Some(RollReason::Resources);
    }
    let names: BTreeSet<&&str> = (old.restart_settings.keys())
        .chain(new.restart_settings.keys())
        .collect();
    let changed = names
        .into_iter()
        .filter(|name| old.restart_settings.get(*name) != new.restart_settings.get(*name))
        .map(|name| (*name).to_owned())
        .collect();
    Some(RollReason::StartOnly(changed))
}

/// Each cluster resolving through config `name` (by its chain as it is now), and what
/// `new_spec` in its place (`None`: the config deleted) does to it.
pub fn changes_through(
    fleet: &Fleet,
    name: &str,
    new_spec: Option<&ValkeyConfigSpec>,
) -> Vec<(ClusterKey, Change)> {
    let candidate = WithConfig {
        inner: fleet,
        name,
        spec: new_spec,
    };
    fleet
        .clusters_resolving_through(name)
        .into_iter()
        .filter_map(|cluster| {
            let config = fleet.cluster_config_ref(&cluster)?;
            let before = resolve::resolve(config, fleet).ok();
            let after = resolve::resolve(config, &candidate).ok();
            Some((cluster, change(before.as_ref(), after.as_ref())))
        })
        .collect()
}

impl fmt::Display for RollReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RollReason::Image { from, to } => write!(f, "image {from} → {to}"),
            RollReason::Resources => f.write_str("resources"),
            RollReason::StartOnly(names) => {
                write!(f, "{} only take effect at start", names.join(", "))
            }
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Rolls(why) => write!(f, "rolls ({why})"),
            Change::Live {
                set,
                removed,
                users,
            } => {
                let mut parts = Vec::new();
                if !set.is_empty() {
                    parts.push(format!("CONFIG SET {} live", set.join(", ")));
                }
                if *users {
                    parts.push("the config's users set live".to_owned());
                }
                if !removed.is_empty() {
                    parts.push(format!(
                        "{} removed: nodes keep the value until replaced",
                        removed.join(", ")
                    ));
                }
                f.write_str(&parts.join("; "))
            }
            Change::Nothing => f.write_str("nothing"),
            Change::StopsResolving => f.write_str(
                "its configRef stops resolving: its nodes are left as they are until it resolves again",
            ),
            Change::ResolvesAgain => f.write_str(
                "its configRef resolves again: it is brought onto it, a roll if its nodes run anything else",
            ),
        }
    }
}

#[cfg(test)]
#[path = "change_tests.rs"]
mod tests;
