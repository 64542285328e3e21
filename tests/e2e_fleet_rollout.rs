//! A fleet rollout a platform team steers, end to end: six one-node clusters on one config
//! with `spec.rollout: {maxConcurrent: 2, waves: [...]}`: the policy puts a canary in wave 0,
//! two clusters in wave 1, and the three others (one of whose owners annotated it wave 0,
//! which the policy does not allow) in the last wave. A server-side dry run of the change says
//! how it will be paced. A change onto an image the test kubelet cannot run stalls the canary
//! and halts the rest (a `Halted` condition, an event and the status on the config); fixing the
//! image resumes it; a pause by annotation in the middle starts nobody new until it is lifted.
//! Sampled from the ValkeyNodes throughout: never more than two clusters rolling, and each wave
//! starting only once the one before completed. `kubectl get valkeyconfigs` shows the fleet
//! columns.
//!
//! And a tenant cannot hold a rollout back: a cluster whose owner annotated it wave 0 and broke
//! it (overwrote the operator's password in its own Secret) neither leads nor halts the others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use valkey_operator::api::annotations::ROLLOUT_PAUSED;

use harness::eventually;
use harness::k8s::{IMAGES, Product};
use serde_json::Value;

const NAMESPACE: &str = "fleet";
/// The clusters, and the wave their owner's annotation asks for (the policy ignores it).
const CLUSTERS: [(&str, Option<u32>); 6] = [
    ("canary", None),
    ("early-a", None),
    ("early-b", None),
    ("late-a", None),
    ("late-b", None),
    ("late-c", Some(0)),
];

fn fleet_yaml() -> String {
    let mut yaml = String::from(
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: fleet}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata: {name: valkey-broken}
spec: {repository: valkey/valkey, tag: "9.2.0", version: "9.2.0"}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: fleet-base}
spec:
  imageRef: valkey-9-0-0
  valkey: {save: ""}
  rollout:
    maxConcurrent: 2
    waves:
    - clusters: [fleet/canary]
    - clusters: [fleet/early-a, fleet/early-b]
"#,
    );
    for (name, wave) in CLUSTERS {
        let annotations = match wave {
            Some(wave) => {
                format!(", annotations: {{valkey.gomomento.com/rollout-wave: \"{wave}\"}}")
            }
            None => String::new(),
        };
        yaml.push_str(&format!(
            "---\napiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyCluster\n\
             metadata: {{name: {name}, namespace: fleet{annotations}}}\n\
             spec: {{configRef: fleet-base, shards: 1, replicasPerShard: 0}}\n"
        ));
    }
    yaml
}

/// Each cluster's live (not deleting) ValkeyNodes' versions, from one list.
fn node_versions(product: &Product) -> BTreeMap<String, Vec<String>> {
    let list: Value = serde_json::from_str(&product.kubectl(&[
        "get",
        "valkeynodes",
        "-n",
        NAMESPACE,
        "-o",
        "json",
    ]))
    .unwrap();
    let mut versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in list["items"].as_array().unwrap() {
        if !node["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let cluster = node["spec"]["cluster"].as_str().unwrap().to_owned();
        let version = node["spec"]["version"].as_str().unwrap().to_owned();
        versions.entry(cluster).or_default().push(version);
    }
    versions
}

fn config(product: &Product) -> Value {
    serde_json::from_str(&product.kubectl(&["get", "valkeyconfig", "fleet-base", "-o", "json"]))
        .unwrap()
}

fn config_events(product: &Product) -> String {
    product.kubectl(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "involvedObject.name=fleet-base",
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ])
}

/// When each cluster started (first node on the new version) and completed (no node on another).
#[derive(Default, Debug)]
struct Timeline {
    started: BTreeMap<String, Instant>,
    completed: BTreeMap<String, Instant>,
    most_rolling: usize,
    samples: usize,
}

impl Timeline {
    fn sample(&mut self, product: &Product, new: &str) -> bool {
        let versions = node_versions(product);
        let now = Instant::now();
        let mut rolling = 0;
        for (cluster, nodes) in &versions {
            let on_new = nodes.iter().any(|v| v == new);
            let on_other = nodes.iter().any(|v| v != new);
            if on_new || (on_other && nodes.iter().any(|v| v != "9.0.0")) {
                self.started.entry(cluster.clone()).or_insert(now);
            }
            if on_other && self.started.contains_key(cluster) {
                rolling += 1;
            }
            if on_new && !on_other {
                self.completed.entry(cluster.clone()).or_insert(now);
            }
        }
        self.most_rolling = self.most_rolling.max(rolling);
        self.samples += 1;
        self.completed.len() == CLUSTERS.len()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_rollout_in_waves_halts_on_a_stall_resumes_when_fixed_and_pauses() {
    let product = Product::start(None, &["--join-timeout-seconds", "8"]).await;
    product.apply(IMAGES);
    product.apply(&fleet_yaml());
    let all: Vec<(&str, &str)> = CLUSTERS
        .iter()
        .map(|(name, _)| (NAMESPACE, *name))
        .collect();
    product
        .wait_converged(&all, "9.0.0", Duration::from_secs(300))
        .await;
    eventually(
        "the config's fleet status",
        Duration::from_secs(30),
        async || {
            let status = &config(&product)["status"];
            (status["clusters"] == 6 && status["upToDate"] == 6 && status["rollout"] == "Complete")
                .then_some(())
                .ok_or(status.to_string())
        },
    )
    .await;
    let table = product.kubectl(&["get", "valkeyconfigs"]);
    println!("{table}");
    let header = table.lines().next().unwrap();
    for column in [
        "CLUSTERS",
        "UP-TO-DATE",
        "ROLLING",
        "QUEUED",
        "STALLED",
        "ROLLOUT",
    ] {
        assert!(header.contains(column), "{table}");
    }

    // Admission says how the change will be paced, before it happens.
    let change = r#"{"spec": {"imageRef": "valkey-broken"}}"#;
    let dry = product.kubectl(&[
        "patch",
        "valkeyconfig",
        "fleet-base",
        "--type",
        "merge",
        "-p",
        change,
        "--dry-run=server",
    ]);
    assert!(
        dry.contains("6 ValkeyClusters paced by ValkeyConfig fleet-base's spec.rollout: at most 2 rolling at once"),
        "{dry}"
    );

    // An image that never starts: the canary stalls, and the rest are halted behind it.
    product.patch("valkeyconfig/fleet-base", None, change);
    eventually(
        "the rollout to halt",
        Duration::from_secs(120),
        async || {
            let status = &config(&product)["status"];
            (status["stalled"] == 1 && status["rollout"] == "Halted")
                .then_some(())
                .ok_or(status.to_string())
        },
    )
    .await;
    let halted = config(&product);
    let condition = |field| harness::k8s::condition_field(&halted, "Halted", field);
    assert_eq!(condition("status").as_deref(), Some("True"), "{halted}");
    assert_eq!(
        condition("reason").as_deref(),
        Some("RollStalled"),
        "{halted}"
    );
    let events = config_events(&product);
    assert!(
        events.contains("RolloutStarted") && events.contains("RolloutHalted"),
        "{events}"
    );
    // A hold: nobody else starts while it is halted.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let versions = node_versions(&product);
    for (name, _) in &CLUSTERS[1..] {
        assert_eq!(
            versions[*name],
            ["9.0.0"],
            "{name} started during the halt: {versions:?}"
        );
    }
    let early = product.cluster(NAMESPACE, "early-a");
    let waiting = harness::k8s::condition_field(&early, "Progressing", "message").unwrap();
    assert!(waiting.starts_with("Wait (RolloutHalted): "), "{waiting}");

    // The fix: a good image. The canary's dead join is retired, and the rollout resumes.
    product.patch(
        "valkeyconfig/fleet-base",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    let fixed_at = Instant::now();
    let mut timeline = Timeline::default();
    let mut paused_at = None;
    let mut resumed_at = None;
    let deadline = Instant::now() + Duration::from_secs(400);
    while !timeline.sample(&product, "9.1.2") {
        assert!(
            Instant::now() < deadline,
            "the rollout did not complete: {timeline:?}"
        );
        // Pause as soon as the canary has completed, when wave 1 would start; resume 10 s later.
        if timeline.completed.contains_key("canary") && paused_at.is_none() {
            let annotation = format!("{ROLLOUT_PAUSED}=true");
            product.kubectl(&["annotate", "valkeyconfig", "fleet-base", &annotation]);
            paused_at = Some(Instant::now());
        }
        if let Some(at) = paused_at
            && resumed_at.is_none()
            && at.elapsed() > Duration::from_secs(10)
        {
            let status = &config(&product)["status"];
            assert_eq!(status["rollout"], "Paused", "{status}");
            // Someone is held by the pause, and says so.
            let held: Vec<String> = CLUSTERS
                .iter()
                .filter(|(name, _)| !timeline.started.contains_key(*name))
                .filter_map(|(name, _)| {
                    let cluster = product.cluster(NAMESPACE, name);
                    harness::k8s::condition_field(&cluster, "Progressing", "message")
                })
                .collect();
            assert!(
                held.iter().any(|m| m.starts_with("Wait (RolloutPaused): ")),
                "{held:?}"
            );
            product.kubectl(&[
                "annotate",
                "valkeyconfig",
                "fleet-base",
                &format!("{ROLLOUT_PAUSED}-"),
            ]);
            resumed_at = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let at = |instant: Option<&Instant>| {
        instant.map_or("-".to_owned(), |i| {
            format!("{:.1}", i.duration_since(fixed_at).as_secs_f64())
        })
    };
    for (name, _) in CLUSTERS {
        println!(
            "{name:8} started +{} s, completed +{} s",
            at(timeline.started.get(name)),
            at(timeline.completed.get(name))
        );
    }
    println!(
        "paused +{} s, resumed +{} s; most rolling at once {} over {} samples",
        at(paused_at.as_ref()),
        at(resumed_at.as_ref()),
        timeline.most_rolling,
        timeline.samples
    );
    assert!(timeline.samples > 20, "{timeline:?}");
    assert!(
        timeline.most_rolling <= 2,
        "more than 2 clusters rolling at once: {timeline:?}"
    );
    assert_eq!(
        timeline.most_rolling, 2,
        "the cap was never reached: {timeline:?}"
    );

    // Waves in order: each starts only after every earlier one completed.
    let done = |names: &[&str]| names.iter().map(|n| timeline.completed[*n]).max().unwrap();
    let first = |names: &[&str]| names.iter().map(|n| timeline.started[*n]).min().unwrap();
    assert!(
        done(&["canary"]) <= first(&["early-a", "early-b"]),
        "{timeline:?}"
    );
    assert!(
        done(&["early-a", "early-b"]) <= first(&["late-a", "late-b", "late-c"]),
        "{timeline:?}"
    );

    // The pause: nobody started between it taking hold (one pass, 3 s) and its end.
    let (paused_at, resumed_at) = (paused_at.unwrap(), resumed_at.unwrap());
    let started_while_paused: BTreeSet<&String> = timeline
        .started
        .iter()
        .filter(|(_, at)| **at > paused_at + Duration::from_secs(3) && **at < resumed_at)
        .map(|(name, _)| name)
        .collect();
    assert!(
        started_while_paused.is_empty(),
        "{started_while_paused:?} started while paused"
    );

    eventually(
        "the config's rollout to complete",
        Duration::from_secs(30),
        async || {
            let latest = config(&product);
            let status = &latest["status"];
            let unhalted = harness::k8s::condition_field(&latest, "Halted", "status");
            (status["upToDate"] == 6
                && status["rollout"] == "Complete"
                && status["stalled"] == 0
                && unhalted.as_deref() == Some("False"))
            .then_some(())
            .ok_or(status.to_string())
        },
    )
    .await;
    let events = config_events(&product);
    for reason in ["RolloutPaused", "RolloutResumed", "RolloutCompleted"] {
        assert!(events.contains(reason), "{reason}:\n{events}");
    }
    println!("{}", product.kubectl(&["get", "valkeyconfigs"]));
    println!("{events}");
}

const TENANTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: fleet}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: fleet-base}
spec:
  imageRef: valkey-9-0-0
  valkey: {save: ""}
  rollout:
    maxConcurrent: 1
    waves:
    - clusters: [fleet/first]
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: first, namespace: fleet}
spec: {configRef: fleet-base, shards: 1, replicasPerShard: 0}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: second, namespace: fleet}
spec: {configRef: fleet-base, shards: 1, replicasPerShard: 0}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata:
  name: intruder
  namespace: fleet
  annotations: {valkey.gomomento.com/rollout-wave: "0"}
spec: {configRef: fleet-base, shards: 1, replicasPerShard: 0}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_broken_cluster_neither_leads_nor_halts_the_rollout() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(TENANTS);
    let all = [
        (NAMESPACE, "first"),
        (NAMESPACE, "second"),
        (NAMESPACE, "intruder"),
    ];
    product
        .wait_converged(&all, "9.0.0", Duration::from_secs(300))
        .await;
    // The intruder is broken by hand: the operator's password in its private Secret
    // overwritten (its team cannot reach that Secret; a person of the platform can).
    let patch = r#"{"stringData": {"operator-password": "somebody-wrote-this-password"}}"#;
    let private = valkey_operator::credentials::private_secret_name(NAMESPACE, "intruder");
    product.kubectl(&[
        "patch",
        "secret",
        &private,
        "-n",
        harness::k8s::chart::NAMESPACE,
        "--type",
        "merge",
        "-p",
        patch,
    ]);
    eventually(
        "the intruder to say its nodes refuse the login",
        Duration::from_secs(60),
        async || {
            let intruder = product.cluster(NAMESPACE, "intruder");
            (harness::k8s::condition_field(&intruder, "Degraded", "reason").as_deref()
                == Some("LoginRefused"))
            .then_some(())
        },
    )
    .await;

    product.patch(
        "valkeyconfig/fleet-base",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    let mut timeline = Timeline::default();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        timeline.sample(&product, "9.1.2");
        let done = ["first", "second"]
            .iter()
            .all(|name| timeline.completed.contains_key(*name));
        if done {
            break;
        }
        let status = &config(&product)["status"];
        assert_ne!(
            status["rollout"], "Halted",
            "the intruder halted the rollout: {status}"
        );
        assert!(
            Instant::now() < deadline,
            "the rollout did not complete: {timeline:?}, {status}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        timeline.completed["first"] <= timeline.started["second"],
        "the policy's wave 0 went first: {timeline:?}"
    );
    assert!(
        !timeline.started.contains_key("intruder"),
        "the intruder, which cannot be worked on, started: {timeline:?}"
    );
    // The config's columns follow within a few seconds: the intruder counted, nobody halted.
    let status = eventually(
        "the config's fleet status",
        Duration::from_secs(30),
        async || {
            let status = config(&product)["status"].clone();
            (status["upToDate"] == 2 && status["stalled"] == 1 && status["rollout"] == "Rolling")
                .then(|| status.clone())
                .ok_or(status.to_string())
        },
    )
    .await;
    let halted = harness::k8s::condition_field(&config(&product), "Halted", "status");
    assert_eq!(halted.as_deref(), Some("False"));
    println!("a tenant's broken cluster annotated wave 0: {status}");
}
