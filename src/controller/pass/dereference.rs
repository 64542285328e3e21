//! Step 1 of a pass, dereference: the spec within the operator's limits (admission may have been
//! bypassed or off) and `spec.configRef` resolved through its `baseRef` chain in the fleet
//! index. No I/O: what it finds wrong, [`crate::controller::pass::update_status::halted`] writes.

use crate::api::bounds::cluster_problems;
use crate::controller::pass::{Halt, Pass};
use crate::controller::status::Reason;
use crate::fleet::resolve::{self, EffectiveConfig};

/// The cluster's effective config, or why the pass stops here.
pub fn dereference(pass: &Pass<'_>) -> Result<EffectiveConfig, Halt> {
    let cluster = pass.cluster;
    let problems = cluster_problems(&pass.key.name, &cluster.spec);
    if !problems.is_empty() {
        return Err(Halt::OutOfBounds(problems));
    }
    let fleet = pass.ctx.fleet.read().unwrap_or_else(|p| p.into_inner());
    resolve::resolve(&cluster.spec.config_ref, &*fleet).map_err(|error| Halt::Waiting {
        reason: Reason::ConfigUnresolved,
        message: format!("spec.configRef does not resolve: {error}"),
    })
}
