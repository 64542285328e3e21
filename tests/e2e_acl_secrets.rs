//! A tenant user whose password lives in a Secret (`passwordSecretRef`), end to end on the real
//! control plane and real valkey-server nodes: the password works on every node (the operator
//! wrote only its hash), the user reads and writes only its patterns and is refused `CONFIG SET`
//! and `FLUSHALL`; a changed Secret is applied live (through the Secret watch, well before the
//! converged cluster's periodic pass); a deleted Secret shows as `AclApplied=False` with an
//! event, and the user keeps its last password instead of being locked out.

use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::{IMAGES, Product, condition, condition_field};
use harness::valkey::connect;

const NAMESPACE: &str = "shop";
const CLUSTER: &str = "carts";

const FLEET: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Secret
metadata: {name: carts-app, namespace: shop}
stringData: {password: "first secret password"}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyRole
metadata: {name: readwrite}
spec: {categories: [{name: read, access: allow}, {name: write, access: allow}]}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: carts-config}
spec: {imageRef: valkey-9-0-0, valkey: {save: ""}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: carts, namespace: shop}
spec:
  configRef: carts-config
  shards: 2
  replicasPerShard: 1
  acl:
  - username: app
    passwordSecretRef: {name: carts-app, key: password}
    permissions:
    - roleRef: readwrite
      keys: [{pattern: "cart:*", access: readwrite}]
"#;

/// `AUTH app <password>` on every node: how many accepted it, of how many.
async fn accepted_on(product: &Product, password: &str) -> (usize, usize) {
    let addresses = product.addresses(NAMESPACE, CLUSTER);
    let mut accepted = 0;
    for address in addresses.values() {
        let mut connection = connect(address).await;
        let reply: redis::RedisResult<String> = redis::cmd("AUTH")
            .arg("app")
            .arg(password)
            .query_async(&mut connection)
            .await;
        accepted += usize::from(reply.is_ok());
    }
    (accepted, addresses.len())
}

async fn wait_accepted(product: &Product, password: &str, on_every_node: bool, within: Duration) {
    let what = format!("AUTH app {password:?} accepted: {on_every_node}");
    eventually(what, within, async || {
        let (accepted, nodes) = accepted_on(product, password).await;
        let expected = if on_every_node { nodes } else { 0 };
        if nodes > 0 && accepted == expected {
            Ok(())
        } else {
            Err(format!("{accepted} of {nodes}"))
        }
    })
    .await;
}

#[tokio::test]
async fn a_user_from_a_secret_is_applied_live_and_a_missing_secret_locks_nobody_out() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(FLEET);
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.0.0", Duration::from_secs(180))
        .await;
    wait_accepted(
        &product,
        "first secret password",
        true,
        Duration::from_secs(30),
    )
    .await;
    let cluster = product.cluster(NAMESPACE, CLUSTER);
    assert_eq!(condition(&cluster, "AclApplied").as_deref(), Some("True"));
    let status = cluster["status"].to_string();
    assert!(!status.contains("first secret password"), "{status}");

    // Only its patterns, and none of the dangerous commands.
    let address = product
        .addresses(NAMESPACE, CLUSTER)
        .into_values()
        .next()
        .unwrap();
    let mut connection = connect(&address).await;
    let _: String = redis::cmd("AUTH")
        .arg("app")
        .arg("first secret password")
        .query_async(&mut connection)
        .await
        .unwrap();
    let refused = async |connection: &mut redis::aio::MultiplexedConnection, cmd: &redis::Cmd| {
        let reply: redis::RedisResult<redis::Value> = cmd.query_async(connection).await;
        match reply {
            Err(error) => error.to_string(),
            Ok(value) => panic!("{cmd:?} was allowed: {value:?}"),
        }
    };
    for cmd in [
        redis::cmd("SET").arg("other:1").arg("x").clone(),
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("1")
            .clone(),
        redis::cmd("FLUSHALL").clone(),
    ] {
        let error = refused(&mut connection, &cmd).await;
        assert!(error.to_lowercase().contains("noperm"), "{cmd:?}: {error}");
    }
    // `cart:*` may hash to another node's slot: MOVED still means the ACL allowed it.
    let reply: redis::RedisResult<String> = redis::cmd("SET")
        .arg("cart:1")
        .arg("x")
        .query_async(&mut connection)
        .await;
    match reply {
        Ok(ok) => assert_eq!(ok, "OK"),
        Err(error) => assert!(
            error.to_string().to_lowercase().contains("moved"),
            "{error}"
        ),
    }

    // The Secret changes: applied through the watch, not the 60 s periodic pass.
    let changed = Instant::now();
    product.apply(
        r#"
apiVersion: v1
kind: Secret
metadata: {name: carts-app, namespace: shop}
stringData: {password: "second secret password"}
"#,
    );
    wait_accepted(
        &product,
        "second secret password",
        true,
        Duration::from_secs(20),
    )
    .await;
    wait_accepted(
        &product,
        "first secret password",
        false,
        Duration::from_secs(5),
    )
    .await;
    println!(
        "figure: a changed Secret password reached every node in {:.1} s",
        changed.elapsed().as_secs_f64()
    );

    // The Secret goes: a condition and an event; the last password keeps working.
    product.kubectl(&["delete", "secret", "carts-app", "-n", NAMESPACE]);
    eventually(
        "AclApplied=False (SecretUnreadable)",
        Duration::from_secs(30),
        async || {
            let cluster = product.cluster(NAMESPACE, CLUSTER);
            let reason = condition_field(&cluster, "AclApplied", "reason");
            if reason.as_deref() == Some("SecretUnreadable") {
                Ok(())
            } else {
                Err(cluster["status"].to_string())
            }
        },
    )
    .await;
    let cluster = product.cluster(NAMESPACE, CLUSTER);
    let message = condition_field(&cluster, "AclApplied", "message").unwrap();
    assert!(
        message.contains("user app: passwordSecretRef: Secret carts-app does not exist"),
        "{message}"
    );
    assert_eq!(condition(&cluster, "Ready").as_deref(), Some("True"));
    let events = product.kubectl(&["get", "events", "-n", NAMESPACE]);
    assert!(events.contains("AclNotApplied"), "{events}");
    wait_accepted(
        &product,
        "second secret password",
        true,
        Duration::from_secs(5),
    )
    .await;
}
