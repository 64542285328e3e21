//! Leader election against the real API server: one leader at a time, a clean handover on
//! shutdown, and a takeover after a leader dies without releasing the Lease, whose last word
//! stops counting (the fence every reconcile checks before acting) before the takeover.

use std::time::{Duration, Instant};

use harness::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use testenv::ControlPlane;
use tokio::sync::{oneshot, watch};
use valkey_operator::controller::lead::lease::{self, LeaseConfig};

struct Elector {
    leading: watch::Receiver<lease::Leadership>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

fn start(client: kube::Client, identity: &str) -> Elector {
    let config = LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
        ..LeaseConfig::new("default", identity)
    };
    let (sender, leading) = watch::channel(None);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(lease::run(client, config, sender, async move {
        let _ = stopped.await;
    }));
    Elector {
        leading,
        stop: Some(stop),
        task,
    }
}

/// How long an election may take: a Lease expires after 3 s, retried every 300 ms.
const ELECTION: Duration = Duration::from_secs(30);

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get("valkey-operator")
        .await
        .ok()?
        .spec?
        .holder_identity
}

#[tokio::test]
async fn one_leader_at_a_time_with_handover_and_takeover() {
    let plane = ControlPlane::start().await.expect("control plane");
    let client = plane.client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");

    let mut a = start(client.clone(), "replica-a");
    eventually("replica-a to lead", ELECTION, async || {
        lease::holds(&a.leading.borrow())
    })
    .await;
    let mut b = start(client.clone(), "replica-b");
    // For several retry periods, b must not lead while a does: a deliberate hold, checked
    // every 50 ms, not a wait for something to happen.
    let watched_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watched_until {
        assert!(
            lease::holds(&a.leading.borrow()) && !lease::holds(&b.leading.borrow()),
            "two leaders, or a lost its lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(holder(&leases).await.as_deref(), Some("replica-a"));

    // A clean shutdown releases the Lease; b takes over.
    let _ = a.stop.take().unwrap().send(());
    (&mut a.task).await.unwrap();
    assert!(!lease::holds(&a.leading.borrow()));
    eventually("replica-b to take over", ELECTION, async || {
        lease::holds(&b.leading.borrow())
    })
    .await;
    assert_eq!(holder(&leases).await.as_deref(), Some("replica-b"));

    // b dies without releasing: c takes over once the Lease expires, never both at once.
    let c = start(client.clone(), "replica-c");
    b.task.abort();
    let _ = (&mut b.task).await;
    // Its last word still says "leading", as a paused process's would: by its own clock it
    // stops counting within the renew deadline, while the Lease is still b's.
    assert!(b.leading.borrow().is_some());
    eventually("b's leadership to stop counting", ELECTION, async || {
        !lease::holds(&b.leading.borrow())
    })
    .await;
    assert_eq!(
        holder(&leases).await.as_deref(),
        Some("replica-b"),
        "the fence closes before the Lease can change hands"
    );
    eventually(
        "replica-c to take over an expired lease",
        ELECTION,
        async || lease::holds(&c.leading.borrow()),
    )
    .await;
    let transitions = leases
        .get("valkey-operator")
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;
    assert_eq!(transitions, Some(2), "a → b → c");
}
