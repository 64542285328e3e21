//! Step 5 of a pass, honour: what a person asked of the roll by annotation, written before the
//! planner looks. `retry-failovers` naming this roll's revision gives the shards that spent
//! their failover attempts new ones (the roll's memory saved first, under its precondition);
//! then the annotation is removed, whatever roll it named, so it acts once.

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::api::ValkeyCluster;
use crate::api::annotations::RETRY_FAILOVERS;
use crate::controller::error::Error;
use crate::controller::events::{ClusterEvent, publish};
use crate::controller::host::KubeHost;
use crate::controller::pass::Pass;
use crate::controller::view::memory_of;
use crate::execute::NodeHost;
use crate::roll::RollMemory;

/// The roll's memory as stored, with a person's request honoured.
pub async fn honour(pass: &Pass<'_>, host: &mut KubeHost<'_>) -> Result<RollMemory, Error> {
    let mut memory = memory_of(&pass.stored.status);
    allow_more_failovers(pass, host, &mut memory).await?;
    Ok(memory)
}

/// Acts once on a person's [`RETRY_FAILOVERS`] annotation naming this roll's revision: every
/// shard that spent its failover attempts gets them again (saved first, under the roll memory's
/// precondition), then the annotation is removed, so it never acts twice.
async fn allow_more_failovers(
    pass: &Pass<'_>,
    host: &mut KubeHost<'_>,
    memory: &mut RollMemory,
) -> Result<(), Error> {
    let (ctx, cluster) = (pass.ctx, pass.cluster);
    let Some(asked) = cluster.annotations().get(RETRY_FAILOVERS) else {
        return Ok(());
    };
    if asked == &memory.revision {
        let shards = memory.allow_more_attempts();
        host.save_memory(memory).await?;
        let event = ClusterEvent::FailoversAllowed { shards };
        publish(&ctx.recorder, cluster, &event).await;
    }
    // Removed also when it names another roll: it could never act, and must not later.
    let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), &pass.namespace);
    let patch = json!({"metadata": {"annotations": {RETRY_FAILOVERS: null}}});
    let params = PatchParams::default();
    let written = api
        .patch(&pass.key.name, &params, &Patch::Merge(&patch))
        .await?;
    host.cluster_written(written.metadata.resource_version.clone());
    ctx.memory.cluster_cache.wrote(&pass.key, written);
    Ok(())
}
