//! TLS to a node, with certificates shaped as Momento's operator documents them: a TLS Secret
//! holding `tls.crt`, `tls.key` and `ca.crt`, whose certificate names the cluster's headless
//! Service `<cluster>.<namespace>.svc.<domain>` and the wildcard under it. Each node announces
//! its per-Pod name `<pod>.<cluster>.<namespace>.svc.<domain>` (which the wildcard covers), and
//! the operator verifies it by that name whatever IP it reaches it at, trusting only the
//! Secret's `ca.crt`. The Secret itself is checked in `access::tls_secret`.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, RootCertStore};

/// Why a cluster's TLS trust cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsTrustError {
    #[error("ca.crt holds no PEM certificate")]
    NoCertificate,
    #[error("ca.crt: {0}")]
    BadCertificate(String),
    #[error("TLS client configuration: {0}")]
    Config(String),
}

/// The DNS names of one cluster's nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNames {
    service: String,
}

impl ClusterNames {
    /// The names of cluster `cluster` in `namespace`, under the Kubernetes DNS `domain`.
    pub fn new(cluster: &str, namespace: &str, domain: &str) -> Self {
        Self {
            service: format!("{cluster}.{namespace}.svc.{domain}"),
        }
    }

    /// The headless Service's name, which every certificate must carry.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The wildcard every certificate must carry: it covers each node's name.
    pub fn wildcard(&self) -> String {
        format!("*.{}", self.service)
    }

    /// The name the node in Pod `pod` announces and is verified by.
    pub fn node(&self, pod: &str) -> String {
        format!("{pod}.{}", self.service)
    }
}

/// Whether the CA certificates in `ca_pem` verify the certificate chain in `cert_pem` (the
/// leaf first) as a server's certificate for `name`, now: what a node trusting that `ca.crt`
/// checks of a peer presenting that certificate.
pub fn ca_verifies(ca_pem: &[u8], cert_pem: &[u8], name: &str) -> bool {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_pem).flatten() {
        if roots.add(certificate).is_err() {
            return false;
        }
    }
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem).flatten().collect();
    let (Some((leaf, intermediates)), Ok(name)) =
        (chain.split_first(), ServerName::try_from(name.to_owned()))
    else {
        return false;
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let Ok(verifier) =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
    else {
        return false;
    };
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], UnixTime::now())
        .is_ok()
}

/// What the operator trusts when it connects to one cluster's nodes: its CA, and the name of
/// each node by the address its Pod holds.
#[derive(Clone)]
pub struct TlsTrust {
    pub(super) config: Arc<ClientConfig>,
    names: ClusterNames,
    /// Pod IP → Pod name, for the cluster's Pods this pass knows.
    pods: BTreeMap<String, String>,
}

impl std::fmt::Debug for TlsTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTrust")
            .field("names", &self.names)
            .field("pods", &self.pods)
            .finish_non_exhaustive()
    }
}

impl TlsTrust {
    /// Trust only the CA certificates in `ca_pem`, for certificates naming the cluster's nodes.
    pub fn new(ca_pem: &[u8], names: ClusterNames) -> Result<Self, TlsTrustError> {
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
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsTrustError::Config(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            config: Arc::new(config),
            names,
            pods: BTreeMap::new(),
        })
    }

    /// Learns which Pod holds which IP, so each node is verified by its own name.
    pub fn know_pods<'a>(&mut self, pods: impl IntoIterator<Item = (&'a str, &'a str)>) {
        self.pods = pods
            .into_iter()
            .map(|(ip, pod)| (ip.to_owned(), pod.to_owned()))
            .collect();
    }

    /// The name the node at `addr` (`host:port`) must present: its Pod's per-Pod name, or, at
    /// an address no Pod of the cluster holds this pass (a peer only gossip has named), the
    /// Service's name, which every certificate of the cluster carries too.
    pub fn server_name(&self, addr: &str) -> Option<ServerName<'static>> {
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = self.pods.get(host).map_or_else(
            || self.names.service().to_owned(),
            |pod| self.names.node(pod),
        );
        ServerName::try_from(name).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::certs::write_dev_certificates;

    #[test]
    fn names_are_the_service_its_wildcard_and_one_per_pod() {
        let names = ClusterNames::new("orders", "team-a", "cluster.local");
        assert_eq!(names.service(), "orders.team-a.svc.cluster.local");
        assert_eq!(names.wildcard(), "*.orders.team-a.svc.cluster.local");
        assert_eq!(
            names.node("orders-0-1eda6"),
            "orders-0-1eda6.orders.team-a.svc.cluster.local"
        );
    }

    fn dns(name: Option<ServerName<'static>>) -> String {
        match name {
            Some(ServerName::DnsName(dns)) => dns.as_ref().to_owned(),
            other => panic!("not a DNS name: {other:?}"),
        }
    }

    #[test]
    fn a_node_is_verified_by_its_pods_name_else_by_the_services() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_dev_certificates(dir.path(), &["ca-holder".to_string()], &[]).unwrap();
        let ca = std::fs::read(&files.ca_cert).unwrap();
        let names = ClusterNames::new("orders", "team-a", "cluster.local");
        let mut trust = TlsTrust::new(&ca, names).unwrap();
        assert_eq!(
            dns(trust.server_name("198.18.1.9:6379")),
            "orders.team-a.svc.cluster.local"
        );
        trust.know_pods([("198.18.1.9", "orders-0-1eda6")]);
        assert_eq!(
            dns(trust.server_name("198.18.1.9:6379")),
            "orders-0-1eda6.orders.team-a.svc.cluster.local"
        );
        assert_eq!(
            dns(trust.server_name("198.18.1.10:6379")),
            "orders.team-a.svc.cluster.local"
        );
        assert!(matches!(
            TlsTrust::new(b"not a certificate", ClusterNames::new("a", "b", "c")),
            Err(TlsTrustError::NoCertificate)
        ));
    }
}
