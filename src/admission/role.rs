//! ValkeyRole admission: each category and command is a plain name (see
//! [`crate::acl::check_command`]) and is named once, and a change keeps every cluster that
//! grants the role within the bounds of its expanded ACL (see [`crate::acl::Cost`]): each
//! permission copies the role's entries.

use std::collections::BTreeSet;

use kube::core::admission::Operation;

use super::{Review, Verdict};
use crate::acl::{cost_problems, role_cost};
use crate::api::bounds::{MAX_ROLE_ENTRIES, role_problems};
use crate::api::{Permission, ValkeyRole, ValkeyRoleSpec};
use crate::fleet::Fleet;

pub fn validate_role(review: &Review<ValkeyRole>, fleet: &Fleet) -> Verdict {
    let mut verdict = Verdict::default();
    if !matches!(review.operation, Operation::Create | Operation::Update) {
        return verdict;
    }
    let Some(role) = review.object else {
        verdict.deny("the request carries no ValkeyRole object");
        return verdict;
    };
    for problem in role_problems(&role.spec) {
        verdict.deny(problem.to_string());
    }
    check_once("spec.categories", &role.spec.categories, &mut verdict);
    check_once("spec.commands", &role.spec.commands, &mut verdict);
    if verdict.allowed() {
        check_expansion(review.name, &role.spec, fleet, &mut verdict);
    }
    verdict
}

/// Clusters granting this role whose ACL it would push past the bounds, or further past them.
fn check_expansion(name: &str, spec: &ValkeyRoleSpec, fleet: &Fleet, verdict: &mut Verdict) {
    let new = role_cost(spec);
    let grown = fleet
        .role_cost(name)
        .is_none_or(|old| new.tokens > old.tokens || new.bytes > old.bytes);
    if !grown {
        return;
    }
    let with_new = |role: &str| {
        if role == name {
            Some(new)
        } else {
            fleet.role_cost(role)
        }
    };
    let mut over: Vec<String> = fleet
        .clusters_using_role(name)
        .into_iter()
        .filter_map(|key| {
            let problems = cost_problems(fleet.cluster_acl_costs(&key), with_new);
            let (index, problem) = problems.into_iter().next()?;
            let field = index.map_or("spec.acl".to_string(), |i| format!("spec.acl[{i}]"));
            Some(format!("ValkeyCluster {key}: {field} {problem}"))
        })
        .collect();
    if !over.is_empty() {
        let shown = over.len().min(3);
        let more = over.len() - shown;
        over.truncate(shown);
        let tail = if more > 0 {
            format!(" (and {more} more)")
        } else {
            String::new()
        };
        verdict.deny(format!(
            "this change of ValkeyRole {name} would make the ACL of clusters granting it too large, its entries copied once per permission: {}{tail}",
            over.join("; ")
        ));
    }
}

/// Each name once (a list longer than the limit is refused above and not read).
fn check_once(field: &str, permissions: &[Permission], verdict: &mut Verdict) {
    if permissions.len() > MAX_ROLE_ENTRIES {
        return;
    }
    let mut seen = BTreeSet::new();
    for permission in permissions {
        let name = permission.acl_name();
        if !seen.insert(name.to_ascii_lowercase()) {
            verdict.deny(format!("{field}: {name:?} is listed twice; keep one entry"));
        }
    }
}
