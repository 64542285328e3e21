//! Leader election with a `coordination.k8s.io/v1` Lease: every replica serves webhooks, only the
//! holder of the Lease reconciles. A replica acquires the Lease when it is free or its holder
//! stopped renewing it, renews it while leading, and steps down (telling its controller to stop)
//! as soon as it cannot renew in time, before another replica may take over. Every write is a
//! compare-and-swap on `resourceVersion`, so two replicas never both believe they lead. The
//! published [`Leadership`] carries the moment it stops counting, so a reconcile checks it by
//! its own clock before acting (a process paused past it acts on nothing it read before).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

/// The Lease the replicas contend for, in the operator's namespace.
pub const LEASE_NAME: &str = "valkey-operator";

/// How leadership is held.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (the Pod name in a cluster).
    pub identity: String,
    /// How long a holder's claim lasts after its last renewal.
    pub lease_duration: Duration,
    /// A leader that has not renewed within this steps down (must be below `lease_duration`).
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: LEASE_NAME.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Whether this replica leads, as the election publishes it: `Some(until)` while it holds the
/// Lease, `until` being when its last renewal stops counting for itself (the renewal's start
/// plus `renew_deadline`, before any other replica may take the Lease at `lease_duration`).
/// A process that was paused past `until` must not act on what it read before the pause.
pub type Leadership = Option<tokio::time::Instant>;

/// Whether `leadership` still holds now, by this process's own monotonic clock.
pub fn holds(leadership: &Leadership) -> bool {
    leadership.is_some_and(|until| tokio::time::Instant::now() < until)
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn expired(lease: &LeaseSpec, at: Timestamp) -> bool {
    let Some(renewed) = lease.renew_time.as_ref().or(lease.acquire_time.as_ref()) else {
        return true;
    };
    let seconds = i64::from(lease.lease_duration_seconds.unwrap_or(0));
    renewed.0 + SignedDuration::from_secs(seconds) < at
}

/// One attempt to acquire or renew; `Ok(true)` when this replica holds the Lease afterwards.
async fn try_acquire_or_renew(api: &Api<Lease>, config: &LeaseConfig) -> Result<bool, kube::Error> {
    let at = now();
    let duration_seconds = i32::try_from(config.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(duration_seconds),
                acquire_time: Some(MicroTime(at)),
                renew_time: Some(MicroTime(at)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
    let mine = holder == Some(config.identity.as_str());
    if !mine && holder.is_some() && !expired(spec, at) {
        return Ok(false);
    }
    if !mine {
        spec.holder_identity = Some(config.identity.clone());
        spec.acquire_time = Some(MicroTime(at));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(MicroTime(at));
    spec.lease_duration_seconds = Some(duration_seconds);
    // `replace` carries the resourceVersion we read: a concurrent writer makes this a 409.
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Gives the Lease up (if held) so another replica can take over at once.
async fn release(api: &Api<Lease>, config: &LeaseConfig) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = Some(MicroTime(now() - SignedDuration::from_secs(3600)));
    api.replace(&config.name, &PostParams::default(), &lease)
        .await?;
    Ok(())
}

/// Runs the election until `shutdown` completes, publishing whether this replica leads.
/// On shutdown a held Lease is released.
pub async fn run(
    client: Client,
    config: LeaseConfig,
    leading: watch::Sender<Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut last_renewal: Option<tokio::time::Instant> = None;
    let mut ticker = tokio::time::interval(config.retry_period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => {}
        }
        let started = tokio::time::Instant::now();
        let attempt =
            tokio::time::timeout(config.renew_deadline, try_acquire_or_renew(&api, &config)).await;
        match attempt {
            Ok(Ok(true)) => {
                last_renewal = Some(started);
                if leading.borrow().is_none() {
                    tracing::info!(identity = %config.identity, lease = %config.name, "became the leader");
                }
                leading.send_replace(Some(started + config.renew_deadline));
            }
            Ok(Ok(false)) => {
                last_renewal = None;
                if leading.borrow().is_some() {
                    tracing::warn!(identity = %config.identity, "lost the lease to another replica");
                    leading.send_replace(None);
                }
            }
            Ok(Err(error)) => tracing::warn!(%error, "lease update failed"),
            Err(_) => tracing::warn!("lease update timed out"),
        }
        let overdue = last_renewal.is_some_and(|at| at.elapsed() > config.renew_deadline);
        if overdue && leading.borrow().is_some() {
            tracing::warn!(identity = %config.identity, "could not renew the lease in time; stepping down");
            leading.send_replace(None);
            last_renewal = None;
        }
    }
    let was_leading = leading.send_replace(None).is_some();
    if was_leading && let Err(error) = release(&api, &config).await {
        tracing::warn!(%error, "could not release the lease on shutdown");
    }
}
