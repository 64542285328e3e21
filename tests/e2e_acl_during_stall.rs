//! ACL users hold during a roll that cannot finish, and a user a node refuses stops nothing
//! else: on the real control plane and real valkey-server nodes,
//! - a key pattern that would grant more (`* +@all`) is refused at the API, naming the field;
//! - with the roll stalled on an image that never starts, a user removed from the spec is gone
//!   from every node within one reconcile;
//! - a user whose role names a command Valkey does not know shows as `AclApplied=False` with the
//!   node and Valkey's words, while the other users are written and the roll, once its image is
//!   fixed, completes; fixing the role turns `AclApplied` back to `True`.

use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::{IMAGES, Product, condition, condition_field};
use harness::valkey::connect;

const NAMESPACE: &str = "ledger-team";
const CLUSTER: &str = "journal";

fn fleet(users: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata: {{name: valkey-9-2-0}}
spec: {{repository: valkey/valkey, tag: "9.2.0", version: "9.2.0"}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyRole
metadata: {{name: reader}}
spec: {{categories: [{{name: read, access: allow}}]}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {{name: journal-config}}
spec: {{imageRef: valkey-9-0-0, valkey: {{save: ""}}}}
---
{}"#,
        cluster(users)
    )
}

fn cluster(users: &str) -> String {
    format!(
        r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {{name: {CLUSTER}, namespace: {NAMESPACE}}}
spec:
  configRef: journal-config
  shards: 2
  replicasPerShard: 1
  acl: {users}
"#
    )
}

const APP: &str =
    r#"{username: app, permissions: [{roleRef: reader, keys: [{pattern: "j:*", access: read}]}]}"#;

/// `ACL USERS` on every node that has an address.
async fn users_per_node(product: &Product) -> Vec<(String, Vec<String>)> {
    let mut seen = Vec::new();
    for (pod, address) in product.addresses(NAMESPACE, CLUSTER) {
        let mut connection = connect(&address).await;
        let users: Vec<String> = redis::cmd("ACL")
            .arg("USERS")
            .query_async(&mut connection)
            .await
            .unwrap();
        seen.push((pod, users));
    }
    seen
}

async fn wait_for_users(product: &Product, what: &str, expected: &[&str], within: Duration) {
    eventually(what, within, async || {
        let seen = users_per_node(product).await;
        if !seen.is_empty() && seen.iter().all(|(_, users)| users == expected) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
}

async fn wait_for_condition(product: &Product, type_: &str, status: &str, reason: &str) {
    eventually(
        format!("{type_}={status} ({reason})"),
        Duration::from_secs(60),
        async || {
            let cluster = product.cluster(NAMESPACE, CLUSTER);
            let now = (
                condition(&cluster, type_),
                condition_field(&cluster, type_, "reason"),
            );
            if now == (Some(status.into()), Some(reason.into())) {
                Ok(())
            } else {
                Err(format!("{now:?}: {}", cluster["status"]))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn acl_changes_reach_every_node_during_a_stalled_roll() {
    let product = Product::start(None, &["--join-timeout-seconds", "8"]).await;
    product.apply(IMAGES);
    product.apply(&fleet(&format!("[{APP}]")));
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.0.0", Duration::from_secs(180))
        .await;
    wait_for_condition(&product, "AclApplied", "True", "UsersApplied").await;

    // A pattern that Valkey's ACL parser would read as two rules never gets in.
    let injected = cluster(
        r#"[{username: app, permissions: [{roleRef: reader, keys: [{pattern: "* +@all", access: read}]}]}]"#,
    );
    let (applied, said) = product.try_kubectl(&["apply", "-f", "-"], Some(&injected));
    assert!(!applied, "the injected pattern was accepted: {said}");
    assert!(
        said.contains("spec.acl[0].permissions[0].keys[0].pattern"),
        "{said}"
    );

    // The roll stalls on an image the kubelet cannot pull.
    product.patch(
        "valkeyconfig/journal-config",
        None,
        r#"{"spec": {"imageRef": "valkey-9-2-0"}}"#,
    );
    wait_for_condition(&product, "Degraded", "True", "RollStalled").await;

    // A user removed mid-stall is gone from every node within one reconcile.
    let removed = Instant::now();
    product.patch(
        "valkeycluster/journal",
        Some(NAMESPACE),
        r#"{"spec": {"acl": []}}"#,
    );
    wait_for_users(
        &product,
        "the removed user gone from every node",
        &["default", "valkey-operator", "valkey-replication"],
        Duration::from_secs(15),
    )
    .await;
    println!(
        "figure: user removal reached every node of a stalled roll in {:.1} s",
        removed.elapsed().as_secs_f64()
    );
    let cluster_now = product.cluster(NAMESPACE, CLUSTER);
    assert_eq!(
        condition_field(&cluster_now, "Degraded", "reason").as_deref(),
        Some("RollStalled"),
        "the roll must still be stalled when the user is gone: {}",
        cluster_now["status"]
    );

    // A role naming a command Valkey does not know: the nodes refuse that user, say so, and
    // take the other one.
    product.apply(
        r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyRole
metadata: {name: batch-jobs}
spec: {commands: [{name: nosuchcommand, access: allow}]}
"#,
    );
    product.apply(&cluster(&format!(
        r#"[{APP}, {{username: batch, permissions: [{{roleRef: batch-jobs, keys: [{{pattern: "b:*", access: readwrite}}]}}]}}]"#
    )));
    wait_for_condition(&product, "AclApplied", "False", "NodeRefused").await;
    let message = condition_field(
        &product.cluster(NAMESPACE, CLUSTER),
        "AclApplied",
        "message",
    )
    .unwrap_or_default();
    assert!(
        message.starts_with(&format!("node {CLUSTER}-"))
            && message.contains("user batch")
            && message.contains("nosuchcommand"),
        "{message}"
    );
    wait_for_users(
        &product,
        "app back on every node",
        &["app", "default", "valkey-operator", "valkey-replication"],
        Duration::from_secs(15),
    )
    .await;

    // The image fixed, the roll completes though a user is still refused.
    product.patch(
        "valkeyconfig/journal-config",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.1.2", Duration::from_secs(240))
        .await;
    let cluster_now = product.cluster(NAMESPACE, CLUSTER);
    assert_eq!(
        condition_field(&cluster_now, "AclApplied", "reason").as_deref(),
        Some("NodeRefused"),
        "{}",
        cluster_now["status"]
    );
    wait_for_users(
        &product,
        "app on every new node",
        &["app", "default", "valkey-operator", "valkey-replication"],
        Duration::from_secs(15),
    )
    .await;

    // The role fixed: every node takes the user, and the condition says so.
    product.patch(
        "valkeyrole/batch-jobs",
        None,
        r#"{"spec": {"commands": [{"name": "get", "access": "allow"}]}}"#,
    );
    wait_for_condition(&product, "AclApplied", "True", "UsersApplied").await;
    wait_for_users(
        &product,
        "batch on every node",
        &[
            "app",
            "batch",
            "default",
            "valkey-operator",
            "valkey-replication",
        ],
        Duration::from_secs(15),
    )
    .await;
}
