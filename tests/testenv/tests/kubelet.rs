//! The test kubelet against a real control plane: Pods created through the API become live
//! valkey-server processes on their own addresses, are restarted when they crash, report
//! image pull failures, and are stopped and removed when deleted.

use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use testenv::{ControlPlane, KubeletOptions, TestKubelet, eventually};

const DEADLINE: Duration = Duration::from_secs(60);

/// A Pod as an operator would write it: the address comes from the downward API.
fn valkey_pod(name: &str, image: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{
            "name": "valkey",
            "image": image,
            "args": ["--bind", "$(POD_IP)", "--port", "6379", "--cluster-enabled", "yes",
                     "--cluster-announce-ip", "$(POD_IP)", "--save", ""],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        }]},
    }))
    .unwrap()
}

async fn started(cp: &ControlPlane) -> (Api<Pod>, TestKubelet) {
    let client = cp.client().await.unwrap();
    let kubelet = TestKubelet::start(client.clone(), Default::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    (pods, kubelet)
}

/// Creates the Pod, retrying while the namespace's `default` ServiceAccount (made by
/// kube-controller-manager) does not exist yet.
async fn create(pods: &Api<Pod>, pod: &Pod) {
    eventually("the Pod to be accepted", DEADLINE, async || {
        pods.create(&PostParams::default(), pod).await.ok()
    })
    .await;
}

async fn ready_pod(pods: &Api<Pod>, name: &str) -> Pod {
    eventually(format!("Pod {name} to be Ready"), DEADLINE, async || {
        let pod = pods.get(name).await.ok()?;
        let conditions = pod.status.as_ref()?.conditions.as_ref()?;
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(pod)
    })
    .await
}

fn pod_ip(pod: &Pod) -> Ipv4Addr {
    pod.status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_ref()
        .unwrap()
        .parse()
        .unwrap()
}

async fn valkey(ip: Ipv4Addr) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{ip}:6379/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn server_version(ip: Ipv4Addr) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut valkey(ip).await)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("valkey_version:"))
        .unwrap()
        .trim()
        .to_string()
}

fn process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_as_valkey_servers_on_their_own_addresses_until_deleted() {
    let cp = ControlPlane::start().await.unwrap();
    let (pods, kubelet) = started(&cp).await;
    create(&pods, &valkey_pod("old", "valkey/valkey:9.0.0")).await;
    create(&pods, &valkey_pod("new", "docker.io/valkey/valkey:9.1.2")).await;
    let old = ready_pod(&pods, "old").await;
    let new = ready_pod(&pods, "new").await;

    let (old_ip, new_ip) = (pod_ip(&old), pod_ip(&new));
    assert_ne!(old_ip, new_ip, "each Pod has its own address");
    for ip in [old_ip, new_ip] {
        assert!(ip.is_loopback() && ip != Ipv4Addr::LOCALHOST, "{ip}");
    }
    assert_eq!(
        old.spec.as_ref().unwrap().node_name.as_deref(),
        Some(kubelet.node_name())
    );
    let pong: String = redis::cmd("PING")
        .query_async(&mut valkey(new_ip).await)
        .await
        .unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!(server_version(old_ip).await, "9.0.0");
    assert_eq!(server_version(new_ip).await, "9.1.2");
    // $(POD_IP) was expanded from the downward API into the server's own settings.
    let announced: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("cluster-announce-ip")
        .query_async(&mut valkey(new_ip).await)
        .await
        .unwrap();
    assert_eq!(
        announced,
        vec!["cluster-announce-ip".to_string(), new_ip.to_string()]
    );

    let process = kubelet.pod_process("default", "new").unwrap();
    let pid = process.pid.unwrap();
    assert!(process_alive(pid));
    pods.delete("new", &DeleteParams::default()).await.unwrap();
    eventually("the Pod object to be removed", DEADLINE, async || {
        matches!(pods.get("new").await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    eventually("the process to stop", DEADLINE, async || {
        (!process_alive(pid)).then_some(())
    })
    .await;
    assert_eq!(kubelet.pod_process("default", "new"), None);
    let log = std::fs::read_to_string(&process.log).unwrap();
    assert!(
        log.contains("Received SIGTERM"),
        "a graceful stop first:\n{log}"
    );
    // The address is free again: nothing holds its Valkey port any more.
    TcpListener::bind((new_ip, 6379)).expect("the deleted Pod's address is free");
    assert_eq!(
        server_version(old_ip).await,
        "9.0.0",
        "the other Pod is untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_server_is_reported_and_restarted_on_the_same_address() {
    let cp = ControlPlane::start().await.unwrap();
    let (pods, kubelet) = started(&cp).await;
    create(&pods, &valkey_pod("crashy", "valkey/valkey:9.1.2")).await;
    let before = ready_pod(&pods, "crashy").await;
    let pid = kill_server(&kubelet, "crashy");

    let after = eventually("the restart to be reported", DEADLINE, async || {
        let pod = pods.get("crashy").await.ok()?;
        let status = pod
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .clone();
        (status.restart_count == 1 && status.ready).then_some((pod, status))
    })
    .await;
    let (pod, status) = after;
    let last = status.last_state.unwrap().terminated.unwrap();
    assert_eq!(last.exit_code, 137, "SIGKILL shows as 128 + 9");
    assert_eq!(
        pod_ip(&pod),
        pod_ip(&before),
        "a restart keeps the Pod's address"
    );
    let new_pid = kubelet
        .pod_process("default", "crashy")
        .unwrap()
        .pid
        .unwrap();
    assert_ne!(new_pid, pid);
    assert_eq!(server_version(pod_ip(&pod)).await, "9.1.2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_without_a_binary_stays_pending_with_a_pull_error() {
    let cp = ControlPlane::start().await.unwrap();
    let (pods, kubelet) = started(&cp).await;
    create(&pods, &valkey_pod("ancient", "valkey/valkey:0.0.1")).await;
    let waiting = eventually(
        "an image pull failure to be reported",
        DEADLINE,
        async || {
            let pod = pods.get("ancient").await.ok()?;
            let status = pod
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .first()?
                .clone();
            let waiting = status.state?.waiting?;
            (waiting.reason.as_deref() == Some("ImagePullBackOff")).then_some((pod, waiting))
        },
    )
    .await;
    let (pod, waiting) = waiting;
    assert!(
        waiting.message.unwrap().contains("no valkey-server 0.0.1"),
        "the message says what is missing"
    );
    let status = pod.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let ready = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "False");
    assert!(
        kubelet
            .pod_process("default", "ancient")
            .is_none_or(|p| p.pid.is_none())
    );
}

/// A Pod that is never restarted, as the operator makes Valkey Pods.
fn pod_never_restarted(name: &str) -> Pod {
    let mut pod = valkey_pod(name, "valkey/valkey:9.1.2");
    pod.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_pods_address_is_released_while_its_status_shows_it_and_can_go_to_the_next_pod() {
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.client().await.unwrap();
    let options = KubeletOptions {
        reuse_freed_ips: true,
        ..Default::default()
    };
    let kubelet = TestKubelet::start(client.clone(), options).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    create(&pods, &pod_never_restarted("first")).await;
    let first = ready_pod(&pods, "first").await;
    let ip = pod_ip(&first);
    assert!(
        kubelet.take_released_ip("default", "first").is_none(),
        "held while it runs"
    );
    kill_server(&kubelet, "first");
    let failed = eventually("the Pod to fail", DEADLINE, async || {
        let pod = pods.get("first").await.ok()?;
        (pod.status.as_ref()?.phase.as_deref() == Some("Failed")).then_some(pod)
    })
    .await;
    assert_eq!(pod_ip(&failed), ip, "the status still shows the address");
    assert!(!kubelet.pod_process("default", "first").unwrap().holds_ip);
    // A stranger may take it, as long as it holds it...
    let lease = kubelet
        .take_released_ip("default", "first")
        .expect("released");
    assert_eq!(lease.ip(), ip);
    drop(lease);
    // ...and once free it is the next Pod's at once.
    create(&pods, &pod_never_restarted("second")).await;
    let second = ready_pod(&pods, "second").await;
    assert_eq!(
        pod_ip(&second),
        ip,
        "the freed address went to the next Pod"
    );
    assert_eq!(server_version(ip).await, "9.1.2");

    // A claimed address is kept from the next Pod for the test that claimed it.
    assert!(kubelet.claim_ip_at_release("default", "second"));
    kill_server(&kubelet, "second");
    eventually("the address released", DEADLINE, async || {
        kubelet
            .pod_process("default", "second")
            .is_some_and(|p| !p.holds_ip)
    })
    .await;
    create(&pods, &pod_never_restarted("third")).await;
    let third = ready_pod(&pods, "third").await;
    assert_ne!(pod_ip(&third), ip, "a claimed address went to the next Pod");
    let lease = kubelet
        .take_released_ip("default", "second")
        .expect("claimed");
    assert_eq!(lease.ip(), ip);
}

/// SIGKILLs the server of the Pod `name` (in `default`), as a crash would; its pid.
fn kill_server(kubelet: &TestKubelet, name: &str) -> u32 {
    let pid = kubelet.pod_process("default", name).unwrap().pid.unwrap();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    pid
}
