//! Admission end to end: the real operator binary serving webhooks for a real kube-apiserver
//! (built by hack/build-k8s.sh), driven by the real `kubectl` as a user would.

mod support;

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use testenv::ControlPlane;

/// The operator process; killed when the test ends, also when it panics.
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn operator() -> Command {
    Command::new(env!("CARGO_BIN_EXE_valkey-operator"))
}

fn run(mut command: Command, stdin: Option<&[u8]>) -> Output {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `kubectl ARGS` (optionally `-f -` fed from `manifest`); returns success, stdout and stderr.
fn kubectl(plane: &ControlPlane, args: &[&str], manifest: Option<&str>) -> (bool, String, String) {
    let mut command = plane.kubectl();
    command.args(args);
    let output = run(command, manifest.map(str::as_bytes));
    (
        output.status.success(),
        text(&output.stdout),
        text(&output.stderr),
    )
}

fn must(plane: &ControlPlane, args: &[&str], manifest: Option<&str>) -> String {
    let (ok, stdout, stderr) = kubectl(plane, args, manifest);
    assert!(ok, "kubectl {args:?} failed:\n{stdout}\n{stderr}");
    format!("{stdout}{stderr}")
}

fn image(name: &str, version: &str) -> String {
    format!(
        "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyImage\nmetadata:\n  name: {name}\nspec:\n  repository: valkey/valkey\n  tag: \"{version}\"\n  version: \"{version}\"\n"
    )
}

#[tokio::test]
async fn kubectl_meets_the_floor_and_the_fleet_warning() {
    let plane = ControlPlane::start().await.expect("control plane");
    let certs = tempfile::tempdir().unwrap();
    support::write_certificates(certs.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("https://127.0.0.1:{port}");

    // CRDs and webhook configuration, both printed by the binary.
    let crds = run(
        {
            let mut c = operator();
            c.arg("crd");
            c
        },
        None,
    );
    must(
        &plane,
        &["apply", "--server-side", "-f", "-"],
        Some(&text(&crds.stdout)),
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
    let webhooks = run(
        {
            let mut c = operator();
            c.args(["webhook-config", "--url", &url, "--ca-file"])
                .arg(certs.path().join("ca.crt"));
            c
        },
        None,
    );
    assert!(webhooks.status.success(), "{}", text(&webhooks.stderr));

    let log = std::fs::File::create(certs.path().join("operator.log")).unwrap();
    let _operator = Operator(
        operator()
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--namespace",
                "default",
            ])
            .arg("--tls-cert")
            .arg(certs.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(certs.path().join("tls.key"))
            .env("KUBECONFIG", plane.kubeconfig_path())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the operator"),
    );
    let client = support::client_trusting(&certs.path().join("ca.crt"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = client
            .get(format!("https://localhost:{port}/readyz"))
            .send()
            .await;
        if matches!(&ready, Ok(r) if r.status() == 200) {
            break;
        }
        let log = std::fs::read_to_string(certs.path().join("operator.log")).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "operator not ready: {ready:?}\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    must(&plane, &["apply", "-f", "-"], Some(&text(&webhooks.stdout)));

    // The floor, as kubectl shows it.
    let (ok, _, stderr) = kubectl(
        &plane,
        &["apply", "-f", "-"],
        Some(&image("valkey-8-1-4", "8.1.4")),
    );
    assert!(!ok, "an 8.1.4 image was accepted");
    assert!(
        stderr
            .contains("denied the request: spec.version 8.1.4 is below the Valkey 9 floor (9.0.0)"),
        "{stderr}"
    );
    must(
        &plane,
        &["apply", "-f", "-"],
        Some(&image("valkey-9-0-0", "9.0.0")),
    );
    must(
        &plane,
        &["apply", "-f", "-"],
        Some(&image("valkey-9-1-2", "9.1.2")),
    );

    // A shared config, one inheriting from it, a cluster on each (in two namespaces).
    let fleet = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: standard}
spec: {imageRef: valkey-9-0-0, valkey: {maxmemory-policy: allkeys-lru}}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: standard-large}
spec: {baseRef: standard}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: orders, namespace: team-a}
spec: {configRef: standard, shards: 3, replicasPerShard: 1}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: sessions, namespace: team-b}
spec: {configRef: standard-large, shards: 2, replicasPerShard: 1}
"#;
    must(&plane, &["apply", "-f", "-"], Some(fleet));

    // The webhook learns of the clusters through its watch; wait for it with a dry run.
    let patch = [
        "patch",
        "valkeyconfig",
        "standard",
        "--type",
        "merge",
        "-p",
        r#"{"spec": {"imageRef": "valkey-9-1-2"}}"#,
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut dry = patch.to_vec();
        dry.push("--dry-run=server");
        let output = must(&plane, &dry, None);
        if output.contains("rolls 2 ValkeyClusters") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the webhook never saw both clusters: {output}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The guide's own command, verbatim.
    let (ok, stdout, stderr) = kubectl(&plane, &patch, None);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("valkeyconfig.valkey.gomomento.com/standard patched"),
        "{stdout}"
    );
    assert!(
        stderr.contains("Warning: Changing ValkeyConfig standard's image from valkey-9-0-0 (valkey/valkey:9.0.0) to valkey-9-1-2 (valkey/valkey:9.1.2) rolls 2 ValkeyClusters at once: team-a/orders and team-b/sessions."),
        "{stderr}"
    );
    assert!(
        stderr.contains("Warning: All of them start rolling immediately; nothing staggers them"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Warning: To stage instead: duplicate the config"),
        "{stderr}"
    );

    // Guards the API server enforces with our rules and messages.
    let (ok, _, stderr) = kubectl(&plane, &["delete", "valkeyimage", "valkey-9-1-2"], None);
    assert!(
        !ok && stderr.contains("cannot be deleted while 1 ValkeyConfig (standard) use it"),
        "{stderr}"
    );
    let (ok, _, stderr) = kubectl(&plane, &["delete", "valkeyconfig", "standard"], None);
    assert!(!ok && stderr.contains("through spec.baseRef"), "{stderr}");
    let (ok, _, stderr) = kubectl(
        &plane,
        &[
            "patch",
            "valkeycluster",
            "orders",
            "-n",
            "team-a",
            "--type",
            "merge",
            "-p",
            r#"{"spec": {"tls": {"secretRef": "x"}}}"#,
        ],
        None,
    );
    assert!(
        !ok && stderr.contains("spec.tls is set at creation only"),
        "{stderr}"
    );
    let (ok, _, stderr) = kubectl(
        &plane,
        &[
            "patch",
            "valkeycluster",
            "orders",
            "-n",
            "team-a",
            "--type",
            "merge",
            "-p",
            r#"{"spec": {"podAnnotations": {"valkey.gomomento.com/x": "y"}}}"#,
        ],
        None,
    );
    assert!(
        !ok && stderr.contains("reserved for the operator"),
        "{stderr}"
    );

    // Printer columns explain themselves.
    let table = must(&plane, &["get", "valkeyimages"], None);
    assert!(
        table.starts_with("NAME") && table.contains("REPOSITORY") && table.contains("VERSION"),
        "{table}"
    );
    assert!(
        table.contains("valkey-9-1-2   valkey/valkey   9.1.2   9.1.2"),
        "{table}"
    );
    let table = must(&plane, &["get", "vkc", "-A"], None);
    assert!(
        table.contains("CONFIG") && table.contains("SHARDS") && table.contains("OUTDATED"),
        "{table}"
    );
}
