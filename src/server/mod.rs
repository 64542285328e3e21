//! The HTTPS listener: the admission router mounted beside `/metrics`, `/healthz` and
//! `/readyz`, served by axum over rustls with certificate reload, until the shutdown signal,
//! within the [`limits`] that keep one client from starving the others. And, where asked for
//! (`serve --health-listen`), a plain HTTP listener of `/healthz` and `/readyz` alone, for the
//! kubelet's probes: a flood of the HTTPS port cannot make them fail and restart the operator.

pub mod limits;
pub mod metrics_access;
pub mod tls;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum_server::Handle;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use hyper_util::rt::TokioTimer;

use crate::admission::Policy;
use crate::admission::http::{self as admission_http, AdmissionState};
use crate::cli::supervise::Health;
use crate::fleet::Fleet;
use crate::fleet::caches::Readiness;
use crate::metrics::Metrics;
use limits::{CertifiedReserve, ConnectionCap, Gate, ServerLimits};
use metrics_access::{MetricsAccess, Verdict};
use tls::CertificatePaths;

/// What the listener's routes share; the admission routes get their part as an
/// [`AdmissionState`].
#[derive(Clone)]
pub struct AppState {
    pub fleet: Arc<RwLock<Fleet>>,
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
    pub policy: Arc<Policy>,
    /// The limits of the guarded routes (see [`limits`]).
    pub limits: ServerLimits,
    /// Who may read `/metrics` (see [`metrics_access`]).
    pub metrics_access: MetricsAccess,
    /// Admission callers must present a client certificate signed by the configured CA (the
    /// API server's; see [`crate::server::tls`]): any other caller of a webhook gets `403`.
    pub certified_callers: bool,
}

impl AppState {
    fn admission(&self) -> AdmissionState {
        AdmissionState {
            fleet: self.fleet.clone(),
            readiness: self.readiness.clone(),
            metrics: self.metrics.clone(),
            policy: self.policy.clone(),
        }
    }
}

/// The admission routes (`/validate/...`) beside `/metrics`, `/healthz` and `/readyz`, for a
/// server with nothing else to watch over: `/healthz` always answers ok.
pub fn router(state: AppState) -> Router {
    router_with_health(state, Arc::new(Health::default()), Router::new())
}

/// [`router`], with `/healthz` answering 503 once `health` records a dead task, and `guarded`
/// routes (the eviction webhook) behind the same request gate as admission. Health, readiness
/// and metrics stay outside the gate: a flood must not make the kubelet restart the operator.
pub fn router_with_health(state: AppState, health: Arc<Health>, guarded: Router) -> Router {
    let gate = Gate::new(state.limits.clone(), state.metrics.clone());
    let mut admission = admission_http::router(state.admission())
        .merge(guarded)
        .layer(axum::middleware::from_fn_with_state(gate, limits::gate));
    if state.certified_callers {
        admission = admission.layer(axum::middleware::from_fn(certified_only));
    }
    let health = Router::new()
        .route("/healthz", get(healthz))
        .with_state(health);
    Router::new()
        .route("/metrics", get(metrics))
        .route("/readyz", get(readyz))
        .with_state(state)
        .merge(health)
        .merge(admission)
}

/// `/healthz` and `/readyz` alone, for a listener of their own ([`serve_health`]).
pub fn health_router(state: AppState, health: Arc<Health>) -> Router {
    let liveness = Router::new()
        .route("/healthz", get(healthz))
        .with_state(health);
    Router::new()
        .route("/readyz", get(readyz))
        .with_state(state)
        .merge(liveness)
}

/// How many probe connections the health listener holds at once: the kubelet opens one per
/// probe; more are dropped at once.
const HEALTH_CONNECTIONS: usize = 16;

/// Serves `app` over plain HTTP on `listener` until `shutdown` completes: at most
/// [`HEALTH_CONNECTIONS`] connections at once, each closed after its first answer or 5 s.
pub async fn serve_health(
    listener: std::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let open = Arc::new(tokio::sync::Semaphore::new(HEALTH_CONNECTIONS));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // A connection that failed before it was accepted: the next one may not.
                Err(_) => continue,
            },
            () = &mut shutdown => return Ok(()),
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .keep_alive(false)
                .serve_connection(io, service);
            let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
            drop(permit);
        });
    }
}

/// Refuses a webhook request whose connection presented no client certificate (one that
/// presented an unverifiable certificate never got past the TLS handshake).
async fn certified_only(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let certified = request
        .extensions()
        .get::<std::sync::Arc<axum_server::tls::TlsInfo>>()
        .is_some_and(|tls| !tls.peer_certificates.is_empty());
    if certified {
        next.run(request).await
    } else {
        let message = "a webhook caller must present the API server's client certificate\n";
        (StatusCode::FORBIDDEN, message).into_response()
    }
}

async fn healthz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    match health.failure() {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(failure) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy: {failure}\n"),
        ),
    }
}

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> axum::response::Response {
    let verdict = match &state.metrics_access {
        MetricsAccess::Open => Verdict::Allowed,
        MetricsAccess::Kubernetes(reviews) => reviews.judge(&headers).await,
    };
    if verdict != Verdict::Allowed {
        let mut refused = (verdict.status(), verdict.message()).into_response();
        if verdict == Verdict::Unauthenticated {
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        return refused;
    }
    match state.metrics.render() {
        Ok(text) => (StatusCode::OK, text).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
    }
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "waiting for caches to sync: {}\n",
                state.readiness.waiting_for().join(", ")
            ),
        )
    }
}

/// How the listener is set up.
#[derive(Clone, Debug)]
pub struct ListenOptions {
    pub certificate: CertificatePaths,
    /// How often the certificate files are checked for a change.
    pub reload_interval: Duration,
    /// Connection, handshake, header and HTTP/2 limits (see [`limits`]).
    pub limits: ServerLimits,
}

/// Serves `app` over HTTPS on `listener` until `shutdown` completes, then drains connections.
/// The certificate must load at start; afterwards it is reloaded when its files change.
pub async fn serve_https(
    listener: std::net::TcpListener,
    app: Router,
    options: ListenOptions,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let loaded = tls::load(&options.certificate)?;
    let served = RustlsConfig::from_config(loaded.config.clone());
    let reloader = tokio::spawn(tls::reload_on_change(
        options.certificate.clone(),
        loaded,
        served.clone(),
        options.reload_interval,
        metrics.clone(),
    ));
    listener.set_nonblocking(true)?;
    let handle: Handle<SocketAddr> = Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopper.graceful_shutdown(Some(Duration::from_secs(10)));
    });
    let limits = &options.limits;
    let certified = options.certificate.client_ca.is_some();
    let acceptor = RustlsAcceptor::new(served)
        .handshake_timeout(limits.handshake_timeout)
        .acceptor(ConnectionCap::new(limits, certified, metrics.clone()));
    let acceptor = CertifiedReserve::new(acceptor, metrics.clone());
    let counted = metrics.clone();
    let mut server = axum_server::from_tcp(listener)?
        .acceptor(acceptor)
        .first_request_timeout(limits.header_timeout)
        .accept_error_handler(move |_, error: &std::io::Error| {
            // Refusals by the connection cap are counted where they happen.
            if error.kind() == std::io::ErrorKind::TimedOut {
                counted.server_refused("handshake_timeout");
            }
        })
        .handle(handle);
    server
        .http_builder()
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    server
        .http_builder()
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.h2_max_streams)
        .max_header_list_size(limits.h2_max_header_bytes)
        // Unread request data a connection may buffer: bounded per connection.
        .initial_stream_window_size(limits.h2_window_bytes)
        .initial_connection_window_size(limits.h2_window_bytes)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    // The peer's address reaches the request gate, which limits each peer's share.
    let result = server
        .serve(app.into_make_service_with_connect_info::<SocketAddr>())
        .await;
    reloader.abort();
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(health: &Arc<Health>) -> (StatusCode, String) {
        let response = healthz(State(health.clone())).await.into_response();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .expect("a short body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn healthz_turns_503_and_names_the_dead_task() {
        let health = Arc::new(Health::default());
        assert_eq!(answer(&health).await, (StatusCode::OK, "ok\n".into()));
        health.mark_failed("task `controller` panicked: boom".into());
        assert_eq!(
            answer(&health).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "unhealthy: task `controller` panicked: boom\n".into()
            )
        );
    }
}
