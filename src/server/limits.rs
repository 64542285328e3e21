//! What one client may cost the HTTPS server, which also runs the controller: the webhooks sit in
//! front of every tenant's changes, so a slow, huge or flooding client must get a fast refusal
//! and leave room for the API server's own calls.
//!
//! In the order a connection meets them:
//! 1. **connections**: at most [`ServerLimits::max_connections`] open at once, and at most
//!    [`ServerLimits::max_connections_per_peer`] from one IP address, so that one flooding host
//!    cannot shut out the API server; the next one is closed at accept, before its TLS handshake
//!    costs anything ([`ConnectionCap`]). Where callers are certified (`--webhook-client-ca`),
//!    [`ServerLimits::reserved_for_certified`] of them are kept for connections that present the
//!    API server's client certificate: past the rest, a connection is let through the handshake
//!    on a reserved place and closed after it unless it presented one ([`CertifiedReserve`]), so
//!    many flooding hosts together cannot shut out the API server either;
//! 2. **handshake and headers**: a TLS handshake within [`ServerLimits::handshake_timeout`], the
//!    first request and each request's headers within [`ServerLimits::header_timeout`]; HTTP/2
//!    allows a few streams per connection and bounded headers (set in `serve_https`);
//! 3. **requests in flight** on the guarded routes (admission, evictions): at most
//!    [`ServerLimits::max_in_flight`], and [`ServerLimits::max_in_flight_per_peer`] from one IP
//!    address (a slow sender holds its permit while its body arrives); beyond either, `429` at
//!    once with `Retry-After` ([`gate`]);
//! 4. **the body**: read whole within [`ServerLimits::body_timeout`] (`408`) and at most
//!    `max_body_bytes` (`413`), so memory is bounded by requests in flight × body limit;
//! 5. **the answer**: within [`ServerLimits::request_timeout`] (`503`), under the webhook's own
//!    timeout so the API server hears a reason rather than a dropped call.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum_server::accept::Accept;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::server::TlsStream;

use crate::admission::http::MAX_BODY_BYTES;
use crate::metrics::Metrics;

/// The server's limits; [`Default`] is what the operator runs with.
#[derive(Clone, Debug)]
pub struct ServerLimits {
    pub max_connections: usize,
    /// Of `max_connections`, how many only a caller with a verified client certificate keeps,
    /// where the server asks for one (see [`CertifiedReserve`]).
    pub reserved_for_certified: usize,
    pub max_connections_per_peer: usize,
    pub max_in_flight: usize,
    pub max_in_flight_per_peer: usize,
    pub max_body_bytes: usize,
    pub handshake_timeout: Duration,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub request_timeout: Duration,
    pub h2_max_streams: u32,
    pub h2_max_header_bytes: u32,
    /// HTTP/2 flow-control window of a stream and of a connection: what a client can make the
    /// server buffer before it is read.
    pub h2_window_bytes: u32,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            // An API server (or a few, behind a load balancer) keeps a handful of connections.
            reserved_for_certified: 32,
            // An API server keeps a few connections (HTTP/2) or a small pool (HTTP/1.1).
            max_connections_per_peer: 64,
            // 32 × 4 MiB = 128 MiB at worst, inside the chart's 512 MiB with the controller.
            max_in_flight: 32,
            // 8 answers of about a millisecond each: thousands a second from one API server.
            max_in_flight_per_peer: 8,
            max_body_bytes: MAX_BODY_BYTES,
            // The API server is near; a handshake takes milliseconds.
            handshake_timeout: Duration::from_secs(2),
            header_timeout: Duration::from_secs(5),
            // The API server sends a whole review at once over a fast network.
            body_timeout: Duration::from_secs(2),
            // Under the chart's webhook timeoutSeconds (5).
            request_timeout: Duration::from_secs(4),
            h2_max_streams: 16,
            h2_max_header_bytes: 16 * 1024,
            // 256 connections × 256 KiB = 64 MiB at worst beside the bodies being read.
            h2_window_bytes: 256 * 1024,
        }
    }
}

/// The request gate's shared part: the permits of requests in flight and where refusals count.
#[derive(Clone)]
pub struct Gate {
    limits: ServerLimits,
    in_flight: Arc<Semaphore>,
    peers: PeerCounts,
    metrics: Arc<Metrics>,
}

impl Gate {
    pub fn new(limits: ServerLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            in_flight: Arc::new(Semaphore::new(limits.max_in_flight)),
            peers: PeerCounts::default(),
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

/// Middleware of the guarded routes: a permit (of the peer's share and of the whole), the whole
/// body in time, the answer in time. Without the peer's address (a router served without
/// connect info, as in unit tests) only the whole is limited.
pub async fn gate(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let limits = &gate.limits;
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(address)| address.ip());
    let _peer_claim = match peer {
        None => None,
        Some(ip) => match gate.peers.claim(ip, limits.max_in_flight_per_peer) {
            Some(claim) => Some(claim),
            None => {
                return gate.refuse(
                    StatusCode::TOO_MANY_REQUESTS,
                    "busy",
                    format!(
                        "{ip} has {} requests in flight already; retry in a second",
                        limits.max_in_flight_per_peer
                    ),
                );
            }
        },
    };
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

/// How many of something each peer IP address holds now.
#[derive(Clone, Default)]
struct PeerCounts(Arc<Mutex<HashMap<IpAddr, usize>>>);

impl PeerCounts {
    /// One more for `ip` if it holds fewer than `limit`; given back when the claim drops.
    fn claim(&self, ip: IpAddr, limit: usize) -> Option<PeerClaim> {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let held = counts.entry(ip).or_insert(0);
        if *held >= limit {
            return None;
        }
        *held += 1;
        Some(PeerClaim {
            counts: self.clone(),
            ip,
        })
    }
}

/// One of a peer's share, given back on drop (the entry goes with its last claim).
struct PeerClaim {
    counts: PeerCounts,
    ip: IpAddr,
}

impl Drop for PeerClaim {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = counts.get_mut(&self.ip) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// An acceptor (inside the TLS one) that closes a connection beyond the cap, or beyond its
/// peer's share, at once; each accepted connection holds its permits until it closes. With a
/// reserve (`certified`), a connection past the rest takes a reserved place, which
/// [`CertifiedReserve`] takes back after the handshake unless it presented a certificate.
#[derive(Clone)]
pub struct ConnectionCap {
    open: Arc<Semaphore>,
    reserved: Arc<Semaphore>,
    per_peer: usize,
    peers: PeerCounts,
    metrics: Arc<Metrics>,
}

impl ConnectionCap {
    /// `certified`: the server asks callers for a client certificate, so a reserve can be kept.
    pub fn new(limits: &ServerLimits, certified: bool, metrics: Arc<Metrics>) -> Self {
        let reserved = if certified {
            limits.reserved_for_certified.min(limits.max_connections)
        } else {
            0
        };
        Self {
            open: Arc::new(Semaphore::new(limits.max_connections - reserved)),
            reserved: Arc::new(Semaphore::new(reserved)),
            per_peer: limits.max_connections_per_peer,
            peers: PeerCounts::default(),
            metrics,
        }
    }

    fn admit(
        &self,
        stream: &TcpStream,
    ) -> io::Result<(OwnedSemaphorePermit, Place, Option<PeerClaim>)> {
        let peer_claim = match stream.peer_addr() {
            Ok(address) => Some(
                self.peers
                    .claim(address.ip(), self.per_peer)
                    .ok_or_else(|| io::Error::other("too many open connections from one peer"))?,
            ),
            // A connection already gone; the handshake will fail on its own.
            Err(_) => None,
        };
        let (permit, place) = match self.open.clone().try_acquire_owned() {
            Ok(permit) => (permit, Place::Open),
            Err(_) => {
                let permit = self.reserved.clone().try_acquire_owned();
                let permit = permit.map_err(|_| io::Error::other("too many open connections"))?;
                (permit, Place::Reserved)
            }
        };
        Ok((permit, place, peer_claim))
    }
}

/// Where an accepted connection counts: among the open places, or on one kept for certified
/// callers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Open,
    Reserved,
}

impl<S> Accept<TcpStream, S> for ConnectionCap {
    type Stream = Counted<TcpStream>;
    type Service = S;
    type Future = std::future::Ready<io::Result<(Counted<TcpStream>, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        std::future::ready(match self.admit(&stream) {
            Ok((permit, place, peer_claim)) => Ok((
                Counted {
                    stream,
                    _permit: permit,
                    place,
                    _peer_claim: peer_claim,
                },
                service,
            )),
            Err(error) => {
                self.metrics.server_refused("connections");
                Err(error)
            }
        })
    }
}

/// A stream that holds its connection's permits.
pub struct Counted<I> {
    stream: I,
    _permit: OwnedSemaphorePermit,
    place: Place,
    _peer_claim: Option<PeerClaim>,
}

impl<I> Counted<I> {
    /// It holds a place kept for certified callers.
    fn on_reserve(&self) -> bool {
        self.place == Place::Reserved
    }
}

/// The acceptor around the TLS one: a connection on a reserved place that presented no client
/// certificate is closed once its handshake is done (a certificate that does not verify never
/// completes the handshake). Every other connection passes as it is.
#[derive(Clone)]
pub struct CertifiedReserve<A> {
    inner: A,
    metrics: Arc<Metrics>,
}

impl<A> CertifiedReserve<A> {
    pub fn new(inner: A, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }
}

impl<A, S> Accept<TcpStream, S> for CertifiedReserve<A>
where
    A: Accept<TcpStream, S, Stream = TlsStream<Counted<TcpStream>>>,
    A::Future: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = TlsStream<Counted<TcpStream>>;
    type Service = A::Service;
    type Future = Pin<Box<dyn Future<Output = io::Result<(Self::Stream, A::Service)>> + Send>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let accepting = self.inner.accept(stream, service);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let (stream, service) = accepting.await?;
            let (counted, session) = stream.get_ref();
            let certified = session
                .peer_certificates()
                .is_some_and(|certificates| !certificates.is_empty());
            if counted.on_reserve() && !certified {
                metrics.server_refused("reserved");
                return Err(io::Error::other(
                    "a place kept for the API server, taken by a caller without its certificate",
                ));
            }
            Ok((stream, service))
        })
    }
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

    #[test]
    fn each_peer_holds_at_most_its_share_until_it_gives_it_back() {
        let counts = PeerCounts::default();
        let one: IpAddr = [10, 0, 0, 1].into();
        let other: IpAddr = [10, 0, 0, 2].into();
        let first = counts.claim(one, 2).expect("first");
        let _second = counts.claim(one, 2).expect("second");
        assert!(counts.claim(one, 2).is_none());
        assert!(
            counts.claim(other, 2).is_some(),
            "another peer has its own share"
        );
        drop(first);
        assert!(counts.claim(one, 2).is_some());
    }

    #[tokio::test]
    async fn a_peer_past_its_share_gets_429_while_another_is_answered() {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let limits = ServerLimits {
            max_in_flight: 4,
            max_in_flight_per_peer: 1,
            ..limits()
        };
        let app = app(Gate::new(limits, metrics));
        let from = |peer: [u8; 4], path: &str, body: Body| {
            let mut request = Request::post(path).body(body).expect("a request");
            let address = SocketAddr::from((peer, 40000));
            request.extensions_mut().insert(ConnectInfo(address));
            request
        };
        let slow = tokio::spawn({
            let app = app.clone();
            let request = from([10, 0, 0, 1], "/slow", Body::empty());
            async move { app.oneshot(request).await.expect("infallible").status() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let same = from([10, 0, 0, 1], "/echo", Body::from("x"));
        let other = from([10, 0, 0, 2], "/echo", Body::from("x"));
        let status = |request: Request| {
            let app = app.clone();
            async move { app.oneshot(request).await.expect("infallible").status() }
        };
        assert_eq!(status(same).await, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(status(other).await, StatusCode::OK);
        assert_eq!(slow.await.expect("joined"), StatusCode::SERVICE_UNAVAILABLE);
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
