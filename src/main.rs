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
    let cli = Cli::parse();
    cli::logging::init(cli.log_format);
    valkey_operator::server::tls::install_crypto_provider();
    match cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
