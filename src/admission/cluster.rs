//! ValkeyCluster admission: the bounds and name rules of [`crate::api::bounds`] and the
//! operator's caps; its `configRef` must resolve at or above the Valkey 9 floor; a `configRef`
//! switch that changes the image warns of the roll; reserved pod annotations and adding or
//! removing TLS are refused (the CRD's own rules say the same, this gives the reason too); the
//! namespace's policies ([`crate::fleet::policy`]) hold, each refusal naming its policy.

use kube::ResourceExt;
use kube::core::admission::Operation;

use super::impact::{config_ref_image_change, judge_config_ref_switch};
use super::users::check_users;
use super::version::check_floor;
use super::{Policy, Review, Verdict, clip};
use crate::acl;
use crate::api::ClusterKey;
use crate::api::annotations::SWITCHOVER;
use crate::api::bounds::{Problem, acl_syntax_problems, cap_problems, cluster_problems};
use crate::api::{AclUser, RESERVED_PREFIX, ValkeyCluster, ValkeyClusterSpec};
use crate::fleet::Fleet;
use crate::fleet::policy::{self, Before, Counted, Footprint, Request};
use crate::fleet::resolve::{self, ResolveError};

/// Why adding or removing `spec.tls` is refused (the CRD's own rule says the same).
pub const TLS_PRESENCE_IS_FIXED: &str = "spec.tls is set at creation only and cannot be added or removed; create a new ValkeyCluster to change that. Only spec.tls.secretRef may change: the nodes roll onto the new Secret, whose ca.crt and the old one's must each trust the other's certificate";

/// Every check of a created or updated cluster; the switch warning only once nothing was refused.
pub fn validate_cluster(review: &Review<ValkeyCluster>, fleet: &Fleet, policy: &Policy) -> Verdict {
    let mut verdict = Verdict::default();
    if !matches!(review.operation, Operation::Create | Operation::Update) {
        return verdict;
    }
    let Some(cluster) = review.object else {
        verdict.deny("the request carries no ValkeyCluster object");
        return verdict;
    };
    let spec = &cluster.spec;
    let old_spec = review.old.map(|old| &old.spec);
    if cluster.metadata.deletion_timestamp.is_some() && old_spec == Some(spec) {
        // Being deleted, only its finalizers change: nothing to judge, and refusing would
        // leave it stuck in deletion.
        return verdict;
    }
    // An update is judged on what it makes worse: a cluster that predates a limit (or slipped
    // past admission) can still be changed, its finalizers too, without fixing everything.
    let known = old_spec
        .map(|old| spec_problems(review.name, old))
        .unwrap_or_default();
    let bounded = spec_problems(review.name, spec)
        .into_iter()
        .filter(|problem| !known.contains(problem))
        .chain(cap_problems(spec, old_spec, &policy.caps));
    for problem in bounded {
        verdict.deny(problem.to_string());
    }
    if !verdict.allowed() {
        // A spec past its bounds is not read any further.
        return verdict;
    }
    check_namespace_policies(review, spec, fleet, &mut verdict);
    check_pod_annotations(spec, &mut verdict);
    check_switchover(cluster, review.old, &mut verdict);
    if let Some(old) = review.old
        && old.spec.tls.is_some() != spec.tls.is_some()
    {
        verdict.deny(TLS_PRESENCE_IS_FIXED);
    }
    check_acl(spec, fleet, &mut verdict);
    check_acl_expansion(spec, old_spec, fleet, &mut verdict);
    check_config_ref(spec, fleet, &mut verdict);
    if let Some(old) = review.old
        && old.spec.config_ref != spec.config_ref
        && verdict.allowed()
        && let Some((from, to)) =
            config_ref_image_change(fleet, &old.spec.config_ref, &spec.config_ref)
    {
        judge_config_ref_switch(
            &old.spec.config_ref,
            &spec.config_ref,
            &from,
            &to,
            &mut verdict,
        );
    }
    verdict
}

/// The policies of the cluster's namespace, counting every other cluster the index knows there.
fn check_namespace_policies(
    review: &Review<ValkeyCluster>,
    spec: &ValkeyClusterSpec,
    fleet: &Fleet,
    verdict: &mut Verdict,
) {
    let key = ClusterKey::new(review.namespace.unwrap_or_default(), review.name);
    let request = Request {
        config_ref: &spec.config_ref,
        footprint: Footprint::of(spec),
        before: review.old.map(|old| Before {
            config_ref: &old.spec.config_ref,
            footprint: Footprint::of(&old.spec),
        }),
    };
    for breach in policy::breaches(fleet, &key, &request, Counted::All) {
        verdict.deny(breach.to_string());
    }
}

/// A switchover request that is not one is refused when it is written (one kept from before is
/// left alone: the controller ignores it and says so).
fn check_switchover(cluster: &ValkeyCluster, old: Option<&ValkeyCluster>, verdict: &mut Verdict) {
    let Some(Err(problem)) = cluster.switchover_request() else {
        return;
    };
    let value = |c: &ValkeyCluster| c.annotations().get(SWITCHOVER).cloned();
    if old.map(value) != Some(value(cluster)) {
        verdict.deny(problem);
    }
}

/// The hard limits and the ACL syntax rules.
fn spec_problems(name: &str, spec: &ValkeyClusterSpec) -> Vec<Problem> {
    let mut problems = cluster_problems(name, spec);
    problems.extend(acl_syntax_problems(&spec.acl));
    problems
}

fn check_pod_annotations(spec: &ValkeyClusterSpec, verdict: &mut Verdict) {
    let reserved: Vec<&String> = spec
        .pod_annotations
        .keys()
        .filter(|k| k.starts_with(RESERVED_PREFIX))
        .collect();
    if !reserved.is_empty() {
        verdict.deny(format!(
            "spec.podAnnotations: keys under {RESERVED_PREFIX} are reserved for the operator ({reserved:?}); use another prefix"
        ));
    }
}

/// The cluster's users as every `spec.acl` is checked, and none under a name its config's
/// `acl` already gives a user (the platform's user would stand, this one would never be written).
fn check_acl(spec: &ValkeyClusterSpec, fleet: &Fleet, verdict: &mut Verdict) {
    check_users(&spec.acl, fleet, verdict);
    let Ok(effective) = resolve::resolve(&spec.config_ref, fleet) else {
        return;
    };
    for (index, user) in spec.acl.iter().enumerate() {
        if effective.acl.iter().any(|p| p.username == user.username) {
            verdict.deny(format!(
                "spec.acl[{index}].username: user {:?} is defined by the acl of ValkeyConfig {} (through baseRef: {}) for every cluster using it; name this cluster's user differently",
                user.username, spec.config_ref, effective.chain
            ));
        }
    }
}

/// The users' rules, as the roles stand now, stay within the bounds of [`acl::Cost`]; an
/// update of a cluster already past them (made before the bounds, or by a role that grew) is
/// refused only for what it makes worse: a user past the bound that grows (or is new), or all
/// users past the bound together growing.
fn check_acl_expansion(
    spec: &ValkeyClusterSpec,
    old: Option<&ValkeyClusterSpec>,
    fleet: &Fleet,
    verdict: &mut Verdict,
) {
    let role = |name: &str| fleet.role_cost(name);
    let cost = |user: &AclUser| acl::UserCost::of(user).with_roles(role);
    let old_users = old.map(|old| old.acl.as_slice()).unwrap_or_default();
    let before = |username: &str| old_users.iter().find(|u| u.username == username).map(&cost);
    let total = |users: &[AclUser]| users.iter().map(|u| cost(u).bytes).sum::<usize>();
    let costs: Vec<acl::UserCost> = spec.acl.iter().map(acl::UserCost::of).collect();
    for (index, message) in acl::cost_problems(&costs, role) {
        let worse = match index.and_then(|i| spec.acl.get(i)) {
            // One user: worse if it is new or its rules grew.
            Some(user) => before(&user.username).is_none_or(|was| cost(user).tokens > was.tokens),
            // All users together: worse if they grew.
            None => old.is_none() || total(&spec.acl) > total(old_users),
        };
        let field = index.map_or("spec.acl".to_owned(), |i| format!("spec.acl[{i}]"));
        if worse {
            verdict.deny(format!("{field}: {message}"));
        }
    }
}

/// `configRef` resolves to an image at or above the floor; a missing object only warns.
fn check_config_ref(spec: &ValkeyClusterSpec, fleet: &Fleet, verdict: &mut Verdict) {
    match resolve::resolve(&spec.config_ref, fleet) {
        Ok(effective) => {
            if let Err(problem) = check_floor(&effective.image.spec.version) {
                verdict.deny(format!(
                    "spec.configRef: ValkeyConfig {} resolves to image {} whose version {problem}",
                    spec.config_ref, effective.image.name
                ));
            }
        }
        Err(error) if error.is_missing_object() => verdict.warn(clip(format!(
            "spec.configRef: {error}; the cluster waits until it exists."
        ))),
        Err(error @ (ResolveError::Cycle { .. } | ResolveError::TooDeep { .. } | ResolveError::NoImage { .. })) => {
            verdict.deny(format!(
                "spec.configRef: ValkeyConfig {} does not resolve: {error}; fix that config or pick another",
                spec.config_ref
            ))
        }
        Err(error) => verdict.deny(format!("spec.configRef: {error}")),
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
