//! Development certificates (`valkey-operator certs`): a CA and a serving certificate for the
//! given DNS names and IPs, written as PEM files. An existing CA in the folder is reused, so a
//! webhook configuration that trusts it stays valid when the serving certificate is reissued.
//! Production installs use the Helm chart's certificate or cert-manager instead.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

const CA_COMMON_NAME: &str = "valkey-operator development CA";

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid DNS name {0:?}")]
    DnsName(String),
}

/// Where the PEM files were written.
#[derive(Clone, Debug)]
pub struct DevCertificates {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl DevCertificates {
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }
    }
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

/// Writes `contents` to `path` atomically (temporary file, then rename), so a server reloading
/// the files never reads half of one. `private` files are readable by their owner only.
fn write_atomically(path: &Path, contents: &str, private: bool) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    let partial = path.with_extension("partial");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&partial)
        .map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&partial, path).map_err(io)
}

/// Writes a serving certificate for `dns_names` and `ips`, signed by the CA in `dir` (created
/// there first if absent).
pub fn write_dev_certificates(
    dir: &Path,
    dns_names: &[String],
    ips: &[IpAddr],
) -> Result<DevCertificates, CertError> {
    let files = DevCertificates::in_dir(dir);
    std::fs::create_dir_all(dir).map_err(|source| CertError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let existing_ca = std::fs::read_to_string(&files.ca_key)
        .ok()
        .filter(|_| files.ca_cert.exists())
        .and_then(|pem| KeyPair::from_pem(&pem).ok());
    let ca_key = match existing_ca {
        Some(key) => key,
        None => {
            let key = KeyPair::generate()?;
            let ca_cert = ca_params()?.self_signed(&key)?;
            write_atomically(&files.ca_key, &key.serialize_pem(), true)?;
            write_atomically(&files.ca_cert, &ca_cert.pem(), false)?;
            key
        }
    };
    let issuer = Issuer::new(ca_params()?, ca_key);

    let mut params = CertificateParams::new(Vec::<String>::new())?;
    for name in dns_names {
        let dns = name
            .clone()
            .try_into()
            .map_err(|_| CertError::DnsName(name.clone()))?;
        params.subject_alt_names.push(SanType::DnsName(dns));
    }
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    let mut name = DistinguishedName::new();
    name.push(
        DnType::CommonName,
        dns_names.first().map_or("valkey-operator", String::as_str),
    );
    params.distinguished_name = name;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    // Key first: a reloading server that sees the new certificate with the old key keeps the
    // old pair until both match.
    write_atomically(&files.key, &key.serialize_pem(), true)?;
    write_atomically(&files.cert, &cert.pem(), false)?;
    Ok(files)
}
