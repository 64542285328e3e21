//! The controller's [`NodeHost`]: a cluster's nodes as ValkeyNodes and Pods. Creating a node
//! creates both; finding one reads its Pod's IP; its id, address and lifecycle are recorded in
//! the ValkeyNode's status; removing it deletes both. The roll memory is written to
//! `status.roll` by server-side apply under its own field manager, with the `resourceVersion`
//! the pass read as a precondition, so a writer acting on an old read fails instead of erasing
//! a newer record.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::api::ClusterKey;
use crate::api::{
    JoinType, NodeLifecycle, NodeRole, ValkeyCluster, ValkeyNode, ValkeyNodeStatus, annotations,
    field_managers, finalizers, labels,
};
use crate::controller::build::render::ClusterRender;
use crate::controller::context::Context;
use crate::controller::memory::node_cache::{Kind, Writes};
use crate::controller::view::{ClusterNodes, roll_status};
use crate::execute::{Member, NodeHost};
use crate::roll::RollMemory;
use crate::valkey::NodeAddress;

/// One cluster's nodes for the length of one pass.
pub struct KubeHost<'a> {
    ctx: &'a Context,
    render: &'a ClusterRender<'a>,
    namespace: String,
    nodes_api: Api<ValkeyNode>,
    pods_api: Api<Pod>,
    pub nodes: ClusterNodes,
    resource_version: Option<String>,
}

impl<'a> KubeHost<'a> {
    /// The cluster was written by this pass (not by the roll memory's own save): the memory's
    /// next save is made over this version.
    pub fn cluster_written(&mut self, resource_version: Option<String>) {
        self.resource_version = resource_version;
    }

    pub fn new(
        ctx: &'a Context,
        render: &'a ClusterRender<'a>,
        namespace: &str,
        nodes: ClusterNodes,
        resource_version: Option<String>,
    ) -> Self {
        Self {
            ctx,
            render,
            namespace: namespace.to_owned(),
            nodes_api: Api::namespaced(ctx.client.clone(), namespace),
            pods_api: Api::namespaced(ctx.client.clone(), namespace),
            nodes,
            resource_version,
        }
    }

    fn cluster(&self) -> &ValkeyCluster {
        self.render.cluster
    }

    /// Where this pass's writes to the cluster's nodes and Pods are recorded.
    pub fn writes(&self) -> Writes<'a> {
        let key = ClusterKey::of(self.cluster());
        self.ctx.memory.node_cache.writes(key)
    }

    /// Takes `join-type: shard` off a node now `Active` (Momento's contract: that value means a
    /// shard still joining; `replica` and `primary` stay, as how the node joined).
    async fn end_shard_join(&mut self, name: &str) -> Result<(), kube::Error> {
        let joining_shard = self.nodes.get(name).is_some_and(|node| {
            node.labels().get(labels::JOIN_TYPE).map(String::as_str)
                == Some(JoinType::Shard.as_str())
        });
        if !joining_shard {
            return Ok(());
        }
        let patch = json!({"metadata": {"labels": {labels::JOIN_TYPE: null}}});
        let updated = self
            .nodes_api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.writes().node(&updated);
        if let Some(node) = self.nodes.get_mut(name) {
            node.metadata.labels = updated.metadata.labels;
        }
        Ok(())
    }

    /// Merges `status` into the ValkeyNode's status, and into this pass's copy of it.
    async fn patch_node_status(
        &mut self,
        name: &str,
        status: serde_json::Value,
    ) -> Result<(), kube::Error> {
        let patch = json!({ "status": status });
        let updated = self
            .nodes_api
            .patch_status(
                name,
                &PatchParams::apply(field_managers::CONTROLLER),
                &Patch::Merge(&patch),
            )
            .await?;
        self.writes().node(&updated);
        if let Some(node) = self.nodes.get_mut(name) {
            node.status = updated.status;
        }
        Ok(())
    }
}

/// A fresh node name in the cluster's shard: `<cluster>-<shard>-<5 hex>`.
fn node_name(cluster: &str, shard: u32) -> String {
    let nanos = Timestamp::now().as_nanosecond();
    let digest = <sha2::Sha256 as sha2::Digest>::digest(format!("{cluster}/{shard}/{nanos}"));
    let suffix: String = digest.iter().take(3).map(|b| format!("{b:02x}")).collect();
    format!("{cluster}-{shard}-{}", &suffix[..5])
}

/// Deletes `name`, treating "already gone" as done; recorded in `writes`.
async fn delete_if_present<K>(
    api: &Api<K>,
    name: &str,
    kind: Kind,
    writes: &Writes<'_>,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        // The object while a grace period or finalizer keeps it; a Status once it is gone.
        Ok(outcome) => writes.deleted(kind, name, outcome.left().as_ref()),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            writes.deleted::<K>(kind, name, None)
        }
        Err(error) => return Err(error),
    }
    Ok(())
}

/// Deletes a node's Pod and ValkeyNode (with or without garbage collection), releasing the
/// node's [`finalizers::RETIRE_NODE`] between the two.
pub async fn delete_node(
    nodes: &Api<ValkeyNode>,
    pods: &Api<Pod>,
    name: &str,
    writes: &Writes<'_>,
) -> Result<(), kube::Error> {
    delete_if_present(pods, name, Kind::Pod, writes).await?;
    release(nodes, name, writes).await?;
    delete_if_present(nodes, name, Kind::Node, writes).await
}

/// Sets the node's finalizers to `change(current)`, over the version read (a concurrent change
/// fails the patch rather than being overwritten); a node that is gone needs nothing.
async fn set_finalizers(
    nodes: &Api<ValkeyNode>,
    name: &str,
    writes: &Writes<'_>,
    change: impl FnOnce(Vec<String>) -> Vec<String>,
) -> Result<(), kube::Error> {
    let Some(node) = nodes.get_opt(name).await? else {
        return Ok(());
    };
    let current = node.metadata.finalizers.clone().unwrap_or_default();
    let wanted = change(current.clone());
    if wanted == current {
        return Ok(());
    }
    let patch = json!({"metadata": {
        "finalizers": wanted,
        "resourceVersion": node.metadata.resource_version,
    }});
    let patched = nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    writes.node(&patched);
    Ok(())
}

/// Puts [`finalizers::RETIRE_NODE`] on the node.
pub async fn hold(
    nodes: &Api<ValkeyNode>,
    name: &str,
    writes: &Writes<'_>,
) -> Result<(), kube::Error> {
    set_finalizers(nodes, name, writes, |mut finalizers| {
        if !finalizers.iter().any(|f| f == finalizers::RETIRE_NODE) {
            finalizers.push(finalizers::RETIRE_NODE.to_string());
        }
        finalizers
    })
    .await
}

/// Takes [`finalizers::RETIRE_NODE`] off the node, leaving any other finalizer.
async fn release(
    nodes: &Api<ValkeyNode>,
    name: &str,
    writes: &Writes<'_>,
) -> Result<(), kube::Error> {
    set_finalizers(nodes, name, writes, |finalizers| {
        finalizers
            .into_iter()
            .filter(|f| f != finalizers::RETIRE_NODE)
            .collect()
    })
    .await
}

impl NodeHost for KubeHost<'_> {
    type Error = kube::Error;

    fn members(&self) -> Vec<Member> {
        let zone_of = |node: &str| self.ctx.kube_nodes.zone(node);
        let mut members = self
            .nodes
            .members(Timestamp::now(), self.ctx.timeouts.join, zone_of);
        let key = ClusterKey::of(self.cluster());
        let silent = self.ctx.memory.silence.silent(&key);
        for member in &mut members {
            member.silent = silent.contains(&member.name);
        }
        members
    }

    async fn create_node(
        &mut self,
        shard: u32,
        _revision: &str,
        replica_of: Option<&str>,
    ) -> Result<String, kube::Error> {
        let name = node_name(&self.cluster().name_any(), shard);
        let mut node = self
            .render
            .node(&name, i32::try_from(shard).unwrap_or(i32::MAX));
        let role = match replica_of {
            Some(primary) => {
                node.annotations_mut()
                    .insert(annotations::REPLICA_OF.into(), primary.to_owned());
                NodeRole::Replica
            }
            None => NodeRole::Primary,
        };
        if let Some(join) = self.render.join_type(replica_of.is_some()) {
            node.labels_mut()
                .insert(labels::JOIN_TYPE.into(), join.as_str().into());
        }
        // Created holding its finalizer: no second write to put it on.
        node.finalizers_mut()
            .push(finalizers::RETIRE_NODE.to_owned());
        let created = self.nodes_api.create(&PostParams::default(), &node).await?;
        self.writes().node(&created);
        let status = ValkeyNodeStatus {
            lifecycle: Some(NodeLifecycle::Joining),
            pod_name: Some(name.clone()),
            ..Default::default()
        };
        self.nodes.objects.push(created.clone());
        self.patch_node_status(&name, json!(status)).await?;
        let pod = self
            .pods_api
            .create(&PostParams::default(), &self.render.pod(&created, role))
            .await?;
        self.writes().pod(&pod);
        Ok(name)
    }

    async fn record_id(
        &mut self,
        name: &str,
        id: &str,
        address: NodeAddress,
    ) -> Result<(), kube::Error> {
        let status = json!({"nodeId": id, "address": address.ip().to_string(), "podName": name});
        self.patch_node_status(name, status).await
    }

    async fn mark_active(&mut self, name: &str) -> Result<(), kube::Error> {
        self.patch_node_status(name, json!({"lifecycle": NodeLifecycle::Active}))
            .await?;
        self.end_shard_join(name).await
    }

    async fn remove_node(&mut self, name: &str) -> Result<(), kube::Error> {
        // Said before it goes, so a watch of ValkeyNodes sees which node is retired.
        match self
            .patch_node_status(name, json!({"lifecycle": NodeLifecycle::Leaving}))
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            other => other?,
        }
        delete_node(&self.nodes_api, &self.pods_api, name, &self.writes()).await?;
        self.nodes.objects.retain(|n| n.name_any() != name);
        self.nodes.pods.remove(name);
        Ok(())
    }

    async fn save_memory(&mut self, memory: &RollMemory) -> Result<(), kube::Error> {
        let name = self.cluster().name_any();
        let api: Api<ValkeyCluster> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let mut metadata = json!({ "name": name });
        if let Some(version) = &self.resource_version {
            metadata["resourceVersion"] = json!(version);
        }
        let patch = json!({
            "apiVersion": ValkeyCluster::api_version(&()),
            "kind": ValkeyCluster::kind(&()),
            "metadata": metadata,
            "status": {"roll": roll_status(memory)},
        });
        let params = PatchParams::apply(field_managers::ROLL).force();
        let stored = api
            .patch_status(&name, &params, &Patch::Apply(&patch))
            .await?;
        let key = ClusterKey::new(self.namespace.clone(), name);
        self.resource_version = stored.metadata.resource_version.clone();
        self.ctx.memory.cluster_cache.wrote(&key, stored);
        Ok(())
    }
}
