//! The plugin's verbs that change something: each writes (or removes) one documented annotation
//! with a merge patch, after reading the object so a wrong name says so plainly.

use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::api::annotations::{
    HANDOVER_REQUESTED, ROLLOUT_HOLD, ROLLOUT_PAUSED, ROTATE_CREDENTIALS, SWITCHOVER,
};
use crate::api::labels::{CLUSTER as CLUSTER_LABEL, SHARD_INDEX};
use crate::api::{SwitchoverRequest, ValkeyCluster, ValkeyConfig, ValkeyNode};
use crate::credentials::secret_name;

/// Sets (`Some`) or removes (`None`) annotation `key` on the object `name` of `api`.
async fn annotate<K>(api: &Api<K>, name: &str, key: &str, value: Option<&str>) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&());
    api.get_opt(name)
        .await
        .with_context(|| format!("reading {kind} {name}"))?
        .with_context(|| format!("{kind} {name} not found"))?;
    let patch = json!({"metadata": {"annotations": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating {kind} {name}"))?;
    Ok(())
}

/// `pause` (`paused`) or `resume` a config's rollouts.
pub async fn pause(client: &Client, config: &str, paused: bool) -> anyhow::Result<String> {
    let api: Api<ValkeyConfig> = Api::all(client.clone());
    let value = paused.then_some("true");
    annotate(&api, config, ROLLOUT_PAUSED, value).await?;
    Ok(if paused {
        format!(
            "valkeyconfig/{config} paused: no cluster resolving through it starts rolling; \
             rolling ones finish their shard and wait (kubectl valkey resume {config})\n"
        )
    } else {
        format!("valkeyconfig/{config} resumed\n")
    })
}

/// Holds a cluster on its revision, for `duration` or until released.
pub async fn hold(
    client: &Client,
    namespace: &str,
    cluster: &str,
    duration: Option<Duration>,
) -> anyhow::Result<String> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), namespace);
    let until = match duration {
        Some(duration) => {
            let span = SignedDuration::try_from(duration).context("the hold's duration")?;
            let until = Timestamp::now()
                .checked_add(span)
                .context("the hold would end past the year 9999")?;
            Some(until.to_string())
        }
        None => None,
    };
    annotate(
        &api,
        cluster,
        ROLLOUT_HOLD,
        Some(until.as_deref().unwrap_or("true")),
    )
    .await?;
    let how_long = until.map_or("until released".to_string(), |t| format!("until {t}"));
    Ok(format!(
        "valkeycluster/{cluster} held on its revision {how_long}: it starts no roll, a shard in \
         flight finishes, healing goes on (kubectl valkey release {cluster} -n {namespace})\n"
    ))
}

/// Removes a cluster's hold.
pub async fn release(client: &Client, namespace: &str, cluster: &str) -> anyhow::Result<String> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), namespace);
    annotate(&api, cluster, ROLLOUT_HOLD, None).await?;
    Ok(format!(
        "valkeycluster/{cluster} released: it rolls when its rollout lets it\n"
    ))
}

/// Asks for one node to be replaced (a primary hands its shard over first).
pub async fn replace(client: &Client, namespace: &str, node: &str) -> anyhow::Result<String> {
    let api: Api<ValkeyNode> = Api::namespaced(client.clone(), namespace);
    let now = Timestamp::now().to_string();
    annotate(&api, node, HANDOVER_REQUESTED, Some(&now)).await?;
    Ok(format!(
        "valkeynode/{node} will be replaced: a new node joins its shard (a primary hands the \
         shard over first), then it is retired (kubectl valkey status <cluster> follows it)\n"
    ))
}

/// Asks for a switchover of one shard (see [`SWITCHOVER`]), checking first that the shard and
/// the replica named are the cluster's, so a typo is said here rather than in the status.
pub async fn switchover(
    client: &Client,
    namespace: &str,
    cluster: &str,
    shard: u32,
    to: Option<String>,
) -> anyhow::Result<String> {
    let clusters: Api<ValkeyCluster> = Api::namespaced(client.clone(), namespace);
    let found = clusters
        .get_opt(cluster)
        .await
        .with_context(|| format!("reading ValkeyCluster {cluster}"))?
        .with_context(|| format!("ValkeyCluster {cluster} not found in namespace {namespace}"))?;
    let shards = u32::try_from(found.spec.shards).unwrap_or(0);
    if shard >= shards {
        bail!(
            "valkeycluster/{cluster} has shards 0 to {}",
            shards.saturating_sub(1)
        );
    }
    if let Some(node) = &to {
        let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), namespace);
        let found = nodes
            .get_opt(node)
            .await
            .with_context(|| format!("reading ValkeyNode {node}"))?
            .with_context(|| format!("ValkeyNode {node} not found in namespace {namespace}"))?;
        let of_shard = found.labels().get(SHARD_INDEX).map(String::as_str);
        let of_cluster = found.labels().get(CLUSTER_LABEL).map(String::as_str);
        if of_cluster != Some(cluster) || of_shard != Some(shard.to_string().as_str()) {
            bail!("valkeynode/{node} is not a node of shard {shard} of valkeycluster/{cluster}");
        }
    }
    let request = SwitchoverRequest {
        shard,
        to: to.clone(),
        requested_at: Some(Timestamp::now().to_string()),
    };
    let value = serde_json::to_string(&request).context("writing the request")?;
    annotate(&clusters, cluster, SWITCHOVER, Some(&value)).await?;
    let onto = to.unwrap_or_else(|| "its most caught-up synced replica".to_string());
    Ok(format!(
        "valkeycluster/{cluster}: switchover of shard {shard} onto {onto} asked; one clean \
         failover once the replica is synced (kubectl valkey status {cluster} -n {namespace})\n"
    ))
}

/// Asks for both of a cluster's operator passwords to be rotated.
pub async fn rotate_credentials(
    client: &Client,
    namespace: &str,
    cluster: &str,
) -> anyhow::Result<String> {
    let clusters: Api<ValkeyCluster> = Api::namespaced(client.clone(), namespace);
    clusters
        .get_opt(cluster)
        .await
        .with_context(|| format!("reading ValkeyCluster {cluster}"))?
        .with_context(|| format!("ValkeyCluster {cluster} not found in namespace {namespace}"))?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secret_name(cluster);
    let now = Timestamp::now().to_string();
    annotate(&secrets, &secret, ROTATE_CREDENTIALS, Some(&now)).await?;
    Ok(format!(
        "secret/{secret}: rotation asked; the nodes take the new passwords live, the old ones \
         are dropped once every node has them\n"
    ))
}

/// `90s`, `30m`, `24h` or `7d`.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .with_context(|| format!("{text:?}: a whole number then s, m, h or d (e.g. 24h)"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => bail!("{text:?}: the unit must be s, m, h or d (e.g. 24h)"),
    };
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .with_context(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1_800));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        for bad in ["", "h", "24", "24 hours", "-1h", "1.5h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
