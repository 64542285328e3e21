//! The product on a real node: a kubelet built from the API server's own Kubernetes module,
//! containerd and runc from Debian, the CNI bridge on 198.18.N.0/24, images assembled here
//! and imported (nothing pulled). A ValkeyCluster's Pods run as containers, as the image's
//! `valkey` user (999), each in its own network namespace with an address of the Pod network;
//! `kubectl logs` and `kubectl exec` reach them through the real kubelet; a client without
//! credentials is refused; the guide's 3 × 1 cluster rolls to a new version under a stock
//! cluster client with no acknowledged write lost and one failover per shard (the same
//! scenario runs on the test kubelet for the comparison of figures). On three nodes in zones a,
//! b and c: a primary's container killed with SIGKILL is taken over and replaced, a hung one
//! (SIGSTOP) is killed by the real kubelet's liveness probe and taken over, and `kubectl
//! drain` of the node holding a primary (a real cordon, real evictions through the operator's
//! webhook, a real kubelet stopping the container) hands the shard over first; no
//! acknowledged write lost in the drain, none but the last second's before a kill or a stop
//! (asynchronous replication: [`REPLICATION_WINDOW`]). On two nodes, a drain of the node of a
//! shard without replicas ends, the shard moved by a surge and one handover, nothing lost. And the
//! operator installed as a user installs it (`helm install`, its image built from this
//! build's binary, two replicas on the real nodes, in-cluster config, webhooks through its
//! Service): the leading replica's Pod deleted in the middle of a roll, another replica (the
//! standby, or the Deployment's new Pod) takes the Lease and finishes the roll with one
//! failover per shard and no write lost.

use std::time::{Duration, Instant};

use harness::eventually;

/// Valkey replicates asynchronously: what a primary acknowledged in the moment before it was
/// killed (or stopped) may not have reached its replica. On this shared 2-core machine, with
/// three kubelets and another test running, that lag reached a few hundred milliseconds (32
/// writes, one run); nothing acknowledged earlier may be lost.
const REPLICATION_WINDOW: Duration = Duration::from_secs(1);
use harness::k8s::{ClusterWatch, IMAGES, Product, ProductOptions, converged};
use serde_json::Value;

const NAMESPACE: &str = "shop";

/// Where the chart installs the operator.
const OPERATOR_NAMESPACE: &str = harness::k8s::chart::NAMESPACE;

/// The namespace, the config on 9.0.0 and a cluster of `shards` × 1 on it.
fn fleet(cluster: &str, shards: u16) -> String {
    fleet_of(cluster, shards, 1)
}

/// The namespace, the config on 9.0.0 and a cluster of `shards` × `replicas` on it.
fn fleet_of(cluster: &str, shards: u16, replicas: u16) -> String {
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: shop}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {{name: standard}}
spec: {{imageRef: valkey-9-0-0, valkey: {{save: ""}}}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {{name: {cluster}, namespace: shop}}
spec: {{configRef: standard, shards: {shards}, replicasPerShard: {replicas}}}
"#
    )
}

/// A bare Pod of the Valkey image, as the operator's would start. On the test kubelet (the
/// host's network) it binds every address, so it listens on a port no other Valkey of the
/// suite uses: tests run two at a time, and 6379 is taken on some loopback address then.
const PROBE_POD: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Pod
metadata: {name: start-latency, namespace: shop}
spec:
  automountServiceAccountToken: false
  restartPolicy: Never
  securityContext: {runAsUser: 999, runAsGroup: 999, runAsNonRoot: true}
  containers:
  - name: valkey
    image: valkey/valkey:9.0.0
    command: [valkey-server, --save, "", --port, "6999"]
    readinessProbe: {tcpSocket: {port: 6999}, periodSeconds: 1}
"#;

/// From `kubectl apply` of a bare Valkey Pod to its `Ready` condition.
async fn pod_start_latency(product: &Product) -> Duration {
    let created = Instant::now();
    product.apply(PROBE_POD);
    eventually(
        "the probe Pod turns Ready",
        Duration::from_secs(60),
        async || {
            let pod = pod(product, "start-latency");
            let ready = pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            ready.then_some(())
        },
    )
    .await;
    let latency = created.elapsed();
    product.kubectl(&[
        "delete",
        "pod",
        "-n",
        NAMESPACE,
        "start-latency",
        "--wait=false",
    ]);
    latency
}

/// The guide on `carts` (3 shards × 1 replica): created until Active, then rolled from 9.0.0
/// to 9.1.2 under a stock cluster client: none lost, one failover per shard, never below one
/// replica, `Active` throughout. Prints the figures, labelled with `nodes`.
async fn create_and_roll(product: &Product, nodes: &str) {
    product.apply(IMAGES);
    let applied = Instant::now();
    product.apply(&fleet("carts", 3));
    eventually("carts comes up", Duration::from_secs(180), async || {
        let cluster = product.cluster(NAMESPACE, "carts");
        if converged(&cluster, "9.0.0") {
            Ok(())
        } else {
            Err(format!(
                "{cluster:#}\n{}",
                product.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "wide"])
            ))
        }
    })
    .await;
    println!(
        "{nodes}: carts (3 x 1) Active after {:.1?}",
        applied.elapsed()
    );

    let watch = ClusterWatch::start(product, NAMESPACE, "carts").await;
    let patched = Instant::now();
    product.patch(
        "valkeyconfig/standard",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    eventually("carts rolls", Duration::from_secs(300), async || {
        let cluster: Value = product.cluster(NAMESPACE, "carts");
        assert_eq!(
            cluster["status"]["state"], "Active",
            "state left Active: {cluster}"
        );
        converged(&cluster, "9.1.2").then_some(())
    })
    .await;
    let rolled = patched.elapsed();
    let report = watch.finish(product).await;
    report.assert_shards(3, 1, 1);
    product.assert_failovers(NAMESPACE, "carts", 3).await;
    println!(
        "{nodes}: carts rolled to 9.1.2 in {rolled:.1?}; {} acknowledged writes, none lost; \
         longest write gap {:.2?}",
        report.log.ack_times.len(),
        report.longest_write_gap()
    );
}

/// A Pod of the tenant's namespace as the API shows it.
fn pod(product: &Product, name: &str) -> Value {
    pod_in(product, NAMESPACE, name)
}

fn pod_in(product: &Product, namespace: &str, name: &str) -> Value {
    harness::k8s::chart::get_json(
        &product.plane,
        &["get", "pod", "-n", namespace, name, "-o", "json"],
    )
}

/// The node a Pod runs on and its container's host pid.
fn container_of<'a>(product: &'a Product, name: &str) -> (&'a testenv::RealNode, u32) {
    product.container(NAMESPACE, name)
}

/// The uid a process runs as, from `/proc/<pid>/status`.
fn uid_of(pid: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

/// The network namespace a process is in (`net:[inode]`).
fn network_namespace(pid: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .map(|link| link.display().to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_guides_cluster_runs_as_containers_on_a_real_node_and_rolls_without_loss() {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a"],
        ..Default::default()
    })
    .await;
    let node = &product.real_nodes()[0];
    let nodes = product.kubectl(&["get", "nodes", "-o", "wide"]);
    assert!(nodes.contains("containerd://"), "{nodes}");
    assert!(nodes.contains(" Ready "), "{nodes}");

    println!(
        "real node: a Valkey Pod Ready {:.2?} after it was created",
        pod_start_latency(&product).await
    );
    create_and_roll(&product, "real node").await;

    // Each Pod a container under this node's containerd: its address on the node's Pod
    // network, its own network namespace, the image's valkey user.
    let pods = harness::k8s::chart::get_json(
        &product.plane,
        &["get", "pods", "-n", NAMESPACE, "-o", "json"],
    );
    let pods = pods["items"].as_array().cloned().unwrap_or_default();
    let pods: Vec<Value> = pods
        .into_iter()
        .filter(|pod| pod["metadata"]["name"] != "start-latency")
        .collect();
    assert_eq!(pods.len(), 6, "{pods:#?}");
    let host_namespace = network_namespace("self");
    let prefix = node.address().trim_end_matches(".1").to_string() + ".";
    let mut namespaces = std::collections::BTreeSet::new();
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap();
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
        assert!(
            ip.starts_with(&prefix),
            "{name} at {ip}, not on {}",
            node.pod_subnet()
        );
        let (_, pid) = container_of(&product, name);
        let pid = pid.to_string();
        assert_eq!(uid_of(&pid), "999", "{name} runs as another user");
        let namespace = network_namespace(&pid);
        assert_ne!(
            namespace, host_namespace,
            "{name} shares the host's network"
        );
        namespaces.insert(namespace);

        // The real kubelet serves logs and exec to the API server.
        let logs = product.kubectl(&["logs", "-n", NAMESPACE, name]);
        assert!(
            logs.contains("Ready to accept connections"),
            "{name}'s log:\n{logs}"
        );
        let version = product.kubectl(&[
            "exec",
            "-n",
            NAMESPACE,
            name,
            "--",
            "valkey-server",
            "--version",
        ]);
        assert!(version.contains("v=9.1.2"), "{version}");

        // A client without credentials gets nothing.
        for command in [&["GET", "k"][..], &["CLUSTER", "NODES"]] {
            let reply =
                harness::valkey::logins::anonymous_reply(&format!("{ip}:6379"), command).await;
            assert!(
                reply.contains("NOAUTH"),
                "{command:?} without credentials on {name}: {reply}"
            );
        }
    }
    assert_eq!(namespaces.len(), 6, "Pods share a network namespace");
}

/// The same guide on the test kubelet, for the figures beside the real node's.
#[tokio::test]
async fn the_same_guide_on_the_test_kubelet_for_comparison() {
    let product = Product::start(None, &[]).await;
    println!(
        "test kubelet: a Valkey Pod Ready {:.2?} after it was created",
        pod_start_latency(&product).await
    );
    create_and_roll(&product, "test kubelet").await;
}

/// Waits until `orders` is whole again on 9.0.0 with none of `gone` among its Pods.
async fn healed(product: &Product, gone: &str, what: &str) {
    eventually(what, Duration::from_secs(180), async || {
        let cluster = product.cluster(NAMESPACE, "orders");
        let pods = product.addresses(NAMESPACE, "orders");
        if converged(&cluster, "9.0.0") && !pods.contains_key(gone) && pods.len() == 2 {
            Ok(())
        } else {
            Err(format!(
                "{cluster:#}\n{}",
                product.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "wide"])
            ))
        }
    })
    .await;
}

// Two workers: `kubectl drain` blocks its thread for seconds while the writer must go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_a_hung_primary_and_a_drained_node_lose_no_replicated_write_on_three_real_nodes() {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a", "b", "c"],
        ..Default::default()
    })
    .await;
    for node in product.real_nodes() {
        println!(
            "{}: kubelet + containerd resident {} MiB",
            node.name(),
            node.resident_kib() / 1024
        );
    }
    product.apply(IMAGES);
    product.apply(&fleet("orders", 1));
    eventually("orders comes up", Duration::from_secs(180), async || {
        converged(&product.cluster(NAMESPACE, "orders"), "9.0.0").then_some(())
    })
    .await;

    // SIGKILL of the primary's container: the replica takes over, the Pod (restartPolicy
    // Never) is replaced.
    let watch = ClusterWatch::start(&product, NAMESPACE, "orders").await;
    let victim = product.primary_of(NAMESPACE, "orders", 0).await;
    let (_, pid) = container_of(&product, &victim);
    let killed = Instant::now();
    let fault = tokio::time::Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -KILL {pid}");
    healed(
        &product,
        &victim,
        "orders heals after its primary's container is killed",
    )
    .await;
    println!(
        "killed primary's shard whole again after {:.1?}",
        killed.elapsed()
    );
    let (report, lost) = watch
        .finish_across_fault(&product, fault, REPLICATION_WINDOW)
        .await;
    report.assert_shards(1, 1, 0);
    println!(
        "SIGKILL: {} acknowledged writes, {lost} lost, all within {REPLICATION_WINDOW:?} before \
         the kill; longest write gap {:.2?}",
        report.log.ack_times.len(),
        report.longest_write_gap()
    );

    // SIGSTOP of the new primary's server: the real kubelet's liveness probe (valkey-cli in
    // the container, on the server's socket) times out three times and kills the container;
    // the Pod fails and the shard is taken over.
    let watch = ClusterWatch::start(&product, NAMESPACE, "orders").await;
    let hung_primary = product.primary_of(NAMESPACE, "orders", 0).await;
    let (_, pid) = container_of(&product, &hung_primary);
    let hung = Instant::now();
    let fault = tokio::time::Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -STOP {pid}");
    eventually(
        "the hung primary killed by the kubelet",
        Duration::from_secs(40),
        // The kubelet's own word (its `Killing` event): the Pod itself may already be gone,
        // retired by the operator once its shard was taken over.
        async || {
            let selector = format!("involvedObject.name={hung_primary},reason=Killing");
            let args = [
                "get",
                "events",
                "-n",
                NAMESPACE,
                "--field-selector",
                &selector,
            ];
            let (read, events) = product.try_kubectl(&[&args[..], &["-o", "name"]].concat(), None);
            (read && !events.trim().is_empty()).then_some(())
        },
    )
    .await;
    let killed = hung.elapsed();
    healed(
        &product,
        &hung_primary,
        "orders heals after its primary hangs",
    )
    .await;
    println!(
        "hung primary killed by its liveness probe {killed:.1?} after SIGSTOP; shard whole \
         again after {:.1?}",
        hung.elapsed()
    );
    let events = product.kubectl(&["get", "events", "-n", NAMESPACE]);
    assert!(
        events.contains("Liveness probe failed"),
        "no liveness failure among the events:\n{events}"
    );
    let (report, lost) = watch
        .finish_across_fault(&product, fault, REPLICATION_WINDOW)
        .await;
    report.assert_shards(1, 1, 0);
    println!(
        "SIGSTOP: {} acknowledged writes, {lost} lost, all within {REPLICATION_WINDOW:?} before \
         the stop; longest write gap {:.2?}",
        report.log.ack_times.len(),
        report.longest_write_gap()
    );

    // `kubectl drain` of the node that holds the primary now.
    let watch = ClusterWatch::start(&product, NAMESPACE, "orders").await;
    let primary = product.primary_of(NAMESPACE, "orders", 0).await;
    let node = pod(&product, &primary)["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let drained = Instant::now();
    drain(&product, &node);
    healed(
        &product,
        &primary,
        "orders whole again off the drained node",
    )
    .await;
    println!(
        "drained {node} (holding the primary) in {:.1?}",
        drained.elapsed()
    );
    let report = watch.finish(&product).await;
    report.assert_shards(1, 1, 1);
    println!(
        "drain: {} acknowledged writes, none lost; longest write gap {:.2?}",
        report.log.ack_times.len(),
        report.longest_write_gap()
    );
    let on_drained = product.kubectl(&[
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "--field-selector",
        &format!("spec.nodeName={node}"),
        "-o",
        "name",
    ]);
    assert!(
        on_drained.trim().is_empty(),
        "Pods left on {node}: {on_drained}"
    );
}

/// `kubectl drain` of the node that holds the one Pod of a shard without replicas: its budget
/// allows no eviction, so the operator moves the shard the way a roll does (a replica joins on
/// the other node, takes the shard over once synced, the drained node's is retired) and the
/// drain ends; one failover, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_a_shard_without_replicas_off_its_node_and_loses_nothing() {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a", "b"],
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(&fleet_of("single", 1, 0));
    eventually("single comes up", Duration::from_secs(180), async || {
        converged(&product.cluster(NAMESPACE, "single"), "9.0.0").then_some(())
    })
    .await;
    let watch = ClusterWatch::start(&product, NAMESPACE, "single").await;
    let primary = product.primary_of(NAMESPACE, "single", 0).await;
    let node = pod(&product, &primary)["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let drained = Instant::now();
    drain(&product, &node);
    eventually(
        "single whole again off the drained node",
        Duration::from_secs(60),
        async || {
            let cluster = product.cluster(NAMESPACE, "single");
            let pods = product.addresses(NAMESPACE, "single");
            (converged(&cluster, "9.0.0") && !pods.contains_key(&primary) && pods.len() == 1)
                .then_some(())
        },
    )
    .await;
    println!(
        "drained {node} (holding a shard without replicas) in {:.1?}",
        drained.elapsed()
    );
    let report = watch.finish(&product).await;
    report.assert_shards(1, 1, 0);
    println!(
        "drain of a shard without replicas: {} acknowledged writes, none lost; longest write \
         gap {:.2?}",
        report.log.ack_times.len(),
        report.longest_write_gap()
    );
}

/// `kubectl drain` of `node`, as a platform team runs it; it must end drained. Blocks its
/// worker thread for as long as the drain waits (the test's runtime has another).
fn drain(product: &Product, node: &str) {
    let output = tokio::task::block_in_place(|| {
        product.kubectl(&[
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=180s",
        ])
    });
    assert!(output.contains("drained"), "{output}");
}

/// A node whose Pod cannot be scheduled (it asks for more CPU than the node has) says so within
/// seconds, in Kubernetes' words: `status.message`, `Degraded` with reason `PodNotStarted`, a
/// Warning event; not "unreachable" for five minutes.
#[tokio::test]
async fn a_pod_that_cannot_be_scheduled_says_why_within_seconds() {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a"],
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    let applied = Instant::now();
    product.apply(
        &harness::k8s::manifest::Manifest::new()
            .namespace(NAMESPACE)
            .config(
                "huge",
                r#"{imageRef: valkey-9-0-0, resources: {cpu: "64", memory: 1Gi}}"#,
            )
            .cluster((NAMESPACE, "greedy"), "huge", 1, 0)
            .yaml(),
    );
    let message = eventually(
        "greedy says why its Pod waits",
        Duration::from_secs(60),
        async || {
            let cluster = product.cluster(NAMESPACE, "greedy");
            let message = cluster["status"]["message"].as_str().unwrap_or_default();
            match message.contains("Insufficient cpu") {
                true => Ok(message.to_string()),
                false => Err(format!("{cluster:#}")),
            }
        },
    )
    .await;
    println!(
        "an unschedulable Pod said why {:.1?} after the cluster was applied: {message}",
        applied.elapsed()
    );
    assert!(message.contains("not schedulable"), "{message}");
    let cluster = product.cluster(NAMESPACE, "greedy");
    assert_eq!(
        harness::k8s::condition_field(&cluster, "Degraded", "reason").as_deref(),
        Some("PodNotStarted")
    );
    let events = product.kubectl(&[
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        "reason=PodNotStarted",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(events.contains("Insufficient cpu"), "events: {events}");
}

/// The operator's Pods (the chart's Deployment), by name.
fn operator_pods(product: &Product) -> Vec<String> {
    product
        .kubectl(&[
            "get",
            "pods",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            "app=valkey-operator",
            "--field-selector=status.phase=Running",
            "-o",
            "name",
        ])
        .lines()
        .map(|line| line.trim_start_matches("pod/").to_string())
        .collect()
}

// Two workers: `kubectl delete` of the leader's Pod waits out its graceful stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_installed_by_helm_finishes_a_roll_after_its_leading_pod_is_deleted() {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a", "b", "c"],
        operator_in_cluster: true,
        ..Default::default()
    })
    .await;

    // Two replicas, each a container of the image as the Dockerfile's user, on the Pod
    // network, talking to the API server as its ServiceAccount.
    let replicas = operator_pods(&product);
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    for name in &replicas {
        let (_, pid) = product.container(OPERATOR_NAMESPACE, name);
        assert_eq!(
            uid_of(&pid.to_string()),
            "65532",
            "{name} runs as another user"
        );
        let ip = pod_in(&product, OPERATOR_NAMESPACE, name)["status"]["podIP"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(ip.starts_with("198.18."), "{name} at {ip}");
    }
    let leader = product.leader().expect("a replica leads");
    assert!(
        replicas.contains(&leader),
        "{leader} leads, not a replica: {replicas:?}"
    );

    // The webhooks answer through the Service: the operator's refusal, not the API server's.
    product.assert_webhook_answers("through the webhook's Service");

    product.apply(IMAGES);
    product.apply(&fleet("carts", 3));
    // Converged, and the primaries moved apart (rule 12) before the roll: a rebalancing move
    // after the watch starts would be counted as the roll's.
    let apart = product
        .primaries_apart(NAMESPACE, "carts", 3, "9.0.0", Duration::from_secs(240))
        .await;
    println!("carts' primaries stand on {apart:?}");

    let watch = ClusterWatch::start(&product, NAMESPACE, "carts").await;
    let patched = Instant::now();
    product.patch(
        "valkeyconfig/standard",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    // Midway: a shard's new nodes on 9.1.2 are Ready while others still run 9.0.0.
    eventually("the roll midway", Duration::from_secs(180), async || {
        let template = "jsonpath={range .items[*]}{.spec.containers[0].image} \
                        {.status.containerStatuses[0].ready}{\"\\n\"}{end}";
        let pods = product.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", template]);
        let new_ready = pods.lines().filter(|p| p.contains("9.1.2 true")).count();
        let old = pods.lines().filter(|p| p.contains("9.0.0")).count();
        (new_ready >= 2 && old >= 2).then_some(()).ok_or(pods)
    })
    .await;
    let deleted = Instant::now();
    tokio::task::block_in_place(|| {
        product.kubectl(&["delete", "pod", "-n", OPERATOR_NAMESPACE, &leader])
    });
    let successor = eventually(
        "another replica leads",
        Duration::from_secs(60),
        async || product.leader().filter(|holder| *holder != leader),
    )
    .await;
    // The standby, or the Pod the Deployment made in the deleted one's place: whichever takes
    // the Lease the leader released first (under load, the newcomer sometimes does).
    assert!(
        successor.starts_with("valkey-operator-"),
        "{successor} leads, not a replica of the operator's Deployment"
    );
    let which = if replicas.contains(&successor) {
        "the standby"
    } else {
        "the deleted one's replacement"
    };
    println!(
        "the leader's Pod deleted {:.1?} into the roll; {successor} ({which}) led {:.1?} later",
        deleted.duration_since(patched),
        deleted.elapsed()
    );
    eventually("carts rolls", Duration::from_secs(300), async || {
        let cluster: Value = product.cluster(NAMESPACE, "carts");
        assert_eq!(
            cluster["status"]["state"], "Active",
            "state left Active: {cluster}"
        );
        converged(&cluster, "9.1.2").then_some(())
    })
    .await;
    let rolled = patched.elapsed();
    let report = watch.finish(&product).await;
    // One failover per shard for the roll, across the change of leader.
    report.assert_shards(3, 1, 1);
    println!(
        "in-cluster operator: carts rolled to 9.1.2 in {rolled:.1?} across a change of leader; \
         {} acknowledged writes, none lost; longest write gap {:.2?}",
        report.log.ack_times.len(),
        report.longest_write_gap()
    );
}
