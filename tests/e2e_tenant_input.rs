//! What a tenant writes cannot hurt the operator or another tenant, end to end on the real
//! control plane with the chart's RBAC and webhooks, real valkey-server Pods and `kubectl`:
//! hostile specs are refused by the layer that sees them first (CRD schema, webhook, and, with
//! the webhooks off, the controller itself), a cluster named like someone else's Service leaves
//! it alone, and a cluster whose reconcile keeps failing does not hold back a healthy one.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::chart::{RELEASE, get_json};
use harness::k8s::manifest::Manifest;
use harness::k8s::{IMAGES, Product, condition, condition_field};
use harness::metric;
use serde_json::Value;

static CONFIG: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("tenant")
        .config(
            "standard",
            r#"{imageRef: valkey-9-0-0, valkey: {save: ""}}"#,
        )
        .yaml()
});

fn cluster_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyCluster\nmetadata: {{name: {name}, namespace: tenant}}\nspec: {spec}\n"
    )
}

/// Takes the admission webhooks out of the way, as a person with the rights could (or as a
/// failure policy of `Ignore` does while the operator is down); returns their configuration,
/// to apply again.
fn webhooks_off(product: &Product) -> Value {
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
    webhooks
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
    product.apply(&CONFIG);
    let rss_before = product.operator().resident_kib().unwrap();

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
    let webhooks = webhooks_off(&product);
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
    assert!(
        product.operator_mut().exited().is_none(),
        "the operator exited"
    );
    let rss_after = product.operator().resident_kib().unwrap();
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
    let text = product.operator().metrics().await;
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

/// The names of `count` commands a real valkey-server 9.0.0 knows (`COMMAND LIST`).
async fn real_commands(count: usize) -> Vec<String> {
    use harness::valkey::roller::LocalRuntime;
    use harness::valkey::runtime::{NodeRuntime, NodeSpec};
    let runtime = LocalRuntime::new(61).unwrap();
    let spec = NodeSpec {
        name: "commands".into(),
        shard: 0,
        revision: "9.0.0".into(),
    };
    let address = runtime.start_node(&spec).await.unwrap();
    let names: Vec<String> = eventually("COMMAND LIST", Duration::from_secs(10), async || {
        let mut conn = redis::Client::open(format!("redis://{address}/"))
            .ok()?
            .get_multiplexed_async_connection()
            .await
            .ok()?;
        redis::cmd("COMMAND")
            .arg("LIST")
            .query_async::<Vec<String>>(&mut conn)
            .await
            .ok()
    })
    .await;
    runtime.stop_node("commands").await.unwrap();
    let mut names: Vec<String> = names.into_iter().map(|n| n.to_lowercase()).collect();
    names.sort();
    names.truncate(count);
    assert_eq!(names.len(), count, "{names:?}");
    names
}

fn role_yaml(commands: &[String]) -> String {
    let entries: Vec<String> = commands
        .iter()
        .map(|c| format!("{{name: {c}, access: allow}}"))
        .collect();
    format!(
        "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyRole\nmetadata: {{name: wide}}\nspec: {{commands: [{}]}}\n",
        entries.join(", ")
    )
}

/// A ValkeyCluster of `users` users, each granted the role `wide` `permissions` times (on a
/// key pattern of its own): a small spec whose ACL the role multiplies.
fn amplified_cluster(name: &str, users: usize, permissions: usize) -> String {
    let acl: Vec<String> = (0..users)
        .map(|u| {
            let granted = vec![
                format!(
                    "{{roleRef: wide, keys: [{{pattern: \"u{u:02}:*\", access: readwrite}}]}}"
                );
                permissions
            ];
            format!(
                "{{username: user{u:02}, passwordHashes: [\"{}\"], permissions: [{}]}}",
                "ab".repeat(32),
                granted.join(", ")
            )
        })
        .collect();
    cluster_yaml(
        name,
        &format!(
            "{{configRef: standard, shards: 1, replicasPerShard: 0, acl: [{}]}}",
            acl.join(", ")
        ),
    )
}

/// The cost of `users` users granted a role of `role` `permissions` times, as the operator
/// reckons it.
fn cost(
    users: usize,
    permissions: usize,
    role: &valkey_operator::api::ValkeyRoleSpec,
) -> (usize, usize) {
    use valkey_operator::acl::{UserCost, role_cost};
    let yaml = amplified_cluster("x", users, permissions);
    let cluster: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let spec: valkey_operator::api::ValkeyClusterSpec =
        serde_json::from_value(cluster["spec"].clone()).unwrap();
    let per_role = role_cost(role);
    let user = UserCost::of(&spec.acl[0]).with_roles(|_| Some(per_role));
    let total: usize = spec
        .acl
        .iter()
        .map(|u| UserCost::of(u).with_roles(|_| Some(per_role)).bytes)
        .sum();
    (user.tokens, total)
}

#[tokio::test]
async fn the_largest_acl_admission_passes_is_written_within_bounded_memory() {
    use valkey_operator::acl::{MAX_NODE_BYTES, MAX_USER_TOKENS};
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&CONFIG);
    let commands = real_commands(200).await;
    product.apply(&role_yaml(&commands));
    let role: valkey_operator::api::ValkeyRoleSpec = serde_json::from_value(
        serde_yaml_ng::from_str::<serde_json::Value>(&role_yaml(&commands)).unwrap()["spec"]
            .clone(),
    )
    .unwrap();
    // The most permissions a user may hold of it, and the most such users a cluster may have.
    let permissions = (1..=32)
        .take_while(|p| cost(1, *p, &role).0 <= MAX_USER_TOKENS)
        .last()
        .unwrap();
    let users = (1..=64)
        .take_while(|u| cost(*u, permissions, &role).1 <= MAX_NODE_BYTES)
        .last()
        .unwrap();
    let (tokens, bytes) = cost(users, permissions, &role);
    println!(
        "the widest ACL within bounds: {users} users × {permissions} grants of a {}-command role: {tokens} rules a user, {bytes} bytes a node",
        commands.len()
    );
    let rss_before = product.operator().resident_kib().unwrap();

    // One grant more per user, or one user more: refused, saying the limit (once admission's
    // index holds the role and the config just applied).
    product
        .until_admission_knows(&amplified_cluster("known", 1, 1))
        .await;
    // One grant more per user, or one user more: refused, saying the limit.
    refused(
        &product,
        &amplified_cluster("too-deep", 1, permissions + 1),
        &["spec.acl[0]", "ACL rules", "at most 4096 per user"],
    );
    if users < 64 {
        refused(
            &product,
            &amplified_cluster("too-wide", users + 1, permissions),
            &[
                "spec.acl",
                "bytes of ACL rules",
                "at most 1048576 are allowed",
            ],
        );
    }

    // The widest: admitted, and every user written on the node.
    product.apply(&amplified_cluster("widest", users, permissions));
    rolled(
        &product,
        "tenant",
        "widest",
        "9.0.0",
        Duration::from_secs(180),
    )
    .await;
    let mut peak = 0;
    eventually(
        "every user written on the node",
        Duration::from_secs(120),
        async || {
            peak = peak.max(product.operator().resident_kib().unwrap_or(0));
            let cluster = product.cluster("tenant", "widest");
            match condition(&cluster, "AclApplied").as_deref() {
                Some("True") => Ok(()),
                _ => Err(condition_field(&cluster, "AclApplied", "message").unwrap_or_default()),
            }
        },
    )
    .await;
    for _ in 0..20 {
        peak = peak.max(product.operator().resident_kib().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "operator RSS with it: {rss_before} KiB before, {peak} KiB at most after (+{} KiB)",
        peak.saturating_sub(rss_before)
    );
    assert!(
        peak < rss_before + 48 * 1024,
        "the operator grew from {rss_before} KiB to {peak} KiB"
    );

    // The role grown by a few commands would push the cluster past its bound: refused, naming it.
    let grown = real_commands(210).await;
    refused(
        &product,
        &role_yaml(&grown),
        &["ValkeyRole wide", "ValkeyCluster tenant/widest"],
    );
}

const POLICY: &str = r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: large}
spec: {imageRef: valkey-9-0-0, valkey: {save: ""}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyNamespacePolicy
metadata: {name: tenant-limits}
spec: {namespaces: [tenant], allowedConfigs: [standard], maxClusters: 2, maxShards: 2, maxNodes: 3}
"#;

/// Applies `yaml` as a server-side dry run until admission refuses it with `expected` (its
/// index may not hold the newest objects yet), and returns the refusal.
async fn refused_once_known(product: &Product, yaml: &str, expected: &str) -> String {
    let mut said = String::new();
    eventually(
        "admission to refuse by the namespace's policy",
        Duration::from_secs(30),
        async || {
            let (ok, output) =
                product.try_kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(yaml));
            said = output.clone();
            match (ok, output.contains(expected)) {
                (false, true) => Ok(()),
                _ => Err(output),
            }
        },
    )
    .await;
    said
}

/// A namespace policy, end to end: admission refuses a config it does not allow and a cluster
/// past each of its caps, naming the policy; with the webhooks off, the controller creates
/// nothing for a cluster past it (`Invalid`, reason `NamespacePolicy`); loosening the policy
/// lets that cluster start.
#[tokio::test]
async fn a_namespace_policy_is_held_by_admission_and_by_the_controller() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&CONFIG);
    product.apply(POLICY);
    let on_large = cluster_yaml(
        "carts",
        "{configRef: large, shards: 1, replicasPerShard: 0}",
    );
    let said = refused_once_known(&product, &on_large, "ValkeyNamespacePolicy tenant-limits").await;
    assert!(
        said.contains("spec.configRef: ValkeyNamespacePolicy tenant-limits lets the clusters of namespace tenant use only ValkeyConfigs standard, not large"),
        "{said}"
    );
    refused(
        &product,
        &cluster_yaml(
            "wide",
            "{configRef: standard, shards: 3, replicasPerShard: 0}",
        ),
        &[
            "spec.shards: ValkeyNamespacePolicy tenant-limits allows at most 2 shards in namespace tenant",
        ],
    );
    refused(
        &product,
        &cluster_yaml(
            "deep",
            "{configRef: standard, shards: 1, replicasPerShard: 3}",
        ),
        &[
            "spec.replicasPerShard: ValkeyNamespacePolicy tenant-limits allows at most 3 Valkey nodes",
        ],
    );
    // Two clusters fit; a third does not, counting the two.
    for name in ["first", "second"] {
        product.apply(&cluster_yaml(
            name,
            "{configRef: standard, shards: 1, replicasPerShard: 0}",
        ));
    }
    let third = cluster_yaml(
        "third",
        "{configRef: standard, shards: 1, replicasPerShard: 0}",
    );
    let said = refused_once_known(&product, &third, "allows at most 2 ValkeyClusters").await;
    assert!(said.contains("metadata.name: ValkeyNamespacePolicy tenant-limits allows at most 2 ValkeyClusters in namespace tenant, which has 2 already"), "{said}");

    // The controller, with the webhooks out of the way: a cluster past the policy is not created.
    let webhooks = webhooks_off(&product);
    // Creation times have a second's resolution, and within one second the name decides which
    // cluster came first: let carts be plainly the newest.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    product.apply(&on_large);
    eventually(
        "carts reads Invalid for the policy",
        Duration::from_secs(30),
        async || {
            let cluster = product.cluster("tenant", "carts");
            let reason = condition_field(&cluster, "Degraded", "reason");
            match (cluster["status"]["state"].as_str(), reason.as_deref()) {
                (Some("Invalid"), Some("NamespacePolicy")) => Ok(()),
                _ => Err(format!("{:#}", cluster["status"])),
            }
        },
    )
    .await;
    let message = product.cluster("tenant", "carts")["status"]["message"].clone();
    let message = message.as_str().unwrap_or_default();
    eprintln!("carts: {message}");
    for expected in [
        "ValkeyNamespacePolicy tenant-limits",
        "not large",
        "at most 2 ValkeyClusters",
    ] {
        assert!(
            message.contains(expected),
            "{expected:?} not in {message:?}"
        );
    }
    let nodes = product.kubectl(&[
        "get",
        "valkeynodes",
        "-n",
        "tenant",
        "-l",
        "valkey.gomomento.com/cluster=carts",
        "-o",
        "name",
    ]);
    assert!(nodes.trim().is_empty(), "nodes were created: {nodes}");
    product.apply(&webhooks.to_string());

    // The older clusters were never held back by the newer one, and loosening the policy lets
    // carts start: the policy's change wakes it.
    for name in ["first", "second"] {
        let cluster = product.cluster("tenant", name);
        assert_ne!(
            cluster["status"]["state"].as_str(),
            Some("Invalid"),
            "{name}: {:#}",
            cluster["status"]
        );
    }
    let loosened = Instant::now();
    product.patch(
        "valkeynamespacepolicy/tenant-limits",
        None,
        r#"{"spec": {"allowedConfigs": ["standard", "large"], "maxClusters": 3, "maxShards": 3}}"#,
    );
    eventually(
        "carts starts once the policy allows it",
        Duration::from_secs(60),
        async || {
            let cluster = product.cluster("tenant", "carts");
            match cluster["status"]["state"].as_str() {
                Some("Active") => Ok(()),
                _ => Err(format!("{:#}", cluster["status"])),
            }
        },
    )
    .await;
    eprintln!(
        "carts: Active {:.1} s after the policy was loosened",
        loosened.elapsed().as_secs_f64()
    );
    let message = &product.cluster("tenant", "carts")["status"]["message"];
    assert!(message.is_null(), "the message stays: {message}");
}

const NODE_CAP: &str = r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyNamespacePolicy
metadata: {name: tenant-nodes}
spec: {namespaces: [tenant], maxNodes: 3}
"#;

/// Admission judges each change alone: with it off (or two changes admitted at once), two
/// clusters growing together could take a namespace past its cap. The controller grants a
/// running cluster's growth again, counting the other clusters at their specs: of two clusters
/// asking at once, the one it sees first grows, the other waits (the namespace never runs more
/// than its cap), and grows once the first gives its growth up.
#[tokio::test]
async fn of_two_clusters_growing_at_once_past_a_policy_one_waits_until_the_other_gives_up() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&CONFIG);
    product.apply(NODE_CAP);
    let clusters = [("tenant", "first"), ("tenant", "second")];
    for (_, name) in clusters {
        product.apply(&cluster_yaml(
            name,
            "{configRef: standard, shards: 1, replicasPerShard: 0}",
        ));
    }
    product
        .wait_converged(&clusters, "9.0.0", Duration::from_secs(120))
        .await;
    let webhooks = webhooks_off(&product);
    let replicas = |name: &str, count: u32| {
        product.patch(
            &format!("valkeycluster/{name}"),
            Some("tenant"),
            &format!(r#"{{"spec": {{"replicasPerShard": {count}}}}}"#),
        );
    };
    // Each alone fits (2 + 1 nodes of 3); both together do not (2 + 2).
    replicas("first", 1);
    replicas("second", 1);
    let nodes = || {
        let listed = product.kubectl(&["get", "valkeynodes", "-n", "tenant", "-o", "name"]);
        listed
            .lines()
            .filter(|line| !line.trim().is_empty())
            .count()
    };
    let held = |name: &str| {
        let cluster = product.cluster("tenant", name);
        condition_field(&cluster, "Degraded", "reason").as_deref() == Some("NamespacePolicy")
    };
    let grown = |name: &str| {
        let cluster = product.cluster("tenant", name);
        cluster["status"]["granted"]["replicasPerShard"] == 1
    };
    let (winner, waiter) = eventually("one grown, one held", Duration::from_secs(60), async || {
        let count = nodes();
        assert!(count <= 3, "{count} nodes in a namespace capped at 3");
        match (
            grown("first"),
            grown("second"),
            held("first"),
            held("second"),
        ) {
            (true, true, _, _) => panic!("both grew past the cap"),
            (true, false, false, true) if count == 3 => Some(("first", "second")),
            (false, true, true, false) if count == 3 => Some(("second", "first")),
            _ => None,
        }
    })
    .await;
    let message = product.cluster("tenant", waiter)["status"]["message"].clone();
    assert!(
        message
            .as_str()
            .is_some_and(|m| m.contains("growth held") && m.contains("tenant-nodes")),
        "{message}"
    );
    // Still held a while later (a held cluster asks again every 10 s).
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        nodes(),
        3,
        "the namespace runs past its cap, or lost a node"
    );
    assert!(held(waiter) && !grown(waiter), "{waiter} grew past the cap");

    // The winner gives its growth up: the waiter grows.
    let gave_up = Instant::now();
    replicas(winner, 0);
    eventually("the waiter grows", Duration::from_secs(120), async || {
        let count = nodes();
        (grown(waiter) && !held(waiter) && !grown(winner) && count == 3).then_some(())
    })
    .await;
    println!(
        "policy race | {winner} grew, {waiter} held at the cap; {waiter} grew {:.1} s after {winner} gave up",
        gave_up.elapsed().as_secs_f64()
    );
    product.apply(&webhooks.to_string());
}
