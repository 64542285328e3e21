//! The serving certificate: loaded from PEM files at start (a bad file stops the start with a
//! clear error), then watched; when the files change (a mounted Secret is swapped by symlink) the
//! new pair is loaded and served without a restart. A bad new pair is reported and the old one
//! stays.
//!
//! With a client CA (`serve --webhook-client-ca`), a client may present a certificate, which
//! must then be signed by that CA (the API server's webhook client certificate); one that
//! presents none is still served (probes, /metrics), and the server's routes decide what it
//! may reach (see `crate::server`).

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
    #[error("{path} holds no usable CA certificate for clients: {reason}")]
    ClientCa { path: PathBuf, reason: String },
}

/// The certificate and key file paths, and the CA clients' certificates must be signed by.
#[derive(Clone, Debug)]
pub struct CertificatePaths {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// The files' contents, as read together.
struct Pems {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Pems {
    fn read(paths: &CertificatePaths) -> Result<Self, TlsError> {
        Ok(Self {
            cert: read(&paths.cert)?,
            key: read(&paths.key)?,
            client_ca: paths.client_ca.as_deref().map(read).transpose()?,
        })
    }

    fn fingerprint(&self) -> [u8; 32] {
        let mut hash = Sha256::new();
        hash.update(&self.cert);
        hash.update([0]);
        hash.update(&self.key);
        if let Some(ca) = &self.client_ca {
            hash.update([0]);
            hash.update(ca);
        }
        hash.finalize().into()
    }
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
fn server_config(paths: &CertificatePaths, pems: &Pems) -> Result<Arc<ServerConfig>, TlsError> {
    install_crypto_provider();
    let (cert_pem, key_pem) = (&pems.cert, &pems.key);
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
    let builder = ServerConfig::builder();
    let builder = match (&pems.client_ca, &paths.client_ca) {
        (Some(ca), Some(path)) => builder.with_client_cert_verifier(client_verifier(ca, path)?),
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Pair {
            cert: paths.cert.clone(),
            key: paths.key.clone(),
            source,
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Checks a client's certificate, when it presents one, against the CA in `ca_pem`; lets a
/// client without one in.
fn client_verifier(
    ca_pem: &[u8],
    path: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let failed = |reason: String| TlsError::ClientCa {
        path: path.to_path_buf(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| failed(e.to_string()))?;
        roots.add(cert).map_err(|e| failed(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(failed("no PEM certificate".into()));
    }
    rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .map_err(|e| failed(e.to_string()))
}

/// A loaded certificate pair and the fingerprint of the files it came from.
pub struct LoadedCertificate {
    pub config: Arc<ServerConfig>,
    fingerprint: [u8; 32],
}

/// Loads the pair (and the client CA) from the files.
pub fn load(paths: &CertificatePaths) -> Result<LoadedCertificate, TlsError> {
    let pems = Pems::read(paths)?;
    Ok(LoadedCertificate {
        config: server_config(paths, &pems)?,
        fingerprint: pems.fingerprint(),
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
        let Ok(pems) = Pems::read(&paths) else {
            // Mid-swap or briefly missing: try again next tick.
            continue;
        };
        let current = pems.fingerprint();
        if current == seen {
            continue;
        }
        seen = current;
        match server_config(&paths, &pems) {
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
