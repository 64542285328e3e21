//! The operator binary as a local process against a testenv control plane, with the admin
//! kubeconfig: CRDs installed from `valkey-operator crd`, development certificates from
//! `valkey-operator certs`, and the webhooks registered by URL from `valkey-operator
//! webhook-config`, as `make dev` does. Killed when dropped, also when the test panics.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use testenv::ControlPlane;

use super::chart::{must, run};

pub struct LocalOperator {
    child: Child,
    log: PathBuf,
    /// Keeps the certificates and the log until the operator is gone.
    _dir: tempfile::TempDir,
}

fn operator_output(args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_valkey-operator"));
    command.args(args);
    let (ok, output) = run(command, None);
    assert!(ok, "valkey-operator {args:?}: {output}");
    output
}

impl LocalOperator {
    /// Installs the CRDs, starts `serve` and waits for `/readyz`, then registers the webhooks.
    pub async fn start(plane: &ControlPlane) -> Self {
        let dir = tempfile::tempdir().unwrap();
        super::write_certificates(dir.path());
        must(
            plane,
            &["apply", "--server-side", "-f", "-"],
            Some(&operator_output(&["crd"])),
        );
        must(
            plane,
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
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.path().join("operator.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_valkey-operator"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--namespace",
                "default",
            ])
            .arg("--tls-cert")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.path().join("tls.key"))
            .env("KUBECONFIG", plane.kubeconfig_path())
            .env("RUST_LOG", "info")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start the operator");
        let client = super::client_trusting(&dir.path().join("ca.crt"));
        let mut operator = Self {
            child,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = client
                .get(format!("https://localhost:{port}/readyz"))
                .send()
                .await;
            if matches!(&ready, Ok(r) if r.status() == 200) {
                break;
            }
            assert!(
                operator.child.try_wait().unwrap().is_none(),
                "the operator exited:\n{}",
                operator.log()
            );
            assert!(
                Instant::now() < deadline,
                "operator not ready: {ready:?}\n{}",
                operator.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let ca = operator._dir.path().join("ca.crt");
        let webhooks = operator_output(&[
            "webhook-config",
            "--url",
            &format!("https://127.0.0.1:{port}"),
            "--ca-file",
            ca.to_str().unwrap(),
        ]);
        must(plane, &["apply", "-f", "-"], Some(&webhooks));
        operator
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LocalOperator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
