//! Step 2 of a pass, read: what a pass reads from the API server and writes nothing for. The
//! cluster's status as stored (its roll memory and conditions; from the watch only once it
//! shows the operator's last write, since the roll memory decides whether a shard may fail
//! over; read when the pass begins), its TLS trust, its ValkeyNodes and their Pods (from the
//! controller's cache once it holds the operator's own writes to them) and its users' password
//! hashes; and the members the executor works with, mapped from those objects. The Secrets the
//! operator owns are step 3's ([`crate::controller::pass::keep`]).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::access;
use crate::api::ClusterKey;
use crate::api::{ValkeyCluster, ValkeyClusterStatus, ValkeyNode, labels};
use crate::controller::build::status::Reason;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::pass::secrets;
use crate::controller::pass::secrets::PasswordHashes;
use crate::controller::pass::{Halt, Pass};
use crate::controller::view::{ClusterNodes, PodView};
use crate::valkey::Reach;

/// What step 2 read, but the nodes (the host takes those).
pub struct Reads {
    /// How the operator reaches the nodes: the TLS trust (the logins come in step 3).
    pub reach: Reach,
    /// The versions of the TLS Secrets the nodes mount, for reloads.
    pub certificate: Option<String>,
    /// The users' passwords, hashed at once.
    pub passwords: PasswordHashes,
}

/// Reads the cluster's TLS trust, nodes and Pods, and users' passwords; a TLS CA that cannot
/// be read stops the pass.
pub async fn read(pass: &Pass<'_>) -> Result<(ClusterNodes, Reads), Halt> {
    let (ctx, cluster, namespace) = (pass.ctx, pass.cluster, &pass.namespace);
    let nodes = read_nodes(ctx, cluster).await?;
    let mounted: BTreeSet<&str> = nodes
        .pods
        .values()
        .flat_map(|pod| &pod.secrets)
        .map(String::as_str)
        .collect();
    let (mut reach, certificate) = access::reach(
        &ctx.client,
        namespace,
        cluster,
        &ctx.settings.cluster_domain,
        ctx.timeouts.call,
        &mounted,
    )
    .await
    .map_err(|message| Halt::Waiting {
        reason: Reason::TlsUnavailable,
        message,
    })?;
    if let Some(trust) = reach.tls.as_mut() {
        // Each node is verified by its own Pod's name.
        trust.know_pods(
            nodes
                .pods
                .iter()
                .filter_map(|(pod, view)| Some((view.ip.as_deref()?, pod.as_str()))),
        );
    }
    let passwords = secrets::read_password_hashes(&ctx.client, namespace, cluster).await;
    let reads = Reads {
        reach,
        certificate,
        passwords,
    };
    Ok((nodes, reads))
}

/// The cluster's status as stored, with the version it was read at.
pub struct StoredStatus {
    pub status: ValkeyClusterStatus,
    /// The ValkeyCluster's `resourceVersion`: the roll memory is only written over it.
    pub resource_version: Option<String>,
}

/// From the controller's cluster watch when it shows the operator's last write to the cluster
/// (see [`crate::controller::memory::cluster_cache`]), else from the API server.
pub async fn read_status(ctx: &Context, cluster: &ValkeyCluster) -> Result<StoredStatus, Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let key = ClusterKey::new(namespace.clone(), cluster.name_any());
    if let Some(current) = ctx.memory.cluster_cache.current(&key) {
        return Ok(StoredStatus {
            resource_version: current.metadata.resource_version.clone(),
            status: current.status.clone().unwrap_or_default(),
        });
    }
    let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let stored = api.get_status(&cluster.name_any()).await?;
    let version = stored.metadata.resource_version.as_deref();
    ctx.memory.cluster_cache.read(&key, version);
    Ok(StoredStatus {
        resource_version: stored.metadata.resource_version.clone(),
        status: stored.status.unwrap_or_default(),
    })
}

/// From the controller's cache when it has every write of the operator's to them (see
/// [`crate::controller::memory::node_cache`]), else listed.
pub async fn read_nodes(ctx: &Context, cluster: &ValkeyCluster) -> Result<ClusterNodes, Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let key = ClusterKey::new(namespace.clone(), cluster.name_any());
    let mut nodes = match ctx.memory.node_cache.fresh(&key) {
        Some(cached) => cached,
        None => {
            let listed = list_nodes(ctx, cluster, &namespace).await?;
            ctx.memory.node_cache.listed(&key, &listed);
            listed
        }
    };
    find_unlabelled_pods(ctx, &namespace, &mut nodes).await?;
    Ok(nodes)
}

/// Pods are listed and watched by their labels, which anyone who may edit Pods can change. A
/// node that ran and whose Pod the labels no longer find is asked for its Pod by name: if the
/// Pod of that name is still the one the node owns, the node is running (its labels are put
/// back by the membership step), not gone.
async fn find_unlabelled_pods(
    ctx: &Context,
    namespace: &str,
    nodes: &mut ClusterNodes,
) -> Result<(), Error> {
    let missing: Vec<String> = nodes
        .objects
        .iter()
        .filter(|n| n.status.as_ref().is_some_and(|s| s.node_id.is_some()))
        .map(ResourceExt::name_any)
        .filter(|name| !nodes.pods.contains_key(name))
        .collect();
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace);
    for name in missing {
        if let Some(pod) = pods.get_opt(&name).await? {
            tracing::warn!(%namespace, pod = %name, "a node's Pod no longer carries its labels");
            nodes.pods.insert(name, PodView::from(&pod));
        }
    }
    Ok(())
}

async fn list_nodes(
    ctx: &Context,
    cluster: &ValkeyCluster,
    namespace: &str,
) -> Result<ClusterNodes, Error> {
    let selector =
        ListParams::default().labels(&format!("{}={}", labels::CLUSTER, cluster.name_any()));
    let objects = Api::<ValkeyNode>::namespaced(ctx.client.clone(), namespace)
        .list(&selector)
        .await?
        .items;
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .list(&selector)
        .await?
        .items
        .iter()
        .map(|p| (p.name_any(), PodView::from(p)))
        .collect();
    Ok(ClusterNodes { objects, pods })
}
