//! What the controller creates for a cluster, rendered purely from the ValkeyCluster and its
//! effective config: the revision that decides which nodes are outdated, ValkeyNodes, their
//! Pods, the headless Service and the PodDisruptionBudget. No I/O here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction,
    KeyToPath, ObjectFieldSelector, Pod, PodSpec, Probe, ResourceRequirements, SecretVolumeSource,
    Service, ServicePort, ServiceSpec, TCPSocketAction, Toleration, TopologySpreadConstraint,
    Volume, VolumeMount,
};
use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};
use k8s_openapi::api::core::v1::{
    NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use serde::Serialize;

use crate::api::annotations;
use crate::api::secret_keys::{AUTH_CONF, TLS_CA, TLS_CERT, TLS_KEY};
use crate::api::setting_impact::{FORCED, needs_restart};
use crate::api::{
    ClusterState, JoinType, NodeRole, ValkeyCluster, ValkeyClusterSpec, ValkeyNode, ValkeyNodeSpec,
    ZoneSpread, labels,
};
use crate::controller::build::status::ConditionType;
use crate::credentials::secret_name;
use crate::fleet::change::{RollingInputs, digest_of};
use crate::fleet::resolve::EffectiveConfig;
use crate::valkey::tls::ClusterNames;

/// The client port every node listens on (its own Pod IP).
pub const VALKEY_PORT: i32 = 6379;
/// The cluster bus port (client port + 10000).
pub const BUS_PORT: i32 = 16379;
/// The named ports of a node, on its container and on the Service.
const PORTS: [(&str, i32); 2] = [("valkey", VALKEY_PORT), ("valkey-bus", BUS_PORT)];
/// Where a TLS cluster's Secret is mounted (its keys: [`crate::api::secret_keys`]).
pub const TLS_DIR: &str = "/etc/valkey/tls";
/// Where the cluster's credentials Secret is mounted: only its `auth.conf`, which every node
/// `--include`s (its users by hash, `default` closed; see [`crate::credentials`]).
pub const AUTH_DIR: &str = "/etc/valkey/auth";
/// The uid and gid of the `valkey` user in the official Valkey images.
pub const VALKEY_UID: i64 = 999;
/// The label the chart puts on the operator's Pods (its selector label), by which a cluster's
/// NetworkPolicy lets the operator in.
pub const OPERATOR_POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "valkey-operator");
/// The label every namespace carries with its own name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The Valkey container's name.
pub const CONTAINER: &str = "valkey";
/// Where the node keeps `nodes.conf` and its data.
pub const DATA_DIR: &str = "/data";

/// A Valkey Pod's `terminationGracePeriodSeconds` (see [`ClusterRender::pod`]).
pub const TERMINATION_GRACE_SECONDS: i64 = 10;

/// The server's unix socket, in the data folder: where the liveness probe reaches it, with the
/// same `PING` under TLS (the socket is never TLS) and no network address needed.
pub const PROBE_SOCKET: &str = "/data/valkey.sock";

/// The liveness probe's command, run in the container by the kubelet: `valkey-cli` (in the
/// official image beside `valkey-server`) PINGs the server on its socket. Any answer counts,
/// `-NOAUTH` and `-LOADING` too (valkey-cli exits 0 on an error reply unless given `-e`): it
/// proves the event loop runs, and no credential enters the Pod. A hung server answers
/// nothing, the probe times out, and the kubelet kills the container.
pub const LIVENESS_COMMAND: [&str; 4] = ["valkey-cli", "-s", PROBE_SOCKET, "PING"];

/// Valkey settings every node starts with unless the config sets them, because the roll relies
/// on them: a new replica's full sync starts at once (the operator adds replicas one at a time,
/// so waiting 5 s for others to share the sync only slows every join), and Valkey never moves
/// replicas between shards by itself (the planner places them). Both can be changed live.
pub const ROLL_DEFAULTS: [(&str, &str); 2] = [
    ("repl-diskless-sync-delay", "0"),
    ("cluster-allow-replica-migration", "no"),
];

const ZONE_KEY: &str = "topology.kubernetes.io/zone";
const HOSTNAME_KEY: &str = "kubernetes.io/hostname";

/// Everything in the effective config and cluster spec that forces a node to be replaced: the
/// config's share ([`RollingInputs`], the one rule of a change) and the cluster's placement and
/// TLS Secret. Live-applicable settings, podAnnotations, zoneSpread and scaling are
/// deliberately absent. The JSON is the same field for field as before the config's share was
/// its own type (`the_revision_of_the_same_inputs_never_changes` pins it).
#[derive(Serialize)]
struct RevisionInputs<'a> {
    #[serde(flatten)]
    config: RollingInputs<'a>,
    zones: Vec<&'a str>,
    node_selector: BTreeMap<&'a str, &'a str>,
    tls_secret: Option<&'a str>,
}

/// Renders a cluster's objects from its spec and effective config.
pub struct ClusterRender<'a> {
    pub cluster: &'a ValkeyCluster,
    pub effective: &'a EffectiveConfig,
    /// The operator's `defaultZoneSpread`, for clusters that do not set one.
    pub default_zone_spread: ZoneSpread,
    /// The Kubernetes cluster's DNS domain, in the names TLS nodes announce.
    pub cluster_domain: &'a str,
}

impl ClusterRender<'_> {
    fn spec(&self) -> &ValkeyClusterSpec {
        &self.cluster.spec
    }

    fn name(&self) -> String {
        self.cluster.name_any()
    }

    /// The DNS names of the cluster's nodes (see [`ClusterNames`]).
    pub fn dns_names(&self) -> ClusterNames {
        let namespace = self.cluster.namespace().unwrap_or_default();
        ClusterNames::new(&self.name(), &namespace, self.cluster_domain)
    }

    /// The revision nodes must run; a node whose revision differs is outdated.
    pub fn revision(&self) -> String {
        let placement = self.spec().placement.as_ref();
        let mut zones: Vec<&str> = placement
            .map(|p| p.zones.iter().map(String::as_str).collect())
            .unwrap_or_default();
        zones.sort_unstable();
        zones.dedup();
        let inputs = RevisionInputs {
            config: RollingInputs::of(self.effective),
            zones,
            node_selector: placement
                .map(|p| {
                    p.node_selector
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect()
                })
                .unwrap_or_default(),
            tls_secret: self.spec().tls.as_ref().map(|t| t.secret_ref.as_str()),
        };
        digest_of(&inputs)
    }

    /// The config's Valkey settings over the operator's [`ROLL_DEFAULTS`], under its
    /// [`FORCED`] ones (a config admitted before a setting was forced cannot override it).
    pub fn valkey_settings(&self) -> BTreeMap<String, String> {
        let mut settings: BTreeMap<String, String> = ROLL_DEFAULTS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        settings.extend(self.effective.valkey.clone());
        settings.extend(FORCED.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        settings
    }

    /// Valkey's `cluster-node-timeout` as the nodes run it ([`FORCED`]): how long before
    /// Valkey itself calls a node failing.
    pub fn node_timeout(&self) -> std::time::Duration {
        let millis = self
            .valkey_settings()
            .get("cluster-node-timeout")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(15_000);
        std::time::Duration::from_millis(millis)
    }

    /// The settings applied live with CONFIG SET (changing them rolls nothing).
    pub fn live_settings(&self) -> BTreeMap<String, String> {
        self.valkey_settings()
            .into_iter()
            .filter(|(name, _)| !needs_restart(name))
            .collect()
    }

    /// Labels of every object of this cluster; with a shard, of that shard's objects.
    pub fn labels(&self, shard: Option<i32>) -> BTreeMap<String, String> {
        let mut labels = self.selector(shard);
        labels.extend(self.service_selector());
        labels
    }

    /// What the operator's own objects select the cluster's Pods by (its budget, its
    /// NetworkPolicy, the spread of a shard): labels every version of the operator has put on
    /// them, so an upgrade never leaves a running Pod unselected while its labels catch up.
    fn selector(&self, shard: Option<i32>) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (labels::CLUSTER.to_string(), self.name()),
            (
                labels::MANAGED_BY.to_string(),
                labels::MANAGED_BY_VALUE.to_string(),
            ),
        ]);
        if let Some(shard) = shard {
            labels.insert(labels::SHARD_INDEX.to_string(), shard.to_string());
        }
        labels
    }

    /// The labels the cluster's Service selects its Pods by: Momento's documented pair, so
    /// a selector written for Momento's clusters finds these.
    pub fn service_selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::NAME.to_string(), labels::NAME_VALUE.to_string()),
            (labels::INSTANCE.to_string(), self.name()),
        ])
    }

    /// How a node created now joins: as a replica when it follows a primary; else as a shard's
    /// new primary: for a cluster that was whole (`Active`), the primary of a shard that lost
    /// every node when slots go unserved, of a scale-out's new shard when every slot is
    /// served; and nothing for a cluster's first nodes.
    pub fn join_type(&self, replica: bool) -> Option<JoinType> {
        let status = self.cluster.status.as_ref();
        let active = status.and_then(|s| s.state) == Some(ClusterState::Active);
        let all_served = status.is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == ConditionType::Ready.as_str() && c.status == "True")
        });
        match (replica, active, all_served) {
            (true, _, _) => Some(JoinType::Replica),
            (false, false, _) => None,
            (false, true, false) => Some(JoinType::Primary),
            (false, true, true) => Some(JoinType::Shard),
        }
    }

    /// The uid of the cluster, which every object it owns names as its controller.
    pub fn owner_uid(&self) -> Option<&str> {
        self.cluster.metadata.uid.as_deref()
    }

    fn owner(&self) -> Option<OwnerReference> {
        self.cluster.controller_owner_ref(&())
    }

    /// A new ValkeyNode for `shard`, owned by the cluster.
    pub fn node(&self, name: &str, shard: i32) -> ValkeyNode {
        let revision = self.revision();
        let mut node = ValkeyNode::new(
            name,
            ValkeyNodeSpec {
                cluster: self.name(),
                shard,
                image: self.effective.image.spec.reference(),
                version: self.effective.image.spec.version.clone(),
                revision: revision.clone(),
            },
        );
        node.metadata.namespace = self.cluster.namespace();
        node.metadata.labels = Some(self.labels(Some(shard)));
        node.metadata.owner_references = self.owner().map(|o| vec![o]);
        node
    }

    /// The labels of the Pod that runs `node` in `role`: how the operator's watches, the
    /// Service and the disruption budget find it (put back if someone changes them).
    pub fn pod_labels(&self, node: &ValkeyNode, role: NodeRole) -> BTreeMap<String, String> {
        let mut labels = self.labels(Some(node.spec.shard));
        labels.insert(labels::NODE.to_string(), node.name_any());
        labels.insert(labels::ROLE.to_string(), role_label(role).to_string());
        labels
    }

    /// The Pod that runs `node`, owned by it. `role` is the role it is created for.
    pub fn pod(&self, node: &ValkeyNode, role: NodeRole) -> Pod {
        let shard = node.spec.shard;
        let labels = self.pod_labels(node, role);
        let mut annotations = self.spec().pod_annotations.clone();
        annotations.insert(
            annotations::REVISION.to_string(),
            node.spec.revision.clone(),
        );
        Pod {
            metadata: ObjectMeta {
                name: Some(node.name_any()),
                namespace: node.namespace(),
                labels: Some(labels),
                annotations: Some(annotations),
                owner_references: node.controller_owner_ref(&()).map(|o| vec![o]),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![self.container(&node.name_any(), &node.spec.image)],
                // `<pod>.<cluster>.<namespace>.svc.<domain>` resolves through the headless
                // Service, the name a TLS node announces.
                hostname: Some(node.name_any()),
                subdomain: Some(self.name()),
                volumes: Some(self.volumes()),
                node_selector: self
                    .spec()
                    .placement
                    .as_ref()
                    .map(|p| p.node_selector.clone())
                    .filter(|s| !s.is_empty()),
                affinity: self.zone_affinity(),
                topology_spread_constraints: Some(self.spread_constraints(shard)),
                // What a stopping server needs: a retired node was handed over before, its data
                // goes with the emptyDir. It is also how long a hung server's kill takes: a
                // kubelet kills a single-container Pod that fails its liveness probe with
                // `restartPolicy: Never` as a whole, with the Pod's grace (not the probe's), and
                // a stopped process ignores SIGTERM.
                termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
                tolerations: Some(vec![arm64_toleration()]),
                // Data lives only in memory and an emptyDir: a server restarted in place
                // comes back as the primary of an empty or stale data set, and its replica
                // would then full-sync from it and discard the data it held. A dead server
                // stays dead instead; Valkey fails its shard over and the planner replaces it.
                restart_policy: Some("Never".into()),
                enable_service_links: Some(false),
                // Valkey never talks to the API server.
                automount_service_account_token: Some(false),
                security_context: Some(pod_security()),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn container(&self, pod: &str, image: &str) -> Container {
        Container {
            name: CONTAINER.into(),
            image: Some(image.to_string()),
            command: Some(vec!["valkey-server".into()]),
            args: Some(self.server_args(pod)),
            env: Some(vec![EnvVar {
                name: "POD_IP".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "status.podIP".into(),
                        api_version: None,
                    }),
                    ..Default::default()
                }),
                value: None,
            }]),
            ports: Some(
                PORTS
                    .iter()
                    .map(|(name, port)| ContainerPort {
                        name: Some((*name).into()),
                        container_port: *port,
                        ..Default::default()
                    })
                    .collect(),
            ),
            resources: Some(self.resources()),
            readiness_probe: Some(Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::Int(VALKEY_PORT),
                    host: None,
                }),
                period_seconds: Some(2),
                ..Default::default()
            }),
            liveness_probe: Some(liveness_probe()),
            volume_mounts: Some(self.volume_mounts()),
            security_context: Some(container_security()),
            ..Default::default()
        }
    }

    /// `valkey-server`'s arguments: the cluster-mode basics, TLS when the cluster has it, every
    /// Valkey setting, and last the operator's users (so no setting can come after them).
    fn server_args(&self, pod: &str) -> Vec<String> {
        let plain_port = if self.spec().tls.is_some() {
            0
        } else {
            VALKEY_PORT
        };
        let mut args: Vec<String> = [
            ("--port", plain_port.to_string()),
            ("--bind", "$(POD_IP)".to_string()),
            ("--protected-mode", "no".to_string()),
            ("--daemonize", "no".to_string()),
            ("--dir", DATA_DIR.to_string()),
            ("--cluster-enabled", "yes".to_string()),
            ("--cluster-config-file", format!("{DATA_DIR}/nodes.conf")),
            ("--cluster-announce-ip", "$(POD_IP)".to_string()),
            ("--unixsocket", PROBE_SOCKET.to_string()),
            ("--unixsocketperm", "700".to_string()),
        ]
        .into_iter()
        .chain(self.tls_args(pod))
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect();
        for (name, value) in self.valkey_settings() {
            args.push(format!("--{name}"));
            args.push(value);
        }
        args.extend(["--include".to_string(), format!("{AUTH_DIR}/{AUTH_CONF}")]);
        args
    }

    /// With `spec.tls`: TLS only on the client port (the plain port closed), and for
    /// replication and the cluster bus; clients may present a certificate but need not (they
    /// authenticate with ACL users). The node announces its per-Pod DNS name, which the
    /// certificate's wildcard covers, and redirects name nodes by it, so a client that follows
    /// a `MOVED` can still verify the name it connects to.
    fn tls_args(&self, pod: &str) -> Vec<(&'static str, String)> {
        if self.spec().tls.is_none() {
            return Vec::new();
        }
        let file = tls_file;
        vec![
            ("--tls-port", VALKEY_PORT.to_string()),
            ("--cluster-port", BUS_PORT.to_string()),
            ("--tls-cert-file", file(TLS_CERT)),
            ("--tls-key-file", file(TLS_KEY)),
            ("--tls-ca-cert-file", file(TLS_CA)),
            ("--tls-replication", "yes".into()),
            ("--tls-cluster", "yes".into()),
            ("--tls-auth-clients", "optional".into()),
            ("--cluster-announce-hostname", self.dns_names().node(pod)),
            ("--cluster-preferred-endpoint-type", "hostname".into()),
        ]
    }

    /// The data volume, the `auth.conf` of the credentials Secret, and a TLS cluster's Secret.
    fn volumes(&self) -> Vec<Volume> {
        let mut volumes = vec![
            Volume {
                name: "data".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            Volume {
                name: "auth".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret_name(&self.name())),
                    // Only the file of hashes: the passwords stay in the Secret.
                    items: Some(vec![KeyToPath {
                        key: AUTH_CONF.into(),
                        path: AUTH_CONF.into(),
                        mode: None,
                    }]),
                    default_mode: Some(0o440),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        if let Some(tls) = &self.spec().tls {
            volumes.push(Volume {
                name: "tls".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(tls.secret_ref.clone()),
                    // Readable by the valkey group only (fsGroup), never by others.
                    default_mode: Some(0o440),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        volumes
    }

    fn volume_mounts(&self) -> Vec<VolumeMount> {
        let mut mounts = vec![
            VolumeMount {
                name: "data".into(),
                mount_path: DATA_DIR.into(),
                ..Default::default()
            },
            VolumeMount {
                name: "auth".into(),
                mount_path: AUTH_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
        ];
        if self.spec().tls.is_some() {
            mounts.push(VolumeMount {
                name: "tls".into(),
                mount_path: TLS_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            });
        }
        mounts
    }

    /// What the config sets, as both request and limit: with CPU and memory set, the Pod is
    /// in the Guaranteed QoS class, the last a node under pressure evicts (an evicted Valkey
    /// node loses what it held in memory).
    fn resources(&self) -> ResourceRequirements {
        let resources = &self.effective.resources;
        let set: BTreeMap<_, _> = [("cpu", &resources.cpu), ("memory", &resources.memory)]
            .into_iter()
            .filter_map(|(name, q)| q.clone().map(|q| (name.to_string(), q)))
            .collect();
        let set = (!set.is_empty()).then_some(set);
        ResourceRequirements {
            requests: set.clone(),
            limits: set,
            ..Default::default()
        }
    }

    /// `placement.zones` as a required node affinity on the zone label.
    fn zone_affinity(&self) -> Option<Affinity> {
        let zones = &self.spec().placement.as_ref()?.zones;
        if zones.is_empty() {
            return None;
        }
        Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: ZONE_KEY.into(),
                            operator: "In".into(),
                            values: Some(zones.clone()),
                        }]),
                        match_fields: None,
                    }],
                }),
                preferred_during_scheduling_ignored_during_execution: None,
            }),
            ..Default::default()
        })
    }

    /// A shard's nodes spread over zones (strictly in `required` mode) and, best effort, over
    /// hosts; in `required` mode the whole cluster is also spread softly over zones.
    fn spread_constraints(&self, shard: i32) -> Vec<TopologySpreadConstraint> {
        let spread = self
            .spec()
            .placement
            .as_ref()
            .and_then(|p| p.zone_spread)
            .unwrap_or(self.default_zone_spread);
        let constraint = |key: &str, strict: bool, shard: Option<i32>| TopologySpreadConstraint {
            max_skew: 1,
            topology_key: key.into(),
            when_unsatisfiable: if strict {
                "DoNotSchedule"
            } else {
                "ScheduleAnyway"
            }
            .into(),
            label_selector: Some(LabelSelector {
                match_labels: Some(self.selector(shard)),
                match_expressions: None,
            }),
            ..Default::default()
        };
        let mut constraints = vec![constraint(
            ZONE_KEY,
            spread == ZoneSpread::Required,
            Some(shard),
        )];
        if spread == ZoneSpread::Required {
            constraints.push(constraint(ZONE_KEY, false, None));
        }
        constraints.push(constraint(HOSTNAME_KEY, false, Some(shard)));
        constraints
    }

    /// The headless Service that gives the cluster's Pods DNS names; not-ready Pods are
    /// published too, since a joining node must be reachable before it is ready.
    pub fn headless_service(&self) -> Service {
        Service {
            metadata: self.owned_meta(self.name()),
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
                selector: Some(self.service_selector()),
                publish_not_ready_addresses: Some(true),
                ports: Some(
                    PORTS
                        .iter()
                        .map(|(name, port)| ServicePort {
                            name: Some((*name).into()),
                            port: *port,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// At most one of the cluster's Pods voluntarily disrupted at a time, and none while one
    /// is not ready, given the `pods` the cluster has now (a roll adds one before it retires
    /// one). A whole number for `minAvailable`, because the disruption controller cannot count
    /// the Pods of a ValkeyNode (no scale subresource) for `maxUnavailable` or a percentage and
    /// would then allow nothing. A shard without replicas cannot move without losing its data,
    /// so such a cluster's budget allows no disruption at all: a drain of its Node is carried
    /// out by the eviction webhook and the planner instead (a surge, one handover, a retire).
    pub fn disruption_budget(&self, pods: usize) -> PodDisruptionBudget {
        let desired = self.spec().shards.max(0) as usize
            * (1 + self.spec().replicas_per_shard.max(0) as usize);
        let spare = usize::from(self.spec().replicas_per_shard > 0);
        let min_available = desired.max(pods).saturating_sub(spare);
        PodDisruptionBudget {
            metadata: self.owned_meta(self.name()),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(
                    i32::try_from(min_available).unwrap_or(i32::MAX),
                )),
                selector: Some(LabelSelector {
                    match_labels: Some(self.selector(None)),
                    match_expressions: None,
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// Who may connect: the cluster bus only from the cluster's own Pods; the client port from
    /// Pods of the cluster's namespace, the operator's Pods (in `operator_namespace`) and the
    /// peers in `spec.network.allowedClients`. Everything else is refused where the network
    /// plugin enforces NetworkPolicies.
    pub fn network_policy(&self, operator_namespace: &str) -> NetworkPolicy {
        let port = |number: i32| NetworkPolicyPort {
            port: Some(IntOrString::Int(number)),
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        let selector = |labels: BTreeMap<String, String>| LabelSelector {
            match_labels: Some(labels),
            match_expressions: None,
        };
        let peer =
            |namespace: Option<LabelSelector>, pod: Option<LabelSelector>| NetworkPolicyPeer {
                namespace_selector: namespace,
                pod_selector: pod,
                ip_block: None,
            };
        let one = |key: &str, value: &str| selector([(key.to_string(), value.to_string())].into());
        let mut clients = vec![
            peer(None, Some(selector(BTreeMap::new()))),
            peer(
                Some(one(NAMESPACE_NAME_LABEL, operator_namespace)),
                Some(one(OPERATOR_POD_LABEL.0, OPERATOR_POD_LABEL.1)),
            ),
        ];
        let allowed = self.spec().network.iter().flat_map(|n| &n.allowed_clients);
        clients.extend(allowed.map(|client| {
            peer(
                client
                    .namespace_selector
                    .as_ref()
                    .map(|s| selector(s.match_labels.clone())),
                client
                    .pod_selector
                    .as_ref()
                    .map(|s| selector(s.match_labels.clone())),
            )
        }));
        NetworkPolicy {
            metadata: self.owned_meta(self.name()),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(selector(self.selector(None))),
                policy_types: Some(vec!["Ingress".into()]),
                ingress: Some(vec![
                    NetworkPolicyIngressRule {
                        ports: Some(vec![port(BUS_PORT)]),
                        from: Some(vec![peer(None, Some(selector(self.selector(None))))]),
                    },
                    NetworkPolicyIngressRule {
                        ports: Some(vec![port(VALKEY_PORT)]),
                        from: Some(clients),
                    },
                ]),
                egress: None,
            }),
        }
    }

    fn owned_meta(&self, name: String) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: self.cluster.namespace(),
            labels: Some(self.labels(None)),
            owner_references: self.owner().map(|o| vec![o]),
            ..Default::default()
        }
    }
}

/// The Pod half of the `restricted` Pod Security Standard: the image's unprivileged `valkey`
/// user (the image's own drop from root is skipped, as `command` is set), the runtime's
/// default seccomp profile, and volumes writable by that user's group.
/// Every Valkey Pod may run on a tainted arm64 node pool (Valkey's images are multi-arch); a
/// no-op where no node has the taint. Momento's operator puts the same one on its Pods.
fn arm64_toleration() -> Toleration {
    Toleration {
        key: Some("kubernetes.io/arch".into()),
        operator: Some("Equal".into()),
        value: Some("arm64".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }
}

/// A hung server (its process alive, its event loop not) fails its third probe within about
/// 11 s (the first probe within 3 s of the hang, three failures 3 s apart, each given 2 s), about
/// when Valkey itself gives a silent node up (`cluster-node-timeout` 5 s, then a vote): a server
/// blocked this long is already failed over by its peers. The kubelet then kills it, SIGKILL
/// after the Pod's grace ([`TERMINATION_GRACE_SECONDS`]): within about 21 s in all. With
/// `restartPolicy: Never` the Pod fails, and its shard is taken over like one whose server died.
fn liveness_probe() -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(LIVENESS_COMMAND.iter().map(ToString::to_string).collect()),
        }),
        period_seconds: Some(3),
        timeout_seconds: Some(2),
        failure_threshold: Some(3),
        ..Default::default()
    }
}

fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(VALKEY_UID),
        run_as_group: Some(VALKEY_UID),
        fs_group: Some(VALKEY_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// The container half: no privilege escalation, no capabilities, and a read-only root
/// filesystem (Valkey writes only under [`DATA_DIR`], a volume).
fn container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        ..Default::default()
    }
}

/// The path of one key of a TLS cluster's mounted Secret.
pub fn tls_file(key: &str) -> String {
    format!("{TLS_DIR}/{key}")
}

/// The value of the role label.
pub fn role_label(role: NodeRole) -> &'static str {
    match role {
        NodeRole::Primary => "primary",
        NodeRole::Replica => "replica",
    }
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
