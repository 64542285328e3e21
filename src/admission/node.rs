//! ValkeyNode admission: nodes are written by the operator for a ValkeyCluster (never by users),
//! and their version obeys the Valkey 9 floor like every other way a version can enter.
//!
//! A ValkeyNode becomes a Pod with the operator's rights, so whoever may write one could run any
//! image: creating one, or changing its spec, is allowed only to the operator's own identity
//! ([`Policy::node_writer`], learnt from the API server at start). The CRD also makes the spec
//! immutable, so the API server refuses a changed spec even with the webhook off. An
//! ownerReference alone proves nothing: anyone can write one.

use kube::core::admission::Operation;

use super::version::check_floor;
use super::{Policy, Review, Verdict};
use crate::api::ValkeyNode;

pub fn validate_node(review: &Review<ValkeyNode>, policy: &Policy) -> Verdict {
    let mut verdict = Verdict::default();
    if !matches!(review.operation, Operation::Create | Operation::Update) {
        return verdict;
    }
    let Some(node) = review.object else {
        verdict.deny("the request carries no ValkeyNode object");
        return verdict;
    };
    let spec_written = match review.old {
        Some(old) => old.spec != node.spec,
        None => true,
    };
    if spec_written {
        check_writer(review, policy, &mut verdict);
    }
    let owned_by_cluster = node
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.kind == "ValkeyCluster" && owner.controller == Some(true));
    if review.operation == Operation::Create && !owned_by_cluster {
        verdict.deny(
            "ValkeyNodes are created by the operator for a ValkeyCluster (controller ownerReference); create or scale a ValkeyCluster instead",
        );
    }
    if let Err(problem) = check_floor(&node.spec.version) {
        verdict.deny(format!("spec.version {problem}"));
    }
    verdict
}

/// Only the operator writes a node's spec.
fn check_writer(review: &Review<ValkeyNode>, policy: &Policy, verdict: &mut Verdict) {
    let Some(writer) = policy.node_writer.as_deref() else {
        return;
    };
    if review.user != Some(writer) {
        verdict.deny(format!(
            "ValkeyNodes are written only by the operator ({writer}), not by {}: a node's spec becomes a Pod with the operator's rights; create or change a ValkeyCluster instead",
            review.user.unwrap_or("an unnamed user")
        ));
    }
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
