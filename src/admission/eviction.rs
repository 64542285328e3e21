//! The eviction webhook: drains that cause only planned failovers.
//!
//! An Eviction (what `kubectl drain`, a cluster upgrade or the autoscaler send) of the Pod of a
//! ready Valkey primary with replicas is deferred with `429 Too Many Requests`, the answer every
//! drain retries, and its ValkeyNode is marked [`HANDOVER_REQUESTED`]. The controller then
//! hands the shard over to a synced replica with Valkey's clean `CLUSTER FAILOVER` (rule 6 of
//! `crate::roll::rules`), the Pod becomes a replica, and the drain's next retry goes through
//! once the PodDisruptionBudget allows it. Everything else (a replica, a Pod that is not ready,
//! a Pod that is not ours) is left to the budget.
//!
//! Why a webhook on the Eviction: it is the one place every voluntary disruption passes before
//! the Pod is touched, and it can say "not yet" in a way drains already understand. A preStop
//! hook runs only once the Pod is already being deleted (too late to keep clients off it), and
//! reacting to a cordon races the eviction that follows it at once.
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
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use serde_json::json;

use super::http::{MAX_BODY_BYTES, parse_review};
use crate::api::annotations::HANDOVER_REQUESTED;
use crate::api::{ValkeyCluster, ValkeyNode, labels};
use crate::metrics::Metrics;

/// The webhook's path, as the ValidatingWebhookConfiguration names it.
pub const VALIDATE_EVICTIONS: &str = "/validate/evictions";

/// How long a deferred eviction waits for its handover before it is let through anyway.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(120);

/// The field manager of the handover annotation.
const MANAGER: &str = "valkey-operator-eviction";

/// What the eviction endpoint needs: the API, to read the Pod and mark its node.
#[derive(Clone)]
pub struct EvictionState {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
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
}

fn allow(reason: impl Into<String>) -> Decision {
    Decision::Allow {
        reason: reason.into(),
    }
}

/// Decides about an Eviction of `pod`, given its cluster and ValkeyNode as stored now. No I/O.
/// The checks, in order: the Pod is ours; it is a primary; it is ready; its cluster keeps
/// replicas; no earlier request for it has been waiting longer than [`GIVE_UP_AFTER`].
pub fn decide(
    pod: &Pod,
    cluster: Option<&ValkeyCluster>,
    node: Option<&ValkeyNode>,
    now: Timestamp,
) -> Decision {
    let pod_labels = pod.labels();
    if pod_labels.get(labels::MANAGED_BY).map(String::as_str) != Some(labels::MANAGED_BY_VALUE) {
        return allow("not a Pod of the valkey-operator");
    }
    if pod_labels.get(labels::ROLE).map(String::as_str) != Some("primary") {
        return allow("not a primary");
    }
    if !is_ready(pod) {
        return allow("not ready: Valkey fails a dead primary over by itself");
    }
    let (Some(cluster), Some(node)) = (cluster, node) else {
        return allow("its ValkeyCluster or ValkeyNode is gone");
    };
    if cluster.spec.replicas_per_shard < 1 {
        return allow("its shard has no replica to hand over to (the budget decides)");
    }
    let requested_at = node.handover_requested_at(now).unwrap_or(now);
    let waited = now.duration_since(requested_at);
    if waited > SignedDuration::try_from(GIVE_UP_AFTER).unwrap_or(SignedDuration::MAX) {
        return allow(format!(
            "its handover was requested {}s ago and has not happened; evicting anyway",
            waited.as_secs()
        ));
    }
    let name = node.name_any();
    Decision::Defer {
        message: format!(
            "{name} is the primary of shard {} of ValkeyCluster {}: the valkey-operator is \
             handing the shard over to a replica first (a planned failover); retry the eviction \
             in a few seconds",
            node.spec.shard,
            cluster.name_any()
        ),
        node: name,
        requested_at,
    }
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
    let response = answer(&state.client, &request).await;
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
    client: &kube::Client,
    request: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let Some(namespace) = request.namespace.as_deref() else {
        return response;
    };
    let decision = match look_up(client, namespace, &request.name).await {
        Ok(Some((pod, cluster, node))) => {
            decide(&pod, cluster.as_ref(), node.as_ref(), Timestamp::now())
        }
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
        Decision::Defer {
            node,
            requested_at,
            message,
        } => {
            if !request.dry_run
                && let Err(error) = mark(client, namespace, &node, requested_at).await
            {
                tracing::warn!(%namespace, %node, %error, "eviction webhook: cannot request the handover; allowing");
                return response;
            }
            tracing::info!(%namespace, %node, "eviction of a primary deferred for a handover");
            too_many_requests(response, message)
        }
    }
}

/// The Pod, its ValkeyCluster and its ValkeyNode; `None` when the Pod does not exist.
async fn look_up(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<(Pod, Option<ValkeyCluster>, Option<ValkeyNode>)>, kube::Error> {
    let Some(pod) = Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(None);
    };
    let Some(cluster_name) = pod.labels().get(labels::CLUSTER).cloned() else {
        return Ok(Some((pod, None, None)));
    };
    let cluster = Api::<ValkeyCluster>::namespaced(client.clone(), namespace)
        .get_opt(&cluster_name)
        .await?;
    let node = Api::<ValkeyNode>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?;
    Ok(Some((pod, cluster, node)))
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
            &PatchParams::apply(MANAGER).force(),
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
