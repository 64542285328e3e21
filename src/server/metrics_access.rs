//! Who may read `/metrics`: the series name every cluster, node and primary of the fleet, so
//! they are served only to callers the API server says may `get` the non-resource URL
//! `/metrics` (the convention of controller-runtime's "secure metrics" and of the kubelet): a
//! bearer token, checked with a TokenReview, whose user a SubjectAccessReview allows. The chart
//! grants that with its ClusterRole `<release>-metrics-reader`, to bind to Prometheus's
//! ServiceAccount.
//!
//! The work a caller can cause is bounded: an answer is kept for a minute per token (a refusal
//! for ten seconds), at most [`MAX_KEPT`] of them, and at most [`MAX_REVIEWS`] reviews run at
//! once; a caller beyond that gets `503` and is asked again by its next scrape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

/// How `/metrics` is guarded.
#[derive(Clone)]
pub enum MetricsAccess {
    /// Anyone who reaches the port (`--metrics-auth=none`, e.g. behind a NetworkPolicy).
    Open,
    /// Callers the API server allows (see the module).
    Kubernetes(Arc<Reviews>),
}

/// Answers kept for a minute (a refusal for [`REFUSAL_KEPT`]).
const ALLOWED_KEPT: Duration = Duration::from_secs(60);
const REFUSAL_KEPT: Duration = Duration::from_secs(10);
/// At most this many tokens' answers are kept; refusals go first, then the oldest.
pub const MAX_KEPT: usize = 1024;
/// At most this many reviews run at once.
pub const MAX_REVIEWS: usize = 4;

/// The API server's answers about bearer tokens, kept briefly.
pub struct Reviews {
    client: kube::Client,
    kept: Mutex<HashMap<[u8; 32], (Instant, Verdict)>>,
    running: Semaphore,
}

/// What a caller of `/metrics` is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// No bearer token, or one the API server does not know: `401`.
    Unauthenticated,
    /// A user the API server does not allow to get `/metrics`: `403`.
    Forbidden,
    /// Too many reviews at once, or the API server could not answer: `503`.
    Unavailable,
}

impl Verdict {
    pub fn status(self) -> StatusCode {
        match self {
            Verdict::Allowed => StatusCode::OK,
            Verdict::Unauthenticated => StatusCode::UNAUTHORIZED,
            Verdict::Forbidden => StatusCode::FORBIDDEN,
            Verdict::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Verdict::Allowed => "",
            Verdict::Unauthenticated => {
                "a bearer token the API server knows is needed (Authorization: Bearer ...)\n"
            }
            Verdict::Forbidden => {
                "this user may not get /metrics: bind it to the ClusterRole <release>-metrics-reader\n"
            }
            Verdict::Unavailable => "cannot check the caller now; try again\n",
        }
    }
}

/// The bearer token of an `Authorization` header, if one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Reviews {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            kept: Mutex::new(HashMap::new()),
            running: Semaphore::new(MAX_REVIEWS),
        }
    }

    /// What the caller with these headers may do.
    pub async fn judge(&self, headers: &HeaderMap) -> Verdict {
        let Some(token) = bearer(headers) else {
            return Verdict::Unauthenticated;
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(kept) = self.kept(&key, Instant::now()) {
            return kept;
        }
        let Ok(_running) = self.running.try_acquire() else {
            return Verdict::Unavailable;
        };
        let verdict = match self.review(token).await {
            Ok(verdict) => verdict,
            Err(error) => {
                tracing::warn!(%error, "could not review a /metrics caller");
                return Verdict::Unavailable;
            }
        };
        self.keep(key, verdict, Instant::now());
        verdict
    }

    fn kept(&self, key: &[u8; 32], now: Instant) -> Option<Verdict> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let (at, verdict) = kept.get(key)?;
        let lasts = match verdict {
            Verdict::Allowed => ALLOWED_KEPT,
            _ => REFUSAL_KEPT,
        };
        (now.saturating_duration_since(*at) < lasts).then_some(*verdict)
    }

    fn keep(&self, key: [u8; 32], verdict: Verdict, now: Instant) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|_, (at, _)| now.saturating_duration_since(*at) < ALLOWED_KEPT);
        // Full: a refusal goes first (anyone can make those by the thousand with made-up
        // tokens; an allowed answer, like Prometheus's, takes a token the API server vouches
        // for), then the oldest.
        let evicted = kept
            .iter()
            .min_by_key(|(_, (at, verdict))| (*verdict == Verdict::Allowed, *at))
            .map(|(k, _)| *k);
        if kept.len() >= MAX_KEPT
            && let Some(evicted) = evicted
        {
            kept.remove(&evicted);
        }
        kept.insert(key, (now, verdict));
    }

    /// A TokenReview of `token`, then a SubjectAccessReview of its user for `get /metrics`.
    async fn review(&self, token: &str) -> Result<Verdict, kube::Error> {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let asked = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = reviews.create(&PostParams::default(), &asked).await?;
        let Some(user) = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
        else {
            return Ok(Verdict::Unauthenticated);
        };
        let access: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let asked = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let answer = access.create(&PostParams::default(), &asked).await?;
        Ok(if answer.status.is_some_and(|s| s.allowed) {
            Verdict::Allowed
        } else {
            Verdict::Forbidden
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(authorization).unwrap(),
        );
        headers
    }

    #[test]
    fn only_a_bearer_token_is_taken() {
        assert_eq!(bearer(&with("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer(&with("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(&with("Basic dXNlcjpwYXNz")), None);
        assert_eq!(bearer(&with("Bearer ")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn answers_are_kept_briefly_refusals_more_briefly_and_never_too_many() {
        // The client is never used: every answer asked for is kept.
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let reviews = Reviews::new(kube::Client::try_from(config).unwrap());
        let start = Instant::now();
        let key = |n: u32| -> [u8; 32] { Sha256::digest(n.to_be_bytes()).into() };
        reviews.keep(key(1), Verdict::Allowed, start);
        reviews.keep(key(2), Verdict::Forbidden, start);
        let at = |secs| start + Duration::from_secs(secs);
        assert_eq!(reviews.kept(&key(1), at(59)), Some(Verdict::Allowed));
        assert_eq!(reviews.kept(&key(1), at(60)), None);
        assert_eq!(reviews.kept(&key(2), at(9)), Some(Verdict::Forbidden));
        assert_eq!(reviews.kept(&key(2), at(10)), None);
        for n in 0..(MAX_KEPT as u32 + 10) {
            reviews.keep(key(1000 + n), Verdict::Forbidden, at(1));
        }
        assert!(reviews.kept.lock().unwrap().len() <= MAX_KEPT);
        // A flood of made-up tokens does not push out an allowed caller's answer.
        assert_eq!(
            reviews.kept(&key(1), at(30)),
            Some(Verdict::Allowed),
            "the oldest, but allowed"
        );
    }
}
