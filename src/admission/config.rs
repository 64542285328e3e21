//! ValkeyConfig admission: operator-owned settings, `baseRef` cycles and depth, the version
//! floor of the effective image (of this config and of every config inheriting from it), advice
//! on its effective replication settings (`crate::api::write_bound`), the fleet-wide roll
//! warning, and no deletion while something uses the config.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::core::admission::Operation;

use super::effects::warn_changes;
use super::impact::{config_image_change, judge_config_change, pacing};
use super::users::check_users;
use super::version::check_floor;
use super::{Policy, Review, Verdict, clip, plural, some_of};
use crate::api::bounds::acl_syntax_problems;
use crate::api::bounds::config_problems;
use crate::api::setting_impact::is_operator_owned;
use crate::api::write_bound;
use crate::api::{ValkeyConfig, ValkeyConfigSpec, annotations};
use crate::fleet::Fleet;
use crate::fleet::change::changes_through;
use crate::fleet::resolve::{self, ResolveError, WithConfig};

fn is_setting_name(setting: &str) -> bool {
    !setting.is_empty()
        && setting
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

pub fn validate_config(review: &Review<ValkeyConfig>, fleet: &Fleet, policy: &Policy) -> Verdict {
    let mut verdict = Verdict::default();
    match review.operation {
        Operation::Create | Operation::Update => match review.object {
            Some(config) => validate_spec(review, config, fleet, policy, &mut verdict),
            None => verdict.deny("the request carries no ValkeyConfig object"),
        },
        Operation::Delete => validate_delete(review.name, fleet, &mut verdict),
        Operation::Connect => {}
    }
    verdict
}

/// A created or updated config: its settings, then every chain through it, then what the change
/// does to the fleet (only once nothing was refused).
fn validate_spec(
    review: &Review<ValkeyConfig>,
    config: &ValkeyConfig,
    fleet: &Fleet,
    policy: &Policy,
    verdict: &mut Verdict,
) {
    let name = review.name;
    let problems = config_problems(&config.spec);
    if !problems.is_empty() {
        problems.iter().for_each(|p| verdict.deny(p.to_string()));
        return;
    }
    check_setting_names(&config.spec, verdict);
    check_platform_users(&config.spec, fleet, verdict);
    if !check_chains(name, &config.spec, fleet, verdict) {
        return;
    }
    match review.operation {
        Operation::Update => {
            judge_image_change(config, name, fleet, policy, review.now, verdict);
            let changes = changes_through(fleet, name, Some(&config.spec));
            warn_changes(&changes, fleet, (name, &config.spec), verdict);
        }
        Operation::Create => warn_waiting_clusters(name, fleet, verdict),
        _ => {}
    }
}

/// The platform's users as every `spec.acl` is checked, by password hash only: a config is in
/// no namespace, so there is no Secret a `passwordSecretRef` could name.
fn check_platform_users(spec: &ValkeyConfigSpec, fleet: &Fleet, verdict: &mut Verdict) {
    let Some(users) = &spec.acl else {
        return;
    };
    for problem in acl_syntax_problems(users) {
        verdict.deny(problem.to_string());
    }
    check_users(users, fleet, verdict);
    for (index, user) in users.iter().enumerate() {
        if user.password_secret_ref.is_some() {
            verdict.deny(format!(
                "spec.acl[{index}].passwordSecretRef: a ValkeyConfig's users take passwordHashes only (a config belongs to no namespace a Secret could be read from); put the user in each cluster's spec.acl to use a Secret"
            ));
        } else if !user.password_hashes.is_empty() {
            verdict.warn(shared_password_warning(index, &user.username));
        }
    }
}

/// What a config user with `passwordHashes` is told: its one password opens every cluster of
/// the config (see `crate::controller::pass::issued` for the alternative).
pub fn shared_password_warning(index: usize, username: &str) -> String {
    format!(
        "spec.acl[{index}]: {username}'s passwordHashes open every cluster of this config, so a team that captures the password on its own cluster reaches every other; leave passwordHashes empty to have the operator issue {username} a password per cluster (Secret <namespace>.<cluster>.issued in the operator's namespace)"
    )
}

/// `spec.valkey` names neither operator-owned settings nor anything that is not a setting name.
fn check_setting_names(spec: &ValkeyConfigSpec, verdict: &mut Verdict) {
    let owned: Vec<&str> = spec
        .valkey
        .keys()
        .map(String::as_str)
        .filter(|k| is_operator_owned(k))
        .collect();
    if !owned.is_empty() {
        verdict.deny(format!(
            "spec.valkey: {} set by the operator on every node and cannot be configured; remove {}",
            if owned.len() == 1 {
                format!("{} is", owned[0])
            } else {
                format!("{} are", owned.join(", "))
            },
            if owned.len() == 1 { "it" } else { "them" },
        ));
    }
    let malformed: Vec<&str> = spec
        .valkey
        .keys()
        .map(String::as_str)
        .filter(|k| !is_setting_name(k))
        .collect();
    if !malformed.is_empty() {
        verdict.deny(format!(
            "spec.valkey: {:?} {} not Valkey setting names; use lowercase names like maxmemory-policy",
            malformed,
            if malformed.len() == 1 { "is" } else { "are" }
        ));
    }
}

/// Resolve this config and every config inheriting from it as if the change were stored.
/// Returns `false` as soon as the verdict is a denial (nothing further is checked then).
fn check_chains(name: &str, spec: &ValkeyConfigSpec, fleet: &Fleet, verdict: &mut Verdict) -> bool {
    let candidate = WithConfig {
        inner: fleet,
        name,
        spec: Some(spec),
    };
    for (i, dependent) in fleet.config_and_descendants(name).iter().enumerate() {
        check_chain(name, dependent, i == 0, &candidate, verdict);
        if !verdict.allowed() {
            return false;
        }
    }
    true
}

/// One chain: `dependent` is the config under review itself (`own`) or inherits from it. A
/// missing object only warns, and only for the config's own references.
fn check_chain(
    name: &str,
    dependent: &str,
    own: bool,
    candidate: &WithConfig<'_, Fleet>,
    verdict: &mut Verdict,
) {
    let subject = if own {
        String::new()
    } else {
        format!("ValkeyConfig {dependent}, which inherits from {name}: ")
    };
    match resolve::resolve(dependent, candidate) {
        Ok(effective) => {
            if own {
                (write_bound::advice(&effective.valkey).into_iter()).for_each(|a| verdict.warn(clip(a)));
            }
            if let Err(problem) = check_floor(&effective.image.spec.version) {
                verdict.deny(format!(
                    "spec.imageRef: {subject}the effective image {} (chain {}) has version {problem}",
                    effective.image.name, effective.chain
                ));
            }
        }
        Err(error @ ResolveError::MissingConfig { .. }) if own => verdict.warn(clip(format!(
            "spec.baseRef: {error}; this config takes effect once it is created."
        ))),
        Err(error @ ResolveError::MissingImage { .. }) if own => verdict.warn(clip(format!(
            "spec.imageRef: {error}; clusters on this config wait until it is created."
        ))),
        Err(error) if error.is_missing_object() => {}
        Err(error @ (ResolveError::Cycle { .. } | ResolveError::TooDeep { .. })) => verdict
            .deny(format!(
                "spec.baseRef: {subject}{error}; point baseRef at a config whose chain ends within {} configs and never returns to {name}",
                resolve::MAX_CHAIN_DEPTH
            )),
        Err(error) => verdict.deny(format!(
            "spec.imageRef: {subject}{error}; set spec.imageRef here or in a base config"
        )),
    }
}

/// An update that changes the effective image rolls every cluster resolving through the config.
fn judge_image_change(
    config: &ValkeyConfig,
    name: &str,
    fleet: &Fleet,
    policy: &Policy,
    now: Timestamp,
    verdict: &mut Verdict,
) {
    if let Some(change) = config_image_change(fleet, name, Some(&config.spec)) {
        let acknowledgement = config
            .annotations()
            .get(annotations::ACKNOWLEDGE_FLEET_ROLL)
            .map(String::as_str);
        let pacing = pacing(fleet, name, Some(&config.spec), &change.clusters);
        judge_config_change(
            &change,
            name,
            acknowledgement,
            &pacing,
            policy,
            now,
            verdict,
        );
    }
}

/// Clusters created before their config start as soon as it is.
fn warn_waiting_clusters(name: &str, fleet: &Fleet, verdict: &mut Verdict) {
    let waiting = fleet.clusters_resolving_through(name);
    if !waiting.is_empty() {
        verdict.warn(clip(format!(
            "{} already {} this config and will start now: {}.",
            plural(waiting.len(), "ValkeyCluster"),
            if waiting.len() == 1 {
                "references"
            } else {
                "reference"
            },
            some_of(&waiting, 3)
        )));
    }
}

fn validate_delete(name: &str, fleet: &Fleet, verdict: &mut Verdict) {
    let clusters: Vec<_> = fleet.clusters_using(name).collect();
    let configs: Vec<_> = fleet.configs_based_on(name).collect();
    let mut users = Vec::new();
    if !clusters.is_empty() {
        users.push(format!(
            "{} ({}) through spec.configRef",
            plural(clusters.len(), "ValkeyCluster"),
            some_of(&clusters, 5)
        ));
    }
    if !configs.is_empty() {
        users.push(format!(
            "{} ({}) through spec.baseRef",
            plural(configs.len(), "ValkeyConfig"),
            some_of(&configs, 5)
        ));
    }
    if !users.is_empty() {
        verdict.deny(format!(
            "ValkeyConfig {name} cannot be deleted while it is used by {}; move them to another config first",
            users.join(" and ")
        ));
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
