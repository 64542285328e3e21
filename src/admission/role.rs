//! ValkeyRole admission: each category and command is a plain name (see
//! [`crate::acl::check_command`]) and is named once.

use std::collections::BTreeSet;

use kube::core::admission::Operation;

use super::{Review, Verdict};
use crate::api::bounds::{MAX_ROLE_ENTRIES, role_problems};
use crate::api::{Permission, ValkeyRole};

pub fn validate_role(review: &Review<ValkeyRole>) -> Verdict {
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
    verdict
}

/// Each name once (a list longer than the limit is refused above and not read).
fn check_once(field: &str, permissions: &[Permission], verdict: &mut Verdict) {
    if permissions.len() > MAX_ROLE_ENTRIES {
        return;
    }
    let mut seen = BTreeSet::new();
    for permission in permissions {
        let name = permission.name.as_str();
        if !seen.insert(name.to_ascii_lowercase()) {
            verdict.deny(format!("{field}: {name:?} is listed twice; keep one entry"));
        }
    }
}
