//! The parts of the Momento operator's documented contract that its users' YAML, selectors and
//! scripts rely on, end to end (`../shared/spec/momento/reference/labels-annotations.md`,
//! `forced-settings.md`, `cluster-status.md`, `security/networking.md`):
//! - a cluster whose config cannot be found reads `Creating` with a `status.message`;
//! - every Valkey Pod carries `app.kubernetes.io/name: valkey`, `app.kubernetes.io/instance` and
//!   `valkey.gomomento.com/shard-index`, the ports `valkey` and `valkey-bus`, the arm64
//!   toleration, and is in the Guaranteed QoS class; the Service and Momento's worked
//!   NetworkPolicy example select exactly those Pods;
//! - every node runs `cluster-node-timeout` 5000, and a config may not set it;
//! - a scale-out's new shard is labelled `join-type: shard` until it is `Active`, a replica
//!   `join-type: replica`; a roll shows each retired node `Leaving` before it goes;
//! - Momento's documented examples apply unchanged (`--dry-run=server`, then for real), with a
//!   role `subcommand`, a permission's `channels` and keys' default access; the user a
//!   ValkeyConfig's `acl` defines logs in on every node of every cluster of that config, a
//!   cluster's own user only on its own, and a cluster may not reuse the config's usernames;
//! - a hung primary (SIGSTOP) of a 2-shard cluster, which Valkey cannot fail over (one of two
//!   primaries is no majority), is killed by its liveness probe and its shard taken over, with
//!   no acknowledged write lost;
//! - a settled cluster keeps the operator's log flowing (Momento's monitoring page alerts when
//!   it stops): a heartbeat line for it each minute.

use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::chart::get_json;
use harness::k8s::manifest::{MOMENTO_NETWORK_POLICY, Manifest};
use harness::k8s::{ClusterWatch, IMAGES, Product, converged};
use harness::valkey::config_get;
use serde_json::Value;

const NAMESPACE: &str = "my-app";

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: my-app}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: sized}
spec:
  imageRef: valkey-9-0-0
  resources: {cpu: 200m, memory: 256Mi}
  valkey: {maxmemory: 128mb, save: ""}
"#;

fn json(product: &Product, args: &[&str]) -> Value {
    get_json(&product.plane, args)
}

/// Names of the Pods a label selector finds in the namespace.
fn pods_selected(product: &Product, selector: &str) -> BTreeSet<String> {
    let pods = json(product, &["get", "pods", "-n", NAMESPACE, "-l", selector]);
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// `matchLabels` as a `-l` selector.
fn selector(match_labels: &Value) -> String {
    let labels = match_labels.as_object().unwrap();
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
        .collect();
    pairs.join(",")
}

/// `kubectl get … -w` into a file: every change it printed while it ran, however briefly each
/// state lasted (a poll could miss one).
struct KubectlWatch {
    child: Child,
    file: tempfile::NamedTempFile,
}

impl KubectlWatch {
    fn start(product: &Product, args: &[&str]) -> Self {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut command = product.plane.kubectl();
        command
            .args(args)
            .arg("-w")
            .stdout(file.reopen().unwrap())
            .stderr(Stdio::null());
        Self {
            child: command.spawn().unwrap(),
            file,
        }
    }

    /// What the watch printed so far.
    fn text(&self) -> String {
        std::fs::read_to_string(self.file.path()).unwrap_or_default()
    }

    /// The watch stopped, and every JSON object it printed, in order.
    fn stop_objects(mut self) -> Vec<Value> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let text = self.text();
        serde_json::Deserializer::from_str(&text)
            .into_iter::<Value>()
            .map_while(Result::ok)
            .collect()
    }
}

impl Drop for KubectlWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn momentos_labels_settings_and_status_hold_here() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(OBJECTS);

    // A config that sets what the operator forces is refused, saying why.
    let (accepted, said) = product.try_kubectl(
        &["apply", "-f", "-"],
        Some("apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyConfig\nmetadata: {name: tuned}\nspec: {imageRef: valkey-9-0-0, valkey: {cluster-node-timeout: \"15000\"}}\n"),
    );
    assert!(!accepted, "{said}");
    assert!(said.contains("cluster-node-timeout"), "{said}");

    // Before its config exists: `Creating`, and a message a person can act on.
    product.apply("apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyCluster\nmetadata: {name: orders, namespace: my-app}\nspec: {configRef: later, shards: 2, replicasPerShard: 1}\n");
    let waiting = eventually(
        "a message about the missing config",
        Duration::from_secs(30),
        async || {
            let status = product.cluster(NAMESPACE, "orders")["status"].clone();
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains("later"))
                .then_some(status)
        },
    )
    .await;
    assert_eq!(waiting["state"], "Creating", "{waiting}");
    product.patch(
        "valkeycluster/orders",
        Some(NAMESPACE),
        r#"{"spec": {"configRef": "sized"}}"#,
    );
    product
        .wait_converged(&[(NAMESPACE, "orders")], "9.0.0", Duration::from_secs(180))
        .await;
    let status = product.cluster(NAMESPACE, "orders")["status"].clone();
    assert_eq!(status["state"], "Active", "{status}");
    assert!(
        status["message"].is_null(),
        "resolved, so no message: {status}"
    );

    // Labels, ports, toleration and QoS of every Valkey Pod.
    let ours = pods_selected(&product, "valkey.gomomento.com/cluster=orders");
    assert_eq!(ours.len(), 4, "{ours:?}");
    let momentos = "app.kubernetes.io/name=valkey,app.kubernetes.io/instance=orders";
    assert_eq!(pods_selected(&product, momentos), ours);
    let pods = json(&product, &["get", "pods", "-n", NAMESPACE]);
    for pod in pods["items"].as_array().unwrap() {
        let name = &pod["metadata"]["name"];
        let shard = pod["metadata"]["labels"]["valkey.gomomento.com/shard-index"].as_str();
        assert!(matches!(shard, Some("0" | "1")), "{name}: {shard:?}");
        let ports = &pod["spec"]["containers"][0]["ports"];
        assert_eq!(ports[0]["name"], "valkey", "{name}");
        assert_eq!(ports[1]["name"], "valkey-bus", "{name}");
        let tolerations = pod["spec"]["tolerations"].to_string();
        assert!(
            tolerations.contains(r#""value":"arm64""#),
            "{name}: {tolerations}"
        );
        assert_eq!(pod["status"]["qosClass"], "Guaranteed", "{name}");
    }
    let service = json(&product, &["get", "service", "orders", "-n", NAMESPACE]);
    assert_eq!(
        pods_selected(&product, &selector(&service["spec"]["selector"])),
        ours
    );
    product.apply(MOMENTO_NETWORK_POLICY);
    let policy = json(
        &product,
        &["get", "networkpolicy", "valkey-ingress", "-n", NAMESPACE],
    );
    let policed = &policy["spec"]["podSelector"]["matchLabels"];
    assert_eq!(pods_selected(&product, &selector(policed)), ours);
    let peers = &policy["spec"]["ingress"][2]["from"][0]["podSelector"]["matchLabels"];
    assert_eq!(
        pods_selected(&product, &selector(peers)),
        ours,
        "node to node"
    );

    // The forced failure-detection window, on every node.
    for (pod, address) in product.addresses(NAMESPACE, "orders") {
        let timeout = config_get(&address, "cluster-node-timeout").await;
        assert_eq!(timeout.as_deref(), Ok("5000"), "{pod}");
    }

    // How nodes joined: a scale-out's shard, then a roll's replicas and its retirements.
    let nodes = json(&product, &["get", "valkeynodes", "-n", NAMESPACE]);
    for node in nodes["items"].as_array().unwrap() {
        let join = node["metadata"]["labels"]["valkey.gomomento.com/join-type"].as_str();
        let replica =
            node["metadata"]["annotations"]["valkey.gomomento.com/replica-of"].is_string();
        let expected = replica.then_some("replica");
        assert_eq!(join, expected, "a first node: {node}");
    }
    // Every version of every ValkeyNode while it runs.
    let watch = KubectlWatch::start(
        &product,
        &["get", "valkeynodes", "-n", NAMESPACE, "-o", "json"],
    );
    product.patch(
        "valkeycluster/orders",
        Some(NAMESPACE),
        r#"{"spec": {"shards": 3}}"#,
    );
    product
        .wait_converged(&[(NAMESPACE, "orders")], "9.0.0", Duration::from_secs(240))
        .await;
    product.patch(
        "valkeyconfig/sized",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    product
        .wait_converged(&[(NAMESPACE, "orders")], "9.1.2", Duration::from_secs(300))
        .await;
    let seen = watch.stop_objects();
    let label = |node: &Value| {
        node["metadata"]["labels"]["valkey.gomomento.com/join-type"]
            .as_str()
            .map(String::from)
    };
    let of_shard_2: Vec<&Value> = seen
        .iter()
        .filter(|n| n["spec"]["shard"] == 2 && n["spec"]["version"] == "9.0.0")
        .collect();
    let first_of_shard_2 = of_shard_2
        .iter()
        .find(|n| n["metadata"]["annotations"]["valkey.gomomento.com/replica-of"].is_null())
        .expect("the new shard's primary was seen");
    let primary = first_of_shard_2["metadata"]["name"].clone();
    let versions: Vec<(Option<String>, Value)> = of_shard_2
        .iter()
        .filter(|n| n["metadata"]["name"] == primary)
        .map(|n| (label(n), n["status"]["lifecycle"].clone()))
        .collect();
    assert_eq!(
        versions.first().map(|v| v.0.as_deref()),
        Some(Some("shard")),
        "{versions:?}"
    );
    assert!(
        versions
            .iter()
            .any(|(join, lifecycle)| join.is_none() && lifecycle == "Active"),
        "the label goes once Active: {versions:?}"
    );
    let leaving: BTreeSet<String> = seen
        .iter()
        .filter(|n| n["status"]["lifecycle"] == "Leaving")
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let rolled: BTreeSet<String> = seen
        .iter()
        .filter(|n| n["spec"]["version"] == "9.0.0")
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        leaving, rolled,
        "every node the roll retired was Leaving first"
    );
    let replaced = seen
        .iter()
        .filter(|n| n["spec"]["version"] == "9.1.2")
        .all(|n| label(n).as_deref() == Some("replica"));
    assert!(replaced, "a roll's new nodes join as replicas");
}

/// Momento's documented examples (`reference/examples.md`, `reference/api/valkeyconfig.md`), as
/// printed there but for the password hashes and a role command written Momento's way with a
/// `subcommand`; the config's `acl` is Momento's platform-level user.
const MOMENTO_EXAMPLES: &str = r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata:
  name: valkey-9-0
spec:
  repository: valkey/valkey
  tag: "9.0.0"
  version: "9.0.0"
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyRole
metadata:
  name: read-write
spec:
  categories:
    - name: read
      access: allow
    - name: write
      access: allow
  commands:
    - name: cluster
      subcommand: slots
      access: allow
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata:
  name: standard
spec:
  imageRef: valkey-9-0
  resources:
    cpu: "1"
    memory: "2Gi"
  valkey:
    maxmemory: "1500mb"
    maxmemory-policy: "allkeys-lru"
  acl:
    - username: platform-user
      passwordHashes:
        - PLATFORM_HASH
      permissions:
        - roleRef: read-write
          keys:
            - pattern: "platform:*"
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata:
  name: large
spec:
  baseRef: standard
  resources:
    cpu: "4"
    memory: "16Gi"
  valkey:
    maxmemory: "12gb"
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata:
  name: my-cluster
  namespace: my-app
spec:
  configRef: standard
  shards: 2
  replicasPerShard: 1
  acl:
    - username: app-user
      passwordHashes:
        - APP_HASH
      permissions:
        - roleRef: read-write
          keys:
            - pattern: "myapp:*"
              access: readwrite
          channels: ["myapp:*"]
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata:
  name: other-cluster
  namespace: my-app
spec:
  configRef: large
  shards: 1
  replicasPerShard: 0
"#;

/// Logs in as `username` on every node of the cluster, or says where it could not.
async fn logs_in_everywhere(
    product: &Product,
    cluster: &str,
    username: &str,
) -> Result<(), String> {
    let login = valkey_operator::credentials::Credentials {
        username: username.into(),
        password: format!("{username}'s password"),
    };
    for (pod, address) in product.addresses(NAMESPACE, cluster) {
        let timeout = Duration::from_secs(2);
        valkey_operator::valkey::NodeClient::connect_as(&address, timeout, Some(&login))
            .await
            .map_err(|e| format!("{cluster}/{pod} as {username}: {e}"))?;
    }
    Ok(())
}

#[tokio::test]
async fn momentos_examples_apply_and_a_config_level_user_logs_in_on_every_cluster() {
    let product = Product::start(None, &[]).await;
    product.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: my-app}\n");
    let hash =
        |user: &str| valkey_operator::acl::password_hash(format!("{user}'s password").as_bytes());
    let examples = MOMENTO_EXAMPLES
        .replace("PLATFORM_HASH", &hash("platform-user"))
        .replace("APP_HASH", &hash("app-user"));
    let (dry, said) =
        product.try_kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&examples));
    assert!(dry, "{said}");
    product.apply(&examples);
    let clusters = [(NAMESPACE, "my-cluster"), (NAMESPACE, "other-cluster")];
    product
        .wait_converged(&clusters, "9.0.0", Duration::from_secs(240))
        .await;
    for (_, cluster) in clusters {
        eventually(
            format!("the config's user logs in on every node of {cluster}"),
            Duration::from_secs(30),
            async || logs_in_everywhere(&product, cluster, "platform-user").await,
        )
        .await;
    }
    logs_in_everywhere(&product, "my-cluster", "app-user")
        .await
        .unwrap();
    // The cluster's own user is on its own cluster only.
    assert!(
        logs_in_everywhere(&product, "other-cluster", "app-user")
            .await
            .is_err()
    );
    // A cluster may not take a name the config gives every cluster.
    let (taken, said) = product.try_kubectl(
        &["patch", "valkeycluster", "other-cluster", "-n", NAMESPACE, "--type", "merge", "-p",
          r#"{"spec": {"acl": [{"username": "platform-user", "passwordHashes": [], "permissions": []}]}}"#],
        None,
    );
    assert!(!taken, "{said}");
    assert!(
        said.contains("defined by the acl of ValkeyConfig large"),
        "{said}"
    );
}

static TWO_SHARDS: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("my-app")
        .config("plain", r#"{imageRef: valkey-9-0-0, valkey: {save: ""}}"#)
        .cluster(("my-app", "stuck"), "plain", 2, 1)
        .yaml()
});

#[tokio::test]
async fn a_hung_primary_is_killed_by_its_liveness_probe_and_its_shard_taken_over() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&TWO_SHARDS);
    product
        .wait_converged(&[(NAMESPACE, "stuck")], "9.0.0", Duration::from_secs(120))
        .await;

    let watch = ClusterWatch::start(&product, NAMESPACE, "stuck").await;
    let victim = product.primary_of(NAMESPACE, "stuck", 0).await;
    // The Pod's phase, and its deletion time once it has one, at every change.
    let template = r#"jsonpath={.status.phase} {.metadata.deletionTimestamp}{"\n"}"#;
    let phases = KubectlWatch::start(
        &product,
        &["get", "pod", "-n", NAMESPACE, &victim, "-o", template],
    );
    let pid = product.server_pid(NAMESPACE, &victim);
    let hung = Instant::now();
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(stopped.success(), "kill -STOP {pid}");

    // Killed by the kubelet (its Pod `Failed`, not deleted): three failed probes within about
    // 11 s, then the Pod's 10 s grace. (The operator's own silence bound, 20 s, would instead
    // delete the Pod after taking its shard over.)
    // Watched, not polled: the operator retires a Pod that failed within a pass or two, often
    // sooner than a poll comes round.
    eventually(
        "the hung primary killed",
        Duration::from_secs(30),
        async || {
            let seen = phases.text();
            // `Failed` before anyone deleted it: the kubelet's doing, not the operator's.
            let failed = seen.lines().any(|line| line.trim() == "Failed");
            failed.then_some(()).ok_or(seen)
        },
    )
    .await;
    let killed = hung.elapsed();
    eventually(
        "the shard taken over and whole",
        Duration::from_secs(120),
        async || {
            let cluster = product.cluster(NAMESPACE, "stuck");
            let pods = product.addresses(NAMESPACE, "stuck");
            if converged(&cluster, "9.0.0") && !pods.contains_key(&victim) && pods.len() == 4 {
                Ok(())
            } else {
                Err(format!("{pods:?}\n{:#}", cluster["status"]))
            }
        },
    )
    .await;
    let whole = hung.elapsed();
    let report = watch.finish(&product).await;
    // The hung shard changed primary once; the other never did.
    report.assert_shard(0, 2, 1, 0);
    report.assert_shard(1, 2, 0, 1);
    println!(
        "hung primary killed by its liveness probe {killed:.1?} after SIGSTOP; shard whole \
         again after {whole:.1?}; {} acknowledged writes, none lost; longest write gap {:.1?}",
        report.log.ack_times.len(),
        report.longest_write_gap()
    );
}

static QUIET_OBJECTS: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("quiet")
        .config(
            "quiet-config",
            r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#,
        )
        .cluster(("quiet", "idle"), "quiet-config", 1, 0)
        .yaml()
});

#[tokio::test]
async fn a_settled_cluster_logs_a_heartbeat_each_minute() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&QUIET_OBJECTS);
    product
        .wait_converged(&[("quiet", "idle")], "9.1.2", Duration::from_secs(120))
        .await;
    let settled = Instant::now();
    let beats = |log: &str| {
        log.lines()
            .filter(|line| line.contains("heartbeat: settled") && line.contains("idle"))
            .count()
    };
    let before = beats(&product.operator().log());
    eventually(
        "a heartbeat of the settled cluster",
        Duration::from_secs(100),
        async || {
            let now = beats(&product.operator().log());
            (now > before).then_some(())
        },
    )
    .await;
    println!(
        "heartbeat | a settled cluster logged a heartbeat {:.0} s after it converged",
        settled.elapsed().as_secs_f64()
    );
}
