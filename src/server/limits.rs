//! What one client may cost the HTTPS server, which also runs the controller: the webhooks sit in
//! front of every tenant's changes, so a slow, huge or flooding client must get a fast refusal
//! and leave room for the API server's own calls.
//!
//! In the order a connection meets them:
//! 1. **connections**: at most [`ServerLimits::max_connections`] open at once; the next one is
//!    closed at accept, before its TLS handshake costs anything ([`ConnectionCap`]);
//! 2. **handshake and headers**: a TLS handshake, the first request and each request's headers
//!    must arrive within [`ServerLimits::header_timeout`]; HTTP/2 allows a few streams per
//!    connection and bounded headers (set in `serve_https`);
//! 3. **requests in flight** on the guarded routes (admission, evictions): at most
//!    [`ServerLimits::max_in_flight`]; beyond it, `429` at once with `Retry-After` ([`gate`]);
//! 4. **the body**: read whole within [`ServerLimits::body_timeout`] (`408`) and at most
//!    `max_body_bytes` (`413`), so memory is bounded by requests in flight × body limit;
//! 5. **the answer**: within [`ServerLimits::request_timeout`] (`503`), under the webhook's own
//!    timeout so the API server hears a reason rather than a dropped call.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum_server::accept::Accept;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admission::http::MAX_BODY_BYTES;
use crate::metrics::Metrics;

/// The server's limits; [`Default`] is what the operator runs with.
#[derive(Clone, Debug)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub max_in_flight: usize,
    pub max_body_bytes: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub request_timeout: Duration,
    pub h2_max_streams: u32,
    pub h2_max_header_bytes: u32,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            // 32 × 4 MiB = 128 MiB at worst, inside the chart's 512 MiB with the controller.
            max_in_flight: 32,
            max_body_bytes: MAX_BODY_BYTES,
            header_timeout: Duration::from_secs(5),
            // The API server sends a whole review at once over a fast network.
            body_timeout: Duration::from_secs(2),
            // Under the chart's webhook timeoutSeconds (5).
            request_timeout: Duration::from_secs(4),
            h2_max_streams: 16,
            h2_max_header_bytes: 16 * 1024,
        }
    }
}

/// The request gate's shared part: the permits of requests in flight and where refusals count.
#[derive(Clone)]
pub struct Gate {
    limits: ServerLimits,
    in_flight: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

impl Gate {
    pub fn new(limits: ServerLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            in_flight: Arc::new(Semaphore::new(limits.max_in_flight)),
            limits,
            metrics,
        }
    }

    fn refuse(&self, status: StatusCode, reason: &'static str, message: String) -> Response {
        self.metrics.server_refused(reason);
        let mut response = (status, format!("{message}\n")).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Middleware of the guarded routes: a permit, the whole body in time, the answer in time.
pub async fn gate(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let limits = &gate.limits;
    let Ok(_permit) = gate.in_flight.clone().try_acquire_owned() else {
        return gate.refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "busy",
            format!(
                "the operator is answering {} requests already; retry in a second",
                limits.max_in_flight
            ),
        );
    };
    let (parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, limits.max_body_bytes);
    let bytes = match tokio::time::timeout(limits.body_timeout, read).await {
        Err(_) => {
            return gate.refuse(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive within {:?}",
                    limits.body_timeout
                ),
            );
        }
        Ok(Err(error)) => {
            return gate.refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "could not read the request body (at most {} is accepted): {error}",
                    readable_size(limits.max_body_bytes)
                ),
            );
        }
        Ok(Ok(bytes)) => bytes,
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    match tokio::time::timeout(limits.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => gate.refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "request_timeout",
            format!("no answer within {:?}", limits.request_timeout),
        ),
    }
}

/// `4 MiB` for whole mebibytes, else bytes.
fn readable_size(bytes: usize) -> String {
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// An acceptor (inside the TLS one) that closes a connection beyond the cap at once; each
/// accepted connection holds a permit until it closes.
#[derive(Clone)]
pub struct ConnectionCap {
    open: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

impl ConnectionCap {
    pub fn new(max_connections: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            open: Arc::new(Semaphore::new(max_connections)),
            metrics,
        }
    }
}

impl<I, S> Accept<I, S> for ConnectionCap {
    type Stream = Counted<I>;
    type Service = S;
    type Future = std::future::Ready<io::Result<(Counted<I>, S)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        std::future::ready(match self.open.clone().try_acquire_owned() {
            Ok(permit) => Ok((
                Counted {
                    stream,
                    _permit: permit,
                },
                service,
            )),
            Err(_) => {
                self.metrics.server_refused("connections");
                Err(io::Error::other("too many open connections"))
            }
        })
    }
}

/// A stream that holds its connection's permit.
pub struct Counted<I> {
    stream: I,
    _permit: OwnedSemaphorePermit,
}

impl<I: AsyncRead + Unpin> AsyncRead for Counted<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Counted<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::Router;
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;

    fn limits() -> ServerLimits {
        ServerLimits {
            max_in_flight: 1,
            max_body_bytes: 16,
            body_timeout: Duration::from_millis(200),
            request_timeout: Duration::from_millis(300),
            ..ServerLimits::default()
        }
    }

    fn app(gate: Gate) -> Router {
        Router::new()
            .route("/echo", post(|body: String| async move { body }))
            .route(
                "/slow",
                post(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "late"
                }),
            )
            .layer(axum::middleware::from_fn_with_state(gate, super::gate))
    }

    fn gate() -> (Gate, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        (Gate::new(limits(), metrics.clone()), metrics)
    }

    async fn send(app: &Router, path: &str, body: Body) -> (StatusCode, String) {
        let request = Request::post(path).body(body).expect("a request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("a body");
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn a_small_body_in_time_passes_through() {
        let (gate, _) = gate();
        assert_eq!(
            send(&app(gate), "/echo", Body::from("hello")).await,
            (StatusCode::OK, "hello".into())
        );
    }

    #[tokio::test]
    async fn an_oversized_body_gets_413() {
        let (gate, metrics) = gate();
        let (status, _) = send(&app(gate), "/echo", Body::from("x".repeat(17))).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(
            metrics
                .render()
                .expect("render")
                .contains("reason=\"body_too_large\"} 1")
        );
    }

    #[tokio::test]
    async fn a_body_that_never_ends_gets_408() {
        let (gate, _) = gate();
        let never = futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
        let (status, _) = send(&app(gate), "/echo", Body::from_stream(never)).await;
        assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    }

    #[tokio::test]
    async fn a_slow_answer_gets_503_and_a_full_gate_gets_429() {
        let (gate, metrics) = gate();
        let app = app(gate);
        let slow = tokio::spawn({
            let app = app.clone();
            async move { send(&app, "/slow", Body::empty()).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (status, text) = send(&app, "/echo", Body::from("x")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
        let (status, _) = slow.await.expect("joined");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        // The permit came back.
        assert_eq!(send(&app, "/echo", Body::from("y")).await.0, StatusCode::OK);
        let rendered = metrics.render().expect("render");
        assert!(rendered.contains("reason=\"busy\"} 1"), "{rendered}");
        assert!(
            rendered.contains("reason=\"request_timeout\"} 1"),
            "{rendered}"
        );
    }
}
