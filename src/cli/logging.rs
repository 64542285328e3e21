//! The operator's log lines: plain text for a person at a terminal, or JSON objects one per line
//! for a log pipeline, in the shape Momento's operator documents (`timestamp`, `level`,
//! `fields` with the `message`, `target`, and `span`/`spans` carrying the cluster and namespace
//! of the pass the line comes from). `RUST_LOG` filters both; `info` when it is unset.

use clap::ValueEnum;
use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

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
    match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
        LogFormat::Json => json(filter, std::io::stdout).init(),
    }
}

/// The JSON lines' subscriber, writing to `writer`.
fn json<W>(filter: EnvFilter, writer: W) -> impl Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .json()
        .with_current_span(true)
        .with_span_list(true)
        .with_writer(writer)
        .finish()
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Lines written, kept for the test to read.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_json_line_has_the_fields_a_pipeline_selects_on() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = json(EnvFilter::new("info"), move || writer.clone());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("pass", cluster = "orders", namespace = "team-a");
            span.in_scope(|| tracing::info!(step = "JoinReplica", "joining a replica"));
        });
        let bytes = captured.0.lock().unwrap().clone();
        let line: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(line["timestamp"].is_string(), "{line}");
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["fields"]["message"], "joining a replica", "{line}");
        assert_eq!(line["fields"]["step"], "JoinReplica", "{line}");
        assert!(
            line["target"]
                .as_str()
                .unwrap()
                .starts_with("valkey_operator"),
            "{line}"
        );
        assert_eq!(line["span"]["cluster"], "orders", "{line}");
        assert_eq!(line["span"]["namespace"], "team-a", "{line}");
        assert_eq!(line["spans"][0]["name"], "pass", "{line}");
    }
}
