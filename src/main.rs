//! `valkey-operator`: parse the command line, set up logging and TLS, run the command.

use clap::Parser;
use valkey_operator::cli::{self, Cli};

/// jemalloc rather than the system allocator: the operator keeps many small objects per
/// cluster (its caches), and glibc's malloc spent about two thirds again of their size on
/// headers and fragmentation (measured with `benches/fleet_scale.rs`, objects only).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    valkey_operator::server::tls::install_crypto_provider();
    match cli::run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
