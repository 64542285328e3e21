//! The NetworkPolicy the operator writes for each cluster, proven by packets: real nodes whose
//! network plugin enforces NetworkPolicies (kube-router's firewall on each, `testenv::Firewall`),
//! and TCP connections made from inside Pods' network namespaces, as a tenant's Pod would make
//! them, to Pods on its own node and on the other.
//!
//! The cluster's policy: the bus port only from the cluster's own Pods; the client port from the
//! cluster's namespace, the operator and the peers of `spec.network.allowedClients`. The chart's
//! policy for the operator: its HTTPS port from `networkPolicy.ingressFrom`, its probes' port
//! from no Pod. The node itself (the kubelet, the API server, an operator on the host) is always
//! let in, as kube-router lets in traffic from its own node. And Momento's worked policy
//! (`security/networking.md`), applied as printed beside the operator's, lets in what it says.

use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Duration;

use harness::eventually;
use harness::k8s::chart::{CHART, NAMESPACE, RELEASE};
use harness::k8s::manifest::{MOMENTO_NETWORK_POLICY, Manifest};
use harness::k8s::{IMAGES, Product, ProductOptions};
use valkey_operator::api::labels;

const CLIENT_PORT: u16 = 6379;
const BUS_PORT: u16 = 16379;

/// Two teams: team-a runs `orders` (a primary and its replica) and `cache` beside it; team-b
/// runs `search`.
static FLEET: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("team-a")
        .namespace("team-b")
        .config("netpol", r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#)
        .cluster(("team-a", "orders"), "netpol", 1, 1)
        .cluster(("team-a", "cache"), "netpol", 1, 0)
        .cluster(("team-b", "search"), "netpol", 1, 0)
        .yaml()
});

/// A cluster's Pods: (name, address), the primary's first once its role label says so.
fn pods(product: &Product, namespace: &str, cluster: &str) -> Vec<(String, String)> {
    let primary = primary_of(product, namespace, cluster);
    let list = product.pods_labelled(namespace, &format!("{}={cluster}", labels::CLUSTER));
    let mut pods: Vec<(bool, String, String)> = list
        .iter()
        .map(|pod| {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            let address = pod["status"]["podIP"].as_str().unwrap_or_default();
            (
                Some(name) != primary.as_deref(),
                name.into(),
                address.into(),
            )
        })
        .collect();
    pods.sort();
    pods.into_iter()
        .map(|(_, name, address)| (name, address))
        .collect()
}

/// The Pod the operator labels its cluster's primary, if one is.
fn primary_of(product: &Product, namespace: &str, cluster: &str) -> Option<String> {
    let selector = format!("{}={cluster},{}=primary", labels::CLUSTER, labels::ROLE);
    let list = product.pods_labelled(namespace, &selector);
    match &list[..] {
        [one] => one["metadata"]["name"].as_str().map(String::from),
        _ => None,
    }
}

/// Whether Pod `from` (in `namespace`) connects to `address:port`.
fn reaches(product: &Product, (namespace, from): (&str, &str), address: &str, port: u16) -> bool {
    let (_, pid) = product.container(namespace, from);
    let to: SocketAddr = format!("{address}:{port}").parse().unwrap();
    testenv::connects_from(pid, to, Duration::from_secs(2)).unwrap()
}

/// Waits until Pod `from` reaches `address:port` (`expected`) or not, as the firewall catches
/// up with a policy; then says so once more, to show it holds.
async fn settles(
    product: &Product,
    from: (&str, &str),
    (address, port): (&str, u16),
    expected: bool,
) {
    let what = format!(
        "{}/{} {} {address}:{port}",
        from.0,
        from.1,
        if expected {
            "reaches"
        } else {
            "does not reach"
        }
    );
    eventually(&what, Duration::from_secs(30), async || {
        match reaches(product, from, address, port) == expected {
            true => Ok(()),
            false => Err("not yet".to_string()),
        }
    })
    .await;
    assert_eq!(reaches(product, from, address, port), expected, "{what}");
}

#[tokio::test]
async fn the_clusters_policy_holds_by_packets_on_nodes_that_enforce_it() {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a", "b"],
        enforce_network_policies: true,
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(&FLEET);
    let clusters = [
        ("team-a", "orders"),
        ("team-a", "cache"),
        ("team-b", "search"),
    ];
    // Created, joined and Active through the firewall: the members reach each other's bus.
    product
        .wait_converged(&clusters, "9.1.2", Duration::from_secs(300))
        .await;
    let orders = eventually(
        "orders' Pods labelled by role",
        Duration::from_secs(30),
        async || {
            let orders = pods(&product, "team-a", "orders");
            match (&orders[..], primary_of(&product, "team-a", "orders")) {
                ([(first, _), _], Some(primary)) if *first == primary => Ok(orders),
                _ => Err(format!("{orders:?}")),
            }
        },
    )
    .await;
    let [(_, primary), (replica, replica_address)] = &orders[..] else {
        panic!("orders should run a primary and a replica: {orders:?}");
    };
    let cache = pods(&product, "team-a", "cache")[0].0.clone();
    let search = pods(&product, "team-b", "search")[0].0.clone();
    let (team_a, team_b) = ("team-a", "team-b");
    let search_node = product.container(team_b, &search).0.name();
    assert!(
        orders
            .iter()
            .any(|(name, _)| product.container(team_a, name).0.name() != search_node),
        "search and both of orders' Pods on one node: no packet would cross nodes"
    );

    // The cluster's own replica reaches its primary's bus port and client port.
    settles(&product, (team_a, replica), (primary, BUS_PORT), true).await;
    settles(&product, (team_a, replica), (primary, CLIENT_PORT), true).await;
    // A neighbour in the namespace is a client, not a member.
    settles(&product, (team_a, &cache), (primary, CLIENT_PORT), true).await;
    settles(&product, (team_a, &cache), (primary, BUS_PORT), false).await;
    // Another team reaches neither port of either Pod (one of which is on the other node).
    for address in [primary, replica_address] {
        settles(&product, (team_b, &search), (address, CLIENT_PORT), false).await;
        settles(&product, (team_b, &search), (address, BUS_PORT), false).await;
    }

    // Momento's worked policy, as printed, in team-a: NetworkPolicies add up, and it lets every
    // Valkey Pod of the namespace in on the bus port, so cache (another cluster beside orders)
    // now reaches orders' bus; another team still reaches nothing. Removed, the bus is the
    // members' again.
    product.apply(&MOMENTO_NETWORK_POLICY.replace("namespace: my-app", "namespace: team-a"));
    settles(&product, (team_a, &cache), (primary, BUS_PORT), true).await;
    settles(&product, (team_b, &search), (primary, CLIENT_PORT), false).await;
    settles(&product, (team_b, &search), (primary, BUS_PORT), false).await;
    product.kubectl(&["delete", "networkpolicy", "valkey-ingress", "-n", team_a]);
    settles(&product, (team_a, &cache), (primary, BUS_PORT), false).await;

    // Once `allowedClients` names team-b, its Pods are clients too; the bus stays the members'.
    product.patch(
        "valkeycluster/orders",
        Some("team-a"),
        r#"{"spec": {"network": {"allowedClients": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-b"}}}
        ]}}}"#,
    );
    for address in [primary, replica_address] {
        settles(&product, (team_b, &search), (address, CLIENT_PORT), true).await;
        settles(&product, (team_b, &search), (address, BUS_PORT), false).await;
    }
}

/// The chart's policy for the operator: its HTTPS port open to anyone by default (where the API
/// server calls from differs between clusters); narrowed by `networkPolicy.ingressFrom`, a
/// team's Pod reaches it no more while the API server's webhook calls still do. The probes'
/// port is never open to a Pod; the kubelet probes from the node.
#[tokio::test]
async fn the_operators_port_narrowed_to_the_api_server_refuses_a_teams_pod() {
    let product = Product::start_with(ProductOptions {
        real_nodes: &["a"],
        operator_in_cluster: true,
        enforce_network_policies: true,
        ..Default::default()
    })
    .await;
    product.apply(IMAGES);
    product.apply(
        &Manifest::new()
            .namespace("team-a")
            .config("netpol", r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#)
            .cluster(("team-a", "orders"), "netpol", 1, 0)
            .yaml(),
    );
    product
        .wait_converged(&[("team-a", "orders")], "9.1.2", Duration::from_secs(300))
        .await;
    let team_pod = pods(&product, "team-a", "orders")[0].0.clone();
    let from = ("team-a", team_pod.as_str());
    let operator = product.pods_labelled(NAMESPACE, "app=valkey-operator");
    let operator = operator[0]["status"]["podIP"].as_str().unwrap().to_string();

    settles(&product, from, (&operator, 8443), true).await;
    settles(&product, from, (&operator, 8081), false).await;

    let api_server = product
        .plane
        .server_url()
        .trim_start_matches("https://")
        .rsplit_once(':')
        .map(|(host, _)| host.to_string())
        .unwrap();
    let ingress =
        format!(r#"networkPolicy.ingressFrom=[{{"ipBlock":{{"cidr":"{api_server}/32"}}}}]"#);
    let upgraded = product.helm.must(&[
        "upgrade",
        RELEASE,
        CHART,
        "-n",
        NAMESPACE,
        "--reuse-values",
        "--set-json",
        &ingress,
    ]);
    assert!(upgraded.contains("STATUS: deployed"), "{upgraded}");
    settles(&product, from, (&operator, 8443), false).await;
    settles(&product, from, (&operator, 8081), false).await;

    // The webhook still answers the API server: the operator's own refusal, not a timeout.
    product.assert_webhook_answers("with the operator's port narrowed");
    // And the kubelet's probes still reach both replicas, over a few probe periods.
    for _ in 0..15 {
        let ready = harness::k8s::chart::get_json(
            &product.plane,
            &["get", "deployment", RELEASE, "-n", NAMESPACE, "-o", "json"],
        )["status"]["readyReplicas"]
            .as_u64();
        assert_eq!(ready, Some(2), "the operator's replicas Ready");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
