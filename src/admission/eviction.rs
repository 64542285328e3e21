//! The eviction webhook: drains that cause only planned failovers.
//!
//! An Eviction (what `kubectl drain`, a cluster upgrade or the autoscaler send) of the Pod of a
//! ready Valkey node is deferred with `429 Too Many Requests`, the answer every drain retries,
//! and its ValkeyNode is marked [`HANDOVER_REQUESTED`]: replace it before it goes, as a roll
//! would. The controller counts a marked node as outdated: a primary first hands its shard over
//! to a synced replica with Valkey's clean `CLUSTER FAILOVER` (rule 8 of `crate::roll::rules`),
//! then a replacement joins the shard (on another Node: the drained one is cordoned) and syncs,
//! and only then is the marked node retired by the operator itself (rule 9); the drain's next
//! retry finds its Pod gone. A shard without replicas is moved the way a roll moves it: a
//! replica joins first (rule 9), the primary hands over to it once it is synced (rule 8), then
//! the marked node is retired; its budget allows no eviction, so without this a drain would
//! wait for ever. So a drain never takes a shard below its replica count, nor costs it more
//! than one planned failover. Everything else (a Pod that is not ready, a Pod that is not
//! ours) is left to the budget.
//!
//! Why a webhook on the Eviction: it is the one place every voluntary disruption passes before
//! the Pod is touched, and it can say "not yet" in a way drains already understand. A preStop
//! hook runs only once the Pod is already being deleted (too late to keep clients off it), and
//! reacting to a cordon races the eviction that follows it at once.
//!
//! Who may ask: a handover is a failover, so the webhook makes sure the Eviction is real
//! ([`Confirmation`]) before it asks for one. Where the API server presents its client
//! certificate to webhooks (`serve --webhook-client-ca`), no one else reaches this endpoint at
//! all. Where it cannot be configured to (managed clusters), anyone who reaches the operator's
//! port could post a review: a handover is then asked for only when the Pod's Node is being
//! drained (cordoned, or tainted `NoSchedule`/`NoExecute`: what `kubectl drain`, the cluster
//! autoscaler and Karpenter all do before they evict), so a forged review of a primary on a
//! Node nobody drains changes nothing. In both cases the facts come from the API server, never
//! from the review (which names only the Pod): the Pod's ValkeyNode by owner uid, its role as
//! the operator recorded it. And handovers of one shard are paced: none is asked for within
//! [`HANDOVER_INTERVAL`] of another node's of the same shard (the drain is told to retry).
//!
//! It fails open: `failurePolicy: Ignore`, an answer that cannot be worked out is "allowed",
//! and a handover that has not happened [`GIVE_UP_AFTER`] the request lets the eviction
//! through. A drain is never blocked by the operator; at worst the primary's shard fails over
//! by Valkey's own detection, as it would without this webhook.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use serde_json::json;

use super::http::{MAX_BODY_BYTES, parse_review};
use crate::api::annotations::HANDOVER_REQUESTED;
use crate::api::{NodeRole, ValkeyCluster, ValkeyNode, field_managers, labels};
use crate::metrics::Metrics;

/// The webhook's path, as the ValidatingWebhookConfiguration names it.
pub const VALIDATE_EVICTIONS: &str = "/validate/evictions";

/// How long a deferred eviction waits for its handover before it is let through anyway.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(120);

/// No handover of a shard is asked for within this of another node's of the same shard.
pub const HANDOVER_INTERVAL: Duration = Duration::from_secs(60);

/// What the eviction endpoint needs: the API, to read the Pod and mark its node.
#[derive(Clone)]
pub struct EvictionState {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    /// Only the API server reaches this endpoint (it presents its client certificate): every
    /// review is a real Eviction.
    pub certified_callers: bool,
}

/// The `/validate/evictions` route.
pub fn router(state: EvictionState) -> Router {
    Router::new()
        .route(VALIDATE_EVICTIONS, post(evictions))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// What to answer an Eviction of one Pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Let the eviction go on (the budget still decides); the reason is for the log.
    Allow { reason: String },
    /// Answer 429 and ask for a handover made at `requested_at` (now, or the standing request).
    Defer {
        node: String,
        requested_at: Timestamp,
        message: String,
    },
    /// Answer 429 without asking for anything yet (another handover of the shard is recent).
    Retry { message: String },
}

/// Why the webhook believes an Eviction is real.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confirmation {
    /// The caller presented the API server's client certificate.
    CertifiedCaller,
    /// The Pod's Node is cordoned, or tainted `NoSchedule`/`NoExecute`: it is being drained.
    NodeDraining,
    /// Neither: the review may be anyone's.
    Unconfirmed,
}

/// What the webhook knows of one Eviction, all of it read from the API server.
pub struct Facts<'a> {
    pub pod: &'a Pod,
    pub cluster: Option<&'a ValkeyCluster>,
    /// The ValkeyNode of the Pod's name, if one.
    pub node: Option<&'a ValkeyNode>,
    /// The other ValkeyNodes of that node's shard.
    pub shard: &'a [ValkeyNode],
    pub confirmation: Confirmation,
    pub now: Timestamp,
}

fn allow(reason: impl Into<String>) -> Decision {
    Decision::Allow {
        reason: reason.into(),
    }
}

/// Decides about an Eviction. No I/O. The checks, in order: the Pod is the one a ValkeyNode
/// owns; the Pod is ready; its cluster exists; the Eviction is confirmed real; no
/// earlier request for it has been waiting longer than [`GIVE_UP_AFTER`]; no other node of its
/// shard was asked to hand over within [`HANDOVER_INTERVAL`].
pub fn decide(facts: &Facts) -> Decision {
    let Some(node) = facts.node.filter(|node| owns(node, facts.pod)) else {
        return allow("not the Pod of a ValkeyNode");
    };
    if !is_ready(facts.pod) {
        return allow(
            "not ready: it serves nothing to hand over or replace first (Valkey fails a dead \
             primary over by itself)",
        );
    }
    let Some(cluster) = facts.cluster else {
        return allow("its ValkeyCluster is gone");
    };
    if facts.confirmation == Confirmation::Unconfirmed {
        return allow(
            "the eviction cannot be confirmed (no client certificate, and its Node is not being \
             drained): nothing is handed over; the budget decides",
        );
    }
    let now = facts.now;
    let requested_at = node.handover_requested_at(now).unwrap_or(now);
    let waited = now.duration_since(requested_at);
    if waited > SignedDuration::try_from(GIVE_UP_AFTER).unwrap_or(SignedDuration::MAX) {
        return allow(format!(
            "its handover was requested {}s ago and has not happened; evicting anyway",
            waited.as_secs()
        ));
    }
    let name = node.name_any();
    let shard = node.spec.shard;
    let interval = SignedDuration::try_from(HANDOVER_INTERVAL).unwrap_or(SignedDuration::MAX);
    let recent = facts
        .shard
        .iter()
        .filter(|other| other.name_any() != name)
        .filter_map(|other| other.handover_requested_at(now))
        .max()
        .filter(|at| now.duration_since(*at) < interval);
    if let Some(at) = recent {
        let wait = interval - now.duration_since(at);
        return Decision::Retry {
            message: format!(
                "another node of shard {shard} of ValkeyCluster {} was asked to hand over {}s ago; \
                 retry the eviction in {}s",
                cluster.name_any(),
                now.duration_since(at).as_secs(),
                wait.as_secs().max(1)
            ),
        };
    }
    let primary = node.status.as_ref().and_then(|s| s.role) == Some(NodeRole::Primary);
    let message = if primary && cluster.spec.replicas_per_shard < 1 {
        format!(
            "{name} is the primary of shard {shard} of ValkeyCluster {}, which has no replica: \
             the valkey-operator is joining one on another Node, handing the shard over to it \
             once it is synced (a planned failover) and retiring this node; retry the eviction \
             in a few seconds",
            cluster.name_any()
        )
    } else if primary {
        format!(
            "{name} is the primary of shard {shard} of ValkeyCluster {}: the valkey-operator is \
             handing the shard over to a replica first (a planned failover) and replacing the \
             node before it goes; retry the eviction in a few seconds",
            cluster.name_any()
        )
    } else {
        format!(
            "{name} is a replica of shard {shard} of ValkeyCluster {}: the valkey-operator is \
             replacing it first (a new replica joins and syncs), then retires it; retry the \
             eviction in a few seconds",
            cluster.name_any()
        )
    };
    Decision::Defer {
        message,
        node: name,
        requested_at,
    }
}

/// Whether `pod` is the Pod `node` runs: its controller ownerReference names the node's uid.
fn owns(node: &ValkeyNode, pod: &Pod) -> bool {
    let Some(uid) = node.metadata.uid.as_deref() else {
        return false;
    };
    pod.owner_references()
        .iter()
        .any(|owner| owner.controller == Some(true) && owner.uid == uid)
}

/// Taints Kubernetes itself puts on a Node for its condition (not ready, unreachable, under
/// pressure): an unhealthy Node, not one anyone is draining.
const CONDITION_TAINTS: [&str; 6] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable",
];

/// Whether `pod`'s Node is being drained: cordoned, or tainted so that Pods leave or stay away
/// (what the cluster autoscaler and Karpenter do), other than for its own condition, by a
/// taint the Pod does not tolerate. (A pool's standing taint, `dedicated=valkey:NoSchedule`
/// say, is one its Pods tolerate: no drain.)
pub fn draining(node: &Node, pod: &Pod) -> bool {
    let Some(spec) = node.spec.as_ref() else {
        return false;
    };
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    spec.unschedulable == Some(true)
        || spec.taints.iter().flatten().any(|taint| {
            matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
                && !CONDITION_TAINTS.contains(&taint.key.as_str())
                && !tolerations.iter().any(|t| tolerates(t, taint))
        })
}

/// Kubernetes' rule: an empty effect tolerates every effect, an empty key with `Exists` every
/// key; `Exists` any value, `Equal` (the default) only the same value.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    let key = toleration.key.as_deref().unwrap_or_default();
    let exists = toleration.operator.as_deref() == Some("Exists");
    (effect.is_empty() || effect == taint.effect)
        && ((key.is_empty() && exists) || key == taint.key)
        && (exists
            || toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default())
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

async fn evictions(
    State(state): State<EvictionState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let request = match parse_review(body) {
        Ok(request) => request,
        Err(bad) => {
            state
                .metrics
                .observe_webhook("Eviction", "unknown", "invalid", started);
            return bad.into_response();
        }
    };
    let response = answer(&state, &request).await;
    let result = if response.allowed {
        "allowed"
    } else {
        "denied"
    };
    state
        .metrics
        .observe_webhook("Eviction", "CREATE", result, started);
    Json(response.into_review()).into_response()
}

async fn answer(
    state: &EvictionState,
    request: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let Some(namespace) = request.namespace.as_deref() else {
        return response;
    };
    let decision = match look_up(state, namespace, &request.name).await {
        Ok(Some(known)) => decide(&known.facts(Timestamp::now())),
        Ok(None) => allow("the Pod is gone"),
        Err(error) => {
            tracing::warn!(%namespace, pod = %request.name, %error, "eviction webhook: cannot read the Pod; allowing");
            allow(format!("cannot read it: {error}"))
        }
    };
    match decision {
        Decision::Allow { reason } => {
            tracing::debug!(%namespace, pod = %request.name, %reason, "eviction allowed");
            response
        }
        Decision::Retry { message } => {
            tracing::info!(%namespace, pod = %request.name, %message, "eviction of a primary deferred");
            too_many_requests(response, message)
        }
        Decision::Defer {
            node,
            requested_at,
            message,
        } => {
            if !request.dry_run
                && let Err(error) = mark(&state.client, namespace, &node, requested_at).await
            {
                tracing::warn!(%namespace, %node, %error, "eviction webhook: cannot request the handover; allowing");
                return response;
            }
            tracing::info!(%namespace, %node, "eviction of a primary deferred for a handover");
            too_many_requests(response, message)
        }
    }
}

/// What the API server says about an Eviction's Pod.
struct Known {
    pod: Pod,
    node: Option<ValkeyNode>,
    cluster: Option<ValkeyCluster>,
    shard: Vec<ValkeyNode>,
    confirmation: Confirmation,
}

impl Known {
    fn facts(&self, now: Timestamp) -> Facts<'_> {
        Facts {
            pod: &self.pod,
            cluster: self.cluster.as_ref(),
            node: self.node.as_ref(),
            shard: &self.shard,
            confirmation: self.confirmation,
            now,
        }
    }
}

/// The Pod, the ValkeyNode of its name, that node's cluster and shard, and whether the
/// Eviction is confirmed; `None` when the Pod does not exist. Only a ValkeyNode's facts are
/// trusted, never the Pod's labels (anyone who may edit the Pod can change them).
async fn look_up(
    state: &EvictionState,
    namespace: &str,
    name: &str,
) -> Result<Option<Known>, kube::Error> {
    let client = &state.client;
    let Some(pod) = Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(None);
    };
    let nodes = Api::<ValkeyNode>::namespaced(client.clone(), namespace);
    let node = nodes.get_opt(name).await?;
    let (cluster, shard) = match &node {
        Some(node) => {
            let cluster = Api::<ValkeyCluster>::namespaced(client.clone(), namespace)
                .get_opt(&node.spec.cluster)
                .await?;
            let selector = format!("{}={}", labels::CLUSTER, node.spec.cluster);
            let shard = nodes
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
                .into_iter()
                .filter(|n| n.spec.cluster == node.spec.cluster && n.spec.shard == node.spec.shard)
                .collect();
            (cluster, shard)
        }
        None => (None, Vec::new()),
    };
    let confirmation = if state.certified_callers {
        Confirmation::CertifiedCaller
    } else {
        let host = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let host = match host {
            Some(host) => Api::<Node>::all(client.clone()).get_opt(&host).await?,
            None => None,
        };
        if host.as_ref().is_some_and(|host| draining(host, &pod)) {
            Confirmation::NodeDraining
        } else {
            Confirmation::Unconfirmed
        }
    };
    Ok(Some(Known {
        pod,
        node,
        cluster,
        shard,
        confirmation,
    }))
}

/// Sets the handover annotation on the node (server-side apply: only this field is ours).
async fn mark(
    client: &kube::Client,
    namespace: &str,
    node: &str,
    requested_at: Timestamp,
) -> Result<(), kube::Error> {
    let patch = json!({
        "apiVersion": "valkey.gomomento.com/v1alpha1",
        "kind": "ValkeyNode",
        "metadata": {"name": node, "annotations": {HANDOVER_REQUESTED: requested_at.to_string()}},
    });
    Api::<ValkeyNode>::namespaced(client.clone(), namespace)
        .patch(
            node,
            &PatchParams::apply(field_managers::EVICTION).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

/// A denial drains retry: `429 Too Many Requests`, as the PodDisruptionBudget itself answers.
fn too_many_requests(mut response: AdmissionResponse, message: String) -> AdmissionResponse {
    response = response.deny(message);
    response.result.code = 429;
    response.result.reason = "TooManyRequests".into();
    response
}

#[cfg(test)]
#[path = "eviction_tests.rs"]
mod tests;
