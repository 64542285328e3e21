//! `testenv`: run the test control plane (and optionally the test kubelet) by hand or from
//! `hack/dev.sh`, until Ctrl-C or SIGTERM, then stop every process it started.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use testenv::{ControlPlane, ControlPlaneOptions, Firewall, KubeletOptions, RealNode, TestKubelet};

#[derive(Parser)]
#[command(about = "A real Kubernetes control plane and a test kubelet for local runs")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Start etcd, kube-apiserver and kube-controller-manager; stay up until interrupted.
    Up {
        /// Also run the test kubelet (Pods become local valkey-server processes).
        #[arg(long, conflicts_with = "real_nodes")]
        kubelet: bool,
        /// Run real nodes (kubelet, containerd, runc, CNI) in these zones, one node per entry
        /// (`node-<zone>`, `node-<zone>-2` for a zone listed again), and kube-scheduler;
        /// needs root on Linux.
        #[arg(long, value_delimiter = ',')]
        real_nodes: Vec<String>,
        /// Enforce NetworkPolicies on every real node (kube-router's firewall, built by
        /// hack/build-kube-router.sh).
        #[arg(long, requires = "real_nodes")]
        enforce_network_policies: bool,
        /// Copy the admin kubeconfig here once the control plane is ready.
        #[arg(long)]
        kubeconfig_out: Option<PathBuf>,
        /// Folder with the Kubernetes binaries (default: from hack/build-k8s.sh).
        #[arg(long, env = "TESTENV_K8S_BIN_DIR")]
        bin_dir: Option<PathBuf>,
    },
    /// Run only the test kubelet against the cluster named by KUBECONFIG.
    Kubelet {
        #[arg(long, default_value = "testenv-node")]
        node_name: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // kube logs every refused connection while the API server is starting.
                .unwrap_or_else(|_| "info,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Commands::Up {
            kubelet,
            real_nodes,
            enforce_network_policies,
            kubeconfig_out,
            bin_dir,
        } => {
            let nodes = Nodes {
                with_kubelet: kubelet,
                real: real_nodes,
                enforce_network_policies,
            };
            up(nodes, kubeconfig_out, bin_dir).await
        }
        Commands::Kubelet { node_name } => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let client = kube::Client::try_default().await?;
            let options = KubeletOptions {
                node_name,
                ..Default::default()
            };
            let _kubelet = TestKubelet::start(client, options).await?;
            eprintln!("test kubelet running; Ctrl-C to stop");
            interrupted().await
        }
    }
}

/// What runs Pods beside the control plane.
struct Nodes {
    /// The test kubelet.
    with_kubelet: bool,
    /// Real nodes, one per zone listed.
    real: Vec<String>,
    /// kube-router's firewall on each real node.
    enforce_network_policies: bool,
}

async fn up(
    nodes: Nodes,
    kubeconfig_out: Option<PathBuf>,
    bin_dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    // Real nodes make a cluster whose Pods reach the API server, as any real one: a chart
    // installed into it runs the operator in-cluster.
    let options = ControlPlaneOptions {
        bin_dir,
        reachable_from_pods: !nodes.real.is_empty(),
        ..Default::default()
    };
    // Started inside a select so that Ctrl-C during start-up drops (and kills) what is up.
    let mut control_plane = tokio::select! {
        cp = ControlPlane::start_with(options) => cp?,
        r = interrupted() => return r,
    };
    eprintln!(
        "control plane ready in {:.1}s at {}",
        started.elapsed().as_secs_f64(),
        control_plane.server_url()
    );
    let _kubelet = if nodes.with_kubelet {
        let kubelet = TestKubelet::start(control_plane.client().await?, Default::default()).await?;
        eprintln!("test kubelet registered Node {}", kubelet.node_name());
        Some(kubelet)
    } else {
        None
    };
    let mut real_nodes = Vec::new();
    let mut firewalls = Vec::new();
    if !nodes.real.is_empty() {
        control_plane.start_node_controllers()?;
    }
    for options in testenv::nodes_in_zones(&nodes.real) {
        let node = tokio::select! {
            node = RealNode::start(&control_plane, options) => node?,
            r = interrupted() => return r,
        };
        if nodes.enforce_network_policies {
            firewalls.push(Firewall::start(&control_plane, &node).await?);
        }
        eprintln!(
            "real node {} Ready (Pods on {}, NetworkPolicies {}, logs in {})",
            node.name(),
            node.pod_subnet(),
            if nodes.enforce_network_policies {
                "enforced"
            } else {
                "not enforced"
            },
            node.dir().display()
        );
        real_nodes.push(node);
    }
    let kubeconfig = match kubeconfig_out {
        Some(out) => {
            if let Some(parent) = out.parent() {
                std::fs::create_dir_all(parent)?;
            }
            // Written via a temporary name so a script polling for the file sees it whole.
            let partial = out.with_extension("partial");
            std::fs::copy(control_plane.kubeconfig_path(), &partial)?;
            std::fs::rename(&partial, &out)?;
            out
        }
        None => control_plane.kubeconfig_path().to_path_buf(),
    };
    println!("KUBECONFIG={}", kubeconfig.display());
    println!("SERVER={}", control_plane.server_url());
    println!("BIN_DIR={}", control_plane.bin_dir().display());
    println!("DATA_DIR={}", control_plane.data_dir().display());
    interrupted().await?;
    eprintln!("stopping the control plane");
    // Each firewall before its node.
    drop(firewalls);
    drop(real_nodes);
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn interrupted() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
