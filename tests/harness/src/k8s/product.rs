//! The whole product on the test control plane, as the end-to-end tests and the fleet benchmark
//! drive it: the chart installed, the operator binary running under the chart's identity with the
//! webhooks pointed at it, the test kubelet running Pods as real valkey-server processes, and
//! `kubectl` for everything a user would type. Plus a watch on one cluster during a change (a
//! cluster-aware writer and an outside sampler) that checks the guide's invariants afterwards.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use testenv::{ControlPlane, ControlPlaneOptions, KubeletOptions, RealNode, TestKubelet};
use valkey_operator::roll::slots::bootstrap_range;

use super::chart::{
    ChartIdentity, Helm, NAMESPACE, Operator, RELEASE, control_plane_with_crds_from, get_json,
    install, kubectl, must, repoint_webhooks,
};
use super::tail;
use crate::valkey::logins::{WRITER_USER, learn_admin, writer_granted, writer_password};
use crate::valkey::{
    Sample, Sampler, Writer, WriterLog, assert_no_lost_writes, describe_sample, fewest_replicas_at,
    primary_changes,
};
use crate::{eventually, metric};
use valkey_operator::acl::OPERATOR_USER;
use valkey_operator::credentials::Credentials;
use valkey_operator::credentials::{private_secret_name, secret_name};
use valkey_operator::valkey::NodeClient;

/// The image every test fleet starts on, and the one the guide upgrades to.
pub const IMAGES: &str = r#"
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata: {name: valkey-9-0-0}
spec: {repository: valkey/valkey, tag: "9.0.0", version: "9.0.0"}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyImage
metadata: {name: valkey-9-1-2}
spec: {repository: valkey/valkey, tag: "9.1.2", version: "9.1.2"}
"#;

/// How [`Product::start_with`] starts everything.
pub struct ProductOptions<'a> {
    /// Applied while the chart's webhooks cannot answer yet (objects that predate the operator).
    pub before_webhooks: Option<&'a str>,
    /// More flags for `serve`.
    pub operator_flags: &'a [&'a str],
    /// How the test kubelet behaves (reusing addresses at once, reporting exits late).
    pub kubelet: KubeletOptions,
    /// The operator requires the API server's webhook client certificate (`serve
    /// --webhook-client-ca`), as where the API server can be configured to present one.
    pub certified_webhooks: bool,
    /// Another operator binary than this build's (a previous release, to upgrade from).
    pub operator_binary: Option<&'a std::path::Path>,
    /// Real nodes (kubelet, containerd, runc, CNI) in these zones, one each, and
    /// kube-scheduler, instead of the test kubelet; empty: the test kubelet.
    pub real_nodes: &'a [&'a str],
    /// Run the operator as a user does, in the cluster: the chart's Deployment (two replicas,
    /// leader election, its ServiceAccount, webhooks through its Service) on the real nodes,
    /// from an image of this build's binary. Needs `real_nodes`.
    pub operator_in_cluster: bool,
    /// NetworkPolicies enforced by the network plugin's firewall (kube-router) on every real
    /// node.
    pub enforce_network_policies: bool,
}

impl Default for ProductOptions<'_> {
    fn default() -> Self {
        Self {
            before_webhooks: None,
            operator_flags: &[],
            kubelet: KubeletOptions::default(),
            certified_webhooks: true,
            operator_binary: None,
            real_nodes: &[],
            operator_in_cluster: false,
            enforce_network_policies: false,
        }
    }
}

/// The reference the in-cluster operator's image is imported under, as the chart names it
/// with `image.repository=valkey-operator` and `image.tag=testenv`.
pub const OPERATOR_IMAGE: &str = "docker.io/library/valkey-operator:testenv";

/// Where the product's Pods run.
pub enum Nodes {
    /// The test kubelet: each Pod a local valkey-server process on a loopback address.
    Test(TestKubelet),
    /// Real nodes: containers under containerd, on the Pod network 198.18.0.0/15.
    Real(Vec<RealNode>),
}

/// The operator, its control plane and its nodes, all stopped when dropped.
pub struct Product {
    /// kube-router's firewall on each real node when NetworkPolicies are enforced, held until
    /// the end.
    _firewalls: Vec<testenv::Firewall>,
    // Dropped early: the nodes stop their Pods before the API server goes.
    pub nodes: Nodes,
    /// The operator process on the host; `None` when it runs in the cluster.
    operator: Option<Operator>,
    pub identity: ChartIdentity,
    pub helm: Helm,
    pub plane: ControlPlane,
}

impl Product {
    /// Starts everything; `before_webhooks` is applied while the chart's webhooks cannot answer
    /// yet (objects that predate the operator), `operator_flags` go to `serve`.
    pub async fn start(before_webhooks: Option<&str>, operator_flags: &[&str]) -> Self {
        Self::start_with(ProductOptions {
            before_webhooks,
            operator_flags,
            ..Default::default()
        })
        .await
    }

    /// [`Self::start`] with every option.
    pub async fn start_with(options: ProductOptions<'_>) -> Self {
        let ProductOptions {
            before_webhooks,
            operator_flags,
            kubelet,
            certified_webhooks,
            operator_binary,
            real_nodes,
            operator_in_cluster,
            enforce_network_policies,
        } = options;
        assert!(
            !operator_in_cluster || !real_nodes.is_empty(),
            "an operator in the cluster needs real nodes to run on"
        );
        assert!(
            !enforce_network_policies || !real_nodes.is_empty(),
            "NetworkPolicies are enforced on real nodes"
        );
        let (mut plane, helm) = control_plane_with_crds_from(ControlPlaneOptions {
            // Real nodes live in network namespaces of their own: the host's loopback is not
            // theirs.
            reachable_from_pods: !real_nodes.is_empty(),
            ..Default::default()
        })
        .await;
        if let Some(objects) = before_webhooks {
            must(&plane, &["apply", "-f", "-"], Some(objects));
        }
        let binary = operator_binary.map_or_else(crate::operator_binary, Into::into);
        if operator_in_cluster {
            return Self::start_in_cluster(
                plane,
                helm,
                real_nodes,
                certified_webhooks,
                enforce_network_policies,
                &binary,
            )
            .await;
        }
        install(&helm, &[]);
        let identity = ChartIdentity::from_release(&plane);
        // The API server presents its webhook client certificate; the operator requires it.
        let client_ca = plane.webhook_client_ca();
        let mut flags = Vec::new();
        if certified_webhooks {
            flags.extend(["--webhook-client-ca", client_ca.to_str().unwrap()]);
        }
        flags.extend_from_slice(operator_flags);
        let mut operator =
            Operator::start_binary(&binary, &identity, "operator.log", NAMESPACE, &flags);
        operator.wait_ready(Duration::from_secs(60)).await;
        repoint_webhooks(&plane, &operator.url);
        let nodes = if real_nodes.is_empty() {
            let client = plane.client().await.unwrap();
            Nodes::Test(TestKubelet::start(client, kubelet).await.unwrap())
        } else {
            plane.start_node_controllers().unwrap();
            let mut started = Vec::new();
            for options in testenv::nodes_in_zones(real_nodes) {
                started.push(RealNode::start(&plane, options).await.unwrap());
            }
            Nodes::Real(started)
        };
        let firewalls = firewalls(&plane, &nodes, enforce_network_policies).await;
        Self {
            _firewalls: firewalls,
            nodes,
            operator: Some(operator),
            identity,
            helm,
            plane,
        }
    }

    /// The chart installed as a user installs it, its Deployment running this build's binary
    /// on `zones`' real nodes; returns once both replicas are Ready and one leads.
    async fn start_in_cluster(
        mut plane: ControlPlane,
        helm: Helm,
        zones: &[&str],
        certified_webhooks: bool,
        enforce_network_policies: bool,
        binary: &std::path::Path,
    ) -> Self {
        let mut values = vec![
            "--set",
            "image.repository=valkey-operator",
            "--set",
            "image.tag=testenv",
            "--set",
            "image.pullPolicy=Never",
        ];
        if certified_webhooks {
            // The chart's way to require the API server's webhook client certificate.
            let ca = plane.webhook_client_ca();
            must(
                &plane,
                &[
                    "create",
                    "secret",
                    "generic",
                    "webhook-client-ca",
                    "-n",
                    NAMESPACE,
                    &format!("--from-file=ca.crt={}", ca.display()),
                ],
                None,
            );
            values.extend(["--set", "webhook.clientAuth.caSecret=webhook-client-ca"]);
        }
        install(&helm, &values);
        let identity = ChartIdentity::from_release(&plane);
        plane.start_node_controllers().unwrap();
        let image = testenv::ImageSpec::operator(OPERATOR_IMAGE, binary);
        let mut nodes = Vec::new();
        for mut options in testenv::nodes_in_zones(zones) {
            options.images.push(image.clone());
            nodes.push(RealNode::start(&plane, options).await.unwrap());
        }
        let nodes = Nodes::Real(nodes);
        let product = Self {
            _firewalls: firewalls(&plane, &nodes, enforce_network_policies).await,
            nodes,
            operator: None,
            identity,
            helm,
            plane,
        };
        eventually(
            "the operator's two replicas Ready, one leading",
            Duration::from_secs(120),
            async || {
                let deployment = get_json(
                    &product.plane,
                    &["get", "deployment", RELEASE, "-n", NAMESPACE, "-o", "json"],
                );
                let ready = deployment["status"]["readyReplicas"].as_u64().unwrap_or(0);
                match product.leader() {
                    Some(leader) if ready == 2 => Ok(leader),
                    leader => Err(format!(
                        "{ready} ready, leader {leader:?}\n{}",
                        product.kubectl(&["get", "pods", "-n", NAMESPACE, "-o", "wide"])
                    )),
                }
            },
        )
        .await;
        product
    }

    /// The operator process on the host; panics when the operator runs in the cluster (a test
    /// that needs the process says so by calling this).
    pub fn operator(&self) -> &Operator {
        self.operator
            .as_ref()
            .expect("this test needs the operator on the host, not in the cluster")
    }

    /// [`Self::operator`], to restart or replace it.
    pub fn operator_mut(&mut self) -> &mut Operator {
        self.operator
            .as_mut()
            .expect("this test needs the operator on the host, not in the cluster")
    }

    /// The holder of the operator's Lease (a Pod's name when it runs in the cluster), if a
    /// replica holds it.
    pub fn leader(&self) -> Option<String> {
        let (found, holder) = self.try_kubectl(
            &[
                "get",
                "lease",
                valkey_operator::controller::lead::lease::LEASE_NAME,
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
            None,
        );
        let holder = holder.trim();
        (found && !holder.is_empty()).then(|| holder.to_string())
    }

    /// The test kubelet; panics on real nodes (a test that needs it says so by calling this).
    pub fn kubelet(&self) -> &TestKubelet {
        match &self.nodes {
            Nodes::Test(kubelet) => kubelet,
            Nodes::Real(_) => panic!("this test needs the test kubelet, not real nodes"),
        }
    }

    /// The real nodes; empty under the test kubelet.
    pub fn real_nodes(&self) -> &[RealNode] {
        match &self.nodes {
            Nodes::Test(_) => &[],
            Nodes::Real(nodes) => nodes,
        }
    }

    /// The real node named `name`, to do something to it (lose it).
    pub fn real_node_mut(&mut self, name: &str) -> Option<&mut RealNode> {
        match &mut self.nodes {
            Nodes::Test(_) => None,
            Nodes::Real(nodes) => nodes.iter_mut().find(|node| node.name() == name),
        }
    }

    /// Starts the lost real node `name` again (see [`RealNode::restart`]), as a machine that
    /// comes back.
    pub async fn restart_real_node(&mut self, name: &str) -> Result<(), testenv::Error> {
        let Nodes::Real(nodes) = &mut self.nodes else {
            return Err(testenv::Error::Binaries("no real nodes".into()));
        };
        let Some(node) = nodes.iter_mut().find(|node| node.name() == name) else {
            return Err(testenv::Error::Binaries(format!("no real node {name}")));
        };
        node.restart(&self.plane).await
    }

    /// The process id of the valkey-server the test kubelet runs for a Pod.
    pub fn server_pid(&self, namespace: &str, pod: &str) -> u32 {
        self.kubelet()
            .pod_process(namespace, pod)
            .and_then(|p| p.pid)
            .unwrap_or_else(|| panic!("no running server for Pod {namespace}/{pod}"))
    }

    /// Asks the API server to admit an 8.1.4 ValkeyImage (a dry run) and checks that the
    /// operator's webhook answered: a refusal in its own words, not the API server's timeout.
    /// `when` says in what circumstances, for the failure message.
    pub fn assert_webhook_answers(&self, when: &str) {
        let (accepted, output) = self.try_kubectl(
            &["apply", "--dry-run=server", "-f", "-"],
            Some(
                "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyImage\n\
                 metadata: {name: valkey-8-1-4}\n\
                 spec: {repository: valkey/valkey, tag: \"8.1.4\", version: \"8.1.4\"}\n",
            ),
        );
        assert!(
            !accepted && output.contains("below the Valkey 9 floor"),
            "an 8.1.4 image {when}:\n{output}"
        );
    }

    /// The Pods of `namespace` that `selector` (a label selector) picks, as the API returns them.
    pub fn pods_labelled(&self, namespace: &str, selector: &str) -> Vec<Value> {
        let list = get_json(
            &self.plane,
            &["get", "pods", "-n", namespace, "-l", selector, "-o", "json"],
        );
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// The real node a Pod runs on and its first container's host pid.
    pub fn container(&self, namespace: &str, pod: &str) -> (&RealNode, u32) {
        self.try_container(namespace, pod)
            .unwrap_or_else(|problem| panic!("{namespace}/{pod}: {problem}"))
    }

    /// [`Self::container`], or what stands in the way (no real node, no running container).
    pub fn try_container(&self, namespace: &str, pod: &str) -> Result<(&RealNode, u32), String> {
        let json = get_json(
            &self.plane,
            &["get", "pod", "-n", namespace, pod, "-o", "json"],
        );
        let node_name = json["spec"]["nodeName"].as_str().unwrap_or_default();
        let node = self
            .real_nodes()
            .iter()
            .find(|node| node.name() == node_name)
            .ok_or_else(|| format!("on no real node: {node_name:?}"))?;
        let container = json["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .unwrap_or_default();
        let id = container
            .strip_prefix("containerd://")
            .ok_or_else(|| format!("not a containerd container: {container:?}"))?;
        let pid = node
            .task_pid(id)
            .ok_or_else(|| format!("no running task ({id})"))?;
        Ok((node, pid))
    }

    /// `kubectl ARGS`, which must succeed; stdout and stderr (warnings included).
    pub fn kubectl(&self, args: &[&str]) -> String {
        must(&self.plane, args, None)
    }

    /// `kubectl ARGS` that may fail: success and output.
    pub fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        kubectl(&self.plane, args, stdin)
    }

    /// `kubectl valkey ARGS`: the plugin, which kubectl finds on the PATH beside this build's
    /// operator binary, as a user's kubectl finds an installed one; success and output.
    pub fn plugin(&self, args: &[&str]) -> (bool, String) {
        let binary = crate::operator_binary();
        let folder = binary.parent().expect("the operator binary's folder");
        let path = std::env::var_os("PATH").unwrap_or_default();
        let path = std::env::join_paths(
            std::iter::once(folder.to_path_buf()).chain(std::env::split_paths(&path)),
        )
        .expect("a PATH");
        let mut command = self.plane.kubectl();
        command.env("PATH", path).arg("valkey").args(args);
        super::chart::run(command, None)
    }

    /// `kubectl apply -f -` of `yaml`, which must succeed; the output.
    pub fn apply(&self, yaml: &str) -> String {
        must(&self.plane, &["apply", "-f", "-"], Some(yaml))
    }

    /// Waits until a server-side dry run of `yaml` warns of nothing missing: admission answers
    /// from the operator's watch-fed index, which may lag a `kubectl apply` by a moment on a
    /// loaded machine, and a test about what admission refuses must not race it.
    pub async fn until_admission_knows(&self, yaml: &str) {
        crate::eventually(
            "admission's index to hold every object the manifest names",
            std::time::Duration::from_secs(30),
            async || {
                let (_, output) =
                    self.try_kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(yaml));
                if output.contains("does not exist") {
                    Err(output)
                } else {
                    Ok(())
                }
            },
        )
        .await;
    }

    /// `kubectl patch KIND NAME [-n NS] --type merge -p PATCH`, which must succeed.
    pub fn patch(&self, kind_name: &str, namespace: Option<&str>, patch: &str) -> String {
        let mut args = vec!["patch", kind_name, "--type", "merge", "-p", patch];
        if let Some(namespace) = namespace {
            args.extend(["-n", namespace]);
        }
        self.kubectl(&args)
    }

    pub fn cluster(&self, namespace: &str, name: &str) -> Value {
        get_json(
            &self.plane,
            &["get", "valkeycluster", name, "-n", namespace, "-o", "json"],
        )
    }

    /// Pod name → `IP:6379` of a cluster's Pods, leaving out Pods already being deleted (a
    /// retired node's Pod lingers for a moment while the kubelet stops it). Learns the
    /// operator's login for the harness's own reads on the way (see [`Self::learn_logins`]).
    pub fn addresses(&self, namespace: &str, name: &str) -> BTreeMap<String, String> {
        self.learn_logins(namespace, name);
        let pods = get_json(
            &self.plane,
            &[
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                &format!("valkey.gomomento.com/cluster={name}"),
                "-o",
                "json",
            ],
        );
        pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| {
                Some((
                    p["metadata"]["name"].as_str()?.to_string(),
                    format!("{}:6379", p["status"]["podIP"].as_str()?),
                ))
            })
            .collect()
    }

    /// Copies the logs of a cluster's Pods (every container, the current run and the one
    /// before a restart) to `/tmp/valkey-operator-failed-<namespace>-<pod>.log`, for a failure
    /// to be read after the test has deleted the cluster; returns the files written.
    pub fn keep_pod_logs(&self, namespace: &str, name: &str) -> Vec<String> {
        let mut kept = Vec::new();
        for pod in self.addresses(namespace, name).into_keys() {
            let mut text = String::new();
            for previous in ["--previous=true", "--previous=false"] {
                let (ok, out) = self.try_kubectl(
                    &[
                        "logs",
                        "-n",
                        namespace,
                        &pod,
                        "--all-containers",
                        "--timestamps",
                        previous,
                    ],
                    None,
                );
                if ok {
                    text.push_str(&out);
                }
            }
            let path = format!("/tmp/valkey-operator-failed-{namespace}-{pod}.log");
            if std::fs::write(&path, text).is_ok() {
                kept.push(path);
            }
        }
        kept
    }

    /// The Pod of shard `shard`'s primary, as the servers themselves say (Pods are named
    /// `<cluster>-<shard>-<suffix>`).
    pub async fn primary_of(&self, namespace: &str, cluster: &str, shard: u32) -> String {
        self.try_primary_of(namespace, cluster, shard)
            .await
            .unwrap_or_else(|| {
                panic!("shard {shard} of {namespace}/{cluster} has no primary that answers")
            })
    }

    /// [`Self::primary_of`], or `None` while no server of the shard answers as a primary
    /// owning slots.
    pub async fn try_primary_of(
        &self,
        namespace: &str,
        cluster: &str,
        shard: u32,
    ) -> Option<String> {
        let prefix = format!("{cluster}-{shard}-");
        for (name, address) in self.addresses(namespace, cluster) {
            if !name.starts_with(&prefix) {
                continue;
            }
            let client = crate::valkey::logins::admin(&address, Duration::from_secs(2)).await;
            // A joiner is a primary too until it is made a replica, and its name may sort
            // first: only a primary owning slots is the shard's (a real-nemesis seed cut the
            // true primary's node while believing it cut a replica's).
            if let Ok(client) = client
                && client.cluster_nodes().await.is_ok_and(|nodes| {
                    (nodes.iter()).any(|n| n.myself && n.primary && !n.slots.is_empty())
                })
            {
                return Some(name);
            }
        }
        None
    }

    /// The address and port the operator reaches its API server at (with real nodes, an
    /// address the kubelets reach too), from the server's URL.
    pub fn api_server_endpoint(&self) -> Result<(String, u16), String> {
        let url = self.plane.server_url();
        let endpoint = url.trim_start_matches("https://");
        let (address, port) = (endpoint.rsplit_once(':'))
            .ok_or_else(|| format!("the API server's URL {url} names no port"))?;
        let port = (port.parse())
            .map_err(|error| format!("the API server's URL {url}: port {port:?}: {error}"))?;
        Ok((address.to_owned(), port))
    }

    /// The Kubernetes Node a Pod runs on (empty before it is scheduled).
    pub fn host_of(&self, namespace: &str, pod: &str) -> String {
        let pod = get_json(
            &self.plane,
            &["get", "pod", "-n", namespace, pod, "-o", "json"],
        );
        pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The Kubernetes Node of each shard's primary, shard by shard.
    pub async fn primary_hosts(&self, namespace: &str, cluster: &str, shards: u32) -> Vec<String> {
        let mut hosts = Vec::new();
        for shard in 0..shards {
            let primary = self.primary_of(namespace, cluster, shard).await;
            hosts.push(self.host_of(namespace, &primary));
        }
        hosts
    }

    /// Waits (at most `within`) until the cluster is converged on `version` with its `shards`
    /// primaries one to a Node (the operator moves them apart); their Nodes, shard by shard.
    pub async fn primaries_apart(
        &self,
        namespace: &str,
        cluster: &str,
        shards: u32,
        version: &str,
        within: Duration,
    ) -> Vec<String> {
        eventually("the primaries stand one to a node", within, async || {
            let mut hosts = Vec::new();
            for shard in 0..shards {
                let primary = self.try_primary_of(namespace, cluster, shard).await;
                let primary = primary.ok_or(format!("shard {shard} has no primary yet"))?;
                hosts.push(self.host_of(namespace, &primary));
            }
            let distinct: std::collections::BTreeSet<&String> = hosts.iter().collect();
            let converged = converged(&self.cluster(namespace, cluster), version);
            match distinct.len() == hosts.len() && converged {
                true => Ok(hosts),
                false => Err(format!("{hosts:?}")),
            }
        })
        .await
    }

    /// A Pod of shard `shard` that is not its primary.
    pub async fn replica_of(&self, namespace: &str, cluster: &str, shard: u32) -> String {
        let primary = self.primary_of(namespace, cluster, shard).await;
        let prefix = format!("{cluster}-{shard}-");
        self.addresses(namespace, cluster)
            .into_keys()
            .find(|name| name.starts_with(&prefix) && name != &primary)
            .unwrap_or_else(|| panic!("shard {shard} of {namespace}/{cluster} has no replica"))
    }

    /// A cluster's ValkeyNodes as the API returns them.
    pub fn valkey_nodes(&self, namespace: &str, cluster: &str) -> Vec<Value> {
        let selector = format!("valkey.gomomento.com/cluster={cluster}");
        let args = [
            "get",
            "valkeynodes",
            "-n",
            namespace,
            "-l",
            &selector,
            "-o",
            "json",
        ];
        let nodes = get_json(&self.plane, &args);
        nodes["items"].as_array().cloned().unwrap_or_default()
    }

    /// Each ValkeyNode of a cluster and the node id its status records (if one).
    pub fn node_ids(&self, namespace: &str, cluster: &str) -> BTreeMap<String, Option<String>> {
        self.valkey_nodes(namespace, cluster)
            .iter()
            .filter_map(|n| {
                let id = n["status"]["nodeId"].as_str().map(String::from);
                Some((n["metadata"]["name"].as_str()?.to_string(), id))
            })
            .collect()
    }

    /// Reads the operator's passwords (current, and any of a rotation) from the cluster's
    /// private credentials Secret (in the operator's namespace, whichever that is), so the
    /// harness can read what only the operator's user may (`CLUSTER NODES`, `ACL LIST`);
    /// nothing when the Secret is not there yet.
    pub fn learn_logins(&self, namespace: &str, name: &str) {
        // One password per line, the current one last (learnt last, so tried first).
        let template = concat!(
            "go-template=",
            r#"{{range .items}}"#,
            r#"{{with index .data "previous-operator-password"}}{{. | base64decode}}{{"\n"}}{{end}}"#,
            r#"{{with index .data "next-operator-password"}}{{. | base64decode}}{{"\n"}}{{end}}"#,
            r#"{{with index .data "operator-password"}}{{. | base64decode}}{{"\n"}}{{end}}"#,
            r#"{{end}}"#,
        );
        // An older operator (tests/e2e_operator_upgrade.rs) kept them in the mounted Secret.
        let older = secret_name(name);
        let older = ["get", "secrets", "-n", namespace, "--field-selector"]
            .map(String::from)
            .into_iter()
            .chain([format!("metadata.name={older}")]);
        let private = ["get", "secrets", "--all-namespaces", "--field-selector"]
            .map(String::from)
            .into_iter()
            .chain([format!(
                "metadata.name={}",
                private_secret_name(namespace, name)
            )]);
        let mut passwords = String::new();
        for args in [older.collect::<Vec<_>>(), private.collect()] {
            let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
            args.extend(["-o", template]);
            let (read, found) = self.try_kubectl(&args, None);
            if read {
                passwords.push_str(&found);
            }
        }
        for password in passwords.lines().map(str::trim).filter(|p| !p.is_empty()) {
            learn_admin(Credentials {
                username: OPERATOR_USER.into(),
                password: password.to_string(),
            });
        }
    }

    /// Adds the harness writer's tenant user to a cluster (read and write on `key:*`, and the
    /// `CLUSTER NODES` its router reads), as an application's team would, and waits until every
    /// node lets it in.
    pub async fn grant_writer(&self, namespace: &str, name: &str) {
        let role = format!(
            "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyRole\nmetadata: {{name: {WRITER_USER}}}\nspec:\n  categories: [{{name: read, access: allow}}, {{name: write, access: allow}}, {{name: connection, access: allow}}]\n  commands: [{{name: cluster|nodes, access: allow}}]\n"
        );
        self.apply(&role);
        let cluster = self.cluster(namespace, name);
        let users = cluster["spec"]["acl"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !users.iter().any(|u| u["username"] == WRITER_USER) {
            let user = serde_json::json!({
                "username": WRITER_USER,
                "passwordHashes": [valkey_operator::acl::password_hash(writer_password().as_bytes())],
                "permissions": [{"roleRef": WRITER_USER, "keys": [{"pattern": "key:*", "access": "readwrite"}]}],
            });
            let patch = if cluster["spec"]["acl"].is_array() {
                serde_json::json!([{"op": "add", "path": "/spec/acl/-", "value": user}])
            } else {
                serde_json::json!([{"op": "add", "path": "/spec/acl", "value": [user]}])
            };
            let kind_name = format!("valkeycluster/{name}");
            let args = [
                "patch",
                &kind_name,
                "-n",
                namespace,
                "--type",
                "json",
                "-p",
                &patch.to_string(),
            ];
            self.kubectl(&args);
        }
        writer_granted();
        let login = Credentials {
            username: WRITER_USER.into(),
            password: writer_password(),
        };
        eventually(
            format!("{namespace}/{name}: every node lets {WRITER_USER} in"),
            Duration::from_secs(30),
            async || {
                for address in self.addresses(namespace, name).values() {
                    NodeClient::connect_as(address, Duration::from_secs(2), Some(&login))
                        .await
                        .map_err(|e| format!("{address}: {e}"))?;
                }
                Ok::<(), String>(())
            },
        )
        .await;
    }

    /// Waits until each cluster is Active on `version` with nothing outdated and no roll going.
    pub async fn wait_converged(&self, clusters: &[(&str, &str)], version: &str, within: Duration) {
        eventually(
            format!("{clusters:?} converged on {version}"),
            within,
            async || {
                let states: Vec<Value> = clusters
                    .iter()
                    .map(|(ns, name)| self.cluster(ns, name))
                    .collect();
                if states.iter().all(|s| converged(s, version)) {
                    Ok(())
                } else {
                    Err(format!("{:#}", Value::Array(statuses(&states))))
                }
            },
        )
        .await;
    }

    /// Checks the operator's own count of planned failovers of one cluster,
    /// `valkey_operator_failovers_total{cluster,namespace}`, which exists (at 0) from the
    /// cluster's first reconcile: a missing series fails the check.
    pub async fn assert_failovers(&self, namespace: &str, name: &str, expected: u64) {
        let text = self.operator().metrics().await;
        let labels = [("cluster", name), ("namespace", namespace)];
        let counted = metric(&text, "valkey_operator_failovers_total", &labels);
        assert_eq!(
            counted,
            Some(expected as f64),
            "{namespace}/{name}: valkey_operator_failovers_total in\n{text}"
        );
    }
}

/// kube-router's firewall on every real node, when asked for.
async fn firewalls(
    plane: &ControlPlane,
    nodes: &Nodes,
    enforce_network_policies: bool,
) -> Vec<testenv::Firewall> {
    let mut firewalls = Vec::new();
    if let Nodes::Real(nodes) = nodes
        && enforce_network_policies
    {
        for node in nodes {
            firewalls.push(testenv::Firewall::start(plane, node).await.unwrap());
        }
    }
    firewalls
}

impl Drop for Product {
    /// A failing test shows the end of the operator's log and keeps all of it (its temporary
    /// folder goes with it otherwise).
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = match &self.operator {
                Some(operator) => operator.log(),
                None => {
                    self.try_kubectl(
                        &[
                            "logs",
                            "-n",
                            NAMESPACE,
                            "-l",
                            "app=valkey-operator",
                            "--tail=100",
                            "--prefix",
                        ],
                        None,
                    )
                    .1
                }
            };
            eprintln!("the operator's log ends:\n{}", tail(&log, 60));
            let kept = std::env::temp_dir()
                .join(format!("valkey-operator-failed-{}.log", std::process::id()));
            if std::fs::write(&kept, log).is_ok() {
                eprintln!("the operator's log is kept in {}", kept.display());
            }
        }
    }
}

fn statuses(states: &[Value]) -> Vec<Value> {
    states
        .iter()
        .map(|s| {
            serde_json::json!({
                "name": s["metadata"]["name"],
                "status": s["status"],
            })
        })
        .collect()
}

/// A condition's status (`"True"`, `"False"`) on a ValkeyCluster.
pub fn condition(cluster: &Value, type_: &str) -> Option<String> {
    condition_field(cluster, type_, "status")
}

/// Any field of a condition (`reason`, `message`).
pub fn condition_field(cluster: &Value, type_: &str, field: &str) -> Option<String> {
    cluster["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c[field].as_str().map(String::from))
}

/// Active on `version`, nothing outdated, no roll in progress, up to date with its spec.
pub fn converged(cluster: &Value, version: &str) -> bool {
    cluster["status"]["state"] == "Active"
        && cluster["status"]["version"] == version
        && cluster["status"]["outdatedNodes"] == 0
        && cluster["status"]["observedGeneration"] == cluster["metadata"]["generation"]
        && condition(cluster, "Progressing").as_deref() == Some("False")
}

/// A writer and a sampler on one cluster through a change, and the Pods it had before.
pub struct ClusterWatch {
    pub namespace: String,
    pub name: String,
    pub pods_before: BTreeMap<String, String>,
    writer: Writer,
    sampler: Sampler,
}

/// What a watch saw, for the invariants and the figures.
pub struct WatchReport {
    /// `namespace/name` of the cluster watched.
    pub cluster: String,
    pub log: WriterLog,
    pub samples: Vec<Sample>,
    pub pods_after: BTreeMap<String, String>,
    /// When each write lost inside the window a finish allowed was acknowledged.
    pub lost_acknowledged: Vec<tokio::time::Instant>,
}

impl ClusterWatch {
    /// Starts writing and sampling, and waits until writes are acknowledged.
    pub async fn start(product: &Product, namespace: &str, name: &str) -> Self {
        product.grant_writer(namespace, name).await;
        let pods_before = product.addresses(namespace, name);
        let seeds: Vec<String> = pods_before.values().cloned().collect();
        let watch = Self {
            namespace: namespace.into(),
            name: name.into(),
            pods_before,
            writer: Writer::start(seeds.clone()),
            sampler: Sampler::start(seeds),
        };
        watch.sampler.first_sample(Duration::from_secs(30)).await;
        watch.writer.assert_progressing().await;
        watch
    }

    /// Fails unless writes are still being acknowledged.
    pub async fn assert_writing(&self) {
        self.writer.assert_progressing().await;
    }

    /// Stops after a primary was killed (or stopped) at `fault`: writes acknowledged within
    /// `window` before it may have died with it (asynchronous replication had not copied them
    /// yet); every other acknowledged write must be readable. Returns the report and how many
    /// were lost inside the window (a figure).
    pub async fn finish_across_fault(
        self,
        product: &Product,
        fault: tokio::time::Instant,
        window: Duration,
    ) -> (WatchReport, usize) {
        self.finish_losing_only_within(product, fault - window, fault)
            .await
    }

    /// Stops, and checks that every write acknowledged outside `from..=until` is readable:
    /// those inside may be lost (a minority primary's writes in a partition). Returns the report
    /// and how many were lost inside (a figure).
    pub async fn finish_losing_only_within(
        self,
        product: &Product,
        from: tokio::time::Instant,
        until: tokio::time::Instant,
    ) -> (WatchReport, usize) {
        let report = self.stop(product).await;
        let seeds: Vec<String> = report.pods_after.values().cloned().collect();
        let (cluster, log) = (&report.cluster, &report.log);
        let lost = crate::valkey::lost_writes(&seeds, log.acked).await;
        let inside = |index: &&u64| {
            let acked = log.ack_times[usize::try_from(**index).unwrap_or(usize::MAX)];
            acked >= from && acked <= until
        };
        let (within, outside): (Vec<&u64>, Vec<&u64>) = lost.iter().partition(inside);
        assert!(
            outside.is_empty(),
            "{cluster} lost {} acknowledged writes outside the {:?} it may lose \
             (of {} acknowledged), first {:?}",
            outside.len(),
            until - from,
            log.acked,
            &outside[..outside.len().min(5)]
        );
        let lost_acknowledged = within
            .iter()
            .filter_map(|&&index| log.ack_times.get(usize::try_from(index).ok()?).copied())
            .collect();
        let within = within.len();
        (
            WatchReport {
                lost_acknowledged,
                ..report
            },
            within,
        )
    }

    /// Stops, and checks that every acknowledged write is readable from the cluster as it is now.
    pub async fn finish(self, product: &Product) -> WatchReport {
        let report = self.stop(product).await;
        let seeds: Vec<String> = report.pods_after.values().cloned().collect();
        assert_no_lost_writes(&seeds, &report.log, &report.cluster).await;
        report
    }

    /// Stops writing (still progressing up to then) and sampling; the Pods as they are now.
    async fn stop(self, product: &Product) -> WatchReport {
        self.writer.assert_progressing().await;
        let log = self.writer.stop().await;
        let samples = self.sampler.stop().await;
        WatchReport {
            cluster: format!("{}/{}", self.namespace, self.name),
            log,
            samples,
            pods_after: product.addresses(&self.namespace, &self.name),
            lost_acknowledged: Vec::new(),
        }
    }
}

impl WatchReport {
    /// Checks each of `shards` evenly split shards: `failovers` primary changes seen from
    /// outside, and never fewer than `replicas` replicas.
    pub fn assert_shards(&self, shards: u16, failovers: usize, replicas: usize) {
        for shard in 0..shards {
            self.assert_shard(shard, shards, failovers, replicas);
        }
    }

    /// [`Self::assert_shards`] for shard `shard` of `shards` alone.
    pub fn assert_shard(&self, shard: u16, shards: u16, failovers: usize, replicas: usize) {
        // The first slot of the shard as the operator assigns them at creation.
        let slot = bootstrap_range(u32::from(shard), u32::from(shards)).start;
        assert_eq!(
            primary_changes(&self.samples, slot),
            failovers,
            "{} shard {shard} (slot {slot}): primary changes",
            self.cluster
        );
        self.assert_kept_replicas(shard, shards, replicas);
    }

    /// Shard `shard` of `shards` never had fewer than `replicas` replicas, seen from outside.
    pub fn assert_kept_replicas(&self, shard: u16, shards: u16, replicas: usize) {
        let slot = bootstrap_range(u32::from(shard), u32::from(shards)).start;
        let (fewest, at) = fewest_replicas_at(&self.samples, slot);
        assert!(
            fewest >= replicas,
            "{} shard {shard} (slot {slot}) dipped below {replicas} replicas; the view:\n{}",
            self.cluster,
            at.map(describe_sample).unwrap_or_default()
        );
    }

    /// How many times shard `shard` of `shards` changed primary, seen from outside.
    pub fn primary_changes(&self, shard: u16, shards: u16) -> usize {
        let slot = bootstrap_range(u32::from(shard), u32::from(shards)).start;
        primary_changes(&self.samples, slot)
    }

    /// The longest stretch without an acknowledged write while the watch ran.
    pub fn longest_write_gap(&self) -> Duration {
        self.longest_write_gap_at().0
    }

    /// The longest write gap and when it began.
    fn longest_write_gap_at(&self) -> (Duration, tokio::time::Instant) {
        match (self.log.ack_times.first(), self.log.ack_times.last()) {
            (Some(first), Some(last)) => self.log.longest_gap_at(*first, *last),
            _ => (Duration::ZERO, tokio::time::Instant::now()),
        }
    }

    /// What the writer was told during its longest gap, from `origin`: "+1.23 s addr: ERROR".
    pub fn refusals_in_longest_gap(&self, origin: tokio::time::Instant) -> Vec<String> {
        let (gap, began) = self.longest_write_gap_at();
        self.log.refusals.between(origin, began, began + gap)
    }
}
