//! Step 1 of a pass, dereference: the spec within the operator's limits (admission may have been
//! bypassed or off), a cluster that has not started within its namespace's policies, and
//! `spec.configRef` resolved through its `baseRef` chain in the fleet index. No I/O: what it
//! finds wrong, [`crate::controller::pass::update_status::halted`] writes.

use crate::api::bounds::cluster_problems;
use crate::controller::build::status::Reason;
use crate::controller::pass::{Halt, Pass};
use crate::fleet::Fleet;
use crate::fleet::policy::{self, Counted, Footprint, Request};
use crate::fleet::resolve::{self, EffectiveConfig};
use crate::words::first_of;

/// The cluster's effective config, or why the pass stops here.
pub fn dereference(pass: &Pass<'_>) -> Result<EffectiveConfig, Halt> {
    let cluster = pass.cluster;
    let problems = cluster_problems(&pass.key.name, &cluster.spec);
    if !problems.is_empty() {
        return Err(Halt::OutOfBounds(problems));
    }
    let fleet = pass.ctx.fleet.read().unwrap_or_else(|p| p.into_inner());
    check_namespace_policies(pass, &fleet)?;
    resolve::resolve(&cluster.spec.config_ref, &*fleet).map_err(|error| Halt::Waiting {
        reason: Reason::ConfigUnresolved,
        message: format!("spec.configRef does not resolve: {error}"),
    })
}

/// Admission's policy check once more, for a cluster that has not started (two created at once
/// both passed admission, or admission was off): it waits, creating nothing, until the
/// namespace has room or the policy allows it. Only the clusters created before it count, so
/// it never takes the place of an older one; a cluster that runs is never stopped by a policy
/// (tightening one limits what comes next, as a ResourceQuota does).
fn check_namespace_policies(pass: &Pass<'_>, fleet: &Fleet) -> Result<(), Halt> {
    let status = &pass.stored.status;
    if !status.nodes.is_empty() {
        return Ok(());
    }
    let spec = &pass.cluster.spec;
    let request = Request {
        config_ref: &spec.config_ref,
        footprint: Footprint::of(spec),
        before: None,
    };
    let created = pass
        .cluster
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0);
    let breaches = policy::breaches(fleet, &pass.key, &request, Counted::CreatedBefore(created));
    if breaches.is_empty() {
        return Ok(());
    }
    Err(Halt::Waiting {
        reason: Reason::NamespacePolicy,
        message: format!(
            "not created: {}; it starts once the namespace has room or the policy allows it",
            first_of(&breaches, 4)
        ),
    })
}
