//! The engine protocol against real valkey-server processes (9.0.0 and 9.1.2): meet,
//! replicate (retried until gossip introduces the primary), slots, CLUSTER SHARDS, atomic slot
//! migration, a clean failover polled to completion, CONFIG SET, ACL SETUSER, FORGET
//! everywhere, and errors that name the node and command.

use std::time::Duration;

use harness::eventually;
use harness::valkey::roller::LocalRuntime;
use harness::valkey::runtime::{NodeRuntime, NodeSpec};
use harness::valkey::{NEW, OLD, key_slot};
use sha2::{Digest, Sha256};
use valkey_operator::credentials::Credentials;
use valkey_operator::roll::{Role, SlotRange};
use valkey_operator::valkey::{NodeAddress, NodeClient, forget_everywhere};

const CALL: Duration = Duration::from_secs(2);

async fn start(runtime: &LocalRuntime, name: &str, version: &str) -> NodeClient {
    let spec = NodeSpec {
        name: name.into(),
        shard: 0,
        revision: version.into(),
    };
    let addr = runtime.start_node(&spec).await.unwrap().to_string();
    eventually(
        format!("{name} to answer"),
        Duration::from_secs(10),
        async || {
            let client = NodeClient::connect(&addr, CALL).await.ok()?;
            client.ping().await.ok()?;
            Some(client)
        },
    )
    .await
}

/// How long gossip and replication get to show a change on every node.
const SETTLE: Duration = Duration::from_secs(15);

fn address(client: &NodeClient) -> NodeAddress {
    client.addr().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_commands_on_real_nodes() {
    let runtime = LocalRuntime::new(46).unwrap();
    let a = start(&runtime, "a", OLD).await;
    let b = start(&runtime, "b", OLD).await;
    let c = start(&runtime, "c", NEW).await;
    assert_eq!(a.server_info().await.unwrap().version, OLD);
    assert_eq!(c.server_info().await.unwrap().version, NEW);
    let (a_id, b_id) = (a.my_id().await.unwrap(), b.my_id().await.unwrap());

    a.meet(address(&b)).await.unwrap();
    a.meet(address(&c)).await.unwrap();
    // Right after MEET, c does not know a yet: replicate retries "Unknown node".
    c.replicate(&a_id, Duration::from_secs(10)).await.unwrap();
    a.add_slots_range(&[SlotRange::new(0, 8191)]).await.unwrap();
    b.add_slots_range(&[SlotRange::new(8192, 16383)])
        .await
        .unwrap();
    for node in [&a, &b, &c] {
        eventually("cluster_state:ok", SETTLE, async || {
            node.cluster_info().await.is_ok_and(|i| i.state_ok)
        })
        .await;
    }
    let shards = a.cluster_shards().await.unwrap();
    assert_eq!(shards.len(), 2);
    let a_shard = shards
        .iter()
        .find(|s| s.slots == [SlotRange::new(0, 8191)])
        .unwrap();
    assert_eq!(a_shard.members.len(), 2);

    // Keys in slots 0..=99, written on a, then migrated to b.
    let keys: Vec<String> = (0..20_000)
        .map(|i| format!("k{i}"))
        .filter(|k| key_slot(k) < 100)
        .collect();
    assert!(!keys.is_empty());
    let mut conn = redis::Client::open(format!("redis://{}/", a.addr()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for key in &keys {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    a.migrate_slots(&b_id, &[SlotRange::new(0, 99)], Duration::from_secs(30))
        .await
        .unwrap();
    let b_view = b.cluster_nodes().await.unwrap();
    let b_self = b_view.iter().find(|n| n.myself).unwrap();
    assert!(b_self.slots.contains(&SlotRange::new(0, 99)));
    let mut b_conn = redis::Client::open(format!("redis://{}/", b.addr()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for key in &keys {
        let value: String = redis::cmd("GET")
            .arg(key)
            .query_async(&mut b_conn)
            .await
            .unwrap();
        assert_eq!(&value, key);
    }
    assert!(
        b.slot_migrations()
            .await
            .unwrap()
            .iter()
            .any(|j| j.succeeded())
    );
    b.cancel_slot_migrations().await.unwrap();

    // A clean failover onto the 9.1.2 replica, once every primary knows it as a's replica.
    eventually("c synced and known", SETTLE, async || {
        let info = c.replication_info().await.unwrap();
        let b_knows = b
            .cluster_nodes()
            .await
            .unwrap()
            .iter()
            .any(|n| n.replica_of.as_deref() == Some(a_id.as_str()));
        info.link_up && !info.sync_in_progress && b_knows
    })
    .await;
    c.failover(&a, Duration::from_secs(10)).await.unwrap();
    assert_eq!(c.replication_info().await.unwrap().role, Role::Primary);
    assert_eq!(a.replication_info().await.unwrap().role, Role::Replica);

    // A failover asked of a primary fails, naming the node and the command.
    let error = c
        .failover(&a, Duration::from_secs(1))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(c.addr()) && error.contains("CLUSTER FAILOVER"),
        "{error}"
    );

    b.config_set("maxmemory", "123mb").await.unwrap();
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query_async(&mut b_conn)
        .await
        .unwrap();
    assert_eq!(got[1], (123 * 1024 * 1024).to_string());

    let hash = format!("#{:x}", Sha256::digest(b"s3cret"));
    b.acl_set_user(
        "app",
        &[
            "reset".into(),
            "on".into(),
            hash,
            "~*".into(),
            "+@all".into(),
        ],
    )
    .await
    .unwrap();
    let auth: String = redis::cmd("AUTH")
        .arg("app")
        .arg("s3cret")
        .query_async(&mut b_conn)
        .await
        .unwrap();
    assert_eq!(auth, "OK");

    // Connecting as a user: the password goes in the handshake; a wrong one is refused there,
    // and neither the error nor the credentials' Debug ever shows it.
    let app = Credentials {
        username: "app".into(),
        password: "s3cret".into(),
    };
    let as_app = NodeClient::connect_as(b.addr(), CALL, Some(&app))
        .await
        .unwrap();
    as_app.ping().await.unwrap();
    let wrong = Credentials {
        password: "guessed-wrong".into(),
        ..app.clone()
    };
    let error = NodeClient::connect_as(b.addr(), CALL, Some(&wrong))
        .await
        .err()
        .expect("a wrong password was accepted")
        .to_string();
    assert!(
        error.contains(b.addr()) && !error.contains("guessed-wrong"),
        "{error}"
    );
    assert!(!format!("{wrong:?}").contains("guessed-wrong"));

    // a, now a replica, leaves: stop it, then every remaining node forgets it.
    runtime.stop_node("a").await.unwrap();
    forget_everywhere(&[b.clone(), c.clone()], &a_id)
        .await
        .unwrap();
    for node in [&b, &c] {
        assert!(
            !node
                .cluster_nodes()
                .await
                .unwrap()
                .iter()
                .any(|n| n.id == a_id)
        );
    }

    // Errors name the node and the command.
    let error = a.ping().await.unwrap_err().to_string();
    assert!(
        error.contains(a.addr()) && error.contains("PING"),
        "{error}"
    );
    let error = NodeClient::connect("127.0.46.250:6379", Duration::from_millis(300))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("127.0.46.250:6379"), "{error}");
}
