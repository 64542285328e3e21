//! ACL users end to end: a ValkeyCluster's `spec.acl` and the ValkeyRoles it names are applied
//! live on every node (no node replaced, no failover), a role change reaches every cluster
//! granting it, and a user removed from the spec is deleted; a user limited to some key
//! patterns cannot list other keys' names (`SCAN`, `KEYS`, `RANDOMKEY`). Checked on each real
//! valkey-server with `AUTH` and `ACL DRYRUN`.

use std::time::Duration;

use harness::eventually;
use harness::k8s::{IMAGES, Product};
use harness::valkey::connect;
use sha2::{Digest, Sha256};

const PASSWORD: &str = "correct horse battery staple";

fn fleet() -> String {
    let hash: String = Sha256::digest(PASSWORD)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: vault}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyRole
metadata: {{name: reader}}
spec: {{categories: [{{name: read, access: allow}}, {{name: connection, access: allow}}], commands: [{{name: keys, access: deny}}]}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {{name: vault-config}}
spec: {{imageRef: valkey-9-0-0, valkey: {{save: ""}}}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {{name: accounts, namespace: vault}}
spec:
  configRef: vault-config
  shards: 2
  replicasPerShard: 1
  acl:
  - username: app
    passwordHashes: ["{hash}"]
    permissions:
    - roleRef: reader
      keys: [{{pattern: "acct:*", access: read}}]
"#
    )
}

/// `ACL DRYRUN app COMMAND...` on one node: whether `app` may run it there.
async fn may_run(address: &str, command: &[&str]) -> bool {
    let mut connection = connect(address).await;
    let reply: redis::RedisResult<String> = redis::cmd("ACL")
        .arg("DRYRUN")
        .arg("app")
        .arg(command)
        .query_async(&mut connection)
        .await;
    matches!(reply.as_deref(), Ok("OK"))
}

/// What `app` may run, per node: (GET acct:1, SET acct:1, GET other:1).
async fn permissions(product: &Product) -> Vec<(bool, bool, bool)> {
    let mut seen = Vec::new();
    for address in product.addresses("vault", "accounts").values() {
        seen.push((
            may_run(address, &["GET", "acct:1"]).await,
            may_run(address, &["SET", "acct:1", "x"]).await,
            may_run(address, &["GET", "other:1"]).await,
        ));
    }
    seen
}

/// Polls until every one of the 4 nodes shows `expected`.
async fn wait_for_permissions(product: &Product, what: &str, expected: (bool, bool, bool)) {
    eventually(
        format!("{what}: {expected:?} on every node"),
        Duration::from_secs(60),
        async || {
            let seen = permissions(product).await;
            if seen == [expected; 4] {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn acl_users_and_roles_apply_live_on_every_node() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&fleet());
    product
        .wait_converged(&[("vault", "accounts")], "9.0.0", Duration::from_secs(180))
        .await;
    let pods = product.addresses("vault", "accounts");

    // Read on acct:* only; every node, replicas included, knows the user.
    wait_for_permissions(&product, "the user as created", (true, false, false)).await;
    // Key names stay within the patterns: `@read` grants SCAN and RANDOMKEY, which list every
    // key's name whatever the patterns, and `@connection` CLIENT TRACKING, whose BCAST mode
    // sends the name of every key anyone writes; a user limited to acct:* gets none of them.
    let tracking = ["CLIENT", "TRACKING", "on", "BCAST", "PREFIX", "acct:"];
    for address in pods.values() {
        for command in [
            &["SCAN", "0"][..],
            &["RANDOMKEY"],
            &["KEYS", "*"],
            &tracking,
        ] {
            assert!(
                !may_run(address, command).await,
                "{address}: app may run {command:?}"
            );
        }
    }
    for address in pods.values() {
        let mut connection = connect(address).await;
        let authed: String = redis::cmd("AUTH")
            .arg("app")
            .arg(PASSWORD)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(authed, "OK");
        let wrong: redis::RedisResult<String> = redis::cmd("AUTH")
            .arg("app")
            .arg("guess")
            .query_async(&mut connection)
            .await;
        assert!(wrong.is_err(), "a wrong password was accepted");
    }

    // The cluster grants readwrite on acct:* and the role gains @write: SET is allowed.
    product.patch(
        "valkeyrole/reader",
        None,
        r#"{"spec": {"categories": [{"name": "read", "access": "allow"}, {"name": "write", "access": "allow"}]}}"#,
    );
    product.patch(
        "valkeycluster/accounts",
        Some("vault"),
        r#"{"spec": {"acl": [{"username": "app", "permissions": [{"roleRef": "reader", "keys": [{"pattern": "acct:*", "access": "readwrite"}]}]}]}}"#,
    );
    wait_for_permissions(
        &product,
        "after the cluster and role change",
        (true, true, false),
    )
    .await;

    // A role change alone reaches the cluster: denying GET takes it away everywhere.
    product.patch(
        "valkeyrole/reader",
        None,
        r#"{"spec": {"commands": [{"name": "get", "access": "deny"}]}}"#,
    );
    wait_for_permissions(&product, "after the role change", (false, true, false)).await;

    // A user removed from the spec is deleted from every node.
    product.patch(
        "valkeycluster/accounts",
        Some("vault"),
        r#"{"spec": {"acl": []}}"#,
    );
    eventually(
        "the removed user to be deleted from every node",
        Duration::from_secs(60),
        async || {
            let mut users = Vec::new();
            for address in pods.values() {
                let mut connection = connect(address).await;
                let names: Vec<String> = redis::cmd("ACL")
                    .arg("USERS")
                    .query_async(&mut connection)
                    .await
                    .unwrap();
                users.push(names);
            }
            if users
                .iter()
                .all(|names| names == &["default", "valkey-operator", "valkey-replication"])
            {
                Ok(())
            } else {
                Err(format!("{users:?}"))
            }
        },
    )
    .await;

    // All of it live: the same Pods, no failover.
    assert_eq!(product.addresses("vault", "accounts"), pods);
    product.assert_failovers("vault", "accounts", 0).await;
}
