//! The operator's log lines: plain text for a person at a terminal, or JSON objects one per line
//! for a log pipeline, in the shape Momento's operator documents (`timestamp`, `level`,
//! `fields` with the `message`, `target`, and `span`/`spans` carrying the cluster and namespace
//! of the pass the line comes from). `RUST_LOG` filters both; `info` when it is unset.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines on stderr.
    #[default]
    Text,
    /// One JSON object per line on stdout.
    Json,
}

/// Installs the process's log subscriber.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.with_writer(std::io::stderr).init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stdout)
            .init(),
    }
}
