//! `kubectl-valkey`: the kubectl plugin (`kubectl valkey …`); see [`valkey_operator::plugin`].

use clap::Parser;
use valkey_operator::plugin::{self, PluginCli};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = PluginCli::parse();
    valkey_operator::server::tls::install_crypto_provider();
    match plugin::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
