//! The admission endpoints, as a router of their own that the HTTPS server mounts: parse an
//! AdmissionReview leniently, turn it into a typed [`Review`], run the kind's validator against
//! the cached fleet, and answer with an AdmissionReview. Malformed requests get a 400 (or 413)
//! with a reason; nothing here panics.

use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use kube::Resource;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde::de::DeserializeOwned;

use super::{Policy, Review, Verdict};
use crate::api::{GROUP, ValkeyCluster, ValkeyConfig, ValkeyImage, ValkeyNode, ValkeyRole};
use crate::fleet::Fleet;
use crate::fleet::caches::Readiness;
use crate::metrics::Metrics;

/// Largest AdmissionReview accepted: an object may be 1.5 MiB and a review carries two.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// The webhook paths, one per kind, as the ValidatingWebhookConfiguration names them.
pub const VALIDATE_IMAGES: &str = "/validate/valkeyimages";
pub const VALIDATE_CONFIGS: &str = "/validate/valkeyconfigs";
pub const VALIDATE_ROLES: &str = "/validate/valkeyroles";
pub const VALIDATE_CLUSTERS: &str = "/validate/valkeyclusters";
pub const VALIDATE_NODES: &str = "/validate/valkeynodes";

/// What the admission handlers read: the cached fleet, whether the caches have synced, the
/// metrics they count into and the operator's admission policy.
#[derive(Clone)]
pub struct AdmissionState {
    pub fleet: Arc<RwLock<Fleet>>,
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
    pub policy: Arc<Policy>,
}

impl AdmissionState {
    /// The fleet index for reading. A writer that panicked cannot leave it half-updated in a way
    /// that matters more than refusing every request would, so a poisoned lock is still read.
    pub fn fleet_read(&self) -> RwLockReadGuard<'_, Fleet> {
        self.fleet
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The five `/validate/...` routes, with the body limit that admission reviews need.
pub fn router(state: AdmissionState) -> Router {
    Router::new()
        .route(VALIDATE_IMAGES, post(images))
        .route(VALIDATE_CONFIGS, post(configs))
        .route(VALIDATE_ROLES, post(roles))
        .route(VALIDATE_CLUSTERS, post(clusters))
        .route(VALIDATE_NODES, post(nodes))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// A request that is not an AdmissionReview at all: answered with an HTTP error, not a review.
pub(super) struct BadRequest {
    status: StatusCode,
    reason: String,
}

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        (self.status, format!("{}\n", self.reason)).into_response()
    }
}

pub(super) fn parse_review(
    body: Result<Bytes, BytesRejection>,
) -> Result<AdmissionRequest<DynamicObject>, BadRequest> {
    let body = body.map_err(|rejection| BadRequest {
        status: rejection.status(),
        reason: format!(
            "could not read the request body (an AdmissionReview of at most {} MiB is expected): {}",
            MAX_BODY_BYTES / (1024 * 1024),
            rejection.body_text()
        ),
    })?;
    let bad = |reason: String| BadRequest {
        status: StatusCode::BAD_REQUEST,
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(value).map_err(|e| {
        bad(format!(
            "the body is not an admission.k8s.io/v1 AdmissionReview: {e}"
        ))
    })?;
    if review.types.kind != "AdmissionReview" {
        return Err(bad(format!(
            "the body is a {:?}, not an AdmissionReview",
            review.types.kind
        )));
    }
    // The webhooks are registered for v1 only; another version is not what they answer.
    if review.types.api_version != "admission.k8s.io/v1" {
        return Err(bad(format!(
            "the AdmissionReview is {:?}; this webhook speaks admission.k8s.io/v1",
            review.types.api_version
        )));
    }
    review
        .try_into()
        .map_err(|_| bad("the AdmissionReview carries no request".to_string()))
}

fn typed<K: DeserializeOwned>(object: &Option<DynamicObject>) -> Result<Option<K>, String> {
    object
        .as_ref()
        .map(|o| {
            serde_json::to_value(o)
                .and_then(serde_json::from_value)
                .map_err(|e| e.to_string())
        })
        .transpose()
}

fn operation_label(operation: &Operation) -> &'static str {
    match operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Runs one kind's validator over a raw request body.
fn admit<K>(
    state: &AdmissionState,
    body: Result<Bytes, BytesRejection>,
    validate: impl FnOnce(&Review<K>, &AdmissionState) -> Verdict,
) -> Response
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let started = Instant::now();
    let kind = K::kind(&());
    let request = match parse_review(body) {
        Ok(request) => request,
        Err(bad) => {
            state
                .metrics
                .observe_webhook(&kind, "unknown", "invalid", started);
            return bad.into_response();
        }
    };
    let operation = operation_label(&request.operation);
    let response = decide(&request, &kind, state, validate);
    let result = match (response.allowed, &response.warnings) {
        (false, _) => "denied",
        (true, Some(w)) if !w.is_empty() => "warned",
        (true, _) => "allowed",
    };
    state
        .metrics
        .observe_webhook(&kind, operation, result, started);
    Json(response.into_review()).into_response()
}

fn decide<K>(
    request: &AdmissionRequest<DynamicObject>,
    kind: &str,
    state: &AdmissionState,
    validate: impl FnOnce(&Review<K>, &AdmissionState) -> Verdict,
) -> AdmissionResponse
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let response = AdmissionResponse::from(request);
    if request.kind.group != GROUP || request.kind.kind != kind {
        return response.deny(format!(
            "this endpoint validates {GROUP} {kind}, but the request is for {}/{} {}; check the webhook's rules",
            request.kind.group, request.kind.version, request.kind.kind
        ));
    }
    if !state.readiness.is_ready() {
        return response.deny(format!(
            "the operator is starting and has not synced its caches of {} yet; retry in a few seconds",
            state.readiness.waiting_for().join(", ")
        ));
    }
    let (object, old) = match (typed::<K>(&request.object), typed::<K>(&request.old_object)) {
        (Ok(object), Ok(old)) => (object, old),
        (Err(e), _) | (_, Err(e)) => {
            return response.deny(format!("the {kind} does not match its schema: {e}"));
        }
    };
    let review = Review {
        operation: request.operation.clone(),
        name: &request.name,
        namespace: request.namespace.as_deref(),
        object: object.as_ref(),
        old: old.as_ref(),
        user: request.user_info.username.as_deref(),
        now: k8s_openapi::jiff::Timestamp::now(),
    };
    let verdict = validate(&review, state);
    let mut response = if verdict.allowed() {
        response
    } else {
        response.deny(verdict.denials.join("; "))
    };
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings);
    }
    response
}

async fn images(
    State(state): State<AdmissionState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    admit::<ValkeyImage>(&state, body, |review, state| {
        super::validate_image(review, &state.fleet_read())
    })
}

async fn configs(
    State(state): State<AdmissionState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    admit::<ValkeyConfig>(&state, body, |review, state| {
        super::validate_config(review, &state.fleet_read(), &state.policy)
    })
}

async fn clusters(
    State(state): State<AdmissionState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    admit::<ValkeyCluster>(&state, body, |review, state| {
        super::validate_cluster(review, &state.fleet_read(), &state.policy)
    })
}

async fn roles(
    State(state): State<AdmissionState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    admit::<ValkeyRole>(&state, body, |review, state| {
        super::validate_role(review, &state.fleet_read())
    })
}

async fn nodes(
    State(state): State<AdmissionState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    admit::<ValkeyNode>(&state, body, |review, state| {
        super::validate_node(review, &state.policy)
    })
}
