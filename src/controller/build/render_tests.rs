//! Tests of the rendered objects: revision, Pods, Service and PodDisruptionBudget.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::api::{Placement, ValkeyImageSpec};
use crate::fleet::resolve::{Chain, ResolvedImage};
use crate::settings::DEFAULT_CLUSTER_DOMAIN;

fn cluster() -> ValkeyCluster {
    let mut cluster = ValkeyCluster::new(
        "orders",
        ValkeyClusterSpec {
            pod_annotations: BTreeMap::from([("team".to_string(), "payments".to_string())]),
            ..ValkeyClusterSpec::new("standard", 3, 1)
        },
    );
    cluster.metadata.namespace = Some("team-a".into());
    cluster.metadata.uid = Some("cluster-uid".into());
    cluster
}

fn effective(version: &str) -> EffectiveConfig {
    EffectiveConfig {
        chain: Chain(vec!["standard".into()]),
        image: ResolvedImage {
            name: format!("valkey-{version}"),
            spec: ValkeyImageSpec {
                repository: "valkey/valkey".into(),
                tag: version.into(),
                version: version.into(),
            },
        },
        resources: crate::api::NodeResources {
            cpu: Some(Quantity("500m".into())),
            memory: Some(Quantity("1Gi".into())),
        },
        valkey: BTreeMap::from([
            ("maxmemory".to_string(), "768mb".to_string()),
            ("databases".to_string(), "16".to_string()),
        ]),
        acl: Vec::new(),
    }
}

#[test]
fn the_config_overrides_the_roll_defaults() {
    let cluster = cluster();
    let mut tuned = effective("9.0.0");
    tuned
        .valkey
        .insert("repl-diskless-sync-delay".into(), "3".into());
    let render = ClusterRender {
        cluster: &cluster,
        effective: &tuned,
        default_zone_spread: ZoneSpread::BestEffort,
        cluster_domain: DEFAULT_CLUSTER_DOMAIN,
    };
    let settings = render.live_settings();
    assert_eq!(settings["repl-diskless-sync-delay"], "3");
    assert_eq!(settings["cluster-allow-replica-migration"], "no");
    // databases needs a restart: in the arguments, never set live.
    assert!(!settings.contains_key("databases"));
}

#[test]
fn the_forced_node_timeout_wins_over_a_config_admitted_before_it_was_forced() {
    let cluster = cluster();
    let mut old = effective("9.0.0");
    old.valkey
        .insert("cluster-node-timeout".into(), "15000".into());
    let render = render_for(&cluster, &old);
    assert_eq!(render.live_settings()["cluster-node-timeout"], "5000");
    assert_eq!(render.node_timeout(), std::time::Duration::from_secs(5));
    // Applied live: forcing it changes no revision, so no running node is replaced.
    assert_eq!(
        revision(&cluster, &old),
        revision(&cluster, &effective("9.0.0"))
    );
}

#[test]
fn a_node_is_labelled_with_how_it_joined() {
    use crate::api::{ClusterState, JoinType, ValkeyClusterStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    let mut cluster = cluster();
    let effective = effective("9.0.0");
    let first = render_for(&cluster, &effective);
    assert_eq!(first.join_type(false), None, "a cluster's first nodes");
    assert_eq!(first.join_type(true), Some(JoinType::Replica));
    let whole = |served: &str| ValkeyClusterStatus {
        state: Some(ClusterState::Active),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: served.into(),
            reason: "AllSlotsServed".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        }],
        ..Default::default()
    };
    cluster.status = Some(whole("True"));
    let scaled = render_for(&cluster, &effective);
    assert_eq!(
        scaled.join_type(false),
        Some(JoinType::Shard),
        "a scale-out"
    );
    cluster.status = Some(whole("False"));
    let lost = render_for(&cluster, &effective);
    assert_eq!(
        lost.join_type(false),
        Some(JoinType::Primary),
        "a lost shard"
    );
}

/// The render of `cluster` with the operator's default zone spreading.
fn render_for<'a>(cluster: &'a ValkeyCluster, effective: &'a EffectiveConfig) -> ClusterRender<'a> {
    ClusterRender {
        cluster,
        effective,
        default_zone_spread: ZoneSpread::BestEffort,
        cluster_domain: DEFAULT_CLUSTER_DOMAIN,
    }
}

/// The spec of the Pod of a primary of shard 1, rendered for `cluster` on 9.1.2.
fn pod_spec(cluster: &ValkeyCluster) -> PodSpec {
    let effective = effective("9.1.2");
    let render = render_for(cluster, &effective);
    let mut node = render.node("orders-1-a1b2", 1);
    node.metadata.uid = Some("node-uid".into());
    render.pod(&node, NodeRole::Primary).spec.unwrap()
}

/// The Secret behind the Pod's volume `name`, and where its container mounts it.
fn secret_volume(spec: &PodSpec, name: &str) -> (SecretVolumeSource, VolumeMount) {
    let volumes = spec.volumes.iter().flatten();
    let secret = volumes
        .filter(|v| v.name == name)
        .find_map(|v| v.secret.clone());
    let mut mounts = spec.containers[0].volume_mounts.iter().flatten();
    let mount = mounts.find(|m| m.name == name).cloned();
    (secret.unwrap(), mount.unwrap())
}

fn revision(cluster: &ValkeyCluster, effective: &EffectiveConfig) -> String {
    render_for(cluster, effective).revision()
}

#[test]
fn the_revision_moves_only_with_what_forces_a_replacement() {
    let base_cluster = cluster();
    let base = effective("9.0.0");
    let original = revision(&base_cluster, &base);
    assert_eq!(original.len(), 12);

    let mut replaced = Vec::new();
    replaced.push(revision(&base_cluster, &effective("9.1.2")));
    let mut bigger = base.clone();
    bigger.resources.memory = Some(Quantity("2Gi".into()));
    replaced.push(revision(&base_cluster, &bigger));
    let mut restart_setting = base.clone();
    restart_setting
        .valkey
        .insert("databases".into(), "32".into());
    replaced.push(revision(&base_cluster, &restart_setting));
    let mut zoned = base_cluster.clone();
    zoned.spec.placement = Some(Placement {
        zones: vec!["b".into(), "a".into()],
        ..Default::default()
    });
    replaced.push(revision(&zoned, &base));
    for changed in &replaced {
        assert_ne!(changed, &original);
    }

    let mut live_setting = base.clone();
    live_setting.valkey.insert("maxmemory".into(), "1gb".into());
    let mut untouched = base_cluster.clone();
    untouched.spec.shards = 5;
    untouched.spec.replicas_per_shard = 2;
    untouched
        .spec
        .pod_annotations
        .insert("new".into(), "annotation".into());
    untouched.spec.placement = Some(Placement {
        zone_spread: Some(ZoneSpread::Required),
        ..Default::default()
    });
    assert_eq!(revision(&base_cluster, &live_setting), original);
    assert_eq!(revision(&untouched, &base), original);

    // Zone order does not matter.
    let mut reordered = zoned.clone();
    reordered.spec.placement = Some(Placement {
        zones: vec!["a".into(), "b".into(), "a".into()],
        ..Default::default()
    });
    assert_eq!(revision(&reordered, &base), revision(&zoned, &base));
}

#[test]
fn a_pod_runs_the_node_with_its_settings_labels_and_owner() {
    let cluster = cluster();
    let effective = effective("9.1.2");
    let render = render_for(&cluster, &effective);
    let mut node = render.node("orders-1-a1b2", 1);
    assert_eq!(node.spec.version, "9.1.2");
    assert_eq!(node.spec.image, "valkey/valkey:9.1.2");
    assert_eq!(
        node.metadata.owner_references.as_ref().unwrap()[0].kind,
        "ValkeyCluster"
    );
    node.metadata.uid = Some("node-uid".into());

    let pod = render.pod(&node, NodeRole::Replica);
    let labels = pod.metadata.labels.clone().unwrap();
    assert_eq!(labels[labels::CLUSTER], "orders");
    assert_eq!(labels[labels::SHARD_INDEX], "1");
    assert_eq!(labels[labels::ROLE], "replica");
    assert_eq!(labels[labels::MANAGED_BY], "valkey-operator");
    // Momento's labels, which its users' NetworkPolicies and dashboards select by.
    assert_eq!(labels[labels::NAME], "valkey");
    assert_eq!(labels[labels::INSTANCE], "orders");
    let annotations = pod.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["team"], "payments");
    assert_eq!(
        annotations[crate::api::annotations::REVISION],
        node.spec.revision
    );
    assert_eq!(pod.metadata.owner_references.unwrap()[0].kind, "ValkeyNode");

    let spec = pod.spec.unwrap();
    // A dead server is never restarted in place as a primary with lost data.
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let container = &spec.containers[0];
    assert_eq!(container.image.as_deref(), Some("valkey/valkey:9.1.2"));
    let args = container.args.clone().unwrap().join(" ");
    assert!(args.contains("--bind $(POD_IP)"), "{args}");
    assert!(args.contains("--cluster-announce-ip $(POD_IP)"), "{args}");
    assert!(args.contains("--cluster-enabled yes"), "{args}");
    assert!(args.contains("--databases 16 --maxmemory 768mb"), "{args}");
    assert!(args.contains("--repl-diskless-sync-delay 0"), "{args}");
    assert!(
        args.contains("--cluster-allow-replica-migration no"),
        "{args}"
    );
    let env = &container.env.as_ref().unwrap()[0];
    assert_eq!(
        env.value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "status.podIP"
    );
    // Requests equal to limits: the Guaranteed QoS class.
    let resources = container.resources.as_ref().unwrap();
    assert_eq!(
        resources.requests.as_ref().unwrap()["cpu"],
        Quantity("500m".into())
    );
    assert_eq!(resources.limits, resources.requests);
    let ports: Vec<_> = container
        .ports
        .iter()
        .flatten()
        .map(|p| p.name.clone())
        .collect();
    assert_eq!(ports, [Some("valkey".into()), Some("valkey-bus".into())]);
    let toleration = &spec.tolerations.as_ref().unwrap()[0];
    assert_eq!(
        (toleration.key.as_deref(), toleration.value.as_deref()),
        (Some("kubernetes.io/arch"), Some("arm64"))
    );
    assert_eq!(toleration.effect.as_deref(), Some("NoSchedule"));
    assert_eq!(
        render.live_settings().keys().collect::<Vec<_>>(),
        [
            "cluster-allow-replica-migration",
            "cluster-node-timeout",
            "maxmemory",
            "repl-diskless-sync-delay"
        ]
    );
}

#[test]
fn placement_becomes_affinity_and_spread() {
    let mut cluster = cluster();
    let effective = effective("9.0.0");
    let spreads = |cluster: &ValkeyCluster, default| {
        let render = ClusterRender {
            cluster,
            effective: &effective,
            default_zone_spread: default,
            cluster_domain: DEFAULT_CLUSTER_DOMAIN,
        };
        let mut node = render.node("orders-0-x", 0);
        node.metadata.uid = Some("u".into());
        render.pod(&node, NodeRole::Primary).spec.unwrap()
    };
    let best_effort = spreads(&cluster, ZoneSpread::BestEffort);
    assert!(best_effort.affinity.is_none());
    let constraints = best_effort.topology_spread_constraints.unwrap();
    let modes: Vec<_> = constraints
        .iter()
        .map(|c| (c.topology_key.as_str(), c.when_unsatisfiable.as_str()))
        .collect();
    assert_eq!(
        modes,
        [
            (ZONE_KEY, "ScheduleAnyway"),
            (HOSTNAME_KEY, "ScheduleAnyway")
        ]
    );

    // The operator's default applies when the cluster sets none.
    let required = spreads(&cluster, ZoneSpread::Required)
        .topology_spread_constraints
        .unwrap();
    let modes: Vec<_> = required
        .iter()
        .map(|c| (c.topology_key.as_str(), c.when_unsatisfiable.as_str()))
        .collect();
    assert_eq!(
        modes,
        [
            (ZONE_KEY, "DoNotSchedule"),
            (ZONE_KEY, "ScheduleAnyway"),
            (HOSTNAME_KEY, "ScheduleAnyway")
        ]
    );
    let per_shard = required[0]
        .label_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert_eq!(per_shard[labels::SHARD_INDEX], "0");
    let cluster_wide = required[1]
        .label_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert!(!cluster_wide.contains_key(labels::SHARD_INDEX));

    cluster.spec.placement = Some(Placement {
        zones: vec!["eu-1a".into(), "eu-1b".into()],
        zone_spread: Some(ZoneSpread::BestEffort),
        primary_spread: None,
        node_selector: BTreeMap::from([("pool".to_string(), "valkey".to_string())]),
    });
    let placed = spreads(&cluster, ZoneSpread::Required);
    let term = &placed
        .affinity
        .unwrap()
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()
        .node_selector_terms[0];
    let requirement = &term.match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (requirement.key.as_str(), requirement.operator.as_str()),
        (ZONE_KEY, "In")
    );
    assert_eq!(
        requirement.values.as_deref(),
        Some(&["eu-1a".to_string(), "eu-1b".to_string()][..])
    );
    assert_eq!(placed.node_selector.unwrap()["pool"], "valkey");
    assert_eq!(
        placed.topology_spread_constraints.unwrap()[0].when_unsatisfiable,
        "ScheduleAnyway"
    );
}

#[test]
fn service_and_budget_select_the_cluster() {
    let cluster = cluster();
    let effective = effective("9.0.0");
    let render = render_for(&cluster, &effective);
    let service = render.headless_service();
    let spec = service.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.publish_not_ready_addresses, Some(true));
    let selector = spec.selector.unwrap();
    assert_eq!(
        selector,
        BTreeMap::from([
            (labels::NAME.to_string(), "valkey".to_string()),
            (labels::INSTANCE.to_string(), "orders".to_string()),
        ])
    );
    let named: Vec<_> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| p.name.clone())
        .collect();
    assert_eq!(named, [Some("valkey".into()), Some("valkey-bus".into())]);
    assert_eq!(service.metadata.owner_references.unwrap()[0].name, "orders");
    let budget = render.disruption_budget(0).spec.unwrap();
    assert_eq!(budget.max_unavailable, None);
}

#[test]
fn the_budget_allows_one_disruption_of_the_pods_there_are_and_none_without_replicas() {
    let mut cluster = cluster();
    cluster.spec.shards = 3;
    cluster.spec.replicas_per_shard = 1;
    let effective = effective("9.0.0");
    let min_available = |cluster: &ValkeyCluster, pods: usize| {
        let render = ClusterRender {
            cluster,
            effective: &effective,
            default_zone_spread: ZoneSpread::BestEffort,
            cluster_domain: DEFAULT_CLUSTER_DOMAIN,
        };
        render.disruption_budget(pods).spec.unwrap().min_available
    };
    // Bootstrap (fewer Pods than desired), settled, and mid-roll (one extra replica).
    assert_eq!(min_available(&cluster, 2), Some(IntOrString::Int(5)));
    assert_eq!(min_available(&cluster, 6), Some(IntOrString::Int(5)));
    assert_eq!(min_available(&cluster, 7), Some(IntOrString::Int(6)));
    cluster.spec.replicas_per_shard = 0;
    assert_eq!(min_available(&cluster, 3), Some(IntOrString::Int(3)));
}

#[test]
fn a_pod_passes_the_restricted_pod_security_standard() {
    let spec = pod_spec(&cluster());
    assert_eq!(spec.automount_service_account_token, Some(false));
    let pod = spec.security_context.unwrap();
    assert_eq!(pod.run_as_non_root, Some(true));
    assert_ne!(pod.run_as_user, Some(0));
    assert_eq!(pod.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let container = spec.containers[0].security_context.clone().unwrap();
    assert_eq!(container.allow_privilege_escalation, Some(false));
    assert_eq!(
        container.capabilities.unwrap().drop,
        Some(vec!["ALL".to_string()])
    );
    assert_eq!(container.read_only_root_filesystem, Some(true));
    // With a read-only root, everything Valkey writes is under a volume.
    let mounts = spec.containers[0].volume_mounts.clone().unwrap();
    let args = spec.containers[0].args.clone().unwrap().join(" ");
    assert!(args.contains(&format!("--dir {DATA_DIR}")), "{args}");
    assert!(mounts.iter().any(|m| m.mount_path == DATA_DIR));
}

#[test]
fn the_network_policy_keeps_the_bus_to_the_cluster_and_names_every_client() {
    let mut cluster = cluster();
    cluster.spec.network = Some(crate::api::ClusterNetwork {
        allowed_clients: vec![crate::api::ClientPeer {
            namespace_selector: Some(crate::api::MatchLabels {
                match_labels: BTreeMap::from([("team".to_string(), "web".to_string())]),
            }),
            pod_selector: None,
        }],
    });
    let effective = effective("9.1.2");
    let render = render_for(&cluster, &effective);
    let policy = render.network_policy("valkey-operator");
    assert_eq!(policy.metadata.name.as_deref(), Some("orders"));
    assert_eq!(
        policy.metadata.owner_references.unwrap()[0].uid,
        "cluster-uid"
    );
    let spec = policy.spec.unwrap();
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    // The operator's own selector, not Momento's labels: Pods of an older operator have it.
    let ours = BTreeMap::from([
        (labels::CLUSTER.to_string(), "orders".to_string()),
        (
            labels::MANAGED_BY.to_string(),
            "valkey-operator".to_string(),
        ),
    ]);
    assert_eq!(spec.pod_selector.unwrap().match_labels, Some(ours.clone()));
    let rules = spec.ingress.unwrap();
    let port_of =
        |rule: &NetworkPolicyIngressRule| rule.ports.as_ref().unwrap()[0].port.clone().unwrap();
    assert_eq!(rules.len(), 2);

    assert_eq!(port_of(&rules[0]), IntOrString::Int(BUS_PORT));
    let bus = rules[0].from.clone().unwrap();
    assert_eq!(bus.len(), 1);
    assert_eq!(bus[0].namespace_selector, None, "same namespace only");
    assert_eq!(
        bus[0].pod_selector.clone().unwrap().match_labels,
        Some(ours)
    );

    assert_eq!(port_of(&rules[1]), IntOrString::Int(VALKEY_PORT));
    let clients = rules[1].from.clone().unwrap();
    let labels_of = |selector: &Option<LabelSelector>| {
        selector
            .as_ref()
            .map(|s| s.match_labels.clone().unwrap_or_default())
    };
    let described: Vec<_> = clients
        .iter()
        .map(|peer| {
            (
                labels_of(&peer.namespace_selector),
                labels_of(&peer.pod_selector),
            )
        })
        .collect();
    let map = |key: &str, value: &str| Some(BTreeMap::from([(key.to_string(), value.to_string())]));
    assert_eq!(
        described,
        [
            (None, Some(BTreeMap::new())),
            (
                map("kubernetes.io/metadata.name", "valkey-operator"),
                map("app.kubernetes.io/name", "valkey-operator")
            ),
            (map("team", "web"), None),
        ]
    );
}

#[test]
fn a_tls_cluster_serves_tls_only_with_its_secret_mounted_read_only() {
    let mut cluster = cluster();
    cluster.spec.tls = Some(crate::api::ClusterTls {
        secret_ref: "orders-tls".into(),
    });
    let spec = pod_spec(&cluster);
    let args = spec.containers[0].args.clone().unwrap().join(" ");
    for expected in [
        "--port 0 ",
        "--tls-port 6379",
        "--cluster-port 16379",
        "--tls-cert-file /etc/valkey/tls/tls.crt",
        "--tls-key-file /etc/valkey/tls/tls.key",
        "--tls-ca-cert-file /etc/valkey/tls/ca.crt",
        "--tls-replication yes",
        "--tls-cluster yes",
        // The per-Pod name the certificate's wildcard covers, in redirects too.
        "--cluster-announce-hostname orders-1-a1b2.orders.team-a.svc.cluster.local",
        "--cluster-preferred-endpoint-type hostname",
    ] {
        assert!(args.contains(expected), "{expected}: {args}");
    }
    // ... which resolves through the headless Service named after the cluster.
    assert_eq!(spec.hostname.as_deref(), Some("orders-1-a1b2"));
    assert_eq!(spec.subdomain.as_deref(), Some("orders"));
    let (secret, mount) = secret_volume(&spec, "tls");
    assert_eq!(secret.secret_name.as_deref(), Some("orders-tls"));
    assert_eq!(secret.default_mode, Some(0o440));
    assert_eq!(mount.mount_path, TLS_DIR);
    assert_eq!(mount.read_only, Some(true));

    // Without TLS, none of it.
    let spec = pod_spec(&super::tests::cluster());
    let args = spec.containers[0].args.clone().unwrap().join(" ");
    assert!(
        args.contains("--port 6379") && !args.contains("tls") && !args.contains("hostname"),
        "{args}"
    );
    let volumes: Vec<String> = spec.volumes.unwrap().into_iter().map(|v| v.name).collect();
    assert_eq!(volumes, ["data", "auth"]);
}

#[test]
fn every_node_starts_with_only_the_auth_conf_of_its_credentials_secret() {
    let spec = pod_spec(&cluster());
    let args = spec.containers[0].args.clone().unwrap();
    assert_eq!(
        args[args.len() - 2..],
        ["--include", "/etc/valkey/auth/auth.conf"],
        "last, so no setting comes after the operator's users"
    );
    let (secret, mount) = secret_volume(&spec, "auth");
    assert_eq!(secret.secret_name.as_deref(), Some("orders-credentials"));
    let items: Vec<(String, String)> = secret
        .items
        .unwrap()
        .into_iter()
        .map(|i| (i.key, i.path))
        .collect();
    assert_eq!(
        items,
        [("auth.conf".to_string(), "auth.conf".to_string())],
        "never the passwords"
    );
    assert_eq!(secret.default_mode, Some(0o440));
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        (AUTH_DIR, Some(true))
    );
    // The password is nowhere in the Pod.
    let env = serde_json::to_string(&spec.containers[0]).unwrap();
    assert!(!env.contains("masterauth"), "{env}");
}

#[test]
fn every_pod_is_probed_for_liveness_on_the_servers_socket_with_or_without_tls() {
    let mut tls = cluster();
    tls.spec.tls = Some(crate::api::ClusterTls {
        secret_ref: "orders-tls".into(),
    });
    for cluster in [cluster(), tls] {
        let spec = pod_spec(&cluster);
        let container = &spec.containers[0];
        let args = container.args.clone().unwrap().join(" ");
        assert!(
            args.contains(&format!("--unixsocket {PROBE_SOCKET} --unixsocketperm 700")),
            "{args}"
        );
        // The socket is in the data folder, which the container mounts.
        let mounts = container.volume_mounts.iter().flatten();
        assert!(
            mounts
                .filter(|m| m.name == "data")
                .any(|m| PROBE_SOCKET.starts_with(&format!("{}/", m.mount_path)))
        );
        let probe = container.liveness_probe.clone().unwrap();
        assert_eq!(
            probe.exec.unwrap().command.unwrap(),
            ["valkey-cli", "-s", PROBE_SOCKET, "PING"]
        );
        // Killed within the bound the docs give: 3 failures 3 s apart, 2 s each, then the
        // Pod's grace.
        assert_eq!(
            (
                probe.period_seconds,
                probe.timeout_seconds,
                probe.failure_threshold
            ),
            (Some(3), Some(2), Some(3))
        );
        assert_eq!(spec.termination_grace_period_seconds, Some(10));
    }
}

/// A node's revision is what tells the controller it is outdated: the same inputs must give
/// the same revision across operator versions, or upgrading the operator rolls the fleet.
#[test]
fn the_revision_of_the_same_inputs_never_changes() {
    let mut zoned = cluster();
    zoned.spec.placement = Some(Placement {
        zones: vec!["b".into(), "a".into()],
        node_selector: BTreeMap::from([("disk".to_string(), "ssd".to_string())]),
        ..Default::default()
    });
    assert_eq!(revision(&cluster(), &effective("9.0.0")), "50030eea1e47");
    assert_eq!(revision(&zoned, &effective("9.1.2")), "6d5864d0123c");
}
