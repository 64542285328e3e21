//! TLS to a node: the cluster's own CA (`ca.crt` of its TLS Secret) as the only root, and the
//! name its certificate must carry, checked whatever IP the node is reached at. The operator
//! reaches nodes by Pod IP, which no certificate names; it checks the headless Service's name,
//! `<cluster>.<namespace>.svc` (see [`service_name`]).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

/// Why a cluster's TLS trust cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsTrustError {
    #[error("ca.crt holds no PEM certificate")]
    NoCertificate,
    #[error("ca.crt: {0}")]
    BadCertificate(String),
    #[error("{0:?} is not a DNS name")]
    BadName(String),
    #[error("TLS client configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The name a cluster's certificates must carry for the operator: its headless Service.
pub fn service_name(cluster: &str, namespace: &str) -> String {
    format!("{cluster}.{namespace}.svc")
}

/// What the operator trusts when it connects to one cluster's nodes.
#[derive(Clone)]
pub struct TlsTrust {
    pub(super) config: Arc<ClientConfig>,
    pub(super) server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTrust")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsTrust {
    /// Trust only the CA certificates in `ca_pem`, for certificates naming `server_name`.
    pub fn new(ca_pem: &[u8], server_name: &str) -> Result<Self, TlsTrustError> {
        let mut roots = RootCertStore::empty();
        let mut found = false;
        for certificate in CertificateDer::pem_slice_iter(ca_pem) {
            let certificate =
                certificate.map_err(|e| TlsTrustError::BadCertificate(e.to_string()))?;
            roots
                .add(certificate)
                .map_err(|e| TlsTrustError::BadCertificate(e.to_string()))?;
            found = true;
        }
        if !found {
            return Err(TlsTrustError::NoCertificate);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = ServerName::try_from(server_name.to_owned())
            .map_err(|_| TlsTrustError::BadName(server_name.to_owned()))?;
        Ok(Self {
            config: Arc::new(config),
            server_name,
        })
    }
}
