//! The serving certificate: loaded from PEM files at start (a bad file stops the start with a
//! clear error), then watched; when the files change (a mounted Secret is swapped by symlink) the
//! new pair is loaded and served without a restart. A bad new pair is reported and the old one
//! stays.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use sha2::{Digest, Sha256};

use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key: {reason}")]
    NoKey { path: PathBuf, reason: String },
    #[error("the certificate in {cert} and the key in {key} do not form a usable pair: {source}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
}

/// The certificate and key file paths.
#[derive(Clone, Debug)]
pub struct CertificatePaths {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Makes sure a process-wide crypto provider is installed (ring); harmless when one already is.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds a rustls server config (TLS 1.2 and 1.3, ALPN h2 and http/1.1) from PEM bytes.
pub fn server_config(
    paths: &CertificatePaths,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<ServerConfig>, TlsError> {
    install_crypto_provider();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: paths.cert.clone(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::NoKey {
        path: paths.key.clone(),
        reason: e.to_string(),
    })?;
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Pair {
            cert: paths.cert.clone(),
            key: paths.key.clone(),
            source,
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A loaded certificate pair and the fingerprint of the files it came from.
pub struct LoadedCertificate {
    pub config: Arc<ServerConfig>,
    fingerprint: [u8; 32],
}

fn fingerprint(cert_pem: &[u8], key_pem: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(cert_pem);
    hash.update([0]);
    hash.update(key_pem);
    hash.finalize().into()
}

/// Loads the pair from the files.
pub fn load(paths: &CertificatePaths) -> Result<LoadedCertificate, TlsError> {
    let cert_pem = read(&paths.cert)?;
    let key_pem = read(&paths.key)?;
    Ok(LoadedCertificate {
        config: server_config(paths, &cert_pem, &key_pem)?,
        fingerprint: fingerprint(&cert_pem, &key_pem),
    })
}

/// Polls the files every `interval` and reloads the served certificate when their content
/// changes. Polling (rather than inotify) also sees Kubernetes' symlink swaps of mounted Secrets.
pub async fn reload_on_change(
    paths: CertificatePaths,
    initial: LoadedCertificate,
    served: RustlsConfig,
    interval: Duration,
    metrics: Arc<Metrics>,
) {
    let mut seen = initial.fingerprint;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let (Ok(cert_pem), Ok(key_pem)) = (read(&paths.cert), read(&paths.key)) else {
            // Mid-swap or briefly missing: try again next tick.
            continue;
        };
        let current = fingerprint(&cert_pem, &key_pem);
        if current == seen {
            continue;
        }
        seen = current;
        match server_config(&paths, &cert_pem, &key_pem) {
            Ok(config) => {
                served.reload_from_config(config);
                metrics.certificate_reloaded(true);
                tracing::info!(cert = %paths.cert.display(), "serving certificate reloaded");
            }
            Err(error) => {
                metrics.certificate_reloaded(false);
                tracing::warn!(%error, "new certificate files are unusable; still serving the previous certificate");
            }
        }
    }
}
