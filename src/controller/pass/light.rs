//! The light pass: a settled cluster whose view is fresh is checked against that view only, with
//! no reads of its objects or nodes (see [`crate::controller::memory::settled`]). Each one that
//! finds the cluster as it was logs a heartbeat line: a settled fleet still logs, once a minute a
//! cluster.

use std::time::Duration;

use kube::runtime::controller::Action;

use crate::api::ClusterKey;
use crate::api::ValkeyCluster;
use crate::controller::build::status::progress;
use crate::controller::context::Context;
use crate::controller::memory::settled::fingerprint;
use crate::controller::pass::update_status::requeue_after;
use crate::execute::observe::observe;
use crate::roll::Step;

/// A settled cluster's periodic pass: what its Valkey nodes say, and nothing else while they
/// say the same (the node gauges are refreshed from it). `None`: a full pass is needed.
pub async fn light_pass(ctx: &Context, cluster: &ValkeyCluster) -> Option<Action> {
    let key = ClusterKey::of(cluster);
    let view = ctx.memory.settled.view(&key)?;
    let observed = observe(&view.members, &view.reach).await;
    if fingerprint(&observed) != view.fingerprint {
        ctx.memory.settled.unsettle(&key);
        return None;
    }
    let converged = Step::Converged;
    let progress = progress(&view.desired, &observed, &converged);
    ctx.metrics
        .roll_progress(&key.namespace, &key.name, &progress);
    // The steady line a settled fleet logs, one per cluster a minute, so that an alert on the
    // operator's log flow stopping (Momento's advice) means it stopped.
    if ctx
        .memory
        .settled
        .heartbeat_due(&key, std::time::Instant::now())
    {
        tracing::info!(
            cluster = %key.name,
            namespace = %key.namespace,
            shards = view.desired.shards,
            nodes = observed.len(),
            "heartbeat: settled, its nodes answer as before"
        );
    }
    Some(requeue_after(&converged, Duration::ZERO))
}
