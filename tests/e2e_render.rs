//! Rendered objects against the real API server and the test kubelet: a ValkeyNode and its Pod
//! as the controller renders them become a live cluster-enabled valkey-server on the Pod IP, and
//! deleting the ValkeyCluster removes node, Pod and process through ownerReferences alone.

use std::time::Duration;

use harness::eventually;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use testenv::{ControlPlane, TestKubelet};
use valkey_operator::acl::OPERATOR_USER;
use valkey_operator::api::{
    self, NodeRole, ValkeyCluster, ValkeyImageSpec, ValkeyNode, ZoneSpread,
};
use valkey_operator::controller::build::render::ClusterRender;
use valkey_operator::controller::pass::credentials::new_secret;
use valkey_operator::credentials::{SystemCredentials, secret_name};
use valkey_operator::fleet::resolve::{Chain, EffectiveConfig, ResolvedImage};
use valkey_operator::settings::DEFAULT_CLUSTER_DOMAIN;

/// How long the API server, its controllers and the kubelet get for each step.
const WITHIN: Duration = Duration::from_secs(60);

async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in api::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for crd in api::crds() {
        let name = crd.name_any();
        eventually(format!("CRD {name} established"), WITHIN, async || {
            let crd = crds.get(&name).await.ok()?;
            let established = crd
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn a_rendered_node_runs_and_goes_with_its_cluster() {
    let plane = ControlPlane::start().await.expect("control plane");
    let client = plane.client().await.unwrap();
    let kubelet = TestKubelet::start(client.clone(), Default::default())
        .await
        .unwrap();
    install_crds(&client).await;
    let namespace = "team-a";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await
        .unwrap();

    let clusters: Api<ValkeyCluster> = Api::namespaced(client.clone(), namespace);
    let cluster: ValkeyCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "valkey.gomomento.com/v1alpha1", "kind": "ValkeyCluster",
        "metadata": {"name": "orders", "namespace": namespace},
        "spec": {"configRef": "standard", "shards": 1, "replicasPerShard": 0},
    }))
    .unwrap();
    let cluster = clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let effective = EffectiveConfig {
        chain: Chain(vec!["standard".into()]),
        image: ResolvedImage {
            name: "valkey-9-1-2".into(),
            spec: ValkeyImageSpec {
                repository: "valkey/valkey".into(),
                tag: "9.1.2".into(),
                version: "9.1.2".into(),
            },
        },
        resources: Default::default(),
        valkey: [
            ("maxmemory".to_string(), "64mb".to_string()),
            ("save".to_string(), String::new()),
        ]
        .into(),
        acl: Vec::new(),
    };
    let render = ClusterRender {
        cluster: &cluster,
        effective: &effective,
        default_zone_spread: ZoneSpread::BestEffort,
        cluster_domain: DEFAULT_CLUSTER_DOMAIN,
    };

    // The credentials Secret the Pod's auth.conf comes from, as the controller creates it.
    let credentials = SystemCredentials::fresh().unwrap();
    let secret = new_secret(&render, &secret_name("orders"), namespace, &credentials);
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    Api::<Service>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &render.headless_service())
        .await
        .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &render.disruption_budget(1))
        .await
        .unwrap();
    let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), namespace);
    let node = nodes
        .create(&PostParams::default(), &render.node("orders-0-a", 0))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = render.pod(&node, NodeRole::Primary);
    eventually("the Pod to be accepted", WITHIN, async || {
        pods.create(&PostParams::default(), &pod).await
    })
    .await;

    let ip = eventually("the Pod to be Ready", WITHIN, async || {
        let pod = pods.get("orders-0-a").await.ok()?;
        let status = pod.status?;
        let ready = status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(status.pod_ip?)
    })
    .await;
    // Closed to a client without credentials; open to the operator's user.
    let anonymous = redis::Client::open(format!("redis://{ip}:6379")).unwrap();
    let mut anonymous = anonymous.get_multiplexed_async_connection().await.unwrap();
    let refused: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut anonymous).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().to_uppercase().contains("NOAUTH")),
        "{refused:?}"
    );
    let password = &credentials.current.operator;
    let connection =
        redis::Client::open(format!("redis://{OPERATOR_USER}:{password}@{ip}:6379")).unwrap();
    let mut connection = connection.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(info.contains("valkey_version:9.1.2"), "{info}");
    let cluster_info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(
        cluster_info.contains("cluster_known_nodes:1"),
        "{cluster_info}"
    );
    let maxmemory: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(maxmemory[1], (64 * 1024 * 1024).to_string());
    let announced: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("cluster-announce-ip")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(announced[1], ip);

    // The disruption controller counts the Pod of a ValkeyNode (it could not with
    // maxUnavailable: a ValkeyNode has no scale subresource), and a shard without replicas
    // allows no eviction.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    eventually("the budget to count the Pod", WITHIN, async || {
        let status = budgets.get("orders").await.ok()?.status?;
        let counted = status.expected_pods == 1 && status.current_healthy == 1;
        (counted && status.disruptions_allowed == 0).then_some(())
    })
    .await;

    // Deleting the cluster cascades through ownerReferences: node, Pod, process.
    clusters
        .delete("orders", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually("the node, Pod and process to go", WITHIN, async || {
        let gone = nodes.get_opt("orders-0-a").await.ok()?.is_none()
            && pods.get_opt("orders-0-a").await.ok()?.is_none()
            && kubelet.pod_process(namespace, "orders-0-a").is_none();
        gone.then_some(())
    })
    .await;
}
