//! Healing on real valkey-server processes: a crashed replica is replaced, and a shard whose
//! primary crashed waits for Valkey's own failover and is then refilled, while writes go on.

use std::time::Duration;

use harness::valkey::roller::{LocalRuntime, Roller, converge, roller, shape};
use harness::valkey::{OLD, Writer, wait_for_layout};
use valkey_operator::roll::{Role, Step};
use valkey_operator::valkey::NodeClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_nodes_are_replaced() {
    let mut roller = roller(45, "heal");
    let desired = shape(3, 1, OLD);
    converge(&mut roller, &desired, Duration::from_secs(60)).await;
    let expected = vec![(1, 5461), (1, 5461), (1, 5462)];
    let writer = Writer::start(roller.addresses());

    let replica = replica_names(&roller).await[0].clone();
    roller.crash_node(&replica).await.unwrap();
    converge(&mut roller, &desired, Duration::from_secs(60)).await;
    writer.assert_progressing().await;
    assert!(!roller.nodes().contains_key(&replica));
    wait_for_layout(&roller.addresses(), &expected).await;

    let before = roller.history().len();
    let primary = primary_names(&roller).await[0].clone();
    roller.crash_node(&primary).await.unwrap();
    converge(&mut roller, &desired, Duration::from_secs(90)).await;
    writer.assert_progressing().await;
    let steps = &roller.history()[before..];
    assert!(
        !steps
            .iter()
            .any(|r| matches!(r.step, Step::Failover { .. })),
        "a crashed primary is Valkey's to fail over, not the planner's"
    );
    assert!(!roller.nodes().contains_key(&primary));
    wait_for_layout(&roller.addresses(), &expected).await;

    // A crashed primary may take its last unreplicated writes with it (asynchronous
    // replication), so only progress is checked here, not every write.
    assert!(writer.stop().await.acked > 0);
}

async fn names_with_role(roller: &Roller<LocalRuntime>, primary: bool) -> Vec<String> {
    let mut out = Vec::new();
    for (name, addr) in roller.nodes() {
        let client = NodeClient::connect(&addr, Duration::from_secs(2))
            .await
            .unwrap();
        let role = client.replication_info().await.unwrap().role;
        if (role == Role::Primary) == primary {
            out.push(name);
        }
    }
    out
}

async fn replica_names(roller: &Roller<LocalRuntime>) -> Vec<String> {
    names_with_role(roller, false).await
}

async fn primary_names(roller: &Roller<LocalRuntime>) -> Vec<String> {
    names_with_role(roller, true).await
}
