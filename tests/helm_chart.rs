//! The Helm chart (`charts/valkey-operator`) with the real helm, kubectl and control plane:
//! lint and render; a server-side dry run of everything it renders; schema refusals; install;
//! the operator binary running under only the chart's ServiceAccount and RBAC; a removed verb
//! keeping it unready; upgrade with a stable CA; uninstall.
//!
//! No kubelet runs the operator's container image (there is no container runtime), so the
//! Deployment's pods never start and the chart's Service has no endpoints. The tests run the
//! operator binary as a local process instead, with the chart's identity (a token of its
//! ServiceAccount) and the chart's generated certificate, and re-point the chart's webhook
//! configuration from the Service to that process by URL.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use testenv::ControlPlane;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/valkey-operator");
const NAMESPACE: &str = "valkey-system";
const RELEASE: &str = "valkey-operator";
const GROUP: &str = "valkey.gomomento.com";

/// Runs a command, feeding `stdin`; returns success and stdout+stderr.
fn run(mut command: Command, stdin: Option<&str>) -> (bool, String) {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The real helm, with its own config/cache folders and (optionally) a control plane.
struct Helm {
    bin: PathBuf,
    kubeconfig: Option<PathBuf>,
    home: tempfile::TempDir,
}

impl Helm {
    fn new(bin_dir: &Path, kubeconfig: Option<&Path>) -> Self {
        Self {
            bin: bin_dir.join("helm"),
            kubeconfig: kubeconfig.map(Path::to_path_buf),
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn run(&self, args: &[&str]) -> (bool, String) {
        let mut command = Command::new(&self.bin);
        for (variable, folder) in [
            ("HELM_CACHE_HOME", "cache"),
            ("HELM_CONFIG_HOME", "config"),
            ("HELM_DATA_HOME", "data"),
        ] {
            command.env(variable, self.home.path().join(folder));
        }
        if let Some(kubeconfig) = &self.kubeconfig {
            command.arg("--kubeconfig").arg(kubeconfig);
        }
        command.args(args);
        run(command, None)
    }

    fn must(&self, args: &[&str]) -> String {
        let (ok, output) = self.run(args);
        assert!(ok, "helm {args:?} failed:\n{output}");
        output
    }
}

fn kubectl(plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut command = plane.kubectl();
    command.args(args);
    run(command, stdin)
}

fn must(plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, output) = kubectl(plane, args, stdin);
    assert!(ok, "kubectl {args:?} failed:\n{output}");
    output
}

fn get_json(plane: &ControlPlane, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["-o", "json"]);
    let output = plane.kubectl().args(&args).output().expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Every document of a multi-document YAML stream.
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
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

    let objects = render(&helm, &[]);

    // The Deployment: hardened, probed over HTTPS, serving on 8443 with the mounted certificate.
    let deployment = find(&objects, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
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
            "--tls-cert",
            "/tls/tls.crt",
            "--tls-key",
            "/tls/tls.key"
        ])
    );
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(container[probe]["httpGet"]["path"], path);
        assert_eq!(container[probe]["httpGet"]["scheme"], "HTTPS");
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

    // The webhook configuration has exactly the rules the binary's own `webhook-config` prints,
    // and trusts the CA in the generated Secret.
    let certificates = tempfile::tempdir().unwrap();
    support::write_certificates(certificates.path());
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
        assert_eq!(chart["rules"][0]["apiGroups"], json!([GROUP]));
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
            .contains(&json!("valkey-operator.valkey-system.svc"))
    );
    assert_eq!(find(&objects, "Issuer")["spec"]["selfSigned"], json!({}));
    let configuration = find(&objects, "ValidatingWebhookConfiguration");
    assert_eq!(
        configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "valkey-system/valkey-operator-serving"
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
        "valkey-operator.valkey-system.svc"
    );
    assert_eq!(
        endpoint["tlsConfig"]["ca"]["secret"],
        json!({"name": "valkey-operator-tls", "key": "ca.crt"})
    );
}

/// A control plane with the chart's CRDs established and the release namespace created.
async fn control_plane_with_crds() -> (ControlPlane, Helm) {
    let plane = ControlPlane::start().await.expect("control plane");
    must(
        &plane,
        &[
            "apply",
            "--server-side",
            "-f",
            &format!("{CHART}/crds/crds.yaml"),
        ],
        None,
    );
    must(
        &plane,
        &[
            "wait",
            "--for",
            "condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
        None,
    );
    must(&plane, &["create", "namespace", NAMESPACE], None);
    // The strictest Pod Security Standard: the API server warns about a Deployment whose pods
    // it would refuse.
    must(
        &plane,
        &[
            "label",
            "namespace",
            NAMESPACE,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/warn=restricted",
        ],
        None,
    );
    let helm = Helm::new(plane.bin_dir(), Some(plane.kubeconfig_path()));
    (plane, helm)
}

/// `helm install` with an extra IP in the certificate, so the local operator process can serve
/// the chart's certificate on https://127.0.0.1.
fn install(helm: &Helm, extra: &[&str]) {
    let mut args = vec![
        "install",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--set",
        "certificate.extraIpAddresses={127.0.0.1}",
        "--timeout",
        "60s",
    ];
    args.extend(extra);
    let output = helm.must(&args);
    assert!(output.contains("STATUS: deployed"), "{output}");
}

/// A Secret's key, decoded.
fn secret_key(plane: &ControlPlane, secret: &str, key: &str) -> String {
    let template = format!("{{{{index .data \"{key}\" | base64decode}}}}");
    must(
        plane,
        &[
            "get",
            "secret",
            secret,
            "-n",
            NAMESPACE,
            "-o",
            &format!("go-template={template}"),
        ],
        None,
    )
}

/// What the operator process needs from the installed chart: its certificate files and a
/// kubeconfig that authenticates as its ServiceAccount (and nothing else).
struct ChartIdentity {
    dir: tempfile::TempDir,
}

impl ChartIdentity {
    fn from_release(plane: &ControlPlane) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for key in ["ca.crt", "tls.crt", "tls.key"] {
            std::fs::write(
                dir.path().join(key),
                secret_key(plane, "valkey-operator-tls", key),
            )
            .unwrap();
        }
        let token = must(
            plane,
            &["create", "token", RELEASE, "-n", NAMESPACE, "--duration=1h"],
            None,
        );
        let admin: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(plane.kubeconfig_path()).unwrap())
                .unwrap();
        let ca_data = admin["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .expect("the admin kubeconfig's CA");
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "testenv", "cluster": {
                "server": plane.server_url(),
                "certificate-authority-data": ca_data,
            }}],
            "users": [{"name": "valkey-operator", "user": {"token": token.trim()}}],
            "contexts": [{"name": "chart", "context": {"cluster": "testenv", "user": "valkey-operator"}}],
            "current-context": "chart",
        });
        std::fs::write(
            dir.path().join("kubeconfig"),
            serde_yaml::to_string(&kubeconfig).unwrap(),
        )
        .unwrap();
        Self { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// `kubectl auth can-i` as the chart's ServiceAccount.
    fn can_i(&self, plane: &ControlPlane, args: &[&str]) -> bool {
        let mut command = Command::new(plane.bin_dir().join("kubectl"));
        command
            .env("KUBECONFIG", self.path("kubeconfig"))
            .args(["auth", "can-i"])
            .args(args);
        // The answer is on stdout; warnings (e.g. about cluster-scoped kinds) go to stderr.
        let output = command.output().expect("run kubectl auth can-i");
        String::from_utf8_lossy(&output.stdout).trim() == "yes"
    }
}

/// The operator binary as a local process; killed when dropped, also when the test panics.
struct Operator {
    child: Child,
    url: String,
    log: PathBuf,
    client: reqwest::Client,
}

impl Operator {
    fn start(identity: &ChartIdentity, log_name: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = identity.path(log_name);
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_valkey-operator"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--namespace", NAMESPACE])
            .arg("--tls-cert")
            .arg(identity.path("tls.crt"))
            .arg("--tls-key")
            .arg(identity.path("tls.key"))
            .env("KUBECONFIG", identity.path("kubeconfig"))
            .env("RUST_LOG", "info")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start the operator");
        Self {
            child,
            url: format!("https://127.0.0.1:{port}"),
            log,
            // Verifies the chart's certificate against the chart's CA, by its 127.0.0.1 SAN.
            client: support::client_trusting(&identity.path("ca.crt")),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/readyz`'s status and body; `None` while nothing answers.
    async fn readyz(&self) -> Option<(u16, String)> {
        let response = self
            .client
            .get(format!("{}/readyz", self.url))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.unwrap_or_default()))
    }

    async fn wait_ready(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let answer = self.readyz().await;
            if matches!(&answer, Some((200, _))) {
                return;
            }
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the operator exited:\n{}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "operator not ready after {within:?}: {answer:?}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Points each of the chart's webhooks at `base_url` (same path, same caBundle) instead of the
/// Service, which has no endpoints here. Returns the chart's client configurations, for
/// [`restore_webhooks`].
fn repoint_webhooks(plane: &ControlPlane, base_url: &str) -> Vec<Value> {
    let configuration = get_json(plane, &["get", "validatingwebhookconfiguration", RELEASE]);
    let originals: Vec<Value> = configuration["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|webhook| webhook["clientConfig"].clone())
        .collect();
    let repointed = originals
        .iter()
        .map(|client| {
            let path = client["service"]["path"].as_str().expect("a Service path");
            json!({"url": format!("{base_url}{path}"), "caBundle": client["caBundle"]})
        })
        .collect();
    replace_client_configs(plane, repointed);
    originals
}

/// Puts the chart's own client configurations back, so `helm upgrade` patches what it installed
/// (its three-way merge would add the Service beside the test's URL, which the API refuses).
fn restore_webhooks(plane: &ControlPlane, originals: Vec<Value>) {
    replace_client_configs(plane, originals);
}

fn replace_client_configs(plane: &ControlPlane, client_configs: Vec<Value>) {
    let operations: Vec<Value> = client_configs
        .into_iter()
        .enumerate()
        .map(|(index, client)| {
            json!({"op": "replace", "path": format!("/webhooks/{index}/clientConfig"), "value": client})
        })
        .collect();
    must(
        plane,
        &[
            "patch",
            "validatingwebhookconfiguration",
            RELEASE,
            "--type",
            "json",
            "-p",
            &serde_json::to_string(&operations).unwrap(),
        ],
        None,
    );
}

fn image(name: &str, version: &str) -> String {
    format!(
        "apiVersion: {GROUP}/v1alpha1\nkind: ValkeyImage\nmetadata:\n  name: {name}\nspec:\n  repository: valkey/valkey\n  tag: \"{version}\"\n  version: \"{version}\"\n"
    )
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

    install(&helm, &[]);
    let identity = ChartIdentity::from_release(&plane);
    // The token carries exactly the chart's RBAC: what the operator reads, nothing more.
    assert!(identity.can_i(&plane, &["list", "valkeyconfigs.valkey.gomomento.com"]));
    assert!(identity.can_i(
        &plane,
        &["get", "configmap/valkey-operator-config", "-n", NAMESPACE]
    ));
    assert!(!identity.can_i(&plane, &["create", "valkeyimages.valkey.gomomento.com"]));
    assert!(!identity.can_i(&plane, &["get", "secrets", "-n", NAMESPACE]));
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
    // name exactly the cache the missing verb starves.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = None;
    while Instant::now() < deadline {
        let answer = operator.readyz().await;
        if let Some((status, body)) = &answer {
            assert_eq!(*status, 503, "ready without list on valkeyconfigs: {body}");
        }
        assert!(
            operator.child.try_wait().unwrap().is_none(),
            "exited:\n{}",
            operator.log()
        );
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
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = operator.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running:\n{}",
            operator.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.success());
    let log = operator.log();
    assert!(
        log.contains("reading ConfigMap valkey-system/valkey-operator-config")
            && log.contains("forbidden"),
        "{log}"
    );
}
