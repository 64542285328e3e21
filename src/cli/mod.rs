//! The process shell: the command line (`crd`, `certs`, `webhook-config` and `serve`), the
//! supervisor of `serve`'s tasks, and the two commands' helpers for local runs.

pub mod certs;
pub mod logging;
pub mod supervise;
pub mod webhook_config;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::{broadcast, watch};

use crate::admission::Policy;
use crate::admission::eviction::{self, EvictionState};
use crate::api;
use crate::api::ClusterKey;
use crate::cli::supervise::{Health, Supervisor};
use crate::controller;
use crate::controller::lead::lease::{self, LeaseConfig};
use crate::execute::Timeouts;
use crate::fleet::Fleet;
use crate::fleet::caches::{self, Readiness};
use crate::metrics::Metrics;
use crate::server::limits::ServerLimits;
use crate::server::metrics_access::{MetricsAccess, Reviews};
use crate::server::tls::CertificatePaths;
use crate::server::{self, AppState, ListenOptions};
use crate::settings::{CONFIG_MAP, OperatorSettings, ZONE_SPREAD_VARIABLE};

#[derive(Parser, Debug)]
#[command(
    name = "valkey-operator",
    version,
    about = "Runs fleets of Valkey clusters on Kubernetes."
)]
pub struct Cli {
    /// How log lines are written: `text` (stderr) or `json` (one object a line, stdout).
    #[arg(long, global = true, value_enum, default_value_t, env = "LOG_FORMAT")]
    pub log_format: logging::LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinitions of all six kinds as YAML.
    Crd,
    /// Write a development CA and serving certificate (PEM) for the given names and IPs.
    Certs {
        /// Folder for ca.crt, ca.key, tls.crt and tls.key; an existing CA there is reused.
        #[arg(long, default_value = "certs/dev")]
        out: PathBuf,
        /// DNS names of the serving certificate.
        #[arg(long = "dns", default_values_t = ["localhost".to_string()])]
        dns_names: Vec<String>,
        /// IP addresses of the serving certificate.
        #[arg(long = "ip", default_values_t = [IpAddr::from([127, 0, 0, 1])])]
        ips: Vec<IpAddr>,
    },
    /// Print a ValidatingWebhookConfiguration that sends the five kinds to a server at a URL.
    WebhookConfig {
        /// The server's base URL, e.g. https://127.0.0.1:8443.
        #[arg(long)]
        url: String,
        /// The CA that signed the serving certificate (PEM).
        #[arg(long, default_value = "certs/dev/ca.crt")]
        ca_file: PathBuf,
    },
    /// Run the HTTPS server (webhooks, /metrics, /healthz, /readyz) against the API server in
    /// KUBECONFIG or the in-cluster configuration.
    Serve {
        #[arg(long, env = "VALKEY_OPERATOR_LISTEN", default_value = "127.0.0.1:8443")]
        listen: SocketAddr,
        /// Also serve `/healthz` and `/readyz` over plain HTTP here, for the kubelet's probes
        /// (the chart: `0.0.0.0:8081`), so a flood of the HTTPS port cannot fail them.
        #[arg(long, env = "VALKEY_OPERATOR_HEALTH_LISTEN")]
        health_listen: Option<SocketAddr>,
        #[arg(
            long,
            env = "VALKEY_OPERATOR_TLS_CERT",
            default_value = "certs/dev/tls.crt"
        )]
        tls_cert: PathBuf,
        #[arg(
            long,
            env = "VALKEY_OPERATOR_TLS_KEY",
            default_value = "certs/dev/tls.key"
        )]
        tls_key: PathBuf,
        /// Seconds between checks of the certificate files for a change.
        #[arg(long, default_value_t = 5)]
        cert_reload_seconds: u64,
        /// The CA of the client certificate the API server presents to webhooks (PEM). With it,
        /// a webhook request from a caller that presents no certificate signed by this CA is
        /// refused (403), and the eviction webhook trusts that an eviction is real. Without it,
        /// a primary is handed over only for an eviction from a Node being drained. The CA must
        /// sign that certificate alone: any certificate it signs is taken for the API server
        /// (not the cluster's client CA, which also signs kubelets' and users' certificates).
        #[arg(long, env = "VALKEY_OPERATOR_WEBHOOK_CLIENT_CA")]
        webhook_client_ca: Option<PathBuf>,
        /// Namespace of the operator's ConfigMap (valkey-operator-config) and leader Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
        namespace: String,
        /// This replica's identity in the leader election (the Pod name in a cluster).
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// A new node that is not a ready member of its shard within this many seconds stalls
        /// the roll (reported as Degraded) instead of letting it go on.
        #[arg(
            long,
            env = "VALKEY_OPERATOR_JOIN_TIMEOUT_SECONDS",
            default_value_t = 300
        )]
        join_timeout_seconds: u64,
        /// At most this many ValkeyClusters are reconciled at once. Each pass makes a few API
        /// requests; unbounded, a fleet roll of thousands would queue them all at the API
        /// server at once, the Lease's renewals behind them.
        #[arg(
            long,
            env = "VALKEY_OPERATOR_MAX_CONCURRENT_RECONCILES",
            default_value_t = 16,
            value_parser = clap::value_parser!(u16).range(1..)
        )]
        max_concurrent_reconciles: u16,
        /// Who may read /metrics: `kubernetes`, callers whose bearer token the API server
        /// knows and allows to get the non-resource URL /metrics (TokenReview and
        /// SubjectAccessReview); `none`, anyone who reaches the port.
        #[arg(
            long,
            env = "VALKEY_OPERATOR_METRICS_AUTH",
            value_enum,
            default_value_t = MetricsAuth::Kubernetes
        )]
        metrics_auth: MetricsAuth,
    },
}

/// See `serve --metrics-auth`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsAuth {
    Kubernetes,
    None,
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crd => {
            print!("{}", api::crds_yaml()?);
            Ok(())
        }
        Command::Certs {
            out,
            dns_names,
            ips,
        } => {
            let files = certs::write_dev_certificates(&out, &dns_names, &ips)?;
            println!(
                "wrote {}, {} (CA: {})",
                files.cert.display(),
                files.key.display(),
                files.ca_cert.display()
            );
            Ok(())
        }
        Command::WebhookConfig { url, ca_file } => {
            let ca = std::fs::read(&ca_file)
                .with_context(|| format!("reading the CA certificate {}", ca_file.display()))?;
            print!(
                "{}",
                serde_yaml_ng::to_string(&webhook_config::for_url(&url, &ca))?
            );
            Ok(())
        }
        Command::Serve {
            listen,
            health_listen,
            tls_cert,
            tls_key,
            cert_reload_seconds,
            webhook_client_ca,
            namespace,
            identity,
            join_timeout_seconds,
            max_concurrent_reconciles,
            metrics_auth,
        } => {
            serve(
                Listeners {
                    https: listen,
                    health: health_listen,
                },
                ListenOptions {
                    certificate: CertificatePaths {
                        cert: tls_cert,
                        key: tls_key,
                        client_ca: webhook_client_ca,
                    },
                    reload_interval: Duration::from_secs(cert_reload_seconds.max(1)),
                    limits: ServerLimits::default(),
                },
                &namespace,
                identity.unwrap_or_else(default_identity),
                Duration::from_secs(join_timeout_seconds),
                max_concurrent_reconciles,
                metrics_auth,
            )
            .await
        }
    }
}

/// The operator's own identity as the API server sees it (a SelfSubjectReview, which every
/// authenticated user may create), so admission knows whose ValkeyNode writes to allow.
async fn whoami(client: &Client) -> anyhow::Result<String> {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .context("asking the API server who the operator is (SelfSubjectReview)")?;
    review
        .status
        .and_then(|status| status.user_info)
        .and_then(|user| user.username)
        .context("the API server's SelfSubjectReview named no user")
}

async fn load_settings(client: &Client, namespace: &str) -> anyhow::Result<OperatorSettings> {
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(CONFIG_MAP)
        .await
        .with_context(|| format!("reading ConfigMap {namespace}/{CONFIG_MAP}"))?;
    let data = config_map.and_then(|c| c.data).unwrap_or_default();
    let zone_spread = std::env::var(ZONE_SPREAD_VARIABLE).ok();
    Ok(OperatorSettings {
        operator_namespace: namespace.to_owned(),
        ..OperatorSettings::from_sources(&data, zone_spread.as_deref())?
    })
}

/// `hostname-pid`, unique enough to tell replicas apart outside a cluster.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

/// How long the tasks get to stop (the server drains for up to 10 s, the election releases the
/// Lease) before the rest are aborted.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// Serves webhooks and runs the controller while leading, all as supervised tasks: SIGTERM or
/// Ctrl-C stops them and returns `Ok`; any of them dying first stops the rest and returns why.
/// Where the server listens: HTTPS for everything, and plain HTTP for the probes if asked.
struct Listeners {
    https: SocketAddr,
    health: Option<SocketAddr>,
}

async fn serve(
    listen: Listeners,
    options: ListenOptions,
    namespace: &str,
    identity: String,
    join_timeout: Duration,
    max_concurrent_reconciles: u16,
    metrics_auth: MetricsAuth,
) -> anyhow::Result<()> {
    let config = kube::Config::infer()
        .await
        .context("configuring the Kubernetes API client (KUBECONFIG or in-cluster)")?;
    let client = Client::try_from(config.clone())
        .context("connecting to the Kubernetes API (KUBECONFIG or in-cluster)")?;
    let settings = OperatorSettings {
        max_concurrent_reconciles,
        ..load_settings(&client, namespace).await?
    };
    tracing::info!(?settings, "operator settings");
    let me = node_writer(&client).await;
    let bind = |address: SocketAddr| {
        std::net::TcpListener::bind(address).with_context(|| format!("listening on {address}"))
    };
    let listener = bind(listen.https)?;
    let health_listener = listen.health.map(bind).transpose()?;
    let state = AppState {
        fleet: Arc::new(RwLock::new(Fleet::default())),
        readiness: Arc::new(Readiness::default()),
        metrics: Arc::new(Metrics::new()?),
        policy: Arc::new(Policy::of(&settings, me)),
        limits: ServerLimits::default(),
        certified_callers: options.certificate.client_ca.is_some(),
        metrics_access: match metrics_auth {
            MetricsAuth::Kubernetes => {
                MetricsAccess::Kubernetes(Arc::new(Reviews::new(client.clone())))
            }
            MetricsAuth::None => MetricsAccess::Open,
        },
    };
    let health = Arc::new(Health::default());
    let mut tasks = Supervisor::new(health.clone(), STOP_GRACE);
    let changes = spawn_watches(&mut tasks, &client, &state);

    // Every replica serves webhooks; only the Lease holder reconciles.
    let (leading_tx, leading) = watch::channel(None);
    let lease = LeaseConfig::new(namespace, &identity);
    spawn_election(&mut tasks, client.clone(), lease, leading_tx);
    let timeouts = Timeouts {
        join: join_timeout,
        ..Timeouts::default()
    };
    // The controller writes only while leading: its client refuses to send otherwise (the
    // election's own Lease requests go through `client`, unfenced).
    let fenced = kube::client::ClientBuilder::try_from(config)
        .context("building the controller's API client")?
        .with_layer(&controller::lead::fence::FenceLayer::new(leading.clone()))
        .build();
    let controller = controller::run(
        fenced,
        state.fleet.clone(),
        settings,
        state.metrics.clone(),
        timeouts,
        changes,
        leading,
    );
    // Dropped at the stop signal, while the election is still releasing the Lease, so it is
    // not reconciling when another replica takes over.
    tasks.spawn_until_stopped("controller", controller);

    if let Some(probes) = health_listener {
        tracing::info!(listen = ?listen.health, "serving /healthz and /readyz over HTTP");
        spawn_health_server(&mut tasks, probes, &state, &health);
    }
    tracing::info!(listen = %listen.https, "serving HTTPS");
    spawn_server(&mut tasks, client, listener, options, state, health);
    tasks.run(shutdown_signal()).await?;
    Ok(())
}

/// The identity allowed to write ValkeyNodes: this process's own, as the API server names it.
/// Without an answer (an API server before 1.28), admission cannot tell who writes a
/// ValkeyNode; the CRD still keeps every node's spec immutable.
async fn node_writer(client: &Client) -> Option<String> {
    match whoami(client).await {
        Ok(me) => {
            tracing::info!(user = %me, "only this identity may write ValkeyNodes");
            Some(me)
        }
        Err(error) => {
            tracing::warn!(
                error = format!("{error:#}"),
                "ValkeyNode creation is not limited to the operator"
            );
            None
        }
    }
}

/// Starts the caches' watches; returns the channel on which they announce the clusters that
/// config and image changes reach, for the controller.
fn spawn_watches(
    tasks: &mut Supervisor,
    client: &Client,
    state: &AppState,
) -> broadcast::Sender<ClusterKey> {
    let (changes, _) = broadcast::channel(4096);
    let watches = caches::start(
        client.clone(),
        state.fleet.clone(),
        state.readiness.clone(),
        changes.clone(),
    );
    tasks.spawn_until_stopped("watches", watches);
    changes
}

/// Runs the Lease election until the stop signal, then releases a held Lease so another
/// replica takes over at once.
fn spawn_election(
    tasks: &mut Supervisor,
    client: Client,
    lease: LeaseConfig,
    leading: watch::Sender<lease::Leadership>,
) {
    let stopping = tasks.stopping();
    tasks.spawn("leader-election", async move {
        lease::run(client, lease, leading, stopping).await;
        Ok(())
    });
}

/// Serves the probes' plain HTTP listener until the stop signal.
fn spawn_health_server(
    tasks: &mut Supervisor,
    listener: std::net::TcpListener,
    state: &AppState,
    health: &Arc<Health>,
) {
    let app = server::health_router(state.clone(), health.clone());
    let stopping = tasks.stopping();
    tasks.spawn("health-server", async move {
        server::serve_health(listener, app, stopping)
            .await
            .context("serving the health probes")
    });
}

/// Serves HTTPS on `listener` until the stop signal, then drains its connections.
fn spawn_server(
    tasks: &mut Supervisor,
    client: Client,
    listener: std::net::TcpListener,
    options: ListenOptions,
    state: AppState,
    health: Arc<Health>,
) {
    let metrics = state.metrics.clone();
    let evictions = eviction::router(EvictionState {
        client,
        metrics: metrics.clone(),
        certified_callers: state.certified_callers,
    });
    let app = server::router_with_health(state, health, evictions);
    let stopping = tasks.stopping();
    tasks.spawn("https-server", async move {
        server::serve_https(listener, app, options, metrics, stopping)
            .await
            .context("serving HTTPS")
    });
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the server");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
