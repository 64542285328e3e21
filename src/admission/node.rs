//! ValkeyNode admission: nodes are created by the operator for a ValkeyCluster (never by users),
//! and their version obeys the Valkey 9 floor like every other way a version can enter.

use kube::core::admission::Operation;

use super::version::check_floor;
use super::{Review, Verdict};
use crate::api::ValkeyNode;

pub fn validate_node(review: &Review<ValkeyNode>) -> Verdict {
    let mut verdict = Verdict::default();
    if !matches!(review.operation, Operation::Create | Operation::Update) {
        return verdict;
    }
    let Some(node) = review.object else {
        verdict.deny("the request carries no ValkeyNode object");
        return verdict;
    };
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
