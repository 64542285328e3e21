//! `kubectl valkey`: the everyday operations of a platform team by name, a kubectl plugin (the
//! binary `kubectl-valkey`, found by kubectl on the `PATH`). Every verb that changes something
//! writes one documented annotation the operator honours, so a GitOps repository can do the
//! same without the plugin:
//!
//! | verb | writes |
//! |---|---|
//! | `pause` / `resume <config>` | `rollout-paused` on the ValkeyConfig |
//! | `hold <cluster> [--for 24h]` / `release <cluster>` | `rollout-hold` on the ValkeyCluster |
//! | `replace <node>` | `handover-requested` on the ValkeyNode |
//! | `rotate-credentials <cluster>` | `rotate-credentials` on its credentials Secret |
//!
//! The rest read: `status` ([`status`]), `fleet` ([`fleet`]), `plan` ([`plan`]: a change's
//! effect on each cluster, after the server's dry run) and `report` ([`report`]), the support
//! bundle with every secret redacted. The plugin talks to the API server with the
//! kubeconfig kubectl uses (`KUBECONFIG`, the current context and its namespace, `-n`).

pub mod annotate;
pub mod fleet;
pub mod nodes;
pub mod plan;
pub mod report;
pub mod status;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use kube::Client;

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-valkey",
    bin_name = "kubectl valkey",
    version,
    about = "Day-2 operations on the Valkey clusters of the valkey-operator, by name."
)]
pub struct PluginCli {
    /// The namespace of the cluster or node named (default: the kubeconfig context's).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The namespace the operator is installed in, where it keeps each cluster's passwords
    /// (`status` and `report` log in to the nodes with them; a team cannot read them).
    #[arg(
        long,
        global = true,
        env = "VALKEY_OPERATOR_NAMESPACE",
        default_value = "valkey-operator"
    )]
    pub operator_namespace: String,
    /// The Kubernetes cluster's DNS domain TLS nodes are verified under (default: the
    /// operator's own `clusterDomain`, from its ConfigMap in --operator-namespace).
    #[arg(long, global = true, env = "VALKEY_OPERATOR_CLUSTER_DOMAIN")]
    pub cluster_domain: Option<String>,
    #[command(subcommand)]
    pub command: Verb,
}

#[derive(Subcommand, Debug)]
pub enum Verb {
    /// One screen on a cluster: state, shards and their nodes, the roll and why, conditions,
    /// recent events.
    Status { cluster: String },
    /// Every config's rollout and its clusters (up to date, rolling, queued, stalled, held).
    Fleet {
        /// Only this config (and the clusters resolving through it).
        config: Option<String>,
        /// `table` or `json`.
        #[arg(short = 'o', long, default_value = "table")]
        output: fleet::Output,
    },
    /// What applying a file of ValkeyConfigs would do to each cluster (rolls, live, nothing),
    /// after a server-side dry run of each.
    Plan { file: PathBuf },
    /// Pause every rollout through a config: no cluster starts rolling; rolling ones finish
    /// their shard and wait.
    Pause { config: String },
    /// Resume a paused config's rollouts.
    Resume { config: String },
    /// Hold one cluster on its revision while the rest of its rollout goes on (healing goes on).
    Hold {
        cluster: String,
        /// For how long (e.g. `30m`, `24h`, `7d`); until `release` without it.
        #[arg(long = "for", value_parser = annotate::parse_duration)]
        duration: Option<Duration>,
    },
    /// Let a held cluster roll.
    Release { cluster: String },
    /// Replace one node: a new one joins its shard, then it is retired (a primary hands its
    /// shard over first).
    Replace { node: String },
    /// Hand one shard's primary role to a synced replica, once: the one named, or the most
    /// caught-up (up-to-date ones first). Also how a supervised roll's primary is failed over.
    Switchover {
        cluster: String,
        /// The shard (its index, `valkey.gomomento.com/shard-index`).
        #[arg(long)]
        shard: u32,
        /// The replica's ValkeyNode to promote.
        #[arg(long)]
        to: Option<String>,
    },
    /// Rotate both of the operator's passwords of a cluster, without a restart.
    RotateCredentials { cluster: String },
    /// Write a support bundle of a cluster into a folder: its objects, events, the operator's
    /// log lines about it, and each node's INFO, CLUSTER NODES and CLUSTER SHARDS; every
    /// password and key redacted.
    Report {
        cluster: String,
        /// The folder to write (created; default `valkey-report-<cluster>`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs one verb; what it prints goes to stdout.
pub async fn run(cli: PluginCli) -> anyhow::Result<()> {
    let config = kube::Config::infer()
        .await
        .context("reading the kubeconfig (KUBECONFIG, or ~/.kube/config)")?;
    let namespace = cli
        .namespace
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).context("connecting to the API server")?;
    let ns = namespace.as_str();
    let home = &nodes::Operator {
        namespace: cli.operator_namespace,
        cluster_domain: cli.cluster_domain,
    };
    let said = match cli.command {
        Verb::Status { cluster } => status::status(&client, ns, home, &cluster).await?,
        Verb::Fleet { config, output } => fleet::fleet(&client, config.as_deref(), output).await?,
        Verb::Plan { file } => plan::plan(&client, &file).await?,
        Verb::Pause { config } => annotate::pause(&client, &config, true).await?,
        Verb::Resume { config } => annotate::pause(&client, &config, false).await?,
        Verb::Hold { cluster, duration } => annotate::hold(&client, ns, &cluster, duration).await?,
        Verb::Release { cluster } => annotate::release(&client, ns, &cluster).await?,
        Verb::Replace { node } => annotate::replace(&client, ns, &node).await?,
        Verb::Switchover { cluster, shard, to } => {
            annotate::switchover(&client, ns, &cluster, shard, to).await?
        }
        Verb::RotateCredentials { cluster } => {
            annotate::rotate_credentials(&client, ns, &cluster).await?
        }
        Verb::Report { cluster, out } => {
            let out = out.unwrap_or_else(|| PathBuf::from(format!("valkey-report-{cluster}")));
            report::report(&client, ns, home, &cluster, &out).await?
        }
    };
    print!("{said}");
    Ok(())
}
