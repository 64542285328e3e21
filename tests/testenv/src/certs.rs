//! The control plane's PKI, made fresh per launch: a CA, the API server's serving
//! certificate, an admin client certificate (group `system:masters`, so RBAC lets it do
//! anything), the service-account signing key, and a CA of its own for the client certificate
//! the API server presents to webhooks (a webhook that trusts it trusts nothing else).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::Error;

/// Where the generated files live (all PEM).
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_public_key: PathBuf,
    pub webhook_client_ca: PathBuf,
    pub webhook_client_cert: PathBuf,
    pub webhook_client_key: PathBuf,
}

impl Pki {
    /// Generates every key and certificate into `dir`; the API server's certificate names
    /// loopback, the `kubernetes` Service's names and `addresses` (its ClusterIP, where it
    /// binds for Pods).
    pub fn generate(dir: &Path, addresses: &[String]) -> Result<Self, Error> {
        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            service_account_key: dir.join("service-account.key"),
            service_account_public_key: dir.join("service-account.pub"),
            webhook_client_ca: dir.join("webhook-client-ca.crt"),
            webhook_client_cert: dir.join("webhook-client.crt"),
            webhook_client_key: dir.join("webhook-client.key"),
        };

        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "testenv-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = Issuer::new(ca_params, ca_key);
        write(&pki.ca_cert, &ca_cert.pem())?;

        let names = [
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ];
        let mut serving = CertificateParams::new(
            names
                .iter()
                .map(ToString::to_string)
                .chain(addresses.iter().cloned())
                .collect::<Vec<_>>(),
        )?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate()?;
        write(
            &pki.serving_cert,
            &serving.signed_by(&serving_key, &ca)?.pem(),
        )?;
        write(&pki.serving_key, &serving_key.serialize_pem())?;

        let mut admin = CertificateParams::new(Vec::<String>::new())?;
        admin
            .distinguished_name
            .push(DnType::CommonName, "testenv-admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_key = KeyPair::generate()?;
        write(&pki.admin_cert, &admin.signed_by(&admin_key, &ca)?.pem())?;
        write(&pki.admin_key, &admin_key.serialize_pem())?;

        let webhook_ca_key = KeyPair::generate()?;
        let mut webhook_ca = CertificateParams::new(Vec::<String>::new())?;
        webhook_ca
            .distinguished_name
            .push(DnType::CommonName, "testenv-webhook-client-ca");
        webhook_ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        webhook_ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        write(
            &pki.webhook_client_ca,
            &webhook_ca.self_signed(&webhook_ca_key)?.pem(),
        )?;
        let webhook_issuer = Issuer::new(webhook_ca, webhook_ca_key);
        let mut webhook_client = CertificateParams::new(Vec::<String>::new())?;
        webhook_client
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver-webhook-client");
        webhook_client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let webhook_client_key = KeyPair::generate()?;
        write(
            &pki.webhook_client_cert,
            &webhook_client
                .signed_by(&webhook_client_key, &webhook_issuer)?
                .pem(),
        )?;
        write(&pki.webhook_client_key, &webhook_client_key.serialize_pem())?;

        let service_account_key = KeyPair::generate()?;
        write(
            &pki.service_account_key,
            &service_account_key.serialize_pem(),
        )?;
        write(
            &pki.service_account_public_key,
            &service_account_key.public_key_pem(),
        )?;
        Ok(pki)
    }
}

fn write(path: &Path, pem: &str) -> Result<(), Error> {
    std::fs::write(path, pem).map_err(|source| Error::Io {
        what: format!("writing {}", path.display()),
        source,
    })
}
