//! The operator's own credentials on real valkey-server processes (9.0.0 and 9.1.2), as the
//! operator writes them: a node started with the `auth.conf` of [`SystemCredentials`] admits no
//! client without credentials, lets the operator in with only its commands and a replica
//! sync from its primary as the replication user; a node made before (open `default`) is
//! closed live; a rotation never locks the operator out.

// Test code reports failures by panicking; the house rules against it are for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use harness::eventually;
use harness::valkey::logins::anonymous_reply;
use harness::valkey::roller::LocalRuntime;
use harness::valkey::runtime::{NodeRuntime, NodeSpec};
use harness::valkey::{NEW, OLD};
use valkey_operator::credentials::{DefaultUser, SystemCredentials};
use valkey_operator::execute::acl::{DesiredAcl, apply_users};
use valkey_operator::roll::{Role, SlotRange};
use valkey_operator::valkey::{NodeAddress, NodeClient, Reach};

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
            let client = NodeClient::at(address, reach).await.ok()?;
            client.ping().await.ok()?;
            Some(client)
        },
    )
    .await;
    (address, client)
}

fn runtime_with(subnet: u8, credentials: &SystemCredentials, default: DefaultUser) -> LocalRuntime {
    let runtime = LocalRuntime::new(subnet).unwrap();
    let conf = std::env::temp_dir().join(format!("auth-{}-{subnet}.conf", std::process::id()));
    std::fs::write(&conf, credentials.auth_conf(default)).unwrap();
    runtime.with_setting("include", conf.to_str().unwrap())
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
        let default = DefaultUser::for_versions([version]);
        let runtime = runtime_with(subnet, &credentials, default);
        let reach = reach(&credentials);
        let (a_address, a) = start(&runtime, "a", version, &reach).await;
        let (b_address, b) = start(&runtime, "b", version, &reach).await;
        assert!(a.is_logged_in());

        // No command for a client without credentials: NOAUTH from 9.1, NOPERM on 9.0 (whose
        // `default` keeps only CLUSTER SYNCSLOTS, for its slot migration).
        let refusal = if version == NEW { "NOAUTH" } else { "NOPERM" };
        for probe in PROBES {
            let answer = anonymous(a_address, probe).await;
            assert!(answer.contains(refusal), "{version} {probe:?}: {answer}");
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
        // Atomic slot migration between primaries (it authenticates as `masteruser`; 9.0 runs
        // `CLUSTER SYNCSLOTS` as `default` too).
        let (c_address, c) = start(&runtime, "c", version, &reach).await;
        a.meet(c_address).await.unwrap();
        a.add_slots_range(&[SlotRange::new(0, 16383)])
            .await
            .unwrap();
        let c_id = c.my_id().await.unwrap();
        eventually(
            format!("{version}: c sees a's slots"),
            Duration::from_secs(15),
            async || {
                let nodes = c.cluster_nodes().await.ok()?;
                nodes
                    .iter()
                    .any(|n| n.id == a_id && !n.slots.is_empty())
                    .then_some(())
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
        a.migrate_slots(&c_id, &[SlotRange::new(0, 99)], Duration::from_secs(30))
            .await
            .unwrap();
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
    let default = DefaultUser::Off;
    let reach_now = reach(&credentials);
    let (address, _) = start(&runtime, "legacy", NEW, &reach_now).await;

    // The operator's login is refused (no such user yet): it gets in as `default`.
    let first = NodeClient::at(address, &reach_now).await.unwrap();
    assert!(!first.is_logged_in());
    let desired = DesiredAcl {
        system: Some(credentials.system_users(default)),
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
    // ...then, logged in as itself, `default` closed.
    let second = NodeClient::at(address, &reach_now).await.unwrap();
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
        let client = NodeClient::at(address, &reach).await.unwrap();
        assert!(client.is_logged_in(), "step {step}: locked out");
        let desired = DesiredAcl {
            system: Some(state.system_users(default)),
            ..DesiredAcl::none()
        };
        assert_eq!(apply_users(&client, &desired).await.unwrap(), []);
        state = state.advanced(step == 0, step > 0, fresh).unwrap().unwrap();
    }
    // Done: the new password is the only one.
    assert_ne!(state.current, credentials.current);
    let desired = DesiredAcl {
        system: Some(state.system_users(default)),
        ..DesiredAcl::none()
    };
    let client = NodeClient::at(address, &reach(&state)).await.unwrap();
    assert!(client.is_logged_in());
    apply_users(&client, &desired).await.unwrap();
    let stale = NodeClient::at(address, &old_only).await.unwrap();
    assert!(!stale.is_logged_in(), "the old password still logs in");
    let refused = stale.ping().await.unwrap_err().to_string().to_uppercase();
    assert!(refused.contains("NOAUTH"), "{refused}");
}
