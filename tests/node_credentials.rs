//! The operator's own credentials on real valkey-server processes (9.0.0 and 9.1.2), as the
//! operator writes them: a node started with the `auth.conf` of [`SystemCredentials`] admits no
//! client without credentials (not even to Valkey 9.0's slot-migration protocol, with which a
//! stranger could otherwise take any shard's slots), lets the operator in with only its
//! commands, a replica sync from its primary as the replication user and slots move (key by
//! key on 9.0, atomically on 9.1); a node made before (open `default`) is closed live; a
//! rotation never locks the operator out.

use std::time::Duration;

use harness::eventually;
use harness::valkey::attacks::hijack_slots;
use harness::valkey::logins::anonymous_reply;
use harness::valkey::roller::LocalRuntime;
use harness::valkey::runtime::{NodeRuntime, NodeSpec};
use harness::valkey::{NEW, OLD};
use valkey_operator::credentials::SystemCredentials;
use valkey_operator::execute::acl::{DesiredAcl, apply_users};
use valkey_operator::roll::{Role, SlotRange};
use valkey_operator::valkey::migration::{KeyMove, Protocol, move_keys};
use valkey_operator::valkey::{ClusterNode, Expected, NodeAddress, NodeClient, Reach};

const CALL: Duration = Duration::from_secs(2);

fn reach(credentials: &SystemCredentials) -> Reach {
    Reach {
        credentials: credentials.logins(),
        ..Reach::plain(CALL)
    }
}

/// A node of `version` started as the operator's Pods start: with `--include` of `auth_conf`
/// (none for a node made before the operator closed `default`).
async fn start(
    runtime: &LocalRuntime,
    name: &str,
    version: &str,
    reach: &Reach,
) -> (NodeAddress, NodeClient) {
    let spec = NodeSpec {
        name: name.into(),
        shard: 0,
        revision: version.into(),
    };
    let address = runtime.start_node(&spec).await.unwrap();
    let client = eventually(
        format!("{name} to answer"),
        Duration::from_secs(10),
        async || {
            let client = NodeClient::open(&any_node(address), reach).await.ok()?;
            client.ping().await.ok()?;
            Some(client)
        },
    )
    .await;
    (address, client)
}

fn runtime_with(subnet: u8, credentials: &SystemCredentials) -> LocalRuntime {
    let runtime = LocalRuntime::new(subnet).unwrap();
    let conf = runtime.work_dir().join("auth.conf");
    std::fs::write(&conf, credentials.auth_conf()).unwrap();
    runtime.with_setting("include", conf.to_str().unwrap())
}

/// A node whose id the test has not recorded, that may be open (one made before the operator
/// closed `default`).
fn any_node(address: NodeAddress) -> Expected<'static> {
    Expected {
        address,
        id: None,
        closed: false,
    }
}

/// A node started with the operator's users.
fn closed(address: NodeAddress) -> Expected<'static> {
    Expected {
        closed: true,
        ..any_node(address)
    }
}

/// What a client without credentials gets for `command`.
async fn anonymous(address: NodeAddress, command: &[&str]) -> String {
    anonymous_reply(&address.to_string(), command).await
}

const PROBES: [&[&str]; 4] = [
    &["GET", "k"],
    &["SET", "k", "v"],
    &["CONFIG", "GET", "maxmemory"],
    &["CLUSTER", "NODES"],
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_started_with_auth_conf_admit_only_the_operator_and_replicate_as_their_own_user() {
    let credentials = SystemCredentials::fresh().unwrap();
    for (subnet, version) in [(49, OLD), (50, NEW)] {
        let runtime = runtime_with(subnet, &credentials);
        let reach = reach(&credentials);
        let (a_address, a) = start(&runtime, "a", version, &reach).await;
        let (b_address, b) = start(&runtime, "b", version, &reach).await;
        assert!(a.is_logged_in());

        // No command for a client without credentials, on either version.
        for probe in PROBES {
            let answer = anonymous(a_address, probe).await;
            assert!(answer.contains("NOAUTH"), "{version} {probe:?}: {answer}");
        }
        // The operator has its commands, and no key.
        a.cluster_nodes().await.unwrap();
        a.config_set("maxmemory-policy", "noeviction")
            .await
            .unwrap();

        // A replica syncs from its primary as the replication user (masteruser/masterauth).
        a.meet(b_address).await.unwrap();
        let a_id = a.my_id().await.unwrap();
        b.replicate(&a_id, Duration::from_secs(10)).await.unwrap();
        eventually(
            format!("{version}: b's link to its primary up"),
            Duration::from_secs(15),
            async || {
                let info = b.replication_info().await.ok()?;
                (info.role == Role::Replica && info.link_up).then_some(())
            },
        )
        .await;
        // Slots move between primaries: atomically on 9.1 (its source logs in to the target as
        // `masteruser`), key by key on 9.0 (`MIGRATE … AUTH2` as the replication user).
        let (c_address, c) = start(&runtime, "c", version, &reach).await;
        a.meet(c_address).await.unwrap();
        a.add_slots_range(&[SlotRange::new(0, 16383)])
            .await
            .unwrap();
        let c_id = c.my_id().await.unwrap();
        eventually(
            format!("{version}: c sees a's slots and the cluster ok"),
            Duration::from_secs(15),
            async || {
                let nodes = c.cluster_nodes().await.ok()?;
                let ok = c.cluster_info().await.ok()?.state_ok;
                (ok && nodes.iter().any(|n| n.id == a_id && !n.slots.is_empty())).then_some(())
            },
        )
        .await;
        // With keys in the slots moved (a tenant's writes).
        let rules = ["reset", "on", ">tenant-password", "~*", "+@all"].map(String::from);
        a.acl_set_user("tenant", &rules).await.unwrap();
        let mut tenant =
            redis::Client::open(format!("redis://tenant:tenant-password@{a_address}/"))
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
        let keys: Vec<String> = (0..5000)
            .map(|i| format!("k{i}"))
            .filter(|k| harness::valkey::key_slot(k) < 100)
            .collect();
        assert!(!keys.is_empty());
        eventually(
            format!("{version}: a serves its slots"),
            Duration::from_secs(15),
            async || {
                let set: redis::RedisResult<()> = redis::cmd("SET")
                    .arg(&keys[0])
                    .arg("v")
                    .query_async(&mut tenant.clone())
                    .await;
                set.ok()
            },
        )
        .await;
        for key in &keys {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg("v")
                .query_async(&mut tenant)
                .await
                .unwrap();
        }
        let slots = [SlotRange::new(0, 99)];
        match Protocol::between(version, version) {
            Protocol::Atomic => a
                .migrate_slots(&c_id, &slots, Duration::from_secs(30))
                .await
                .unwrap(),
            Protocol::KeyByKey => {
                let login = credentials.system_users().replication;
                let mover = NodeClient::open_as(&any_node(a_address), &reach, &login)
                    .await
                    .unwrap();
                let ends = KeyMove {
                    source: &a,
                    source_pool: &[],
                    target_pool: &[],
                    mover: &mover,
                    target: &c,
                    target_address: c_address,
                    login: Some(&login),
                };
                let moved = move_keys(&ends, &slots, Duration::from_secs(30))
                    .await
                    .unwrap();
                assert_eq!(moved, keys.len() as u64, "{version}");
            }
        }
        assert!(
            owns(&c, 0).await && owns(&c, 99).await,
            "{version}: c owns 0-99"
        );
        c.acl_set_user("tenant", &rules).await.unwrap();
        let mut at_c = redis::Client::open(format!("redis://tenant:tenant-password@{c_address}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        for key in &keys {
            let value: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut at_c)
                .await
                .unwrap();
            assert_eq!(
                value.as_deref(),
                Some("v"),
                "{version}: {key} after the move"
            );
        }
        for name in ["a", "b", "c"] {
            runtime.stop_node(name).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_node_is_closed_live_and_a_rotation_never_locks_the_operator_out() {
    // Made before the operator closed `default`: no auth.conf.
    let runtime = LocalRuntime::new(51).unwrap();
    let credentials = SystemCredentials::fresh().unwrap();
    let reach_now = reach(&credentials);
    let (address, _) = start(&runtime, "legacy", NEW, &reach_now).await;

    // The operator's login is refused (no such user yet): it gets in as `default`.
    let legacy = any_node(address);
    let first = NodeClient::open(&legacy, &reach_now).await.unwrap();
    assert!(!first.is_logged_in());
    let desired = DesiredAcl {
        system: Some(credentials.system_users()),
        ..DesiredAcl::none()
    };
    // First its users, `default` left open (the other nodes may not have the login yet)...
    assert_eq!(
        apply_users(&first, &desired.leaving_default_open())
            .await
            .unwrap(),
        []
    );
    let still_open = anonymous(address, &["PING"]).await;
    assert!(still_open.contains("answered"), "{still_open}");
    // ...then, logged in as itself, `default` closed: a password goes only to the node
    // recorded with this id, never to whoever answers at the address.
    let unrecorded = NodeClient::open(&legacy, &reach_now).await.unwrap();
    assert!(!unrecorded.is_logged_in());
    let id = first.id().unwrap().to_owned();
    let recorded = Expected {
        id: Some(&id),
        ..any_node(address)
    };
    let second = NodeClient::open(&recorded, &reach_now).await.unwrap();
    assert!(second.is_logged_in());
    assert_eq!(apply_users(&second, &desired).await.unwrap(), []);
    for probe in PROBES {
        let answer = anonymous(address, probe).await;
        assert!(answer.contains("NOAUTH"), "{probe:?}: {answer}");
    }

    // A rotation: both passwords are let in while it moves on, and the operator always is.
    let fresh = || valkey_operator::credentials::Passwords::generate();
    let mut state = credentials.clone();
    let old_only = Reach {
        credentials: credentials.logins(),
        ..Reach::plain(CALL)
    };
    for step in 0..3 {
        let reach = reach(&state);
        let client = NodeClient::open(&closed(address), &reach).await.unwrap();
        assert!(client.is_logged_in(), "step {step}: locked out");
        let desired = DesiredAcl {
            system: Some(state.system_users()),
            ..DesiredAcl::none()
        };
        assert_eq!(apply_users(&client, &desired).await.unwrap(), []);
        state = state.advanced(step == 0, step > 0, fresh).unwrap().unwrap();
    }
    // Done: the new password is the only one.
    assert_ne!(state.current, credentials.current);
    let desired = DesiredAcl {
        system: Some(state.system_users()),
        ..DesiredAcl::none()
    };
    let client = NodeClient::open(&closed(address), &reach(&state))
        .await
        .unwrap();
    assert!(client.is_logged_in());
    apply_users(&client, &desired).await.unwrap();
    // The old password is refused, and a closed node is never used without credentials.
    let stale = NodeClient::open(&closed(address), &old_only).await;
    assert!(
        stale.as_ref().is_err_and(|e| e.is_auth_refusal()),
        "the old password: {:?}",
        stale.err()
    );
}

/// Whether `node` says it owns `slot` (its own line of `CLUSTER NODES`).
async fn owns(node: &NodeClient, slot: u16) -> bool {
    let view = node.cluster_nodes().await.unwrap();
    let me: &ClusterNode = view.iter().find(|n| n.myself).unwrap();
    me.slots.iter().any(|r| (r.start..=r.end).contains(&slot))
}

/// The attack of the 9.0 slot-migration protocol, by a client without credentials, on real
/// 9.0.0 nodes started as the operator starts them: refused with `NOAUTH` at every step, no
/// slot changes owner, every key stays readable. The same attack on a node whose `default`
/// keeps `CLUSTER SYNCSLOTS` (what this operator used to leave on 9.0 nodes) takes the slots
/// and loses their keys: the refusal is the configuration's doing, not the attack's failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_credentials_cannot_take_a_9_0_shards_slots() {
    let credentials = SystemCredentials::fresh().unwrap();
    let runtime = runtime_with(53, &credentials);
    let reach = reach(&credentials);
    let (a_address, a) = start(&runtime, "a", OLD, &reach).await;
    let (b_address, b) = start(&runtime, "b", OLD, &reach).await;
    a.add_slots_range(&[SlotRange::new(0, 8191)]).await.unwrap();
    b.add_slots_range(&[SlotRange::new(8192, 16383)])
        .await
        .unwrap();
    a.meet(b_address).await.unwrap();
    for node in [&a, &b] {
        eventually("cluster_state:ok", Duration::from_secs(15), async || {
            node.cluster_info().await.ok()?.state_ok.then_some(())
        })
        .await;
    }
    let b_id = b.my_id().await.unwrap();
    let rules = ["reset", "on", ">tenant-password", "~*", "+@all"].map(String::from);
    b.acl_set_user("tenant", &rules).await.unwrap();
    let mut tenant = redis::Client::open(format!("redis://tenant:tenant-password@{b_address}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = (0..20_000)
        .map(|i| format!("k{i}"))
        .filter(|k| (8192..=8300).contains(&harness::valkey::key_slot(k)))
        .take(50)
        .collect();
    for key in &keys {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("v")
            .query_async(&mut tenant)
            .await
            .unwrap();
    }
    let readable = async |tenant: &mut redis::aio::MultiplexedConnection| {
        let mut found = 0;
        for key in &keys {
            let value: redis::RedisResult<Option<String>> =
                redis::cmd("GET").arg(key).query_async(tenant).await;
            if matches!(value, Ok(Some(_))) {
                found += 1;
            }
        }
        found
    };

    let replies = hijack_slots(&a_address.to_string(), &b_id, 8192, 8300).await;
    for reply in &replies {
        assert!(reply.starts_with("-NOAUTH"), "a step answered: {replies:?}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!owns(&a, 8192).await, "a took slot 8192");
    assert!(owns(&b, 8192).await && owns(&b, 8300).await);
    assert_eq!(readable(&mut tenant).await, keys.len(), "keys lost");

    // The control: `default` as the operator used to leave it on 9.0.
    let open = ["reset", "on", "nopass", "+cluster|syncslots"].map(String::from);
    a.acl_set_user("default", &open).await.unwrap();
    let replies = hijack_slots(&a_address.to_string(), &b_id, 8192, 8300).await;
    assert_eq!(replies[0], "+OK\r\n", "{replies:?}");
    eventually(
        "the open node takes the slots",
        Duration::from_secs(10),
        async || owns(&a, 8192).await.then_some(()),
    )
    .await;
    assert!(
        readable(&mut tenant).await < keys.len(),
        "the attack on an open node lost nothing: the test would prove nothing"
    );
    for name in ["a", "b"] {
        runtime.stop_node(name).await.unwrap();
    }
}
