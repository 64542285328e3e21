//! Admission end to end: the real operator binary serving webhooks for a real kube-apiserver
//! (built by hack/build-k8s.sh), driven by the real `kubectl` as a user would.

use std::time::Duration;

use harness::eventually;
use harness::k8s::LocalOperator;
use harness::k8s::chart::{image, kubectl, must};
use testenv::ControlPlane;

#[tokio::test]
async fn kubectl_meets_the_floor_and_the_fleet_warning() {
    let plane = ControlPlane::start().await.expect("control plane");
    let _operator = LocalOperator::start(&plane).await;

    // The floor, as kubectl shows it.
    let (ok, stderr) = kubectl(
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
    eventually(
        "the webhook to see both clusters",
        Duration::from_secs(30),
        async || {
            let mut dry = patch.to_vec();
            dry.push("--dry-run=server");
            let output = must(&plane, &dry, None);
            if output.contains("rolls 2 ValkeyClusters") {
                Ok(())
            } else {
                Err(output)
            }
        },
    )
    .await;
    // The guide's own command, verbatim.
    let (ok, output) = kubectl(&plane, &patch, None);
    assert!(ok, "{output}");
    assert!(
        output.contains("valkeyconfig.valkey.gomomento.com/standard patched"),
        "{output}"
    );
    assert!(
        output.contains("Warning: Changing ValkeyConfig standard's image from valkey-9-0-0 (valkey/valkey:9.0.0) to valkey-9-1-2 (valkey/valkey:9.1.2) rolls 2 ValkeyClusters at once: team-a/orders and team-b/sessions."),
        "{output}"
    );
    assert!(
        output.contains("Warning: All of them start rolling immediately; nothing staggers them"),
        "{output}"
    );
    assert!(
        output.contains("Warning: To stage instead: set spec.rollout on ValkeyConfig standard"),
        "{output}"
    );
    // And, cluster by cluster, what the change does.
    assert!(
        output.contains(
            "Warning: team-a/orders (the last wave): rolls (image valkey-9-0-0 → valkey-9-1-2)."
        ),
        "{output}"
    );

    // Guards the API server enforces with our rules and messages.
    let (ok, stderr) = kubectl(&plane, &["delete", "valkeyimage", "valkey-9-1-2"], None);
    assert!(
        !ok && stderr.contains("cannot be deleted while 1 ValkeyConfig (standard) use it"),
        "{stderr}"
    );
    let (ok, stderr) = kubectl(&plane, &["delete", "valkeyconfig", "standard"], None);
    assert!(!ok && stderr.contains("through spec.baseRef"), "{stderr}");
    let (ok, stderr) = kubectl(
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
    let (ok, stderr) = kubectl(
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

    // A TLS cluster's Secret may be repointed (the nodes roll onto it); TLS may not be removed.
    must(
        &plane,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyCluster\nmetadata: {name: vault, namespace: team-a}\nspec: {configRef: standard, shards: 1, replicasPerShard: 1, tls: {secretRef: vault-tls}}\n",
        ),
    );
    let patch_vault = |patch: &str| {
        kubectl(
            &plane,
            &[
                "patch",
                "valkeycluster",
                "vault",
                "-n",
                "team-a",
                "--type",
                "merge",
                "-p",
                patch,
            ],
            None,
        )
    };
    let (ok, stderr) = patch_vault(r#"{"spec": {"tls": {"secretRef": "vault-tls-2027"}}}"#);
    assert!(ok, "a repointed TLS Secret was refused: {stderr}");
    let (ok, stderr) = patch_vault(r#"{"spec": {"tls": null}}"#);
    assert!(
        !ok && stderr.contains("spec.tls is set at creation only"),
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
