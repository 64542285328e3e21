//! The guide's other rollouts end to end, each on its own control plane with the chart's RBAC,
//! real valkey-server Pods and kubectl: a staged rollout and a downgrade by `configRef`; a live
//! setting and podAnnotations changed in place against a restart-only setting that rolls; a
//! roll onto an image that never becomes ready, and its fix; the operator killed mid-roll.

use std::time::Duration;

use harness::eventually;
use harness::k8s::{ClusterWatch, IMAGES, Product, condition, condition_field, converged};
use harness::valkey::{connect, versions};
use serde_json::Value;

/// A namespace, a config on 9.0.0 and clusters of `shards` × 1 replica on it.
fn fleet(namespace: &str, config: &str, clusters: &[(&str, u16)]) -> String {
    let mut yaml = format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {{name: {config}}}
spec: {{imageRef: valkey-9-0-0, valkey: {{save: "", maxmemory-policy: noeviction}}}}
"#
    );
    for (name, shards) in clusters {
        yaml.push_str(&format!(
            r#"---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {{name: {name}, namespace: {namespace}}}
spec: {{configRef: {config}, shards: {shards}, replicasPerShard: 1}}
"#
        ));
    }
    yaml
}

/// `CONFIG GET key` on one node.
async fn config_get(address: &str, key: &str) -> String {
    let mut connection = connect(address).await;
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(key)
        .query_async(&mut connection)
        .await
        .unwrap();
    pair.get(1).cloned().unwrap_or_default()
}

async fn config_everywhere(
    product: &Product,
    namespace: &str,
    name: &str,
    key: &str,
) -> Vec<String> {
    let mut values = Vec::new();
    for address in product.addresses(namespace, name).values() {
        values.push(config_get(address, key).await);
    }
    values
}

#[tokio::test]
async fn a_staged_rollout_and_a_downgrade_move_only_the_chosen_cluster() {
    // An 8.x image registered before the operator enforced the floor: the webhook must still
    // keep it out of every config.
    let legacy = r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata: {name: valkey-8-1-4}
spec: {repository: valkey/valkey, tag: "8.1.4", version: "8.1.4"}
"#;
    let product = Product::start(Some(legacy), &[]).await;
    product.apply(IMAGES);
    product.apply(&fleet("shop", "standard", &[("cart", 1), ("checkout", 1)]));
    let both = [("shop", "cart"), ("shop", "checkout")];
    product
        .wait_converged(&both, "9.0.0", Duration::from_secs(180))
        .await;
    let checkout_pods = product.addresses("shop", "checkout");

    // Stage: the same config under a new name on the new image; nothing uses it yet.
    let created = product.apply(
        r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: standard-9-1-2}
spec: {imageRef: valkey-9-1-2, valkey: {save: "", maxmemory-policy: noeviction}}
"#,
    );
    assert!(!created.contains("Warning"), "{created}");

    // Move one cluster.
    let watch = ClusterWatch::start(&product, "shop", "cart").await;
    let switched = product.patch(
        "valkeycluster/cart",
        Some("shop"),
        r#"{"spec": {"configRef": "standard-9-1-2"}}"#,
    );
    assert!(
        switched.contains("Switching spec.configRef from standard to standard-9-1-2")
            && switched.contains("it rolls now"),
        "{switched}"
    );
    eventually(
        "cart rolls onto 9.1.2",
        Duration::from_secs(180),
        async || {
            let p = &product;
            let checkout = p.cluster("shop", "checkout");
            assert_eq!(
                condition(&checkout, "Progressing").as_deref(),
                Some("False"),
                "checkout started rolling: {checkout}"
            );
            let cart = p.cluster("shop", "cart");
            if converged(&cart, "9.1.2") {
                Ok(())
            } else {
                Err(cart["status"].to_string())
            }
        },
    )
    .await;
    let report = watch.finish(&product).await;
    report.assert_shards(1, 1, 1);
    let cart: Vec<String> = report.pods_after.values().cloned().collect();
    assert_eq!(versions(&cart).await, ["9.1.2", "9.1.2"]);
    assert_eq!(product.addresses("shop", "checkout"), checkout_pods);

    // The downgrade, the same way back.
    let watch = ClusterWatch::start(&product, "shop", "cart").await;
    let switched = product.patch(
        "valkeycluster/cart",
        Some("shop"),
        r#"{"spec": {"configRef": "standard"}}"#,
    );
    assert!(
        switched.contains("This is a downgrade (9.1.2 → 9.0.0)"),
        "{switched}"
    );
    product
        .wait_converged(&[("shop", "cart")], "9.0.0", Duration::from_secs(180))
        .await;
    let report = watch.finish(&product).await;
    report.assert_shards(1, 1, 1);
    let cart: Vec<String> = report.pods_after.values().cloned().collect();
    assert_eq!(versions(&cart).await, ["9.0.0", "9.0.0"]);
    product.assert_failovers("shop", "cart", 2).await;
    product.assert_failovers("shop", "checkout", 0).await;

    // Below the floor, by either path: the image exists, yet no config may point at it.
    let (ok, refused) = product.try_kubectl(
        &[
            "patch",
            "valkeyconfig/standard-9-1-2",
            "--type",
            "merge",
            "-p",
            r#"{"spec": {"imageRef": "valkey-8-1-4"}}"#,
        ],
        None,
    );
    assert!(
        !ok && refused.contains("below the Valkey 9 floor"),
        "{refused}"
    );
    let (ok, refused) = product.try_kubectl(
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: standard-8}
spec: {imageRef: valkey-8-1-4}
"#,
        ),
    );
    assert!(
        !ok && refused.contains("below the Valkey 9 floor"),
        "{refused}"
    );
    assert_eq!(product.addresses("shop", "checkout"), checkout_pods);
}

#[tokio::test]
async fn a_live_setting_changes_in_place_and_a_restart_only_setting_rolls() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&fleet("tuning", "tuned", &[("cache", 2)]));
    let cache = [("tuning", "cache")];
    product
        .wait_converged(&cache, "9.0.0", Duration::from_secs(180))
        .await;
    let revision_before = product.cluster("tuning", "cache")["status"]["desiredRevision"].clone();
    let watch = ClusterWatch::start(&product, "tuning", "cache").await;

    // maxmemory-policy: CONFIG SET applies it; no node is replaced.
    let patched = product.patch(
        "valkeyconfig/tuned",
        None,
        r#"{"spec": {"valkey": {"maxmemory-policy": "allkeys-lru"}}}"#,
    );
    assert!(!patched.contains("rolls"), "{patched}");
    eventually(
        "the live setting to reach every node",
        Duration::from_secs(60),
        async || {
            let seen = config_everywhere(&product, "tuning", "cache", "maxmemory-policy").await;
            if seen.len() == 4 && seen.iter().all(|v| v == "allkeys-lru") {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        },
    )
    .await;
    // podAnnotations: patched onto the live Pods, nothing replaced.
    product.patch(
        "valkeycluster/cache",
        Some("tuning"),
        r#"{"spec": {"podAnnotations": {"example.com/owner": "team-tuning"}}}"#,
    );
    eventually("the annotation reaches every Pod", Duration::from_secs(60), async || {
        let p = &product;
            let owners = p.kubectl(&[
                "get",
                "pods",
                "-n",
                "tuning",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.annotations.example\.com/owner}{"\n"}{end}"#,
            ]);
            if owners.lines().filter(|l| *l == "team-tuning").count() == 4 {
                Ok(())
            } else {
                Err(owners)
            }
        })
        .await;
    let cluster: Value = product.cluster("tuning", "cache");
    assert_eq!(cluster["status"]["desiredRevision"], revision_before);
    assert!(converged(&cluster, "9.0.0"), "{cluster}");
    assert_eq!(product.addresses("tuning", "cache"), watch.pods_before);
    product.assert_failovers("tuning", "cache", 0).await;

    // dbfilename: CONFIG SET refuses it, so every node is replaced, one shard at a time.
    product.patch(
        "valkeyconfig/tuned",
        None,
        r#"{"spec": {"valkey": {"dbfilename": "cache.rdb"}}}"#,
    );
    eventually(
        "the restart-only setting rolls",
        Duration::from_secs(240),
        async || {
            let p = &product;
            let cluster = p.cluster("tuning", "cache");
            let rolled = cluster["status"]["desiredRevision"] != revision_before;
            if rolled && converged(&cluster, "9.0.0") {
                Ok(())
            } else {
                Err(cluster["status"].to_string())
            }
        },
    )
    .await;
    let pods_before = watch.pods_before.clone();
    let report = watch.finish(&product).await;
    report.assert_shards(2, 1, 1);
    assert!(
        pods_before
            .keys()
            .all(|n| !report.pods_after.contains_key(n)),
        "not every node was replaced: {:?} → {:?}",
        pods_before.keys(),
        report.pods_after.keys()
    );
    assert_eq!(
        config_everywhere(&product, "tuning", "cache", "dbfilename").await,
        ["cache.rdb"; 4]
    );
    // The live setting is in the new nodes' arguments too.
    assert_eq!(
        config_everywhere(&product, "tuning", "cache", "maxmemory-policy").await,
        ["allkeys-lru"; 4]
    );
    product.assert_failovers("tuning", "cache", 2).await;
}

#[tokio::test]
async fn a_roll_onto_an_image_that_never_starts_stalls_then_resumes_when_fixed() {
    let product = Product::start(None, &["--join-timeout-seconds", "8"]).await;
    product.apply(IMAGES);
    // The test kubelet has no 9.2.0 binary: its Pods stay in ErrImagePull/ImagePullBackOff,
    // as a real kubelet's would for a tag the registry does not have.
    product.apply(
        r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata: {name: valkey-9-2-0}
spec: {repository: valkey/valkey, tag: "9.2.0", version: "9.2.0"}
"#,
    );
    product.apply(&fleet("risky", "ledger-config", &[("ledger", 2)]));
    let ledger = [("risky", "ledger")];
    product
        .wait_converged(&ledger, "9.0.0", Duration::from_secs(180))
        .await;
    let watch = ClusterWatch::start(&product, "risky", "ledger").await;

    product.patch(
        "valkeyconfig/ledger-config",
        None,
        r#"{"spec": {"imageRef": "valkey-9-2-0"}}"#,
    );
    // First its Pod says why it does not start (PodNotStarted), then, past the join timeout,
    // the roll stalls (RollStalled).
    let mut said_why = None;
    eventually(
        "the roll stalls as Degraded",
        Duration::from_secs(90),
        async || {
            let p = &product;
            let cluster = p.cluster("risky", "ledger");
            assert_eq!(cluster["status"]["state"], "Active", "{cluster}");
            let reason = condition_field(&cluster, "Degraded", "reason");
            if reason.as_deref() == Some("PodNotStarted") {
                said_why = condition_field(&cluster, "Degraded", "message");
            }
            match (
                condition(&cluster, "Degraded").as_deref(),
                reason.as_deref(),
            ) {
                (Some("True"), Some("RollStalled")) => Ok(()),
                _ => Err(cluster["status"].to_string()),
            }
        },
    )
    .await;
    let said_why = said_why.unwrap_or_default();
    assert!(
        said_why.contains("ImagePull"),
        "before the stall: {said_why:?}"
    );
    let cluster = product.cluster("risky", "ledger");
    let message = condition_field(&cluster, "Degraded", "message").unwrap_or_default();
    assert!(
        message.contains("shard 0") && message.contains("never became ready"),
        "{message}"
    );
    // Stays stalled: nothing retired, the second shard untouched, no failover. (A deliberate
    // hold: five more seconds in which nothing must happen.)
    tokio::time::sleep(Duration::from_secs(5)).await;
    watch.assert_writing().await;
    let pods = product.addresses("risky", "ledger");
    assert!(
        watch.pods_before.keys().all(|n| pods.contains_key(n)),
        "a node was retired during the stall: {:?}",
        pods.keys()
    );
    let nodes = product.kubectl(&["get", "valkeynodes", "-n", "risky"]);
    assert_eq!(nodes.lines().count(), 1 + 5, "one new node only:\n{nodes}");
    let waiting = product.kubectl(&[
        "get",
        "pods",
        "-n",
        "risky",
        "-o",
        "jsonpath={.items[*].status.containerStatuses[*].state.waiting.reason}",
    ]);
    assert!(waiting.contains("ImagePull"), "{waiting}");
    let events = product.kubectl(&["get", "events", "-n", "risky"]);
    assert!(events.contains("RollStalled"), "{events}");
    product.assert_failovers("risky", "ledger", 0).await;

    // The fix: point the config at an image that exists. The roll resumes by itself.
    product.patch(
        "valkeyconfig/ledger-config",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    product
        .wait_converged(&ledger, "9.1.2", Duration::from_secs(240))
        .await;
    let cluster = product.cluster("risky", "ledger");
    assert_eq!(
        condition(&cluster, "Degraded").as_deref(),
        Some("False"),
        "{cluster}"
    );
    let report = watch.finish(&product).await;
    report.assert_shards(2, 1, 1);
    let addresses: Vec<String> = report.pods_after.values().cloned().collect();
    assert_eq!(versions(&addresses).await, ["9.1.2"; 4]);
    product.assert_failovers("risky", "ledger", 2).await;
}

#[tokio::test]
async fn killing_the_operator_mid_roll_then_restarting_it_finishes_the_roll() {
    let mut product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&fleet("payments", "payments-config", &[("payments", 3)]));
    let payments = [("payments", "payments")];
    product
        .wait_converged(&payments, "9.0.0", Duration::from_secs(240))
        .await;
    let watch = ClusterWatch::start(&product, "payments", "payments").await;

    product.patch(
        "valkeyconfig/payments-config",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    // Mid-roll: the first shard has failed over, the others have not.
    eventually("the first failover", Duration::from_secs(120), async || {
        let p = &product;
        let cluster = p.cluster("payments", "payments");
        match cluster["status"]["roll"]["failedOverShards"].as_array() {
            Some(shards) if !shards.is_empty() => Ok(()),
            _ => Err(cluster["status"].to_string()),
        }
    })
    .await;
    product.operator_mut().kill_and_restart();
    product
        .operator_mut()
        .wait_ready(Duration::from_secs(60))
        .await;
    // The old leader's Lease has to expire (15 s) before the new process reconciles.
    product
        .wait_converged(&payments, "9.1.2", Duration::from_secs(300))
        .await;
    assert!(
        product
            .operator()
            .log()
            .matches("became the leader")
            .count()
            >= 2,
        "the restarted operator never led"
    );
    let report = watch.finish(&product).await;
    report.assert_shards(3, 1, 1);
    let addresses: Vec<String> = report.pods_after.values().cloned().collect();
    assert_eq!(versions(&addresses).await, ["9.1.2"; 6]);
    let cluster = product.cluster("payments", "payments");
    assert_eq!(
        cluster["status"]["roll"]["failedOverShards"],
        serde_json::json!([0, 1, 2]),
        "{cluster}"
    );
}
