//! What a tenant writes cannot hurt the operator or another tenant, end to end on the real
//! control plane with the chart's RBAC and webhooks, real valkey-server Pods and `kubectl`:
//! hostile specs are refused by the layer that sees them first (CRD schema, webhook, and, with
//! the webhooks off, the controller itself), a cluster named like someone else's Service leaves
//! it alone, and a cluster whose reconcile keeps failing does not hold back a healthy one.

// Test code reports failures by panicking; the house rules against it are for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::chart::{RELEASE, get_json};
use harness::k8s::{IMAGES, Product, condition, condition_field};
use harness::metric;
use serde_json::Value;

const CONFIG: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: tenant}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: standard}
spec: {imageRef: valkey-9-0-0, valkey: {save: ""}}
"#;

fn cluster_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyCluster\nmetadata: {{name: {name}, namespace: tenant}}\nspec: {spec}\n"
    )
}

/// Applies `yaml`, which must be refused with every `expected` text in the answer.
fn refused(product: &Product, yaml: &str, expected: &[&str]) -> String {
    let (ok, output) = product.try_kubectl(&["apply", "-f", "-"], Some(yaml));
    assert!(!ok, "accepted:\n{yaml}\n{output}");
    for text in expected {
        assert!(output.contains(text), "{text:?} not in:\n{output}");
    }
    output
}

#[tokio::test]
async fn hostile_specs_are_refused_and_cost_the_operator_nothing() {
    let mut product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(CONFIG);
    let rss_before = product.operator.resident_kib().unwrap();

    // The CRD schema: numbers past the hard limits, a name too long for its node names, an
    // annotation key Kubernetes would refuse on the Pod.
    let cases = [
        (
            cluster_yaml("huge", "{configRef: standard, shards: 100000}"),
            vec!["spec.shards", "16384"],
        ),
        (
            cluster_yaml(
                "wide",
                "{configRef: standard, shards: 1, replicasPerShard: 500}",
            ),
            vec!["spec.replicasPerShard", "15"],
        ),
        (
            cluster_yaml(&"n".repeat(60), "{configRef: standard, shards: 1}"),
            vec!["metadata.name must be at most 50"],
        ),
        (
            cluster_yaml(
                "odd",
                "{configRef: standard, shards: 1, podAnnotations: {'bad key!': x}}",
            ),
            vec!["spec.podAnnotations", "valid annotation keys"],
        ),
        (
            cluster_yaml(
                "placed",
                "{configRef: standard, shards: 1, placement: {nodeSelector: {'bad key!': x}}}",
            ),
            vec!["spec.placement.nodeSelector keys must be valid Kubernetes label keys"],
        ),
    ];
    for (yaml, expected) in &cases {
        let said = refused(&product, yaml, expected);
        eprintln!("refused: {}", said.lines().last().unwrap_or_default());
    }
    // The webhook: inside the schema but above the operator's cap, and a nodeSelector value
    // whose format the schema cannot judge (the API server's cost budget allows no regex on
    // map values).
    refused(
        &product,
        &cluster_yaml("big", "{configRef: standard, shards: 200}"),
        &[
            "spec.shards: 200 is above this operator's cap of 128 shards",
            "maxShards",
        ],
    );
    refused(
        &product,
        &cluster_yaml(
            "placed",
            "{configRef: standard, shards: 1, placement: {nodeSelector: {pool: '-x'}}}",
        ),
        &["spec.placement.nodeSelector[\"pool\"]: the value must consist"],
    );

    // The controller, with the webhooks out of the way (a spec that slipped through): it
    // says so and creates nothing.
    let mut webhooks = get_json(
        &product.plane,
        &[
            "get",
            "validatingwebhookconfiguration",
            RELEASE,
            "-o",
            "json",
        ],
    );
    for field in [
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "managedFields",
        "generation",
    ] {
        webhooks["metadata"].as_object_mut().unwrap().remove(field);
    }
    product.kubectl(&["delete", "validatingwebhookconfiguration", RELEASE]);
    product.apply(&cluster_yaml(
        "slipped",
        "{configRef: standard, shards: 1, replicasPerShard: 0, placement: {nodeSelector: {pool: '-x'}}}",
    ));
    eventually(
        "slipped reports SpecOutOfBounds",
        Duration::from_secs(30),
        async || {
            let cluster = product.cluster("tenant", "slipped");
            match condition_field(&cluster, "Degraded", "reason").as_deref() {
                Some("SpecOutOfBounds") => Ok(()),
                _ => Err(format!("{:#}", cluster["status"])),
            }
        },
    )
    .await;
    let message = condition_field(&product.cluster("tenant", "slipped"), "Degraded", "message");
    assert!(
        message
            .as_deref()
            .unwrap_or_default()
            .contains("nodeSelector[\"pool\"]"),
        "{message:?}"
    );
    let nodes = product.kubectl(&["get", "valkeynodes", "-n", "tenant", "-o", "name"]);
    assert!(nodes.trim().is_empty(), "nodes were created: {nodes}");
    // With the webhooks back, the cluster that slipped past them can still be deleted (its
    // finalizer's removal is an update the webhook must not refuse).
    product.apply(&webhooks.to_string());
    product.kubectl(&[
        "delete",
        "valkeycluster",
        "slipped",
        "-n",
        "tenant",
        "--wait",
        "--timeout=60s",
    ]);

    // A cluster named like someone else's Service: reported, the Service untouched.
    product.apply(
        r#"
apiVersion: v1
kind: Service
metadata: {name: billing, namespace: tenant, labels: {team: billing}}
spec: {selector: {app: billing}, ports: [{port: 80}]}
"#,
    );
    product.apply(&cluster_yaml(
        "billing",
        "{configRef: standard, shards: 1, replicasPerShard: 0}",
    ));
    eventually(
        "billing reports NameConflict",
        Duration::from_secs(30),
        async || {
            let cluster = product.cluster("tenant", "billing");
            match condition_field(&cluster, "Degraded", "reason").as_deref() {
                Some("NameConflict") => Ok(()),
                _ => Err(format!("{:#}", cluster["status"])),
            }
        },
    )
    .await;
    let cluster = product.cluster("tenant", "billing");
    let message = condition_field(&cluster, "Degraded", "message").unwrap();
    assert!(
        message.contains("Service tenant/billing already exists and is not this cluster's"),
        "{message}"
    );
    let events = product.kubectl(&[
        "get",
        "events",
        "-n",
        "tenant",
        "--field-selector",
        "reason=NameConflict",
        "-o",
        "name",
    ]);
    assert!(!events.trim().is_empty(), "no NameConflict event");
    let service = |product: &Product| {
        get_json(
            &product.plane,
            &["get", "service", "billing", "-n", "tenant", "-o", "json"],
        )
    };
    let untouched = |service: &Value| {
        assert_eq!(
            service["spec"]["selector"],
            serde_json::json!({"app": "billing"})
        );
        assert!(
            service["metadata"]["ownerReferences"].is_null(),
            "{service:#}"
        );
        assert_eq!(
            service["metadata"]["labels"],
            serde_json::json!({"team": "billing"})
        );
    };
    untouched(&service(&product));
    product.kubectl(&[
        "delete",
        "valkeycluster",
        "billing",
        "-n",
        "tenant",
        "--wait",
    ]);
    untouched(&service(&product));

    // The operator lived through all of it, at the memory it had.
    assert!(product.operator.exited().is_none(), "the operator exited");
    let rss_after = product.operator.resident_kib().unwrap();
    eprintln!("operator RSS: {rss_before} KiB before, {rss_after} KiB after");
    assert!(
        rss_after < rss_before + 32 * 1024,
        "the operator grew from {rss_before} KiB to {rss_after} KiB"
    );
}

/// Waits until `namespace/name` is Active on `version` with nothing outdated.
async fn rolled(product: &Product, namespace: &str, name: &str, version: &str, within: Duration) {
    product
        .wait_converged(&[(namespace, name)], version, within)
        .await;
}

#[tokio::test]
async fn a_broken_cluster_does_not_hold_back_a_healthy_one() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: good}
---
apiVersion: v1
kind: Namespace
metadata: {name: bad}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: shared}
spec: {imageRef: valkey-9-0-0, valkey: {save: ""}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: healthy, namespace: good}
spec: {configRef: shared, shards: 1, replicasPerShard: 1}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: broken, namespace: bad}
spec: {configRef: shared, shards: 1, replicasPerShard: 1}
"#,
    );
    let both = [("good", "healthy"), ("bad", "broken")];
    product
        .wait_converged(&both, "9.0.0", Duration::from_secs(120))
        .await;

    // The bad namespace may not have one Pod more: every replacement the roll needs is
    // forbidden, so each of broken's reconciles fails from now on.
    product.apply(
        r#"
apiVersion: v1
kind: ResourceQuota
metadata: {name: no-more-pods, namespace: bad}
spec: {hard: {pods: "2"}}
"#,
    );
    eventually(
        "the quota counts the Pods",
        Duration::from_secs(30),
        async || {
            let quota = get_json(
                &product.plane,
                &[
                    "get",
                    "resourcequota",
                    "no-more-pods",
                    "-n",
                    "bad",
                    "-o",
                    "json",
                ],
            );
            match quota["status"]["used"]["pods"].as_str() {
                Some("2") => Ok(()),
                other => Err(format!("used pods: {other:?}")),
            }
        },
    )
    .await;

    let started = Instant::now();
    product.patch(
        "valkeyconfig/shared",
        None,
        r#"{"spec":{"imageRef":"valkey-9-1-2"}}"#,
    );
    rolled(
        &product,
        "good",
        "healthy",
        "9.1.2",
        Duration::from_secs(90),
    )
    .await;
    let healthy_took = started.elapsed();

    let broken = product.cluster("bad", "broken");
    assert_eq!(
        condition(&broken, "Degraded").as_deref(),
        Some("True"),
        "{broken:#}"
    );
    let message = condition_field(&broken, "Degraded", "message").unwrap_or_default();
    assert!(message.contains("quota"), "{message}");
    let text = product.operator.metrics().await;
    let errors = metric(
        &text,
        "valkey_operator_reconcile_errors_total",
        &[("category", "kubernetes")],
    )
    .unwrap_or(0.0);
    assert!(
        errors >= 1.0,
        "no kubernetes reconcile errors counted:\n{text}"
    );
    eprintln!(
        "healthy rolled in {:.1} s while broken failed {errors} reconciles: {message}",
        healthy_took.as_secs_f64()
    );

    // The fault removed, the broken cluster rolls too.
    product.kubectl(&["delete", "resourcequota", "no-more-pods", "-n", "bad"]);
    rolled(&product, "bad", "broken", "9.1.2", Duration::from_secs(120)).await;
}
