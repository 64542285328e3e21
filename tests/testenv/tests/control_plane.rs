//! The launcher: a real API server of the pinned release with RBAC on, controllers that
//! garbage-collect owned objects and delete namespaces, the real kubectl, and no process
//! left behind when a test panics.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use testenv::{ControlPlane, TestKubelet, eventually};

const DEADLINE: Duration = Duration::from_secs(60);

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_pinned_release_with_rbac_and_controllers() {
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.client().await.unwrap();
    assert_eq!(
        client.apiserver_version().await.unwrap().git_version,
        "v1.35.4"
    );

    // The real kubectl, with the admin kubeconfig, reaches the same server.
    let out = cp
        .kubectl()
        .args(["version", "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(version["serverVersion"]["gitVersion"], "v1.35.4");
    assert_eq!(version["clientVersion"]["gitVersion"], "v1.35.4");

    // helm, built beside kubectl, talks to the same server.
    let out = Command::new(cp.bin_dir().join("helm"))
        .args(["list", "--all-namespaces", "-o", "json"])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .env("HELM_CACHE_HOME", cp.data_dir().join("helm"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");

    // RBAC is on: an unprivileged identity is refused.
    let out = cp
        .kubectl()
        .args(["get", "pods", "--as", "nobody", "-n", "default"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Forbidden"));

    // Garbage collection: a ConfigMap owned by another goes when its owner goes.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner = config_maps
        .create(
            &PostParams::default(),
            &object(serde_json::json!({"metadata": {"name": "owner"}})),
        )
        .await
        .unwrap();
    let owned: ConfigMap = object(serde_json::json!({"metadata": {
        "name": "owned",
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                             "uid": owner.metadata.uid}],
    }}));
    config_maps
        .create(&PostParams::default(), &owned)
        .await
        .unwrap();
    config_maps
        .delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the owned ConfigMap to be collected",
        DEADLINE,
        async || {
            matches!(config_maps.get("owned").await, Err(kube::Error::Api(e)) if e.code == 404)
                .then_some(())
        },
    )
    .await;

    // Namespace deletion completes (the namespace controller empties and finalizes it).
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &object(serde_json::json!({"metadata": {"name": "doomed"}})),
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "doomed")
        .create(
            &PostParams::default(),
            &object(serde_json::json!({"metadata": {"name": "x"}})),
        )
        .await
        .unwrap();
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the namespace to be deleted", DEADLINE, async || {
        matches!(namespaces.get("doomed").await, Err(kube::Error::Api(e)) if e.code == 404)
            .then_some(())
    })
    .await;
}

/// Where the child test writes the pids it saw, one per line.
const PID_FILE_ENV: &str = "TESTENV_PANIC_CHILD_PID_FILE";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by a_panicking_test_leaves_no_process_behind"]
async fn panicking_child() {
    let pid_file = std::env::var(PID_FILE_ENV).expect("run by the parent test");
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.client().await.unwrap();
    let kubelet = TestKubelet::start(client.clone(), Default::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = object(serde_json::json!({
        "metadata": {"name": "doomed"},
        "spec": {"containers": [{"name": "valkey", "image": "valkey/valkey:9.1.2",
                                 "args": ["--bind", "$(POD_IP)", "--save", ""],
                                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]},
    }));
    eventually("the Pod to be accepted", DEADLINE, async || {
        pods.create(&PostParams::default(), &pod).await.ok()
    })
    .await;
    let valkey_pid = eventually("the Pod's process", DEADLINE, async || {
        kubelet.pod_process("default", "doomed")?.pid
    })
    .await;
    let mut pids: Vec<String> = cp.pids().iter().map(|(_, pid)| pid.to_string()).collect();
    pids.push(valkey_pid.to_string());
    std::fs::write(pid_file, pids.join("\n")).unwrap();
    panic!("this test panics on purpose with the control plane and a Pod running");
}

#[tokio::test]
async fn a_panicking_test_leaves_no_process_behind() {
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["panicking_child", "--exact", "--ignored", "--nocapture"])
        .env(PID_FILE_ENV, pid_file.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        !child.status.success(),
        "the child test must fail: {stdout}"
    );
    assert!(stdout.contains("panicking_child ... FAILED"), "{stdout}");

    let pids = std::fs::read_to_string(pid_file.path()).unwrap();
    let pids: Vec<&str> = pids.lines().collect();
    assert_eq!(
        pids.len(),
        4,
        "etcd, kube-apiserver, kube-controller-manager, valkey-server"
    );
    eventually(
        "every process of the panicked test to end",
        Duration::from_secs(10),
        async || {
            let alive: Vec<&str> = pids
                .iter()
                .copied()
                .filter(|pid| Path::new(&format!("/proc/{pid}")).exists())
                .collect();
            if alive.is_empty() {
                Ok(())
            } else {
                Err(format!("processes left behind: {alive:?}"))
            }
        },
    )
    .await;
}
