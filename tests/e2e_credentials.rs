//! The operator's own credentials end to end, on a real API server with real valkey-server
//! Pods: each cluster's passwords live in a private Secret in the operator's namespace, and the
//! cluster's own Secret (what its Pods mount, what its team can read) holds only `auth.conf`,
//! with no administrative password; passwords an older operator left in the team's Secret are
//! moved and rotated; nodes admit no client without credentials (`GET`, `SET`, `CONFIG GET`,
//! `CLUSTER NODES` all refused, on 9.0 as on 9.1), not even to Valkey 9.0's slot-migration
//! protocol, with which a stranger would otherwise take a shard's slots and their keys; a
//! rotation by annotation and a deleted Secret each move to new passwords with no roll, no
//! failover and the writer never stopped; the guide's upgrade to 9.1 keeps all of that, with no
//! acknowledged write lost.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::chart::NAMESPACE as OPERATOR_NAMESPACE;
use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product, condition_field};
use harness::valkey::attacks::hijack_slots;
use harness::valkey::logins::{admin, anonymous_reply};
use harness::valkey::wait_for_layout;
use k8s_openapi::ByteString;
use serde_json::Value;
use valkey_operator::acl::OPERATOR_USER;
use valkey_operator::api::annotations::ROTATE_CREDENTIALS;
use valkey_operator::credentials::Credentials;
use valkey_operator::credentials::{private_secret_name, secret_name};
use valkey_operator::valkey::NodeClient;

const NAMESPACE: &str = "bank";
const CLUSTER: &str = "ledger";

static FLEET: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("bank")
        .config(
            "bank-config",
            r#"{imageRef: valkey-9-0-0, valkey: {save: ""}}"#,
        )
        .cluster(("bank", "ledger"), "bank-config", 2, 1)
        .yaml()
});

/// The cluster's own Secret, in its namespace: what its Pods mount and its team can read.
fn mounted(product: &Product) -> Value {
    try_secret(product, &secret_name(CLUSTER), NAMESPACE).unwrap()
}

/// The operator's private Secret of the cluster, in the operator's namespace.
fn private(product: &Product) -> Result<Value, String> {
    let name = private_secret_name(NAMESPACE, CLUSTER);
    try_secret(product, &name, OPERATOR_NAMESPACE)
}

/// A Secret, or why it cannot be read yet (deleted, and not recreated yet).
fn try_secret(product: &Product, name: &str, namespace: &str) -> Result<Value, String> {
    let args = ["get", "secret", name, "-n", namespace, "-o", "json"];
    match product.try_kubectl(&args, None) {
        (true, output) => serde_json::from_str(&output).map_err(|e| format!("{e}: {output}")),
        (false, output) => Err(output),
    }
}

fn keys(secret: &Value) -> Vec<String> {
    let data = secret["data"].as_object().cloned().unwrap_or_default();
    data.keys().cloned().collect()
}

/// The private Secret's keys, and its operator password.
fn keys_and_password(secret: &Value) -> (Vec<String>, String) {
    let password = decode(&secret["data"]["operator-password"]);
    (keys(secret), password)
}

/// The two keys of a private Secret without a rotation going on.
const STEADY: [&str; 2] = ["operator-password", "replication-password"];

/// How a Secret's data holds `text`.
fn base64(text: &str) -> String {
    serde_json::to_value(ByteString(text.as_bytes().to_vec()))
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

/// A Secret's data value (base64), decoded.
fn decode(value: &Value) -> String {
    let bytes: ByteString = serde_json::from_value(value.clone()).unwrap();
    String::from_utf8(bytes.0).unwrap()
}

/// What a client without credentials gets for `command` on every node.
async fn anonymous_answers(product: &Product, command: &[&str]) -> Vec<String> {
    let mut answers = Vec::new();
    for address in product.addresses(NAMESPACE, CLUSTER).values() {
        answers.push(anonymous_reply(address, command).await);
    }
    answers
}

async fn assert_anonymous_refused(product: &Product, refusal: &str) {
    for command in [
        &["GET", "key:1"][..],
        &["SET", "key:1", "x"],
        &["CONFIG", "GET", "maxmemory"],
        &["CLUSTER", "NODES"],
    ] {
        let answers = anonymous_answers(product, command).await;
        assert!(
            !answers.is_empty() && answers.iter().all(|a| a.contains(refusal)),
            "{command:?} without credentials: {answers:?}"
        );
    }
}

/// How many nodes let the operator's user in with `password`, of how many.
async fn logins_with(product: &Product, password: &str) -> (usize, usize) {
    let login = Credentials {
        username: OPERATOR_USER.into(),
        password: password.into(),
    };
    let addresses = product.addresses(NAMESPACE, CLUSTER);
    let mut accepted = 0;
    for address in addresses.values() {
        let connected = NodeClient::connect_as(address, Duration::from_secs(2), Some(&login)).await;
        accepted += usize::from(connected.is_ok());
    }
    (accepted, addresses.len())
}

/// Waits until the private Secret holds a steady operator password other than `old` (no
/// rotation keys left, no annotation on the mounted one, which holds `auth.conf` only), and
/// returns it with how long that took.
async fn wait_rotated(product: &Product, old: &str, started: Instant) -> (String, Duration) {
    let password = eventually(
        "the rotation to finish",
        Duration::from_secs(60),
        async || {
            let secret = private(product)?;
            let (keys, password) = keys_and_password(&secret);
            let mounted = try_secret(product, &secret_name(CLUSTER), NAMESPACE)?;
            let annotated = mounted["metadata"]["annotations"][ROTATE_CREDENTIALS].is_string();
            let steady = keys == STEADY && self::keys(&mounted) == ["auth.conf"];
            if steady && !annotated && password != old && !password.is_empty() {
                Ok(password)
            } else {
                Err(format!("keys {keys:?}, annotated {annotated}"))
            }
        },
    )
    .await;
    (password, started.elapsed())
}

async fn assert_only_password_accepted(product: &Product, new: &str, old: &str) {
    let (accepted, nodes) = logins_with(product, new).await;
    assert_eq!(accepted, nodes, "the new password on every node");
    let (accepted, _) = logins_with(product, old).await;
    assert_eq!(accepted, 0, "the old password is gone from every node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_admit_only_credentials_and_rotations_roll_nothing() {
    let mut product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&FLEET);
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.0.0", Duration::from_secs(180))
        .await;

    // The mounted Secret is the cluster's and holds only the file of hashes; the passwords are
    // in the operator's namespace; the Pods hold no password.
    let first = mounted(&product);
    let owner = &first["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("ValkeyCluster"), Some(CLUSTER))
    );
    assert_eq!(keys(&first), ["auth.conf"]);
    let (private_keys, password) = keys_and_password(&private(&product).unwrap());
    assert_eq!(private_keys, STEADY);
    let pods = product.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "json"]);
    assert!(!pods.contains(&password), "an operator password in a Pod");
    let team_can_read = product.kubectl(&["get", "secrets", "-n", NAMESPACE, "-o", "json"]);
    assert!(
        !team_can_read.contains(&base64(&password)),
        "the operator password in the team's namespace"
    );
    let auth_conf = decode(&first["data"]["auth.conf"]);
    assert!(!auth_conf.contains(&password), "{auth_conf}");
    // `default` is closed on 9.0 too: slots move key by key there, never by its atomic protocol.
    assert!(
        auth_conf.starts_with("user default reset off\n"),
        "{auth_conf}"
    );
    assert_anonymous_refused(&product, "NOAUTH").await;

    // With an application writing: a stranger speaks 9.0's slot-migration protocol to shard 0's
    // primary, asking it to take the end of shard 1's slots. Every step is refused; no slot
    // changes owner; the writer's keys there stay (checked with every other write at the end).
    let watch = ClusterWatch::start(&product, NAMESPACE, CLUSTER).await;
    let (target, source_id) = primaries_by_shard(&product).await;
    let replies = hijack_slots(&target, &source_id, 16000, 16383).await;
    assert!(
        replies.iter().all(|r| r.starts_with("-NOAUTH")),
        "a step of the hijack answered: {replies:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let addresses: Vec<String> = product
        .addresses(NAMESPACE, CLUSTER)
        .into_values()
        .collect();
    // Each shard still owns its half (a replica may be between health checks a moment).
    wait_for_layout(&addresses, &[(1, 8192), (1, 8192)]).await;
    let (_, still) = primaries_by_shard(&product).await;
    assert_eq!(still, source_id, "shard 1 changed hands");
    println!("9.0 slot hijack without credentials: refused at every step ({replies:?})");
    watch.assert_writing().await;

    // A rotation by annotation, with an application writing throughout.
    let started = Instant::now();
    product.kubectl(&[
        "annotate",
        "secret",
        &secret_name(CLUSTER),
        "-n",
        NAMESPACE,
        &format!("{ROTATE_CREDENTIALS}=now"),
    ]);
    let (rotated, took) = wait_rotated(&product, &password, started).await;
    println!("rotation by annotation: new password only, on every node, in {took:.1?}");
    assert_only_password_accepted(&product, &rotated, &password).await;
    let events = product.kubectl(&["get", "events", "-n", NAMESPACE]);
    assert!(events.contains("CredentialsRotation"), "{events}");
    watch.assert_writing().await;

    // A deleted private Secret comes back as a rotation from what the nodes have: nothing
    // locked out. A deleted mounted one comes back as it was.
    let started = Instant::now();
    let private_name = private_secret_name(NAMESPACE, CLUSTER);
    let private_args = ["delete", "secret", &private_name, "-n", OPERATOR_NAMESPACE];
    product.kubectl(&private_args);
    let (recreated, took) = wait_rotated(&product, &rotated, started).await;
    println!("deleted private Secret: recreated and rotated on every node in {took:.1?}");
    assert_only_password_accepted(&product, &recreated, &rotated).await;
    let conf = decode(&mounted(&product)["data"]["auth.conf"]);
    product.kubectl(&["delete", "secret", &secret_name(CLUSTER), "-n", NAMESPACE]);
    eventually(
        "the mounted Secret to come back",
        Duration::from_secs(60),
        async || {
            let back = try_secret(&product, &secret_name(CLUSTER), NAMESPACE).ok()?;
            (decode(&back["data"]["auth.conf"]) == conf).then_some(())
        },
    )
    .await;
    watch.assert_writing().await;

    // An older operator kept the passwords in the team's Secret: they are moved to the private
    // one and rotated at once, since the team could read them.
    let started = Instant::now();
    let exposed = private(&product).unwrap();
    let data = exposed["data"].clone();
    let older = serde_json::json!({"data": data}).to_string();
    product.kubectl(&[
        "patch",
        "secret",
        &secret_name(CLUSTER),
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        &older,
    ]);
    product.kubectl(&private_args);
    let (moved, took) = wait_rotated(&product, &recreated, started).await;
    println!("passwords in the team's Secret: moved and rotated on every node in {took:.1?}");
    assert_only_password_accepted(&product, &moved, &recreated).await;
    assert_eq!(keys(&mounted(&product)), ["auth.conf"]);
    watch.assert_writing().await;

    assert_eq!(
        product.addresses(NAMESPACE, CLUSTER),
        watch.pods_before,
        "a rotation replaced a Pod"
    );

    // The guide's upgrade onto 9.1 with the application writing: `default` then closes.
    product.patch(
        "valkeyconfig/bank-config",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.1.2", Duration::from_secs(300))
        .await;
    let report = watch.finish(&product).await;
    println!(
        "upgrade with credentials: {} acknowledged writes, none lost, longest gap {:.2?}",
        report.log.acked,
        report.longest_write_gap()
    );
    report.assert_shards(2, 1, 1);
    // The rotations rolled nothing: exactly one failover per shard, the upgrade's.
    product.assert_failovers(NAMESPACE, CLUSTER, 2).await;
    let conf = decode(&mounted(&product)["data"]["auth.conf"]);
    assert!(conf.starts_with("user default reset off\n"), "{conf}");
    assert_anonymous_refused(&product, "NOAUTH").await;

    // The private Secret deleted while the operator does not remember the passwords (it
    // restarted): it makes no new ones, which would lock it out, and says so until the Secret
    // is restored.
    let mut saved = private(&product).unwrap();
    let (_, password) = keys_and_password(&saved);
    for field in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "managedFields",
    ] {
        saved["metadata"].as_object_mut().unwrap().remove(field);
    }
    product.operator_mut().kill_and_restart();
    product.kubectl(&private_args);
    let degraded = eventually(
        "the cluster to say its credentials are unusable",
        Duration::from_secs(60),
        async || {
            let cluster = product.cluster(NAMESPACE, CLUSTER);
            let reason = condition_field(&cluster, "Degraded", "reason");
            let message = condition_field(&cluster, "Degraded", "message").unwrap_or_default();
            (reason.as_deref() == Some("CredentialsUnusable")).then_some(message)
        },
    )
    .await;
    assert!(
        degraded.contains("Restore the private Secret"),
        "{degraded}"
    );
    let (exists, _) = product.try_kubectl(
        &["get", "secret", &private_name, "-n", OPERATOR_NAMESPACE],
        None,
    );
    assert!(
        !exists,
        "new passwords were made for nodes that have others"
    );
    product.apply(&saved.to_string());
    eventually(
        "the restored Secret to be used again",
        Duration::from_secs(60),
        async || {
            let cluster = product.cluster(NAMESPACE, CLUSTER);
            let reason = condition_field(&cluster, "Degraded", "reason");
            (reason.as_deref() != Some("CredentialsUnusable")).then_some(())
        },
    )
    .await;
    let (accepted, nodes) = logins_with(&product, &password).await;
    assert_eq!(accepted, nodes, "the restored password on every node");
}

/// The address of the primary owning slot 0 (shard 0) and the id of the one owning slot
/// 16383 (shard 1), as the nodes themselves say.
async fn primaries_by_shard(product: &Product) -> (String, String) {
    let addresses = product.addresses(NAMESPACE, CLUSTER);
    let any = addresses.values().next().expect("a Pod");
    let view = admin(any, Duration::from_secs(2))
        .await
        .unwrap()
        .cluster_nodes()
        .await
        .unwrap();
    let owner = |slot: u16| {
        view.iter()
            .find(|n| n.slots.iter().any(|r| (r.start..=r.end).contains(&slot)))
            .expect("an owner")
    };
    let target = owner(0);
    (
        format!("{}:{}", target.ip, target.port),
        owner(16383).id.clone(),
    )
}
