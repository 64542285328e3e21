//! Only those entitled reach what the operator serves, end to end:
//!
//! - With the API server presenting its webhook client certificate (and the operator requiring
//!   it): a forged AdmissionReview of an Eviction of a primary's Pod, posted straight to the
//!   operator's port without that certificate, is refused (403) and changes nothing (no
//!   handover annotation, no handover, no event); a real Eviction through the API server is
//!   deferred for a handover as before.
//! - Without it (a managed cluster's API server): the same forged review is answered "allowed"
//!   and changes nothing while the Pod's Node is not being drained; once the Node is cordoned
//!   (as `kubectl drain` does first), the eviction is taken as real and the shard handed over.
//! - `/metrics` without a token is refused (401), with the token of a ServiceAccount not bound to
//!   the metrics-reader ClusterRole refused (403), with one that is, served.

use std::sync::LazyLock;
use std::time::Duration;

use harness::eventually;
use harness::https::client_trusting;
use harness::k8s::manifest::Manifest;
use harness::k8s::{IMAGES, Product, ProductOptions};
use serde_json::{Value, json};
use valkey_operator::api::annotations::HANDOVER_REQUESTED;

const NAMESPACE: &str = "callers";
const CLUSTER: &str = "orders";

static OBJECTS: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("callers")
        .config("callers-config", "{imageRef: valkey-9-1-2}")
        .cluster(("callers", "orders"), "callers-config", 2, 1)
        .yaml()
});

/// An AdmissionReview of an Eviction of `pod`, as the API server would send it, written by hand.
fn forged_review(pod: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-00000000f0e9",
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "requestSubResource": "eviction",
            "name": pod,
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:generic-garbage-collector"},
            "object": {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod, "namespace": NAMESPACE},
            },
            "dryRun": false,
        },
    })
}

/// Posts `review` to the operator's eviction webhook as anyone who reaches its port would:
/// HTTPS trusting its CA, no client certificate. The status and the body.
async fn post_as_stranger(product: &Product, review: &Value) -> (u16, String) {
    let client = client_trusting(&product.identity.path("ca.crt"));
    let response = client
        .post(format!("{}/validate/evictions", product.operator().url))
        .json(review)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn handover_annotation(product: &Product, node: &str) -> Option<String> {
    let node: Value = serde_json::from_str(&product.kubectl(&[
        "get",
        "valkeynode",
        node,
        "-n",
        NAMESPACE,
        "-o",
        "json",
    ]))
    .unwrap();
    node["metadata"]["annotations"][HANDOVER_REQUESTED]
        .as_str()
        .map(String::from)
}

/// Nothing moved for `primary` over a few seconds: no annotation, still the primary of shard
/// 0, no handover event.
async fn assert_nothing_changed(product: &Product, primary: &str) {
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(handover_annotation(product, primary), None);
    assert_eq!(product.primary_of(NAMESPACE, CLUSTER, 0).await, primary);
    let events = product.kubectl(&["get", "events", "-n", NAMESPACE]);
    assert!(!events.contains("HandOver"), "{events}");
}

async fn started(certified_webhooks: bool) -> Product {
    let product = Product::start_with(ProductOptions {
        certified_webhooks,
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(&OBJECTS);
    product
        .wait_converged(&[(NAMESPACE, CLUSTER)], "9.1.2", Duration::from_secs(180))
        .await;
    product
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_api_server_may_ask_for_a_handover_where_it_presents_its_certificate() {
    let product = started(true).await;
    let primary = product.primary_of(NAMESPACE, CLUSTER, 0).await;

    let (status, body) = post_as_stranger(&product, &forged_review(&primary)).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("client certificate"), "{body}");
    assert_nothing_changed(&product, &primary).await;
    println!(
        "forged eviction review, certified webhooks: {status} {}",
        body.trim()
    );

    // The API server's own call (a real Eviction) still defers for a planned handover.
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{primary}/eviction");
    let eviction = format!(
        r#"{{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {{"name": "{primary}", "namespace": "{NAMESPACE}"}}}}"#
    );
    let (evicted, output) =
        product.try_kubectl(&["create", "--raw", &path, "-f", "-"], Some(&eviction));
    assert!(!evicted, "the primary's Pod was evicted at once: {output}");
    assert!(output.contains("handing the shard over"), "{output}");
    eventually("the handover", Duration::from_secs(30), async || {
        (product.primary_of(NAMESPACE, CLUSTER, 0).await != primary).then_some(())
    })
    .await;

    // /metrics: no token, a token without the role, a metrics reader's token.
    let client = client_trusting(&product.identity.path("ca.crt"));
    let metrics = format!("{}/metrics", product.operator().url);
    let anonymous = client.get(&metrics).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    product.kubectl(&["create", "serviceaccount", "nosy", "-n", NAMESPACE]);
    let nosy = product.kubectl(&["create", "token", "nosy", "-n", NAMESPACE]);
    let refused = client
        .get(&metrics)
        .bearer_auth(nosy.trim())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    let text = product.operator().metrics().await;
    assert!(text.contains("valkey_operator_leader"), "{text}");
    println!(
        "/metrics: 401 without a token, 403 for a ServiceAccount without the role, 200 for a metrics reader"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_certificate_a_handover_needs_a_node_being_drained() {
    let product = started(false).await;
    let primary = product.primary_of(NAMESPACE, CLUSTER, 0).await;

    let (status, body) = post_as_stranger(&product, &forged_review(&primary)).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{body}");
    assert_nothing_changed(&product, &primary).await;
    println!("forged eviction review, Node not drained: allowed, nothing asked of the cluster");

    // The Node cordoned, as a drain does before it evicts: the eviction is taken as real.
    let node = product.kubelet().node_name().to_string();
    product.kubectl(&["cordon", &node]);
    let (status, body) = post_as_stranger(&product, &forged_review(&primary)).await;
    product.kubectl(&["uncordon", &node]);
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{body}");
    assert_eq!(answer["response"]["status"]["code"], 429, "{body}");
    assert!(handover_annotation(&product, &primary).is_some());
    eventually("the handover", Duration::from_secs(30), async || {
        (product.primary_of(NAMESPACE, CLUSTER, 0).await != primary).then_some(())
    })
    .await;
}
