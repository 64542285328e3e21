//! `kubectl valkey`, end to end through kubectl itself (the plugin found on the PATH) against
//! the operator on a real API server with real Valkey:
//! - `status` shows a cluster's nodes by shard with their roles and replication lag, asked of
//!   the nodes;
//! - `fleet` (table and `-o json`) shows each config's clusters and where they stand;
//! - `plan` of a config file says which clusters roll and which change live, after a server
//!   dry run that changes nothing;
//! - `hold` keeps one cluster on 9.0.0 while the rest of its config rolls to 9.1.2, the config
//!   counts it `held`, and `release` lets it roll; a hold put on in the middle of a shard stops
//!   the roll at its next step, and on release it finishes with nothing lost;
//! - `replace` of a primary's node under a stock cluster client: one failover, nothing lost;
//! - `pause` and `resume` write the config's annotation; `rotate-credentials` starts a
//!   rotation;
//! - `report` writes a bundle with each node's words in it and no secret value anywhere;
//! - `switchover` of a shard under a stock cluster client: one failover, nothing lost, carried
//!   out once; a config with a closed maintenance window rolls nothing, shows (and admission's
//!   answer says) when the window opens, and once it opens a supervised roll surges the replica and waits for a person's
//!   `switchover`, which is the roll's one failover.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product, condition_field, converged};
use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;
use valkey_operator::api::annotations::{ROLLOUT_PAUSED, ROTATE_CREDENTIALS};

const NAMESPACE: &str = "plugin";

static FLEET: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("plugin")
        .config("shared", "{imageRef: valkey-9-0-0}")
        .cluster(("plugin", "alpha"), "shared", 1, 1)
        .cluster(("plugin", "beta"), "shared", 1, 1)
        .yaml()
});

fn plugin(product: &Product, args: &[&str]) -> String {
    let (ok, said) = product.plugin(args);
    assert!(ok, "kubectl valkey {args:?} failed:\n{said}");
    said
}

/// `kubectl valkey fleet shared -o json`: the config's view.
fn fleet_json(product: &Product) -> Value {
    let said = plugin(product, &["fleet", "shared", "-o", "json"]);
    let views: Value = serde_json::from_str(&said).unwrap_or_else(|e| panic!("{e}: {said}"));
    views[0].clone()
}

fn standing_of(view: &Value, cluster: &str) -> String {
    let clusters = view["clusters"].as_array().cloned().unwrap_or_default();
    let found = clusters.iter().find(|c| c["name"] == cluster);
    found.map_or(String::new(), |c| {
        c["standing"].as_str().unwrap_or("").into()
    })
}

#[tokio::test]
async fn the_plugin_shows_holds_replaces_and_reports_by_name() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&FLEET);
    let both = [(NAMESPACE, "alpha"), (NAMESPACE, "beta")];
    product
        .wait_converged(&both, "9.0.0", Duration::from_secs(180))
        .await;

    // status: one screen, the nodes asked for their replication.
    let screen = plugin(&product, &["status", "alpha", "-n", NAMESPACE]);
    assert!(
        screen.contains("valkeycluster plugin/alpha: Active"),
        "{screen}"
    );
    assert!(
        screen.contains("primary") && screen.contains("replica"),
        "{screen}"
    );
    assert!(screen.contains(" B"), "a replica's lag in bytes: {screen}");
    assert!(!screen.contains("not asked"), "{screen}");
    let (ok, said) = product.plugin(&["status", "nowhere", "-n", NAMESPACE]);
    assert!(
        !ok && said.contains("ValkeyCluster nowhere not found"),
        "{said}"
    );

    // fleet: both clusters under their config, up to date.
    let table = plugin(&product, &["fleet"]);
    assert!(
        table.contains("shared") && table.contains("alpha"),
        "{table}"
    );
    let view = fleet_json(&product);
    assert_eq!(standing_of(&view, "alpha"), "upToDate", "{view}");
    assert_eq!(standing_of(&view, "beta"), "upToDate", "{view}");

    // plan: the image change rolls both clusters, a live setting rolls none, after the
    // server's dry run (which changes nothing).
    let folder = tempfile::tempdir().unwrap();
    let change = |spec: &str| {
        let path = folder.path().join("change.yaml");
        let yaml = format!(
            "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyConfig\nmetadata: {{name: shared}}\nspec: {spec}\n"
        );
        std::fs::write(&path, yaml).unwrap();
        path.to_string_lossy().to_string()
    };
    let rolls = plugin(&product, &["plan", &change("{imageRef: valkey-9-1-2}")]);
    assert!(rolls.contains("admitted (server dry run)"), "{rolls}");
    for cluster in ["alpha", "beta"] {
        let row = rolls
            .lines()
            .find(|l| l.contains(cluster))
            .unwrap_or_default();
        let effect = row.split_whitespace().nth(3);
        assert_eq!(effect, Some("rolls"), "{cluster}: {rolls}");
        assert!(
            row.contains("image valkey-9-0-0 → valkey-9-1-2"),
            "{cluster}: {rolls}"
        );
    }
    let live = plugin(
        &product,
        &[
            "plan",
            &change("{imageRef: valkey-9-0-0, valkey: {maxmemory-policy: allkeys-lru}}"),
        ],
    );
    assert_eq!(
        live.lines()
            .filter(|l| l.split_whitespace().nth(3) == Some("live"))
            .count(),
        2,
        "{live}"
    );
    let config = product.kubectl(&["get", "valkeyconfig", "shared", "-o", "json"]);
    let config: Value = serde_json::from_str(&config).unwrap();
    assert_eq!(
        config["spec"]["imageRef"], "valkey-9-0-0",
        "a plan changes nothing"
    );

    // hold: beta stays on 9.0.0 while alpha rolls; the config counts it held.
    let said = plugin(&product, &["hold", "beta", "-n", NAMESPACE, "--for", "2h"]);
    assert!(said.contains("held on its revision until"), "{said}");
    product.patch(
        "valkeyconfig/shared",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    product
        .wait_converged(&[(NAMESPACE, "alpha")], "9.1.2", Duration::from_secs(180))
        .await;
    let held = eventually(
        "the config to count beta held",
        Duration::from_secs(30),
        async || {
            let view = fleet_json(&product);
            let counted = view["status"]["held"] == 1 && view["status"]["upToDate"] == 1;
            (counted && standing_of(&view, "beta") == "held").then_some(view)
        },
    )
    .await;
    assert_eq!(held["status"]["upToDate"], 1, "{held}");
    let beta = product.cluster(NAMESPACE, "beta");
    assert_eq!(beta["status"]["version"], "9.0.0", "{beta}");
    let progressing = condition_field(&beta, "Progressing", "message");
    assert!(
        progressing
            .as_deref()
            .unwrap_or("")
            .contains("rollout-hold"),
        "{progressing:?}"
    );
    plugin(&product, &["release", "beta", "-n", NAMESPACE]);
    product
        .wait_converged(&[(NAMESPACE, "beta")], "9.1.2", Duration::from_secs(180))
        .await;

    // replace: alpha's primary's node, under a stock cluster client.
    let primary = product.primary_of(NAMESPACE, "alpha", 0).await;
    let watch = ClusterWatch::start(&product, NAMESPACE, "alpha").await;
    let started = Instant::now();
    let said = plugin(&product, &["replace", &primary, "-n", NAMESPACE]);
    assert!(said.contains("will be replaced"), "{said}");
    eventually(
        "the primary's node replaced",
        Duration::from_secs(120),
        async || {
            let cluster = product.cluster(NAMESPACE, "alpha");
            let nodes = product.node_ids(NAMESPACE, "alpha");
            (!nodes.contains_key(&primary) && converged(&cluster, "9.1.2")).then_some(())
        },
    )
    .await;
    let replaced_in = started.elapsed();
    let report = watch.finish(&product).await;
    report.assert_shards(1, 1, 1);
    println!(
        "plugin | replace of a primary's node | done in {:.1} s | acked {} | lost 0 | longest write gap {:.3} s",
        replaced_in.as_secs_f64(),
        report.log.acked,
        report.longest_write_gap().as_secs_f64()
    );

    // pause and resume: the config's annotation.
    plugin(&product, &["pause", "shared"]);
    let config = product.kubectl(&["get", "valkeyconfig", "shared", "-o", "json"]);
    let config: Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["metadata"]["annotations"][ROLLOUT_PAUSED], "true");
    plugin(&product, &["resume", "shared"]);
    let config = product.kubectl(&["get", "valkeyconfig", "shared", "-o", "json"]);
    let config: Value = serde_json::from_str(&config).unwrap();
    assert!(
        config["metadata"]["annotations"][ROLLOUT_PAUSED].is_null(),
        "{config}"
    );

    // report: the nodes' own words, and no secret anywhere.
    let out = folder.path().join("bundle");
    let out_arg = out.to_string_lossy().to_string();
    plugin(
        &product,
        &["report", "alpha", "-n", NAMESPACE, "--out", &out_arg],
    );
    // The users file the team's Secret holds, and the passwords the operator's private one.
    let private = valkey_operator::credentials::private_secret_name(NAMESPACE, "alpha");
    let mut values: Vec<String> = Vec::new();
    for (name, namespace) in [
        ("alpha-credentials", NAMESPACE),
        (private.as_str(), harness::k8s::chart::NAMESPACE),
    ] {
        let secret = product.kubectl(&["get", "secret", name, "-n", namespace, "-o", "json"]);
        let secret: Secret = serde_json::from_str(&secret).unwrap();
        values.extend(
            (secret.data.unwrap_or_default().into_values())
                .map(|value| String::from_utf8_lossy(&value.0).into_owned()),
        );
    }
    assert!(
        values.len() >= 3,
        "the users file and the operator's passwords"
    );
    let mut node_files = 0;
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for value in &values {
            for line in value.lines().filter(|l| l.trim().len() >= 8) {
                assert!(
                    !text.contains(line.trim()),
                    "{} holds a secret value",
                    path.display()
                );
            }
        }
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("node-")
        {
            assert!(
                text.contains("# CLUSTER NODES") && text.contains("redis_version"),
                "{text}"
            );
            node_files += 1;
        }
    }
    assert_eq!(node_files, 2, "a file per node");

    // rotate-credentials: the operator takes the request (and removes the annotation).
    plugin(&product, &["rotate-credentials", "alpha", "-n", NAMESPACE]);
    eventually(
        "the rotation to start",
        Duration::from_secs(60),
        async || {
            let secret = product.kubectl(&[
                "get",
                "secret",
                "alpha-credentials",
                "-n",
                NAMESPACE,
                "-o",
                "json",
            ]);
            let secret: Value = serde_json::from_str(&secret).ok()?;
            secret["metadata"]["annotations"][ROTATE_CREDENTIALS]
                .is_null()
                .then_some(())
        },
    )
    .await;
}

const OPS_NAMESPACE: &str = "plugin-ops";

/// A namespace, a config whose rollout is supervised with one daily window of an hour opening
/// at `start` (UTC), and a 1 × 1 cluster on it.
fn supervised_fleet(start: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {OPS_NAMESPACE}}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {{name: supervised}}
spec:
  imageRef: valkey-9-0-0
  rollout:
    primaryUpdate: Supervised
    maintenanceWindows:
      - start: "{start}"
        durationMinutes: 60
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {{name: gamma, namespace: {OPS_NAMESPACE}}}
spec: {{configRef: supervised, shards: 1, replicasPerShard: 1}}
"#
    )
}

fn progressing(product: &Product) -> String {
    let cluster = product.cluster(OPS_NAMESPACE, "gamma");
    condition_field(&cluster, "Progressing", "message").unwrap_or_default()
}

/// `kubectl valkey switchover` under a stock cluster client: the shard's primary changes once,
/// nothing acknowledged is lost. Returns the time it took.
async fn switch_over(product: &Product, version: &str) -> Duration {
    let before = product.primary_of(OPS_NAMESPACE, "gamma", 0).await;
    let watch = ClusterWatch::start(product, OPS_NAMESPACE, "gamma").await;
    let started = Instant::now();
    let said = plugin(
        product,
        &["switchover", "gamma", "--shard", "0", "-n", OPS_NAMESPACE],
    );
    assert!(said.contains("switchover of shard 0"), "{said}");
    eventually("the switchover", Duration::from_secs(90), async || {
        let cluster = product.cluster(OPS_NAMESPACE, "gamma");
        let now = product.primary_of(OPS_NAMESPACE, "gamma", 0).await;
        (now != before && converged(&cluster, version)).then_some(())
    })
    .await;
    let took = started.elapsed();
    let report = watch.finish(product).await;
    report.assert_shards(1, 1, 1);
    println!(
        "plugin | switchover of shard 0 ({version}) | done in {:.1} s | acked {} | lost 0 | longest write gap {:.3} s",
        took.as_secs_f64(),
        report.log.acked,
        report.longest_write_gap().as_secs_f64()
    );
    took
}

#[tokio::test]
async fn a_switchover_a_maintenance_window_and_a_supervised_roll_by_name() {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    // A daily window that opens two hours from now: closed for the whole test.
    let in_two_hours = Timestamp::now() + SignedDuration::from_hours(2);
    product.apply(&supervised_fleet(
        &in_two_hours.strftime("%H:%M").to_string(),
    ));
    product
        .wait_converged(
            &[(OPS_NAMESPACE, "gamma")],
            "9.0.0",
            Duration::from_secs(180),
        )
        .await;

    // The new config's columns follow its cluster (the operator started moments ago), and
    // it says when its window opens; `fleet` shows it.
    let converged_at = Instant::now();
    let next = eventually(
        "the config's columns",
        Duration::from_secs(10),
        async || {
            let config = product.kubectl(&["get", "valkeyconfig", "supervised", "-o", "json"]);
            let config: Value = serde_json::from_str(&config).ok()?;
            let status = &config["status"];
            let counted = status["clusters"] == 1 && status["upToDate"] == 1;
            let next = status["nextWindow"].as_str().map(String::from);
            next.filter(|_| counted)
        },
    )
    .await;
    let lag = converged_at.elapsed();
    println!(
        "plugin | a new config's fleet columns after its cluster converged | {:.1} s",
        lag.as_secs_f64()
    );
    assert!(lag <= Duration::from_secs(4), "the columns lagged {lag:?}");
    let opens: Timestamp = next.parse().unwrap();
    let ahead = opens.duration_since(Timestamp::now());
    assert!(
        ahead > SignedDuration::from_mins(118) && ahead <= SignedDuration::from_mins(120),
        "next window {next}"
    );
    let table = plugin(&product, &["fleet", "supervised"]);
    assert!(
        table.contains("NEXT-WINDOW") && table.contains(&next),
        "{table}"
    );

    // A switchover asked for by name; a shard the cluster does not have is refused.
    switch_over(&product, "9.0.0").await;
    let cluster = product.cluster(OPS_NAMESPACE, "gamma");
    assert!(
        cluster["status"]["roll"]["switchover"].is_string(),
        "the request is remembered: {}",
        cluster["status"]["roll"]
    );
    let (ok, said) = product.plugin(&["switchover", "gamma", "--shard", "3", "-n", OPS_NAMESPACE]);
    assert!(!ok && said.contains("has shards 0 to 0"), "{said}");
    let (ok, refused) = product.try_kubectl(
        &[
            "annotate",
            "valkeycluster",
            "gamma",
            "-n",
            OPS_NAMESPACE,
            "--overwrite",
            "valkey.gomomento.com/switchover=shard one",
        ],
        None,
    );
    assert!(!ok && refused.contains("expected JSON like"), "{refused}");

    // Outside the window a change rolls nothing, and admission says when it will start.
    let said = product.patch(
        "valkeyconfig/supervised",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    assert!(
        said.contains("ValkeyConfig supervised's maintenance windows are closed now: plugin-ops/gamma start rolling when the next opens, at "),
        "{said}"
    );
    eventually(
        "the roll waits for the window",
        Duration::from_secs(30),
        async || {
            progressing(&product)
                .contains("outside the rollout's maintenance windows")
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let cluster = product.cluster(OPS_NAMESPACE, "gamma");
    assert_eq!(
        cluster["status"]["outdatedNodes"], 2,
        "{}",
        cluster["status"]
    );
    assert_eq!(
        product.node_ids(OPS_NAMESPACE, "gamma").len(),
        2,
        "nothing joined"
    );

    // The window opened (a minute ago): the roll surges the replica, then waits for a person.
    let opened = Timestamp::now() - SignedDuration::from_mins(1);
    let start = opened.strftime("%H:%M").to_string();
    let window = format!(
        r#"{{"spec": {{"rollout": {{"maintenanceWindows": [{{"start": "{start}", "durationMinutes": 120}}]}}}}}}"#
    );
    product.patch("valkeyconfig/supervised", None, &window);
    eventually(
        "the supervised wait",
        Duration::from_secs(120),
        async || progressing(&product).contains("supervised").then_some(()),
    )
    .await;
    let primary = product.primary_of(OPS_NAMESPACE, "gamma", 0).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        product.primary_of(OPS_NAMESPACE, "gamma", 0).await,
        primary,
        "a supervised roll fails nothing over by itself"
    );
    // The switchover is the roll's one failover; the roll then finishes.
    switch_over(&product, "9.1.2").await;
}

/// `(name, shard, version)` of each ValkeyNode of a cluster, sorted.
fn nodes_of(product: &Product, namespace: &str, cluster: &str) -> Vec<(String, i64, String)> {
    let mut nodes: Vec<(String, i64, String)> = product
        .valkey_nodes(namespace, cluster)
        .iter()
        .map(|node| {
            (
                node["metadata"]["name"].as_str().unwrap_or("").to_string(),
                node["spec"]["shard"].as_i64().unwrap_or(-1),
                node["spec"]["version"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    nodes.sort();
    nodes
}

fn signal(pid: u32, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(sent, "kill {signal} {pid}");
}

/// A hold put on in the middle of a shard (its first new node joining, its old ones serving):
/// the roll takes no step more, the cluster serves on mixed versions, and on release it
/// finishes, nothing lost.
#[tokio::test]
async fn a_hold_in_the_middle_of_a_shard_stops_the_roll_at_its_next_step() {
    const HELD: &str = "plugin-hold";
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(
        &Manifest::new()
            .namespace(HELD)
            .config(
                "midshard",
                r#"{imageRef: valkey-9-0-0, valkey: {save: ""}}"#,
            )
            .cluster((HELD, "orders"), "midshard", 2, 1)
            .yaml(),
    );
    product
        .wait_converged(&[(HELD, "orders")], "9.0.0", Duration::from_secs(180))
        .await;
    let watch = ClusterWatch::start(&product, HELD, "orders").await;
    product.patch(
        "valkeyconfig/midshard",
        None,
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    );
    // The first node of the new revision is paused as its server starts, so the hold lands
    // between its shard's replace and its retire whatever the machine's pace.
    let (joiner, pid) = eventually(
        "the first node of 9.1.2 running",
        Duration::from_secs(60),
        async || {
            let nodes = nodes_of(&product, HELD, "orders");
            let joiner = nodes.iter().find(|(_, _, version)| version == "9.1.2");
            let (name, ..) = joiner.ok_or_else(|| format!("{nodes:?}"))?;
            let process = product.kubelet().pod_process(HELD, name);
            let pid = process.and_then(|p| p.pid).ok_or("no server yet")?;
            Ok::<_, String>((name.clone(), pid))
        },
    )
    .await;
    signal(pid, "-STOP");
    plugin(&product, &["hold", "orders", "-n", HELD]);
    signal(pid, "-CONT");

    // Whatever step was under way ends; then nothing moves for 10 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = nodes_of(&product, HELD, "orders");
    let shard_of_joiner = held.iter().find(|(name, ..)| *name == joiner).map(|n| n.1);
    let old_in_its_shard = held
        .iter()
        .filter(|(_, shard, version)| Some(*shard) == shard_of_joiner && version == "9.0.0")
        .count();
    assert!(
        old_in_its_shard > 0,
        "the joiner's shard finished before the hold: {held:?}"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        nodes_of(&product, HELD, "orders"),
        held,
        "the roll took a step while held"
    );
    let cluster = product.cluster(HELD, "orders");
    let progressing = condition_field(&cluster, "Progressing", "message").unwrap_or_default();
    assert!(progressing.contains("rollout-hold"), "{progressing}");

    plugin(&product, &["release", "orders", "-n", HELD]);
    product
        .wait_converged(&[(HELD, "orders")], "9.1.2", Duration::from_secs(180))
        .await;
    let report = watch.finish(&product).await;
    report.assert_shards(2, 1, 1);
    println!(
        "held mid-shard with {old_in_its_shard} old node(s) in the joiner's shard for 13 s; \
         {} acknowledged writes, none lost",
        report.log.acked
    );
}
