//! The operator binary as a local process against a testenv control plane, with the admin
//! kubeconfig, as `make dev` runs it: CRDs installed from `valkey-operator crd`, development
//! certificates from `valkey-operator certs`, and the webhooks registered by URL from
//! `valkey-operator webhook-config`. Killed when dropped, also when the test panics.

use std::process::Command;
use std::time::Duration;

use testenv::ControlPlane;

use super::chart::{ChartIdentity, Operator, must, run, wait_crds_established};
use crate::operator_binary;

pub struct LocalOperator {
    pub operator: Operator,
    /// Keeps the certificates, kubeconfig and log until the operator is gone.
    _files: ChartIdentity,
}

fn operator_output(args: &[&str]) -> String {
    let mut command = Command::new(operator_binary());
    command.args(args);
    let (ok, output) = run(command, None);
    assert!(ok, "valkey-operator {args:?}: {output}");
    output
}

impl LocalOperator {
    /// Installs the CRDs, starts `serve` and waits for `/readyz`, then registers the webhooks.
    pub async fn start(plane: &ControlPlane) -> Self {
        let files = ChartIdentity::admin(plane);
        must(
            plane,
            &["apply", "--server-side", "-f", "-"],
            Some(&operator_output(&["crd"])),
        );
        wait_crds_established(plane);
        let mut operator = Operator::start_in(&files, "operator.log", "default");
        operator.wait_ready(Duration::from_secs(60)).await;
        let ca = files.path("ca.crt");
        let webhooks = operator_output(&[
            "webhook-config",
            "--url",
            &operator.url,
            "--ca-file",
            ca.to_str().unwrap(),
        ]);
        must(plane, &["apply", "-f", "-"], Some(&webhooks));
        Self {
            operator,
            _files: files,
        }
    }
}
