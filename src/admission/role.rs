//! ValkeyRole admission: each category and command is named once, without ACL syntax.

use std::collections::BTreeSet;

use kube::core::admission::Operation;

use super::{Review, Verdict};
use crate::api::bounds::role_problems;
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
    let problems = role_problems(&role.spec);
    if !problems.is_empty() {
        problems.iter().for_each(|p| verdict.deny(p.to_string()));
        return verdict;
    }
    check_list("spec.categories", &role.spec.categories, '@', &mut verdict);
    check_list("spec.commands", &role.spec.commands, '+', &mut verdict);
    verdict
}

fn check_list(field: &str, permissions: &[Permission], sigil: char, verdict: &mut Verdict) {
    let mut seen = BTreeSet::new();
    for permission in permissions {
        let name = permission.name.as_str();
        if name.starts_with(['@', '+', '-', '~', '&']) {
            verdict.deny(format!(
                "{field}: write {:?} without ACL syntax (the access field says allow or deny)",
                name.trim_start_matches(['@', '+', '-', '~', '&'])
            ));
        } else if name.contains(char::is_whitespace) {
            verdict.deny(format!(
                "{field}: {name:?} contains spaces; name one {} per entry",
                if sigil == '@' { "category" } else { "command" }
            ));
        }
        if !seen.insert(name.to_ascii_lowercase()) {
            verdict.deny(format!("{field}: {name:?} is listed twice; keep one entry"));
        }
    }
}
