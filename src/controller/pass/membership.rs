//! Step 4 of a pass, membership: keeping a cluster's members in place before the planner looks. The
//! objects the cluster owns (its headless Service, PodDisruptionBudget and NetworkPolicy), the
//! operator's finalizer on every node, the Pod of a node whose creation was cut short, the
//! executor's membership pass (ids, MEET, REPLICATE, FORGET; `crate::execute::membership`), then
//! what every node says (which are silent, by the operator's clock) and each node's role in its
//! status and Pod labels, with the cluster's podAnnotations.
//!
//! These run outside the planner, on every pass, because none of them is a step of a roll: each is
//! idempotent, safe at any time, and finishes work a restart may have interrupted. The planner only
//! sees their result. The owned objects are the exception to "every pass": once applied, they are
//! applied again only when they render differently, when one of them is deleted (a watch says so,
//! see [`AppliedObjects`]'s forget), or after [`crate::controller::memory::REFRESH`], so a
//! converged cluster costs the API server nothing for them.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::api::ClusterKey;
use crate::api::annotations::HANDOVER_REQUESTED;
use crate::api::field_managers::CONTROLLER as MANAGER;
use crate::api::{NodeRole, ValkeyNode};
use crate::api::{annotations, finalizers};
use crate::controller::build::render::ClusterRender;
use crate::controller::build::status::{Reason, node_role};
use crate::controller::error::Error;
use crate::controller::events::{ClusterEvent, publish};
use crate::controller::host::{KubeHost, hold};
use crate::controller::memory::owned::Standing;
use crate::controller::memory::owned::{AppliedObjects, Owned};
use crate::controller::memory::silence::silence_bound;
use crate::controller::pass::{Halt, Pass};
use crate::controller::view::has_stopped;
use crate::execute::observe::observe;
use crate::execute::{self, NodeHost};
use crate::roll::ObservedNode;
use crate::valkey::Reach;

/// Puts the cluster's members in place and returns what every node says. A failure is said
/// in the status (`StepFailed`, or `NameConflict` where an object of the cluster's name is
/// someone else's) and fails the pass.
pub async fn membership(
    pass: &Pass<'_>,
    render: &ClusterRender<'_>,
    host: &mut KubeHost<'_>,
    reach: &Reach,
) -> Result<Vec<ObservedNode>, Halt> {
    pass.ctx.fence()?;
    match put_in_place(pass, render, host, reach).await {
        Ok(observed) => Ok(observed),
        Err(error @ Error::NotOurs { .. }) => {
            let problem = error.to_string();
            let event = ClusterEvent::NameConflict { problem };
            publish(&pass.ctx.recorder, pass.cluster, &event).await;
            let reason = Reason::NameConflict;
            Err(Halt::Failed { reason, error })
        }
        Err(error) => {
            let reason = Reason::StepFailed;
            Err(Halt::Failed { reason, error })
        }
    }
}

async fn put_in_place(
    pass: &Pass<'_>,
    render: &ClusterRender<'_>,
    host: &mut KubeHost<'_>,
    reach: &Reach,
) -> Result<Vec<ObservedNode>, Error> {
    let (ctx, namespace) = (pass.ctx, pass.namespace.as_str());
    let operator_namespace = &ctx.settings.operator_namespace;
    let memory = &ctx.memory.applied_owned;
    let conflict =
        apply_owned_objects(&ctx.client, memory, render, host, operator_namespace).await?;
    if let Some(conflict) = conflict {
        tracing::warn!(cluster = %pass.key.name, %conflict, "NetworkPolicy not applied");
        let problem = conflict.to_string();
        let event = ClusterEvent::NameConflict { problem };
        publish(&ctx.recorder, pass.cluster, &event).await;
    }
    hold_nodes(host, &ctx.client, namespace).await?;
    bound_handover_times(host, &ctx.client, namespace, Timestamp::now()).await?;
    create_missing_pods(&ctx.client, render, host, namespace).await?;
    execute::membership::introduce(host, &ctx.timeouts, reach).await?;
    let members = host.members();
    let mut observed = observe(&members, reach).await;
    let bound = silence_bound(render.node_timeout());
    let silence = &ctx.memory.silence;
    silence.judge(&pass.key, &members, &mut observed, bound);
    sync_roles(&ctx.client, host, &observed, render, namespace).await?;
    Ok(observed)
}

/// A digest of the object as rendered (its owner's uid included, so a cluster recreated under
/// the same name applies it again). `None` if it cannot be serialized: then it is always applied.
fn rendered_fingerprint(object: &impl serde::Serialize) -> Option<u64> {
    let rendered = serde_json::to_string(object).ok()?;
    let mut hasher = DefaultHasher::new();
    rendered.hash(&mut hasher);
    Some(hasher.finish())
}

/// Server-side applies the cluster's headless Service, PodDisruptionBudget (sized for the
/// Pods the cluster has now, see [`ClusterRender::disruption_budget`]) and NetworkPolicy, each
/// only if no object of that name exists or the existing one is this cluster's: a force-apply
/// would otherwise take over an object someone else owns (and garbage collection would delete
/// it later). A NetworkPolicy that is someone else's is returned rather than failing the pass.
///
/// Each object is sent only when it renders differently from when it was last applied (see
/// [`AppliedObjects`]): a roll resizes the budget at every node it adds or retires, and sends
/// nothing else for it.
pub async fn apply_owned_objects(
    client: &kube::Client,
    applied: &AppliedObjects,
    render: &ClusterRender<'_>,
    host: &KubeHost<'_>,
    operator_namespace: &str,
) -> Result<Option<Error>, Error> {
    let service = render.headless_service();
    let key = ClusterKey::new(
        service.namespace().unwrap_or_default(),
        render.cluster.name_any(),
    );
    let namespace = key.namespace.as_str();
    let owned = Owner {
        applied,
        key: &key,
        owner: render.owner_uid(),
    };
    let services = Api::<Service>::namespaced(client.clone(), namespace);
    owned.apply(&services, Owned::Service, service).await?;
    let budget = render.disruption_budget(serving_pods(host));
    let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace);
    owned.apply(&budgets, Owned::Budget, budget).await?;
    // A policy of that name that is not the cluster's is no reason to stop managing the
    // cluster (an upgrade may meet one a person made): it is left alone and returned, to say
    // (and looked at again next pass, so the conflict is said until it is resolved).
    let policy = render.network_policy(operator_namespace);
    let policies = Api::<NetworkPolicy>::namespaced(client.clone(), namespace);
    match owned.apply(&policies, Owned::Policy, policy).await {
        Err(conflict @ Error::NotOurs { .. }) => Ok(Some(conflict)),
        Err(error) => Err(error),
        Ok(()) => Ok(None),
    }
}

/// One cluster's owned objects, as [`apply_owned_objects`] sends them.
struct Owner<'a> {
    applied: &'a AppliedObjects,
    key: &'a ClusterKey,
    /// The cluster's uid.
    owner: Option<&'a str>,
}

impl Owner<'_> {
    /// Sends `object` if it is not current: over the object applied before (by its uid), or,
    /// when that is not known or the uid no longer matches, as [`apply_if_ours`] does.
    async fn apply<K>(&self, api: &Api<K>, which: Owned, object: K) -> Result<(), Error>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let digest = rendered_fingerprint(&object);
        let uid = match self.applied.standing(self.key, which, digest) {
            Standing::Current => return Ok(()),
            Standing::Ours(uid) => match apply_over(api, object.clone(), &uid).await {
                Ok(applied) => applied,
                // Gone, or another object of that name (uid mismatch): find out what is there.
                Err(kube::Error::Api(status)) if [404, 409, 422].contains(&status.code) => {
                    self.applied.forget_object(self.key, which);
                    apply_if_ours(api, object, self.owner).await?
                }
                Err(error) => return Err(error.into()),
            },
            Standing::Unknown => apply_if_ours(api, object, self.owner).await?,
        };
        // Recorded only once applied: a failed apply is tried again next pass.
        if let Some(digest) = digest {
            self.applied.record(self.key, which, digest, uid);
        }
        Ok(())
    }
}

/// Applies `object` over the object of its name whose uid is `uid`, and only over that one:
/// the API server refuses an apply whose `metadata.uid` differs from the stored object's (422,
/// "field is immutable") and one that names a uid no object has (409, "uid mismatch").
async fn apply_over<K>(
    api: &Api<K>,
    mut object: K,
    uid: &str,
) -> Result<Option<String>, kube::Error>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    object.meta_mut().uid = Some(uid.to_owned());
    let apply = PatchParams::apply(MANAGER).force();
    let applied = api
        .patch(&object.name_any(), &apply, &Patch::Apply(&object))
        .await?;
    Ok(applied.meta().uid.clone())
}

/// Creates `object` if no object of its name exists (a create fails rather than take over one
/// made in the meantime), applies it over one that `owner` controls, and leaves any other
/// alone. The uid of the object it was sent to.
async fn apply_if_ours<K>(
    api: &Api<K>,
    object: K,
    owner: Option<&str>,
) -> Result<Option<String>, Error>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = object.name_any();
    let sent = match api.get_opt(&name).await? {
        None => {
            let create = PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            api.create(&create, &object).await?
        }
        Some(existing) if is_controlled_by(&existing, owner) => {
            let apply = PatchParams::apply(MANAGER).force();
            api.patch(&name, &apply, &Patch::Apply(&object)).await?
        }
        Some(existing) => {
            return Err(Error::NotOurs {
                kind: K::kind(&()).into_owned(),
                namespace: existing.namespace().unwrap_or_default(),
                name,
            });
        }
    };
    Ok(sent.meta().uid.clone())
}

/// Whether `object`'s controller ownerReference is the owner with uid `owner`.
pub(in crate::controller) fn is_controlled_by<K: kube::Resource>(
    object: &K,
    owner: Option<&str>,
) -> bool {
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|reference| {
            reference.controller == Some(true) && Some(reference.uid.as_str()) == owner
        })
}

/// The cluster's Pods that are not going away: the ones a disruption budget protects.
fn serving_pods(host: &KubeHost<'_>) -> usize {
    host.nodes
        .pods
        .values()
        .filter(|pod| !pod.deleting && !has_stopped(pod))
        .count()
}

/// Puts the operator's finalizer on nodes created before it existed (new nodes get it when
/// created): from then on, a ValkeyNode deleted by hand is replaced before it goes.
pub async fn hold_nodes(
    host: &KubeHost<'_>,
    client: &kube::Client,
    namespace: &str,
) -> Result<(), Error> {
    let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), namespace);
    let unheld = host.nodes.objects.iter().filter(|n| {
        n.metadata.deletion_timestamp.is_none()
            && !n.finalizers().iter().any(|f| f == finalizers::RETIRE_NODE)
    });
    for node in unheld {
        hold(&nodes, &node.name_any(), &host.writes()).await?;
    }
    Ok(())
}

/// Writes back as `now` a handover request dated ahead of the operator's clock: it counts as
/// `now` already (see [`ValkeyNode::handover_requested_at`]), and written so it expires like any
/// other, instead of holding every drain of that node back for as long as the date lies ahead.
pub async fn bound_handover_times(
    host: &KubeHost<'_>,
    client: &kube::Client,
    namespace: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), namespace);
    for node in host
        .nodes
        .objects
        .iter()
        .filter(|n| n.handover_time_ahead(now))
    {
        let name = node.name_any();
        tracing::info!(node = %name, "a handover request dated ahead of this clock: dating it now");
        let patch = json!({"metadata": {
            "annotations": {HANDOVER_REQUESTED: now.to_string()},
            "resourceVersion": node.metadata.resource_version,
        }});
        let patched = nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        host.writes().node(&patched);
    }
    Ok(())
}

/// Creates the Pod of a node that never had one running (its creation failed after the
/// ValkeyNode was created, e.g. refused by RBAC or a quota). A node that did run is not
/// restarted here: if its Pod is gone it is unreachable, and the planner replaces it.
pub async fn create_missing_pods(
    client: &kube::Client,
    render: &ClusterRender<'_>,
    host: &KubeHost<'_>,
    namespace: &str,
) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    for node in host.nodes.objects.iter().filter(|n| needs_pod(host, n)) {
        let role = if node.annotations().contains_key(annotations::REPLICA_OF) {
            NodeRole::Replica
        } else {
            NodeRole::Primary
        };
        match pods
            .create(&PostParams::default(), &render.pod(node, role))
            .await
        {
            Ok(pod) => host.writes().pod(&pod),
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

fn needs_pod(host: &KubeHost<'_>, node: &ValkeyNode) -> bool {
    let never_ran = node
        .status
        .as_ref()
        .and_then(|s| s.node_id.as_ref())
        .is_none();
    let deleting = node.metadata.deletion_timestamp.is_some();
    never_ran && !deleting && !host.nodes.pods.contains_key(&node.name_any())
}

/// Keeps each node's `status.role`, and its Pod's labels and annotations, in step with what
/// the node reports (a failover swaps roles; podAnnotations are patched onto live Pods; labels
/// someone removed or changed are put back, as the watches and the Service find Pods by them).
pub async fn sync_roles(
    client: &kube::Client,
    host: &KubeHost<'_>,
    observed: &[ObservedNode],
    render: &ClusterRender<'_>,
    namespace: &str,
) -> Result<(), Error> {
    let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let wanted_annotations = &render.cluster.spec.pod_annotations;
    for seen in observed.iter().filter(|o| o.reachable) {
        let Some(node) = host.nodes.get(&seen.name) else {
            continue;
        };
        let role = node_role(seen.role);
        if node.status.as_ref().and_then(|s| s.role) != Some(role) {
            let patch = json!({"status": {"role": role}});
            let patched = nodes
                .patch_status(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            host.writes().node(&patched);
        }
        let Some(pod) = host.nodes.pod_of(node) else {
            continue;
        };
        let wanted_labels = render.pod_labels(node, role);
        let differs = |wanted: &BTreeMap<String, String>, has: &BTreeMap<String, String>| {
            wanted.iter().any(|(k, v)| has.get(k) != Some(v))
        };
        if differs(&wanted_labels, &pod.labels) || differs(wanted_annotations, &pod.annotations) {
            if differs(&wanted_labels, &pod.labels) {
                tracing::info!(pod = %seen.name, "putting the Pod's labels back");
            }
            let patch =
                json!({"metadata": {"labels": wanted_labels, "annotations": wanted_annotations}});
            let patched = pods
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            host.writes().pod(&patched);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    #[test]
    fn the_digest_follows_the_rendered_object() {
        let a = serde_json::json!({"metadata": {"ownerReferences": [{"uid": "1"}]}});
        let b = serde_json::json!({"metadata": {"ownerReferences": [{"uid": "2"}]}});
        assert_eq!(rendered_fingerprint(&a), rendered_fingerprint(&a.clone()));
        assert_ne!(
            rendered_fingerprint(&a),
            rendered_fingerprint(&b),
            "a recreated cluster applies again"
        );
    }

    fn service_owned_by(uid: &str, controller: Option<bool>) -> Service {
        let mut service = Service::default();
        service.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "valkey.gomomento.com/v1alpha1".into(),
            kind: "ValkeyCluster".into(),
            name: "orders".into(),
            uid: uid.into(),
            controller,
            block_owner_deletion: None,
        }]);
        service
    }

    #[test]
    fn only_the_clusters_own_objects_are_applied_over() {
        let ours = service_owned_by("uid-1", Some(true));
        assert!(is_controlled_by(&ours, Some("uid-1")));
        // Another cluster of the same name (deleted and created again), a mere owner, or no
        // owner at all: someone else's.
        assert!(!is_controlled_by(&ours, Some("uid-2")));
        assert!(!is_controlled_by(
            &service_owned_by("uid-1", None),
            Some("uid-1")
        ));
        assert!(!is_controlled_by(&Service::default(), Some("uid-1")));
        assert!(!is_controlled_by(&ours, None));
    }
}
