//! One reconcile of a ValkeyCluster: resolve its config, keep its Service and budget in place,
//! finish the joins of new nodes, observe every node, ask the planner for the next step,
//! perform exactly that step, write the status, and requeue by cause. Live changes (settings
//! CONFIG SET can change, ACL users) are applied once the cluster has converged, and a new
//! node gets the ACL users before it becomes Active.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{Event as Finalized, finalizer};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::render::ClusterRender;
use super::status::{set_condition, versions_running};
use crate::acl;
use crate::api::{
    ClusterNodeStatus, ClusterState, NodeLifecycle, NodeRole, RollStatus, ShardStatus,
    ValkeyCluster, ValkeyClusterStatus, ValkeyNode, labels,
};
use crate::fleet::Fleet;
use crate::metrics::{Metrics, RollProgress};
use crate::resolve;
use crate::roll::{DesiredShape, Lifecycle, ObservedNode, Role, RollMemory, Step, plan};
use crate::runtime::driver::Timeouts;
use crate::runtime::observe::{Member, observe};
use crate::settings::OperatorSettings;
use crate::valkey::{EngineError, NodeClient, forget_everywhere};

/// The field manager of everything the controller writes.
pub const MANAGER: &str = "valkey-operator";
/// The finalizer that retires a cluster's nodes before it goes.
pub const FINALIZER: &str = "valkey.gomomento.com/retire-nodes";
/// On a ValkeyNode created as a replica: the ValkeyNode it replicates.
pub const REPLICA_OF_ANNOTATION: &str = "valkey.gomomento.com/replica-of";

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub fleet: Arc<RwLock<Fleet>>,
    pub settings: OperatorSettings,
    pub timeouts: Timeouts,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
}

/// Why a reconcile failed; retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Valkey: {0}")]
    Engine(#[from] EngineError),
    #[error("{0}")]
    Finalizer(#[from] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("the ValkeyCluster has no namespace")]
    NoNamespace,
}

impl Error {
    /// A small, bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kubernetes",
            Error::Engine(error) => error.category(),
            Error::Finalizer(_) => "finalizer",
            Error::NoNamespace => "invalid",
        }
    }
}

/// Reconciles one cluster (the entry point the controller runs).
pub async fn reconcile(cluster: Arc<ValkeyCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, cluster, |event| async {
        match event {
            Finalized::Apply(cluster) => apply(&cluster, &ctx).await,
            Finalized::Cleanup(cluster) => cleanup(&cluster, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .reconciled(started, result.as_ref().err().map(Error::category));
    result
}

/// Everything one reconcile reads about a cluster's nodes.
struct Nodes {
    objects: Vec<ValkeyNode>,
    pods: BTreeMap<String, Pod>,
}

impl Nodes {
    fn address(&self, node: &ValkeyNode) -> Option<String> {
        let pod = self.pods.get(&node.name_any())?;
        let ip = pod.status.as_ref()?.pod_ip.clone()?;
        Some(format!("{ip}:{}", super::render::VALKEY_PORT))
    }

    fn by_name(&self, name: &str) -> Option<&ValkeyNode> {
        self.objects.iter().find(|n| n.name_any() == name)
    }
}

fn apis(ctx: &Context, namespace: &str) -> (Api<ValkeyNode>, Api<Pod>) {
    (
        Api::namespaced(ctx.client.clone(), namespace),
        Api::namespaced(ctx.client.clone(), namespace),
    )
}

async fn read_nodes(
    ctx: &Context,
    cluster: &ValkeyCluster,
    namespace: &str,
) -> Result<Nodes, Error> {
    let (node_api, pod_api) = apis(ctx, namespace);
    let selector =
        ListParams::default().labels(&format!("{}={}", labels::CLUSTER, cluster.name_any()));
    let objects = node_api.list(&selector).await?.items;
    let pods = pod_api
        .list(&selector)
        .await?
        .items
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect();
    Ok(Nodes { objects, pods })
}

fn lifecycle(node: &ValkeyNode) -> Lifecycle {
    match node.status.as_ref().and_then(|s| s.lifecycle) {
        Some(NodeLifecycle::Active) => Lifecycle::Active,
        _ => Lifecycle::Joining,
    }
}

fn members(nodes: &Nodes, join_timeout: Duration) -> Vec<Member> {
    let now = Timestamp::now();
    let limit = SignedDuration::try_from(join_timeout).unwrap_or(SignedDuration::MAX);
    nodes
        .objects
        .iter()
        .map(|node| {
            let created = node.metadata.creation_timestamp.as_ref().map(|t| t.0);
            Member {
                name: node.name_any(),
                shard: u32::try_from(node.spec.shard).unwrap_or(0),
                revision: node.spec.revision.clone(),
                lifecycle: lifecycle(node),
                join_overdue: lifecycle(node) == Lifecycle::Joining
                    && created.is_some_and(|c| c + limit < now),
                address: nodes.address(node),
                id: node.status.as_ref().and_then(|s| s.node_id.clone()),
            }
        })
        .collect()
}

fn memory_of(cluster: &ValkeyCluster) -> RollMemory {
    let roll = cluster
        .status
        .as_ref()
        .and_then(|s| s.roll.clone())
        .unwrap_or_default();
    RollMemory {
        revision: roll.revision,
        failed_over_shards: roll
            .failed_over_shards
            .iter()
            .filter_map(|s| u32::try_from(*s).ok())
            .collect(),
    }
}

async fn apply(cluster: &ValkeyCluster, ctx: &Context) -> Result<Action, Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let resolved = {
        let fleet = ctx.fleet.read().unwrap_or_else(|p| p.into_inner());
        resolve::resolve(&cluster.spec.config_ref, &*fleet)
    };
    let effective = match resolved {
        Ok(effective) => effective,
        Err(error) => {
            let message = format!("spec.configRef does not resolve: {error}");
            write_status(ctx, cluster, |status| {
                degraded(status, cluster, "ConfigUnresolved", &message);
            })
            .await?;
            // Often only a cache catching up with a config created a moment ago.
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    let render = ClusterRender {
        cluster,
        effective: &effective,
        default_zone_spread: ctx.settings.default_zone_spread,
    };
    let prepared = async {
        ensure_owned_objects(ctx, &render, &namespace).await?;
        let nodes = read_nodes(ctx, cluster, &namespace).await?;
        create_missing_pods(ctx, &render, &nodes, &namespace).await?;
        finish_joins(ctx, &nodes, &namespace).await?;
        let nodes = read_nodes(ctx, cluster, &namespace).await?;
        let observed = observe(&members(&nodes, ctx.timeouts.join), ctx.timeouts.call).await;
        sync_roles(ctx, &nodes, &observed, &namespace, &render).await?;
        Ok::<_, Error>((nodes, observed))
    }
    .await;
    let (nodes, observed) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            // Said in the status too, so `kubectl describe` shows why nothing moves.
            let message = format!("preparing the next step: {error}");
            write_status(ctx, cluster, |status| {
                degraded(status, cluster, "StepFailed", &message)
            })
            .await?;
            return Err(error);
        }
    };
    let desired = DesiredShape {
        shards: u32::try_from(cluster.spec.shards).unwrap_or(1),
        replicas_per_shard: u32::try_from(cluster.spec.replicas_per_shard).unwrap_or(0),
        revision: render.revision(),
    };
    let memory = memory_of(cluster);
    let step = plan(&desired, &observed, &memory);
    ctx.metrics.roll_progress(
        &namespace,
        &cluster.name_any(),
        &progress(&desired, &observed, &step),
    );
    tracing::info!(cluster = %cluster.name_any(), %namespace, %step, "planned");
    let acted = act(ctx, cluster, &render, &nodes, &observed, &desired, &step).await;
    if let Err(error) = &acted {
        tracing::warn!(cluster = %cluster.name_any(), %step, %error, "step failed");
    }
    if matches!(step, Step::Converged) {
        apply_live_settings(ctx, &render, &observed, &nodes).await;
        apply_live_acl(ctx, cluster, &observed, &nodes).await;
    }
    let summary = summarize(
        cluster,
        &nodes,
        &observed,
        &desired,
        &step,
        acted.as_ref().err(),
    );
    write_status(ctx, cluster, summary).await?;
    acted?;
    Ok(match step {
        Step::Converged => Action::requeue(Duration::from_secs(60)),
        Step::Stalled { .. } => Action::requeue(Duration::from_secs(5)),
        Step::Wait { .. } => Action::requeue(Duration::from_secs(1)),
        _ => Action::requeue(Duration::from_millis(200)),
    })
}

async fn ensure_owned_objects(
    ctx: &Context,
    render: &ClusterRender<'_>,
    namespace: &str,
) -> Result<(), Error> {
    let apply = PatchParams::apply(MANAGER).force();
    let service = render.headless_service();
    Api::<Service>::namespaced(ctx.client.clone(), namespace)
        .patch(&service.name_any(), &apply, &Patch::Apply(&service))
        .await?;
    let budget = render.disruption_budget();
    Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace)
        .patch(&budget.name_any(), &apply, &Patch::Apply(&budget))
        .await?;
    Ok(())
}

/// Keeps each node's `status.role`, and its Pod's role label and annotations, in step with
/// what the node reports (a failover swaps roles; podAnnotations are patched onto live Pods).
async fn sync_roles(
    ctx: &Context,
    nodes: &Nodes,
    observed: &[ObservedNode],
    namespace: &str,
    render: &ClusterRender<'_>,
) -> Result<(), Error> {
    let (node_api, pod_api) = apis(ctx, namespace);
    let wanted_annotations = &render.cluster.spec.pod_annotations;
    for seen in observed.iter().filter(|o| o.reachable) {
        let Some(node) = nodes.by_name(&seen.name) else {
            continue;
        };
        let role = match seen.role {
            Role::Primary => NodeRole::Primary,
            Role::Replica => NodeRole::Replica,
        };
        if node.status.as_ref().and_then(|s| s.role) != Some(role) {
            let patch = json!({"status": {"role": role}});
            node_api
                .patch_status(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        let Some(pod) = nodes.pods.get(&seen.name) else {
            continue;
        };
        let label = super::render::role_label(role);
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let missing = wanted_annotations
            .iter()
            .any(|(k, v)| annotations.get(k) != Some(v));
        if pod.labels().get(labels::ROLE).map(String::as_str) != Some(label) || missing {
            let patch = json!({"metadata": {"labels": {labels::ROLE: label}, "annotations": wanted_annotations}});
            pod_api
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    Ok(())
}

/// A node's client, once it has an address.
async fn client_of(ctx: &Context, nodes: &Nodes, name: &str) -> Result<NodeClient, Error> {
    let address = nodes
        .by_name(name)
        .and_then(|n| nodes.address(n))
        .ok_or_else(|| EngineError::Reply {
            node: name.to_string(),
            command: "connect".into(),
            reply: "the node's Pod has no IP yet".into(),
        })?;
    Ok(NodeClient::connect(&address, ctx.timeouts.call).await?)
}

/// Creates the Pod of a node that never had one running (its creation failed after the
/// ValkeyNode was created, e.g. refused by RBAC or a quota). A node that did run is not
/// restarted here: if its Pod is gone it is unreachable, and the planner replaces it.
async fn create_missing_pods(
    ctx: &Context,
    render: &ClusterRender<'_>,
    nodes: &Nodes,
    namespace: &str,
) -> Result<(), Error> {
    let (_, pod_api) = apis(ctx, namespace);
    for node in &nodes.objects {
        let never_ran = node
            .status
            .as_ref()
            .and_then(|s| s.node_id.as_ref())
            .is_none();
        let deleting = node.metadata.deletion_timestamp.is_some();
        if nodes.pods.contains_key(&node.name_any()) || !never_ran || deleting {
            continue;
        }
        let role = if node.annotations().contains_key(REPLICA_OF_ANNOTATION) {
            NodeRole::Replica
        } else {
            NodeRole::Primary
        };
        match pod_api
            .create(&PostParams::default(), &render.pod(node, role))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Makes the nodes whose Pods answer into one cluster, before every plan (so it also finishes
/// a join interrupted by a restart): records each node's id and address in its status, has
/// every node meet any member it does not know yet (`CLUSTER MEET`; two primaries created in
/// one bootstrap must meet whichever came up first), and attaches a `Joining` replica to the
/// primary it was created for.
async fn finish_joins(ctx: &Context, nodes: &Nodes, namespace: &str) -> Result<(), Error> {
    let (node_api, _) = apis(ctx, namespace);
    let mut live: Vec<(&ValkeyNode, NodeClient, String)> = Vec::new();
    for node in &nodes.objects {
        let Some(address) = nodes.address(node) else {
            continue;
        };
        let Ok(client) = NodeClient::connect(&address, ctx.timeouts.call).await else {
            continue;
        };
        let Ok(id) = client.my_id().await else {
            continue;
        };
        if node.status.as_ref().and_then(|s| s.node_id.as_deref()) != Some(id.as_str()) {
            let ip = address
                .rsplit_once(':')
                .map_or(address.as_str(), |(ip, _)| ip);
            let patch =
                json!({"status": {"nodeId": id, "address": ip, "podName": node.name_any()}});
            node_api
                .patch_status(
                    &node.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
        live.push((node, client, id));
    }
    for (node, client, _) in &live {
        let known: Vec<String> = client
            .cluster_nodes()
            .await?
            .into_iter()
            .map(|n| n.id)
            .collect();
        for (peer, _, peer_id) in &live {
            if peer.name_any() == node.name_any() || known.contains(peer_id) {
                continue;
            }
            let Some(peer_address) = nodes.address(peer) else {
                continue;
            };
            let Some((ip, port)) = peer_address.rsplit_once(':') else {
                continue;
            };
            client
                .meet(
                    ip,
                    port.parse().unwrap_or(super::render::VALKEY_PORT as u16),
                )
                .await?;
        }
    }
    for (node, client, _) in live
        .iter()
        .filter(|(n, _, _)| lifecycle(n) == Lifecycle::Joining)
    {
        let Some(primary) = node.annotations().get(REPLICA_OF_ANNOTATION) else {
            continue;
        };
        if client.replication_info().await?.role != Role::Replica {
            let Some((_, _, primary_id)) = live.iter().find(|(n, _, _)| n.name_any() == *primary)
            else {
                continue;
            };
            client.replicate(primary_id, ctx.timeouts.start).await?;
        }
    }
    Ok(())
}

fn node_name(cluster: &ValkeyCluster, shard: u32) -> String {
    let nanos = Timestamp::now().as_nanosecond();
    let digest =
        <sha2::Sha256 as sha2::Digest>::digest(format!("{}/{shard}/{nanos}", cluster.name_any()));
    let suffix: String = digest.iter().take(3).map(|b| format!("{b:02x}")).collect();
    format!("{}-{shard}-{}", cluster.name_any(), &suffix[..5])
}

/// Records an Event on the cluster. `node` names the ValkeyNode it concerns: kube's recorder
/// folds events with the same reason and related object into one series (keeping the first
/// note), so without it every join of a roll would show as the first one, counted.
async fn event(
    ctx: &Context,
    cluster: &ValkeyCluster,
    node: Option<&str>,
    reason: &str,
    action: &str,
    note: String,
    warning: bool,
) {
    let secondary = node.map(|name| ObjectReference {
        api_version: Some(ValkeyNode::api_version(&()).into_owned()),
        kind: Some(ValkeyNode::kind(&()).into_owned()),
        name: Some(name.to_string()),
        namespace: cluster.namespace(),
        ..Default::default()
    });
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary,
    };
    if let Err(error) = ctx.recorder.publish(&event, &cluster.object_ref(&())).await {
        tracing::warn!(%error, "could not record an event");
    }
}

#[allow(clippy::too_many_arguments)]
async fn act(
    ctx: &Context,
    cluster: &ValkeyCluster,
    render: &ClusterRender<'_>,
    nodes: &Nodes,
    observed: &[ObservedNode],
    desired: &DesiredShape,
    step: &Step,
) -> Result<(), Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let (node_api, pod_api) = apis(ctx, &namespace);
    match step {
        Step::JoinPrimary { shard } | Step::JoinReplica { shard, .. } => {
            let mut node = render.node(
                &node_name(cluster, *shard),
                i32::try_from(*shard).unwrap_or(0),
            );
            let role = match step {
                Step::JoinReplica { primary, .. } => {
                    node.annotations_mut()
                        .insert(REPLICA_OF_ANNOTATION.into(), primary.clone());
                    NodeRole::Replica
                }
                _ => NodeRole::Primary,
            };
            let created = node_api.create(&PostParams::default(), &node).await?;
            let status = json!({"status": {"lifecycle": "Joining", "podName": created.name_any()}});
            node_api
                .patch_status(
                    &created.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await?;
            pod_api
                .create(&PostParams::default(), &render.pod(&created, role))
                .await?;
            event(
                ctx,
                cluster,
                Some(&created.name_any()),
                "NodeJoining",
                "Join",
                format!("{}: {step}", created.name_any()),
                false,
            )
            .await;
        }
        Step::Activate { node, shard } => {
            // Every Active node serves the cluster's users, also mid-roll after a failover.
            let users = desired_acl(ctx, cluster);
            apply_acl(&client_of(ctx, nodes, node).await?, &users).await?;
            let status = json!({"status": {"lifecycle": "Active"}});
            node_api
                .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
            event(
                ctx,
                cluster,
                Some(node),
                "NodeActive",
                "Activate",
                format!("{node} is an active member of shard {shard}"),
                false,
            )
            .await;
        }
        Step::AssignSlots { assignments } => {
            for (node, slots) in assignments {
                client_of(ctx, nodes, node)
                    .await?
                    .add_slots_range(slots)
                    .await?;
            }
        }
        Step::Failover { shard, from, to } => {
            // Remembered before it is issued: whatever happens next, never a second one.
            let mut memory = memory_of(cluster);
            memory.record_failover(&desired.revision, *shard);
            let roll = RollStatus {
                revision: memory.revision.clone(),
                failed_over_shards: memory
                    .failed_over_shards
                    .iter()
                    .filter_map(|s| i32::try_from(*s).ok())
                    .collect(),
            };
            let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), &namespace);
            api.patch_status(
                &cluster.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"roll": roll}})),
            )
            .await?;
            event(
                ctx,
                cluster,
                Some(to),
                "Failover",
                "Failover",
                format!("{step}"),
                false,
            )
            .await;
            let started = std::time::Instant::now();
            let old_primary = client_of(ctx, nodes, from).await?;
            let result = client_of(ctx, nodes, to)
                .await?
                .failover(&old_primary, ctx.timeouts.failover)
                .await;
            ctx.metrics
                .failover(&namespace, &cluster.name_any(), result.is_ok(), started);
            result?;
        }
        Step::MigrateSlots {
            from, to, slots, ..
        } => {
            event(
                ctx,
                cluster,
                Some(to),
                "SlotMigration",
                "MigrateSlots",
                format!("{step}"),
                false,
            )
            .await;
            let target = client_of(ctx, nodes, to).await?.my_id().await?;
            let result = client_of(ctx, nodes, from)
                .await?
                .migrate_slots(&target, slots, ctx.timeouts.migration)
                .await;
            ctx.metrics
                .slot_migration(&namespace, &cluster.name_any(), result.is_ok());
            result?;
        }
        Step::RetireNode { node, .. } => {
            let id = nodes
                .by_name(node)
                .and_then(|n| n.status.as_ref()?.node_id.clone());
            delete_node(&node_api, &pod_api, node).await?;
            if let Some(id) = id {
                let mut remaining = Vec::new();
                for other in observed.iter().filter(|o| o.name != *node && o.reachable) {
                    if let Ok(client) = client_of(ctx, nodes, &other.name).await {
                        remaining.push(client);
                    }
                }
                forget_everywhere(&remaining, &id).await?;
            }
            event(
                ctx,
                cluster,
                Some(node),
                "NodeRetired",
                "Retire",
                format!("{step}"),
                false,
            )
            .await;
        }
        Step::Stalled { reason } => {
            event(
                ctx,
                cluster,
                None,
                "RollStalled",
                "Plan",
                reason.to_string(),
                true,
            )
            .await;
        }
        Step::Wait { .. } | Step::Converged => {}
    }
    Ok(())
}

/// The roll-progress figures of one reconcile.
fn progress(desired: &DesiredShape, observed: &[ObservedNode], step: &Step) -> RollProgress {
    let shards: std::collections::BTreeSet<u32> = observed.iter().map(|o| o.shard).collect();
    let up_to_date = (0..desired.shards)
        .filter(|shard| {
            let mut in_shard = observed.iter().filter(|o| o.shard == *shard).peekable();
            in_shard.peek().is_some() && in_shard.all(|o| o.is_up_to_date(desired))
        })
        .count();
    RollProgress {
        shards: usize::try_from(desired.shards)
            .unwrap_or(usize::MAX)
            .max(shards.len()),
        shards_up_to_date: up_to_date,
        outdated_nodes: observed
            .iter()
            .filter(|o| !o.is_up_to_date(desired))
            .count(),
        in_progress: !matches!(step, Step::Converged),
    }
}

/// Deletes a node's Pod and ValkeyNode (works with or without garbage collection).
async fn delete_node(
    node_api: &Api<ValkeyNode>,
    pod_api: &Api<Pod>,
    name: &str,
) -> Result<(), Error> {
    for result in [
        pod_api
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ()),
        node_api
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ()),
    ] {
        match result {
            Ok(()) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Settings CONFIG SET can change are applied to every reachable node in place.
async fn apply_live_settings(
    ctx: &Context,
    render: &ClusterRender<'_>,
    observed: &[ObservedNode],
    nodes: &Nodes,
) {
    let settings = render.live_settings();
    for node in observed.iter().filter(|o| o.reachable) {
        let Ok(client) = client_of(ctx, nodes, &node.name).await else {
            continue;
        };
        for (key, value) in &settings {
            if let Err(error) = client.config_set(key, value).await {
                tracing::warn!(node = %node.name, %key, %error, "could not apply a setting live");
            }
        }
    }
}

/// The cluster's ACL users as `ACL SETUSER` rules (from the roles in the fleet index), and what
/// could not be rendered (a user naming a role that does not exist is left as it is).
struct DesiredAcl {
    users: Vec<(String, Vec<String>)>,
    /// Users the spec names: every other user but `default` is deleted.
    keep: BTreeSet<String>,
    problems: Vec<String>,
}

fn desired_acl(ctx: &Context, cluster: &ValkeyCluster) -> DesiredAcl {
    let fleet = ctx.fleet.read().unwrap_or_else(|p| p.into_inner());
    let mut desired = DesiredAcl {
        users: Vec::new(),
        keep: BTreeSet::from([acl::DEFAULT_USER.to_string()]),
        problems: Vec::new(),
    };
    for user in &cluster.spec.acl {
        desired.keep.insert(user.username.clone());
        match acl::user_rules(user, |role| fleet.role(role)) {
            Ok(rules) => desired.users.push((user.username.clone(), rules)),
            Err(problem) => desired.problems.push(problem),
        }
    }
    desired
}

/// Writes the users on one node (each whole, in one command) and deletes the ones the spec no
/// longer names.
async fn apply_acl(client: &NodeClient, desired: &DesiredAcl) -> Result<(), Error> {
    for (username, rules) in &desired.users {
        client.acl_set_user(username, rules).await?;
    }
    for stale in client
        .acl_users()
        .await?
        .iter()
        .filter(|user| !desired.keep.contains(*user))
    {
        client.acl_del_user(stale).await?;
    }
    Ok(())
}

/// [`apply_acl`] on every reachable node; a role that does not exist is reported as an event.
async fn apply_live_acl(
    ctx: &Context,
    cluster: &ValkeyCluster,
    observed: &[ObservedNode],
    nodes: &Nodes,
) {
    let desired = desired_acl(ctx, cluster);
    for problem in &desired.problems {
        event(
            ctx,
            cluster,
            None,
            "AclRoleMissing",
            "ApplyAcl",
            format!("spec.acl: {problem}; that user is left as it was"),
            true,
        )
        .await;
    }
    for node in observed.iter().filter(|o| o.reachable) {
        let applied =
            async { apply_acl(&client_of(ctx, nodes, &node.name).await?, &desired).await };
        if let Err(error) = applied.await {
            tracing::warn!(node = %node.name, %error, "could not apply the ACL users");
        }
    }
}

/// Retires every node of a deleted cluster; the Service and budget go with their owner.
async fn cleanup(cluster: &ValkeyCluster, ctx: &Context) -> Result<Action, Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let (node_api, pod_api) = apis(ctx, &namespace);
    let nodes = read_nodes(ctx, cluster, &namespace).await?;
    for node in &nodes.objects {
        delete_node(&node_api, &pod_api, &node.name_any()).await?;
    }
    event(
        ctx,
        cluster,
        None,
        "Deleted",
        "Cleanup",
        format!("retired {} nodes", nodes.objects.len()),
        false,
    )
    .await;
    ctx.metrics.forget_cluster(&namespace, &cluster.name_any());
    Ok(Action::await_change())
}

fn degraded(
    status: &mut ValkeyClusterStatus,
    cluster: &ValkeyCluster,
    reason: &str,
    message: &str,
) {
    let now = Time(Timestamp::now());
    let generation = cluster.metadata.generation;
    set_condition(
        &mut status.conditions,
        "Degraded",
        true,
        reason,
        message,
        generation,
        now,
    );
}

/// Computes the status from what was observed and done.
fn summarize<'a>(
    cluster: &'a ValkeyCluster,
    nodes: &'a Nodes,
    observed: &'a [ObservedNode],
    desired: &'a DesiredShape,
    step: &'a Step,
    failure: Option<&'a Error>,
) -> impl FnOnce(&mut ValkeyClusterStatus) + 'a {
    move |status| {
        let now = Time(Timestamp::now());
        let generation = cluster.metadata.generation;
        let outdated = observed
            .iter()
            .filter(|o| !o.is_up_to_date(desired))
            .count();
        let slots_served: u32 = observed
            .iter()
            .filter(|o| o.reachable && o.role == Role::Primary)
            .map(|o| o.slot_count())
            .sum();
        let all_served = slots_served == 16384;
        if all_served {
            status.state = Some(ClusterState::Active);
        } else if status.state.is_none() {
            status.state = Some(ClusterState::Creating);
        }
        status.observed_generation = generation;
        status.desired_revision = Some(desired.revision.clone());
        status.outdated_nodes = Some(i32::try_from(outdated).unwrap_or(i32::MAX));
        status.version = Some(versions_running(
            nodes.objects.iter().map(|n| n.spec.version.as_str()),
        ));
        status.nodes = nodes
            .objects
            .iter()
            .map(|node| {
                let seen = observed.iter().find(|o| o.name == node.name_any());
                ClusterNodeStatus {
                    name: node.name_any(),
                    shard: node.spec.shard,
                    role: seen.filter(|o| o.reachable).map(|o| match o.role {
                        Role::Primary => NodeRole::Primary,
                        Role::Replica => NodeRole::Replica,
                    }),
                    lifecycle: node.status.as_ref().and_then(|s| s.lifecycle),
                    version: node.spec.version.clone(),
                    outdated: node.spec.revision != desired.revision,
                }
            })
            .collect();
        status.shards = (0..cluster.spec.shards)
            .map(|index| ShardStatus {
                index,
                primary: observed
                    .iter()
                    .find(|o| {
                        o.reachable
                            && o.role == Role::Primary
                            && i64::from(o.shard) == i64::from(index)
                            && o.slot_count() > 0
                    })
                    .map(|o| o.name.clone()),
            })
            .collect();
        let ready_message = if all_served {
            "every slot is served"
        } else {
            "not every slot is served yet"
        };
        set_condition(
            &mut status.conditions,
            "Ready",
            all_served,
            if all_served {
                "AllSlotsServed"
            } else {
                "SlotsUnserved"
            },
            ready_message,
            generation,
            now.clone(),
        );
        let progressing = !matches!(step, Step::Converged);
        let progress = match step.shard() {
            Some(shard) => format!("shard {shard}: {step}"),
            None => step.to_string(),
        };
        set_condition(
            &mut status.conditions,
            "Progressing",
            progressing,
            if progressing { "Rolling" } else { "UpToDate" },
            &progress,
            generation,
            now.clone(),
        );
        let problem = match (step, failure) {
            (Step::Stalled { reason }, _) => Some(("RollStalled", reason.to_string())),
            (_, Some(error)) => Some(("StepFailed", format!("{step}: {error}"))),
            _ => None,
        };
        match problem {
            Some((reason, message)) => set_condition(
                &mut status.conditions,
                "Degraded",
                true,
                reason,
                &message,
                generation,
                now,
            ),
            None => set_condition(
                &mut status.conditions,
                "Degraded",
                false,
                "Healthy",
                "",
                generation,
                now,
            ),
        }
    }
}

/// Reads the cluster's current status, lets `update` change it, and writes it back.
async fn write_status(
    ctx: &Context,
    cluster: &ValkeyCluster,
    update: impl FnOnce(&mut ValkeyClusterStatus),
) -> Result<(), Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<ValkeyCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut status = api
        .get_status(&cluster.name_any())
        .await?
        .status
        .unwrap_or_default();
    update(&mut status);
    api.patch_status(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await?;
    Ok(())
}
