//! A hostile team on real nodes: alice holds the usual RBAC of team-b's namespace (Secrets,
//! Pods, `pods/exec`, ConfigMaps, ValkeyClusters), impersonated through the real API server, and
//! works from inside her own cluster's container with `kubectl exec`, as a person with those
//! rights would. Each attack is a test of its own; the node's network plugin enforces
//! NetworkPolicies (kube-router's firewall) where the attack is a connection.

use std::sync::LazyLock;
use std::time::Duration;

use harness::eventually;
use harness::k8s::manifest::Manifest;
use harness::k8s::{IMAGES, Product, ProductOptions};
use k8s_openapi::ByteString;
use serde_json::Value;
use valkey_operator::acl::REPLICATION_USER;
use valkey_operator::api::labels;

/// team-a runs `orders`; team-b, alice's, runs `search`.
static FLEET: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("team-a")
        .namespace("team-b")
        .config("shared", r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#)
        .cluster(("team-a", "orders"), "shared", 1, 0)
        .cluster(("team-b", "search"), "shared", 1, 0)
        .yaml()
});

/// Both clusters up on one real node, alice's Role bound.
async fn fleet(enforce_network_policies: bool) -> Product {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a"],
        enforce_network_policies,
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(&FLEET);
    product.apply(&Manifest::new().team_access("team-b", "alice").yaml());
    product
        .wait_converged(
            &[("team-a", "orders"), ("team-b", "search")],
            "9.1.2",
            Duration::from_secs(300),
        )
        .await;
    product
}

/// `kubectl` as alice.
fn as_alice(product: &Product, args: &[&str]) -> (bool, String) {
    let mut all = vec!["--as", "alice"];
    all.extend_from_slice(args);
    product.try_kubectl(&all, None)
}

/// `valkey-cli ARGS` run by alice inside `pod` of `namespace` (`kubectl exec`).
fn cli_in(product: &Product, (namespace, pod): (&str, &str), args: &[&str]) -> (bool, String) {
    let mut all = vec!["exec", "-n", namespace, pod, "--", "valkey-cli"];
    all.extend_from_slice(args);
    as_alice(product, &all)
}

/// A cluster's one Pod: (name, address).
fn only_pod(product: &Product, namespace: &str, cluster: &str) -> (String, String) {
    let selector = format!("{}={cluster}", labels::CLUSTER);
    let list = harness::k8s::chart::get_json(
        &product.plane,
        &[
            "get", "pods", "-n", namespace, "-l", &selector, "-o", "json",
        ],
    );
    let pod: &Value = &list["items"][0];
    (
        pod["metadata"]["name"].as_str().unwrap().to_string(),
        pod["status"]["podIP"].as_str().unwrap().to_string(),
    )
}

/// A Secret's value as text.
fn decode(value: &Value) -> String {
    let bytes: ByteString = serde_json::from_value(value.clone()).unwrap();
    String::from_utf8_lossy(&bytes.0).into_owned()
}

#[tokio::test]
async fn from_inside_her_own_pod_a_team_reaches_no_port_of_another_teams_cluster() {
    let product = fleet(true).await;
    let (search, search_ip) = only_pod(&product, "team-b", "search");
    let (orders, orders_ip) = only_pod(&product, "team-a", "orders");
    let from = ("team-b", search.as_str());

    // Her own cluster answers her (NOAUTH: a connection, and no login).
    let (_, answer) = cli_in(&product, from, &["-h", &search_ip, "-p", "6379", "PING"]);
    assert!(answer.contains("NOAUTH"), "her own node: {answer}");
    // Another team's: no connection on either port, once the firewall has the policies.
    for port in ["6379", "16379"] {
        eventually(
            format!("{orders} refusing alice's connection on {port}"),
            Duration::from_secs(30),
            async || {
                let (_, answer) = cli_in(&product, from, &["-h", &orders_ip, "-p", port, "PING"]);
                match answer.contains("Could not connect") {
                    true => Ok(()),
                    false => Err(answer),
                }
            },
        )
        .await;
    }
    // Nor may she exec into another team's Pod.
    let (allowed, said) = as_alice(
        &product,
        &["exec", "-n", "team-a", &orders, "--", "valkey-cli", "PING"],
    );
    assert!(!allowed && said.contains("Forbidden"), "{said}");
}

#[tokio::test]
async fn with_every_password_she_reads_a_team_announces_no_address_of_its_own() {
    let product = fleet(false).await;
    let (search, search_ip) = only_pod(&product, "team-b", "search");
    let from = ("team-b", search.as_str());
    // The replication user's password is the one her Secret holds in the clear.
    let (read, secret) = as_alice(
        &product,
        &[
            "get",
            "secret",
            "search-credentials",
            "-n",
            "team-b",
            "-o",
            "json",
        ],
    );
    assert!(read, "{secret}");
    let secret: Value = serde_json::from_str(&secret).unwrap();
    let auth_conf = decode(&secret["data"]["auth.conf"]);
    let password = auth_conf
        .lines()
        .find_map(|line| line.strip_prefix("masterauth "))
        .unwrap_or_else(|| panic!("no masterauth in auth.conf:\n{auth_conf}"))
        .to_string();
    let login = [
        "-h",
        &search_ip,
        "--user",
        REPLICATION_USER,
        "--pass",
        &password,
        "--no-auth-warning",
    ];

    // It logs in: the password is real.
    let (_, answer) = cli_in(&product, from, &[&login[..], &["PING"]].concat());
    assert!(
        answer.contains("PONG"),
        "the replication user's PING: {answer}"
    );
    // The first step of capturing a platform password, and two more, are refused.
    for command in [
        &["CONFIG", "SET", "cluster-announce-ip", "198.18.250.1"][..],
        &["ACL", "SETUSER", "mine", "on", ">mine", "+@all"],
        &["CLUSTER", "MEET", "198.18.250.1", "6379"],
    ] {
        let (_, answer) = cli_in(&product, from, &[&login[..], command].concat());
        assert!(answer.contains("NOPERM"), "{command:?}: {answer}");
    }
}
