//! What the plugin reads of one cluster, and how it reaches the cluster's nodes: as the
//! operator does, through the same [`access`] (its private Secret's logins, the identity check
//! of [`NodeClient::open`](crate::valkey::NodeClient::open), TLS with the cluster's CA and each
//! node's name under the operator's own cluster domain), from wherever `kubectl` runs that can
//! reach Pod IPs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, anyhow};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::access;
use crate::api::{ValkeyCluster, ValkeyNode, labels};
use crate::credentials::{SystemCredentials, private_secret_name};
use crate::settings::{CONFIG_MAP, OperatorSettings};
use crate::valkey::{EngineError, Expected, NodeAddress, NodeClient, Reach};

/// How long one call to a node may take.
const CALL: Duration = Duration::from_secs(3);

/// A cluster and the objects it owns, as the API server holds them now.
pub struct ClusterObjects {
    pub cluster: ValkeyCluster,
    pub nodes: Vec<ValkeyNode>,
    pub pods: Vec<Pod>,
    /// Events about the cluster and its nodes and Pods, oldest first.
    pub events: Vec<Event>,
}

impl ClusterObjects {
    /// Reads `name` in `namespace`, its ValkeyNodes and Pods (by the operator's cluster label)
    /// and their events.
    pub async fn read(client: &Client, namespace: &str, name: &str) -> anyhow::Result<Self> {
        let clusters: Api<ValkeyCluster> = Api::namespaced(client.clone(), namespace);
        let cluster = clusters
            .get_opt(name)
            .await
            .with_context(|| format!("reading ValkeyCluster {name}"))?
            .with_context(|| format!("ValkeyCluster {name} not found in namespace {namespace}"))?;
        let selector = ListParams::default().labels(&format!("{}={name}", labels::CLUSTER));
        let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), namespace);
        let mut nodes = nodes
            .list(&selector)
            .await
            .context("listing ValkeyNodes")?
            .items;
        nodes.sort_by_key(|node| (node.spec.shard, node.name_any()));
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let pods = pods.list(&selector).await.context("listing Pods")?.items;
        let mut owned: BTreeSet<String> = nodes.iter().map(ResourceExt::name_any).collect();
        owned.insert(name.to_owned());
        let events: Api<Event> = Api::namespaced(client.clone(), namespace);
        let mut events: Vec<Event> = (events.list(&ListParams::default()).await)
            .context("listing events")?
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object
                    .name
                    .as_ref()
                    .is_some_and(|n| owned.contains(n))
            })
            .collect();
        events.sort_by_key(event_time);
        Ok(Self {
            cluster,
            nodes,
            pods,
            events,
        })
    }

    /// The Pod of `node`, if it has one.
    pub fn pod_of(&self, node: &ValkeyNode) -> Option<&Pod> {
        let name = node
            .status
            .as_ref()?
            .pod_name
            .clone()
            .unwrap_or(node.name_any());
        self.pods.iter().find(|pod| pod.name_any() == name)
    }
}

/// When an event last happened (`lastTimestamp`, else `eventTime`).
pub fn event_time(event: &Event) -> Option<Timestamp> {
    let last = event.last_timestamp.as_ref().map(|t| t.0);
    last.or(event.event_time.as_ref().map(|t| t.0))
}

/// Where the operator is installed and how it is set up, as far as reaching nodes goes.
pub struct Operator {
    /// Its namespace, where it keeps each cluster's passwords and its settings.
    pub namespace: String,
    /// The Kubernetes cluster's DNS domain, when given (`--cluster-domain`); else the
    /// operator's own setting is read.
    pub cluster_domain: Option<String>,
}

impl Operator {
    /// The DNS domain TLS nodes are verified under: the one given, else `clusterDomain` of the
    /// operator's ConfigMap (its settings, read as the operator reads them), else the default.
    pub async fn cluster_domain(&self, client: &Client) -> anyhow::Result<String> {
        if let Some(domain) = &self.cluster_domain {
            return Ok(domain.clone());
        }
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &self.namespace);
        let map = maps.get_opt(CONFIG_MAP).await.with_context(|| {
            format!(
                "reading the operator's settings (ConfigMap {}/{CONFIG_MAP}); --cluster-domain \
                 skips it",
                self.namespace
            )
        })?;
        let data = map.and_then(|m| m.data).unwrap_or_default();
        let settings = OperatorSettings::from_data(&data)
            .with_context(|| format!("the operator's settings in {}", self.namespace))?;
        Ok(settings.cluster_domain)
    }
}

/// The operator's way into one cluster's nodes.
pub struct NodeAccess {
    reach: Reach,
}

impl NodeAccess {
    /// The logins of the cluster's private credentials Secret (in the operator's namespace,
    /// where only the platform reads) and, for a TLS cluster, the trust in its Secret's CA
    /// (each node by its Pod's name under the operator's cluster domain), as
    /// [`access::reach`] builds it for the controller.
    pub async fn of(
        client: &Client,
        operator: &Operator,
        objects: &ClusterObjects,
    ) -> anyhow::Result<Self> {
        let operator_namespace = operator.namespace.as_str();
        let domain = operator.cluster_domain(client).await?;
        let cluster = &objects.cluster;
        let namespace = cluster.namespace().unwrap_or_default();
        let secrets_api: Api<Secret> = Api::namespaced(client.clone(), operator_namespace);
        let name = private_secret_name(&namespace, &cluster.name_any());
        let secret = secrets_api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading Secret {operator_namespace}/{name}"))?
            .with_context(|| {
                format!(
                    "the operator's Secret {operator_namespace}/{name} does not exist (is the \
                     operator installed in {operator_namespace}? --operator-namespace says where)"
                )
            })?;
        let data: BTreeMap<String, Vec<u8>> = (secret.data.unwrap_or_default().into_iter())
            .map(|(key, value)| (key, value.0))
            .collect();
        let logins = SystemCredentials::from_data(&data)
            .map_err(|problem| anyhow!("Secret {name}: {problem}"))?
            .logins();
        let (mut reach, _) =
            access::reach(client, &namespace, cluster, &domain, CALL, &BTreeSet::new())
                .await
                .map_err(|problem| anyhow!(problem))?;
        reach.credentials = logins;
        if let Some(trust) = reach.tls.as_mut() {
            let pods = objects.pods.iter().filter_map(|pod| {
                let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
                Some((ip, pod.metadata.name.as_deref()?))
            });
            trust.know_pods(pods);
        }
        Ok(Self { reach })
    }

    /// A logged-in connection to `node`, checked to be it, at the address its status records.
    pub async fn open(&self, node: &ValkeyNode) -> Result<NodeClient, EngineError> {
        let status = node.status.as_ref();
        let address = status
            .and_then(|s| s.address.as_deref())
            .and_then(NodeAddress::of_pod_ip)
            .ok_or_else(|| EngineError::Reply {
                node: node.name_any(),
                command: "connect".into(),
                reply: "the node has no address yet".into(),
            })?;
        let expected = Expected {
            address,
            id: status.and_then(|s| s.node_id.as_deref()),
            closed: true,
        };
        NodeClient::open(&expected, &self.reach).await
    }
}
