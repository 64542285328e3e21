//! The Helm chart (`charts/valkey-operator`) with the real helm, kubectl and control plane:
//! lint and render; a server-side dry run of everything it renders; the plain manifests
//! (`deploy/operator.yaml`) current and applicable; schema refusals; install;
//! the operator binary running under only the chart's ServiceAccount and RBAC (see
//! `harness::k8s::chart` for how, without a container runtime); a removed verb keeping it unready;
//! upgrade with a stable CA; uninstall.

use std::process::Command;
use std::time::{Duration, Instant};

use harness::https::write_certificates;
use harness::k8s::chart::*;
use harness::{GROUP, eventually, metric};
use serde::Deserialize;
use serde_json::{Value, json};
use testenv::ControlPlane;

/// Every document of a multi-document YAML stream.
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|document| Value::deserialize(document).unwrap())
        .filter(|document| !document.is_null())
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn render(helm: &Helm, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", RELEASE, CHART, "--namespace", NAMESPACE];
    args.extend(extra);
    documents(&helm.must(&args))
}

fn assert_lint_clean(helm: &Helm, extra: &[&str]) {
    let mut args = vec!["lint", CHART, "--strict"];
    args.extend(extra);
    let output = helm.must(&args);
    assert!(
        output.contains("1 chart(s) linted, 0 chart(s) failed")
            && !output.contains("[WARNING]")
            && !output.contains("[ERROR]"),
        "helm lint {extra:?}:\n{output}"
    );
}

#[test]
fn chart_lints_clean_and_renders_what_the_operator_needs() {
    let helm = Helm::new(&testenv::k8s_bin_dir().expect("helm"), None);
    assert_lint_clean(&helm, &[]);
    assert_lint_clean(
        &helm,
        &[
            "--set",
            "certificate.source=certManager",
            "--set",
            "serviceMonitor.enabled=true",
        ],
    );
    assert_lint_clean(
        &helm,
        &[
            "--set",
            "webhook.clientAuth.caSecret=apiserver-webhook-client-ca",
            "--set",
            "networkPolicy.ingressFrom[0].ipBlock.cidr=198.18.0.0/24",
            "--set",
            "metrics.auth=none",
        ],
    );

    let objects = render(&helm, &[]);

    // The Deployment: hardened, serving on 8443 with the mounted certificate, probed over plain
    // HTTP on a port of their own (8081) that a flood of 8443 cannot fill.
    let deployment = find(&objects, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    // Every cluster's NetworkPolicy lets the operator in by this label.
    let (key, value) = valkey_operator::controller::build::render::OPERATOR_POD_LABEL;
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["labels"][key], value,
        "the operator's Pods must carry the label the NetworkPolicies name"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["args"],
        json!([
            "serve",
            "--listen",
            "0.0.0.0:8443",
            "--health-listen",
            "0.0.0.0:8081",
            "--tls-cert",
            "/tls/tls.crt",
            "--tls-key",
            "/tls/tls.key",
            "--max-concurrent-reconciles",
            "16",
            "--metrics-auth",
            "kubernetes"
        ])
    );
    let tuned = render(&helm, &["--set", "operator.maxConcurrentReconciles=40"]);
    let args = &find(&tuned, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(args[10], "40", "{args}");
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(container[probe]["httpGet"]["path"], path);
        assert_eq!(container[probe]["httpGet"]["scheme"], "HTTP");
        assert_eq!(container[probe]["httpGet"]["port"], "probes");
    }
    for kind in ["requests", "limits"] {
        assert!(container["resources"][kind]["cpu"].is_string(), "{kind}");
        assert!(container["resources"][kind]["memory"].is_string(), "{kind}");
    }
    let namespace_env = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "POD_NAMESPACE")
        .expect("POD_NAMESPACE");
    assert_eq!(
        namespace_env["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    let service = find(&objects, "Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 443);
    assert_eq!(container["ports"][0]["containerPort"], 8443);
    assert_eq!(container["ports"][1]["containerPort"], 8081);

    // RBAC without wildcards.
    for kind in ["ClusterRole", "Role"] {
        for rule in find(&objects, kind)["rules"].as_array().unwrap() {
            for field in ["apiGroups", "resources", "verbs"] {
                assert!(
                    !rule[field].as_array().unwrap().contains(&json!("*")),
                    "{kind} rule with a wildcard: {rule}"
                );
            }
        }
    }
    // Who may read /metrics: a ClusterRole to bind to Prometheus, and the reviews it needs.
    let reader = objects
        .iter()
        .find(|o| {
            o["kind"] == "ClusterRole" && o["metadata"]["name"] == "valkey-operator-metrics-reader"
        })
        .expect("the metrics-reader ClusterRole");
    assert_eq!(
        reader["rules"],
        json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let operator_rules = find(&objects, "ClusterRole")["rules"].to_string();
    for resource in ["tokenreviews", "subjectaccessreviews", "nodes"] {
        assert!(
            operator_rules.contains(resource),
            "{resource}: {operator_rules}"
        );
    }

    // The operator's own NetworkPolicy: only its HTTPS port, from anyone unless narrowed.
    let policy = find(&objects, "NetworkPolicy");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"][0]["ports"],
        json!([{"port": 8443, "protocol": "TCP"}])
    );
    assert!(policy["spec"]["ingress"][0]["from"].is_null());
    let narrowed = render(
        &helm,
        &[
            "--set",
            "networkPolicy.ingressFrom[0].ipBlock.cidr=198.18.0.0/24",
        ],
    );
    assert_eq!(
        find(&narrowed, "NetworkPolicy")["spec"]["ingress"][0]["from"],
        json!([{"ipBlock": {"cidr": "198.18.0.0/24"}}])
    );
    // The API server's webhook client certificate required, where its CA is given.
    let certified = render(
        &helm,
        &[
            "--set",
            "webhook.clientAuth.caSecret=apiserver-webhook-client-ca",
        ],
    );
    let pod = &find(&certified, "Deployment")["spec"]["template"]["spec"];
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains("\"--webhook-client-ca\",\"/webhook-client-ca/ca.crt\""),
        "{args}"
    );
    assert!(
        pod["volumes"]
            .to_string()
            .contains("apiserver-webhook-client-ca"),
        "{pod}"
    );

    // The webhook configuration has exactly the rules the binary's own `webhook-config` prints,
    // and trusts the CA in the generated Secret.
    let certificates = tempfile::tempdir().unwrap();
    write_certificates(certificates.path());
    let printed = Command::new(env!("CARGO_BIN_EXE_valkey-operator"))
        .args([
            "webhook-config",
            "--url",
            "https://example.invalid",
            "--ca-file",
        ])
        .arg(certificates.path().join("ca.crt"))
        .output()
        .unwrap();
    assert!(printed.status.success());
    let binary = documents(&String::from_utf8(printed.stdout).unwrap());
    let binary_hooks = binary[0]["webhooks"].as_array().unwrap();
    let configuration = find(&objects, "ValidatingWebhookConfiguration");
    let chart_hooks = configuration["webhooks"].as_array().unwrap();
    assert_eq!(chart_hooks.len(), binary_hooks.len());
    let secret = find(&objects, "Secret");
    for (chart, binary) in chart_hooks.iter().zip(binary_hooks) {
        for field in [
            "name",
            "rules",
            "failurePolicy",
            "sideEffects",
            "timeoutSeconds",
            "matchPolicy",
            "admissionReviewVersions",
        ] {
            assert_eq!(chart[field], binary[field], "{field} of {}", binary["name"]);
        }
        let url = binary["clientConfig"]["url"].as_str().unwrap();
        let service = &chart["clientConfig"]["service"];
        assert_eq!(
            format!(
                "https://example.invalid{}",
                service["path"].as_str().unwrap()
            ),
            url
        );
        assert_eq!(service["name"], RELEASE);
        assert_eq!(service["namespace"], NAMESPACE);
        assert_eq!(chart["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
        // Only our group fails closed; evictions of Pods fail open.
        if chart["name"] == format!("evictions.{GROUP}") {
            assert_eq!(chart["rules"][0]["resources"], json!(["pods/eviction"]));
            assert_eq!(chart["failurePolicy"], "Ignore");
        } else {
            assert_eq!(chart["rules"][0]["apiGroups"], json!([GROUP]));
            assert_eq!(chart["failurePolicy"], "Fail");
        }
    }

    // With cert-manager: a Certificate for the Service's names, the CA injected, no Secret.
    let objects = render(
        &helm,
        &[
            "--set",
            "certificate.source=certManager",
            "--set",
            "serviceMonitor.enabled=true",
        ],
    );
    assert!(objects.iter().all(|o| o["kind"] != "Secret"));
    let certificate = find(&objects, "Certificate");
    assert_eq!(certificate["spec"]["secretName"], "valkey-operator-tls");
    assert!(
        certificate["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&json!("valkey-operator.valkey-operator.svc"))
    );
    assert_eq!(find(&objects, "Issuer")["spec"]["selfSigned"], json!({}));
    let configuration = find(&objects, "ValidatingWebhookConfiguration");
    assert_eq!(
        configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "valkey-operator/valkey-operator-serving"
    );
    assert!(
        configuration["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["clientConfig"]["caBundle"].is_null())
    );
    // The ServiceMonitor scrapes HTTPS and verifies the certificate.
    let endpoint = &find(&objects, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(
        endpoint["tlsConfig"]["serverName"],
        "valkey-operator.valkey-operator.svc"
    );
    assert_eq!(
        endpoint["tlsConfig"]["ca"]["secret"],
        json!({"name": "valkey-operator-tls", "key": "ca.crt"})
    );
    // It sends Prometheus's own token, which /metrics asks for.
    assert_eq!(
        endpoint["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
}

#[tokio::test]
async fn chart_installs_upgrades_and_uninstalls_and_the_operator_runs_under_its_rbac() {
    let (plane, helm) = control_plane_with_crds().await;

    // Everything the chart renders is accepted by the real API server.
    let rendered = helm.must(&["template", RELEASE, CHART, "--namespace", NAMESPACE]);
    let dry_run = must(
        &plane,
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&rendered),
    );
    assert!(
        !dry_run.contains("would violate PodSecurity"),
        "the operator pods break the restricted Pod Security Standard:\n{dry_run}"
    );
    for object in [
        "serviceaccount/valkey-operator",
        "configmap/valkey-operator-config",
        "secret/valkey-operator-tls",
        "clusterrole.rbac.authorization.k8s.io/valkey-operator",
        "role.rbac.authorization.k8s.io/valkey-operator",
        "service/valkey-operator",
        "deployment.apps/valkey-operator",
        "poddisruptionbudget.policy/valkey-operator",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/valkey-operator",
    ] {
        assert!(
            dry_run.contains(&format!("{object} created (server dry run)")),
            "{object}:\n{dry_run}"
        );
    }

    // Bad values are refused by the schema before anything is created.
    for (bad, field) in [
        ("replicas=-1", "/replicas"),
        (
            "operator.defaultZoneSpread=sometimes",
            "/operator/defaultZoneSpread",
        ),
        (
            "operator.fleetRollAckThreshold=many",
            "/operator/fleetRollAckThreshold",
        ),
        (
            "operator.maxConcurrentReconciles=0",
            "/operator/maxConcurrentReconciles",
        ),
    ] {
        let (ok, output) = helm.run(&["install", RELEASE, CHART, "-n", NAMESPACE, "--set", bad]);
        assert!(!ok, "{bad} was accepted");
        assert!(
            output.contains("values don't meet the specifications of the schema")
                && output.contains(field),
            "{bad}: {output}"
        );
    }
    assert_eq!(helm.must(&["list", "-n", NAMESPACE, "-q"]).trim(), "");

    let notes = install(&helm, &[]);
    // NOTES.txt says what to do next.
    assert!(
        notes.contains("kubectl -n valkey-operator rollout status deployment/valkey-operator")
            && notes.contains("kind: ValkeyImage")
            && notes.contains("fleetRollAckThreshold=unset"),
        "{notes}"
    );
    let identity = ChartIdentity::from_release(&plane);
    // The token carries exactly the chart's RBAC: what the operator reads, nothing more.
    assert!(identity.can_i(&plane, &["list", "valkeyconfigs.valkey.gomomento.com"]));
    assert!(identity.can_i(
        &plane,
        &["get", "configmap/valkey-operator-config", "-n", NAMESPACE]
    ));
    assert!(!identity.can_i(&plane, &["create", "valkeyimages.valkey.gomomento.com"]));
    // Secrets are read (users' passwordSecretRef), never updated; deleted only in the
    // operator's own namespace (a deleted cluster's private Secrets there), nowhere else.
    assert!(identity.can_i(&plane, &["get", "secrets", "-n", NAMESPACE]));
    assert!(!identity.can_i(&plane, &["update", "secrets", "-n", NAMESPACE]));
    assert!(identity.can_i(&plane, &["delete", "secrets", "-n", NAMESPACE]));
    assert!(!identity.can_i(&plane, &["delete", "secrets", "-n", "default"]));
    assert!(!identity.can_i(&plane, &["get", "configmap/other", "-n", NAMESPACE]));

    let mut operator = Operator::start(&identity, "operator.log");
    operator.wait_ready(Duration::from_secs(60)).await;
    let chart_clients = repoint_webhooks(&plane, &operator.url);

    // The floor refusal, through kubectl, answered by the operator under the chart's identity.
    let (ok, output) = kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&image("valkey-8-1-4", "8.1.4")),
    );
    assert!(!ok, "an 8.1.4 image was accepted");
    assert!(
        output
            .contains("denied the request: spec.version 8.1.4 is below the Valkey 9 floor (9.0.0)"),
        "{output}"
    );
    must(
        &plane,
        &["apply", "-f", "-"],
        Some(&image("valkey-9-0-0", "9.0.0")),
    );

    // Upgrade with a changed setting: the ConfigMap follows, the pods are told to restart, the
    // CA stays the same (so every caBundle stays valid).
    let ca_before = secret_key(&plane, "valkey-operator-tls", "ca.crt");
    let checksum = |plane: &ControlPlane| {
        get_json(plane, &["get", "deployment", RELEASE, "-n", NAMESPACE])["spec"]["template"]
            ["metadata"]["annotations"]["checksum/config"]
            .clone()
    };
    let checksum_before = checksum(&plane);
    restore_webhooks(&plane, chart_clients);
    let output = helm.must(&[
        "upgrade",
        RELEASE,
        CHART,
        "-n",
        NAMESPACE,
        "--reuse-values",
        "--set",
        "operator.fleetRollAckThreshold=3",
    ]);
    assert!(
        output.contains("STATUS: deployed") && output.contains("REVISION: 2"),
        "{output}"
    );
    let config = get_json(
        &plane,
        &[
            "get",
            "configmap",
            "valkey-operator-config",
            "-n",
            NAMESPACE,
        ],
    );
    assert_eq!(config["data"]["fleetRollAckThreshold"], "3");
    assert_ne!(checksum(&plane), checksum_before);
    assert_eq!(
        secret_key(&plane, "valkey-operator-tls", "ca.crt"),
        ca_before
    );
    let configuration = get_json(&plane, &["get", "validatingwebhookconfiguration", RELEASE]);
    let ca_b64 = get_json(
        &plane,
        &["get", "secret", "valkey-operator-tls", "-n", NAMESPACE],
    )["data"]["ca.crt"]
        .clone();
    for webhook in configuration["webhooks"].as_array().unwrap() {
        assert_eq!(webhook["clientConfig"]["caBundle"], ca_b64);
    }

    // A restarted operator reads the new setting, and the re-signed certificate still chains
    // to the same CA (the client trusts only the CA read before the upgrade).
    drop(operator);
    let upgraded = ChartIdentity::from_release(&plane);
    std::fs::copy(identity.path("ca.crt"), upgraded.path("ca.crt")).unwrap();
    let mut operator = Operator::start(&upgraded, "operator-upgraded.log");
    operator.wait_ready(Duration::from_secs(60)).await;
    assert!(
        operator.log().contains("fleet_roll_ack_threshold: Some(3)"),
        "{}",
        operator.log()
    );
    repoint_webhooks(&plane, &operator.url);
    let (ok, output) = kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&image("valkey-8-0-0", "8.0.0")),
    );
    assert!(
        !ok && output.contains("below the Valkey 9 floor"),
        "{output}"
    );
    drop(operator);

    // Uninstall removes what the chart made; the CRDs (and so the users' objects) stay.
    let output = helm.must(&["uninstall", RELEASE, "-n", NAMESPACE, "--timeout", "60s"]);
    assert!(output.contains("uninstalled"), "{output}");
    for (kind, namespaced) in [
        ("validatingwebhookconfiguration", false),
        ("clusterrole", false),
        ("clusterrolebinding", false),
        ("deployment", true),
        ("service", true),
        ("serviceaccount", true),
        ("secret/valkey-operator-tls", true),
        ("configmap/valkey-operator-config", true),
    ] {
        let name = if kind.contains('/') {
            vec![kind]
        } else {
            vec![kind, RELEASE]
        };
        let mut args = vec!["get"];
        args.extend(name);
        if namespaced {
            args.extend(["-n", NAMESPACE]);
        }
        let (ok, output) = kubectl(&plane, &args, None);
        assert!(
            !ok && output.contains("NotFound"),
            "{kind} left behind: {output}"
        );
    }
    must(&plane, &["get", "valkeyimage", "valkey-9-0-0"], None);
}

/// The rule of the chart's ClusterRole for one resource of our group.
fn rule_index(plane: &ControlPlane, resource: &str) -> usize {
    let role = get_json(plane, &["get", "clusterrole", RELEASE]);
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .position(|rule| rule["resources"] == json!([resource]))
        .unwrap_or_else(|| panic!("no rule for {resource}: {role}"))
}

fn set_verbs(plane: &ControlPlane, resource: &str, verbs: &[&str]) {
    set_role_verbs(plane, "clusterrole", rule_index(plane, resource), verbs);
}

/// Replaces the verbs of rule `index` of the chart's `clusterrole` or (namespaced) `role`.
fn set_role_verbs(plane: &ControlPlane, kind: &str, index: usize, verbs: &[&str]) {
    let patch = json!([{
        "op": "replace",
        "path": format!("/rules/{index}/verbs"),
        "value": verbs,
    }]);
    must(
        plane,
        &[
            "patch",
            kind,
            "-n",
            NAMESPACE,
            RELEASE,
            "--type",
            "json",
            "-p",
            &patch.to_string(),
        ],
        None,
    );
}

#[tokio::test]
async fn without_a_needed_verb_the_operator_never_becomes_ready() {
    let (plane, helm) = control_plane_with_crds().await;
    install(&helm, &[]);
    let identity = ChartIdentity::from_release(&plane);

    // The chart's ClusterRole with `list` removed from valkeyconfigs (watch kept).
    set_verbs(&plane, "valkeyconfigs", &["watch"]);
    assert!(!identity.can_i(&plane, &["list", "valkeyconfigs.valkey.gomomento.com"]));

    let mut operator = Operator::start(&identity, "operator.log");
    // Give it far longer than a ready start takes (about a second): it must stay unready, and
    // name exactly the cache the missing verb starves. (A deliberate hold, checked every poll.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = None;
    while Instant::now() < deadline {
        let answer = operator.readyz().await;
        if let Some((status, body)) = &answer {
            assert_eq!(*status, 503, "ready without list on valkeyconfigs: {body}");
        }
        assert!(operator.exited().is_none(), "exited:\n{}", operator.log());
        last = answer;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, body) = last.expect("the operator never answered /readyz");
    assert_eq!(body, "waiting for caches to sync: valkeyconfigs\n");
    let log = operator.log();
    assert!(
        log.contains("forbidden") && log.contains("valkeyconfigs"),
        "the log does not say why:\n{log}"
    );

    // The control: give the verb back, and the same process becomes ready on its own.
    set_verbs(&plane, "valkeyconfigs", &["list", "watch"]);
    operator.wait_ready(Duration::from_secs(90)).await;
    drop(operator);

    // The namespaced Role matters too: without `get` on its ConfigMap the operator stops at
    // start and says which object it could not read.
    let role = get_json(&plane, &["get", "role", RELEASE, "-n", NAMESPACE]);
    let index = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .position(|rule| rule["resources"] == json!(["configmaps"]))
        .expect("a configmaps rule");
    set_role_verbs(&plane, "role", index, &["watch"]);
    let mut operator = Operator::start(&identity, "operator-no-configmap.log");
    let status = eventually(
        "the operator to stop at start",
        Duration::from_secs(30),
        async || operator.exited().ok_or_else(|| operator.log()),
    )
    .await;
    assert!(!status.success());
    let log = operator.log();
    assert!(
        log.contains("reading ConfigMap valkey-operator/valkey-operator-config")
            && log.contains("forbidden"),
        "{log}"
    );
}

/// The controller under the chart's RBAC: without `create` on pods no cluster comes up and the
/// cluster's Degraded condition says why; with the verb back the same process brings it up.
#[tokio::test]
async fn without_pod_create_the_controller_reports_it_and_recovers_once_granted() {
    let (plane, helm) = control_plane_with_crds().await;
    install(&helm, &[]);
    let identity = ChartIdentity::from_release(&plane);
    set_verbs(&plane, "pods", &["list", "watch", "patch", "delete"]);
    assert!(!identity.can_i(&plane, &["create", "pods", "-n", "team-a"]));
    let mut operator = Operator::start(&identity, "operator.log");
    operator.wait_ready(Duration::from_secs(60)).await;
    repoint_webhooks(&plane, &operator.url);
    let _kubelet = testenv::TestKubelet::start(plane.client().await.unwrap(), Default::default())
        .await
        .unwrap();
    let fleet = format!(
        "{}---\n{}",
        image("valkey-9-0-0", "9.0.0"),
        r#"apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: standard}
spec: {imageRef: valkey-9-0-0}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: orders, namespace: team-a}
spec: {configRef: standard, shards: 1, replicasPerShard: 0}
"#
    );
    must(&plane, &["apply", "-f", "-"], Some(&fleet));
    let status = |plane: &ControlPlane| {
        get_json(
            plane,
            &[
                "get",
                "valkeycluster",
                "orders",
                "-n",
                "team-a",
                "-o",
                "json",
            ],
        )["status"]
            .clone()
    };
    let degraded = |status: &Value| {
        status["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Degraded").cloned())
            .unwrap_or(Value::Null)
    };
    eventually(
        "Degraded for the forbidden Pod",
        Duration::from_secs(60),
        async || {
            let status = status(&plane);
            let condition = degraded(&status);
            // (A first pass may also report the config as not yet known: caches are eventually
            // consistent. The condition that must show up is the forbidden Pod.)
            let message = condition["message"].as_str().unwrap_or_default();
            if condition["status"] == "True" && message.contains("pods is forbidden") {
                assert_ne!(status["state"], "Active");
                Ok(())
            } else {
                Err(format!("{status}\n{}", operator.log()))
            }
        },
    )
    .await;
    // The refusal is counted under its real cause, not under the finalizer that wraps every
    // reconcile.
    let text = operator.metrics().await;
    let errors = |category| {
        metric(
            &text,
            "valkey_operator_reconcile_errors_total",
            &[("category", category)],
        )
    };
    assert!(
        errors("kubernetes").is_some_and(|n| n >= 1.0),
        "no reconcile error counted as kubernetes:\n{text}"
    );
    assert_eq!(errors("finalizer"), None, "{text}");

    set_verbs(
        &plane,
        "pods",
        &["list", "watch", "create", "patch", "delete"],
    );
    eventually(
        "Active once granted",
        Duration::from_secs(120),
        async || {
            let status = status(&plane);
            if status["state"] == "Active" {
                Ok(())
            } else {
                Err(format!("{status}\n{}", operator.log()))
            }
        },
    )
    .await;
    assert_eq!(degraded(&status(&plane))["status"], "False");
}

/// `deploy/operator.yaml` is what `make manifests` renders from the chart today, carries no
/// key material (the same on every render), and what it holds, with cert-manager's kinds
/// left out, passes a server-side dry run on a fresh API server.
#[tokio::test]
async fn the_plain_manifests_are_the_charts_and_apply() {
    let root = env!("CARGO_MANIFEST_DIR");
    let render = || {
        let output = Command::new(format!("{root}/hack/render-manifests.sh"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let rendered = render();
    let checked_in = std::fs::read_to_string(format!("{root}/deploy/operator.yaml")).unwrap();
    assert!(
        rendered == checked_in,
        "deploy/operator.yaml is stale: run `make manifests`"
    );
    assert_eq!(render(), rendered, "a render is not reproducible");

    let objects = documents(&rendered);
    assert!(
        objects.iter().all(|o| o["kind"] != "Secret"),
        "key material in the manifests"
    );
    let crds = objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .count();
    assert_eq!(crds, valkey_operator::api::crds().len());
    assert_eq!(
        find(&objects, "Certificate")["spec"]["secretName"],
        "valkey-operator-tls"
    );

    let plane = ControlPlane::start().await.unwrap();
    // A dry run creates nothing: the namespace the objects go to must exist.
    let created = plane
        .kubectl()
        .args(["create", "namespace", "valkey-operator"])
        .output()
        .unwrap();
    assert!(created.status.success(), "{created:?}");
    let applicable: Vec<String> = objects
        .iter()
        .filter(|o| o["kind"] != "Certificate" && o["kind"] != "Issuer")
        .map(|o| serde_yaml_ng::to_string(o).unwrap())
        .collect();
    let mut apply = plane.kubectl();
    apply
        .args(["apply", "--server-side", "--dry-run=server", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = apply.spawn().unwrap();
    std::io::Write::write_all(
        child.stdin.as_mut().unwrap(),
        applicable.join("---\n").as_bytes(),
    )
    .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
