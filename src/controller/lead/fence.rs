//! Fencing: every write the controller makes, to a Valkey node or to the API server, is sent
//! only while this replica's leadership still holds by its own clock
//! ([`crate::controller::lead::lease::holds`]), checked right before it is sent:
//!
//! | write | guarded by |
//! |---|---|
//! | every Valkey command that changes a node (`CLUSTER MEET`/`REPLICATE`/`FORGET`/`FAILOVER`/`SETSLOT`/`ADDSLOTSRANGE`/`MIGRATESLOTS`, `MIGRATE`, `ACL SETUSER`/`DELUSER`, `CONFIG SET`) | the check before each command ([`crate::valkey::Fence`]) |
//! | every API request that is not a read (ValkeyNodes, Pods, statuses, Secrets, owned objects, annotations, finalizers, Events) | the check before each request ([`FenceLayer`], on the controller's client) |
//! | the roll memory (`status.roll`) | also the `resourceVersion` the pass read, as a precondition: a writer acting on an old read fails |
//!
//! What a check cannot close: a process paused in the instant between the check and the bytes
//! leaving. The Lease's renew deadline (10 s) lies 5 s before another replica may take it (15
//! s), so such a write would have to stall for seconds inside one send.
//!
//! The election's own Lease requests go through another client: they are how leadership is
//! kept, and must never be fenced by it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Method, Request};
use tokio::sync::watch;

use crate::controller::lead::lease::{Leadership, holds};
use crate::valkey::Fence;

/// The Valkey fence of this replica's leadership.
pub fn valkey_fence(leadership: &watch::Receiver<Leadership>) -> Fence {
    let leadership = leadership.clone();
    Fence::new(move || holds(&leadership.borrow()))
}

/// A layer for the controller's API client: a request that is not a read fails without being
/// sent once leadership no longer holds.
#[derive(Clone)]
pub struct FenceLayer {
    leadership: watch::Receiver<Leadership>,
}

impl FenceLayer {
    pub fn new(leadership: watch::Receiver<Leadership>) -> Self {
        Self { leadership }
    }
}

impl<S> tower::Layer<S> for FenceLayer {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Fenced {
            inner,
            leadership: self.leadership.clone(),
        }
    }
}

/// The controller's API client's service, fenced (see [`FenceLayer`]).
#[derive(Clone)]
pub struct Fenced<S> {
    inner: S,
    leadership: watch::Receiver<Leadership>,
}

/// Why a request was not sent.
#[derive(Debug, thiserror::Error)]
#[error("{method} {path}: not sent: this replica no longer leads")]
pub struct NotLeading {
    method: Method,
    path: String,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Reads change nothing: they are never fenced (the watches keep running while a new term is
/// awaited).
fn is_read(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

impl<S, B> tower::Service<Request<B>> for Fenced<S>
where
    S: tower::Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if !is_read(request.method()) && !holds(&self.leadership.borrow()) {
            let refused = NotLeading {
                method: request.method().clone(),
                path: request.uri().path().to_owned(),
            };
            return Box::pin(async move { Err(refused.into()) });
        }
        let response = self.inner.call(request);
        Box::pin(async move { response.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, ServiceExt};

    #[tokio::test]
    async fn writes_go_only_while_leading_and_reads_always() {
        let (leading, leadership) = watch::channel(None);
        let answer = tower::service_fn(|_: Request<()>| async { Ok::<_, BoxError>("sent") });
        let fenced = FenceLayer::new(leadership).layer(answer);
        let request = |method: Method| {
            Request::builder()
                .method(method)
                .uri("/api/v1/namespaces/a/pods/b")
                .body(())
                .unwrap()
        };
        let sent = |method: Method| fenced.clone().oneshot(request(method));
        assert_eq!(sent(Method::GET).await.unwrap(), "sent");
        let refused = sent(Method::PATCH).await.unwrap_err().to_string();
        assert_eq!(
            refused,
            "PATCH /api/v1/namespaces/a/pods/b: not sent: this replica no longer leads"
        );
        leading.send_replace(Some(
            tokio::time::Instant::now() + std::time::Duration::from_secs(5),
        ));
        assert_eq!(sent(Method::DELETE).await.unwrap(), "sent");
        // Past the moment its last renewal counts for: fenced again, without a word from the
        // election (a paused process).
        leading.send_replace(Some(tokio::time::Instant::now()));
        assert!(sent(Method::POST).await.is_err());
    }
}
