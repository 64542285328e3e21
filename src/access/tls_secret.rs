//! A TLS cluster's Secret (`spec.tls.secretRef`), checked on every pass before anything is
//! done with the cluster, as Momento's operator checks it: present with data, the three keys,
//! `tls.crt` as PEM and as X.509, and both SANs its nodes' names need (the Service's name and
//! the wildcard under it, compared as names). Beyond Momento, `tls.key` and `ca.crt` must parse
//! too (Momento leaves those to the first handshake). Every problem reads as Momento's
//! `status.message`, verbatim where its troubleshooting page lists one; the cluster is
//! `Invalid` until the Secret is fixed, in place or by pointing `spec.tls.secretRef` elsewhere.
//!
//! A repointed `spec.tls.secretRef` rolls the nodes onto the new Secret; while nodes on the old
//! one run, the two must trust each other ([`check_continuity`]), else nothing is done.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::api::secret_keys::{TLS_CA, TLS_CERT, TLS_KEY};
use crate::valkey::tls::{ClusterNames, TlsTrust, TlsTrustError, ca_verifies};

/// Why a TLS Secret cannot be used: Momento's messages where it documents one (its
/// troubleshooting page lists them), then the two checks Momento leaves to the handshake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsSecretProblem {
    #[error("TLS Secret {secret:?} not found in namespace {namespace:?}")]
    NotFound { secret: String, namespace: String },
    #[error("TLS Secret {secret:?} has no data")]
    NoData { secret: String },
    #[error("TLS Secret {secret:?} missing required key {key:?}")]
    MissingKey { secret: String, key: &'static str },
    #[error("TLS Secret {secret:?}: tls.crt is not valid PEM")]
    NotPem { secret: String },
    #[error("TLS Secret {secret:?}: tls.crt is not a valid X.509 certificate")]
    NotX509 { secret: String },
    #[error("TLS cert in Secret {secret:?} missing SAN {name:?}")]
    MissingSan { secret: String, name: String },
    #[error("TLS Secret {secret:?}: tls.key is not a PEM private key")]
    NotAKey { secret: String },
    #[error("TLS Secret {secret:?}: {problem}")]
    Ca {
        secret: String,
        problem: TlsTrustError,
    },
    #[error(
        "TLS Secret {to:?} cannot replace {from:?}, which running nodes still use, until each trusts the other: {detail}; put both CA certificates in both Secrets' ca.crt, or point spec.tls.secretRef back at {from:?}"
    )]
    NoContinuity {
        from: String,
        to: String,
        detail: String,
    },
}

/// Checks a TLS Secret's `data` as Momento does (the three keys, `tls.crt` as PEM and X.509,
/// both SANs, compared as names, not matched as patterns), and that `tls.key` and `ca.crt`
/// parse, then builds the trust in its CA for `names`.
pub fn check_secret(
    secret: &str,
    data: Option<&BTreeMap<String, ByteString>>,
    names: &ClusterNames,
) -> Result<TlsTrust, TlsSecretProblem> {
    let secret_name = || secret.to_owned();
    let data = data
        .filter(|data| !data.is_empty())
        .ok_or_else(|| TlsSecretProblem::NoData {
            secret: secret_name(),
        })?;
    let value = |key: &'static str| {
        data.get(key).ok_or(TlsSecretProblem::MissingKey {
            secret: secret_name(),
            key,
        })
    };
    let (cert, key, ca) = (&value(TLS_CERT)?.0, &value(TLS_KEY)?.0, &value(TLS_CA)?.0);
    let cert = CertificateDer::pem_slice_iter(cert)
        .next()
        .and_then(Result::ok)
        .ok_or_else(|| TlsSecretProblem::NotPem {
            secret: secret_name(),
        })?;
    let end_entity =
        webpki::EndEntityCert::try_from(&cert).map_err(|_| TlsSecretProblem::NotX509 {
            secret: secret_name(),
        })?;
    let presented: Vec<String> = end_entity
        .valid_dns_names()
        .map(str::to_ascii_lowercase)
        .collect();
    for name in [names.service().to_owned(), names.wildcard()] {
        if !presented.contains(&name) {
            return Err(TlsSecretProblem::MissingSan {
                secret: secret_name(),
                name,
            });
        }
    }
    PrivateKeyDer::from_pem_slice(key).map_err(|_| TlsSecretProblem::NotAKey {
        secret: secret_name(),
    })?;
    TlsTrust::new(ca, names.clone()).map_err(|problem| TlsSecretProblem::Ca {
        secret: secret_name(),
        problem,
    })
}

/// The value of `key` in a Secret's `data`, if it has one.
fn key<'a>(data: Option<&'a BTreeMap<String, ByteString>>, key: &str) -> Option<&'a [u8]> {
    data.and_then(|data| data.get(key))
        .map(|value| value.0.as_slice())
}

/// Whether nodes on the Secret `from` and nodes on `to` can work together while the cluster
/// rolls from one to the other (`spec.tls.secretRef` repointed): a new replica verifies its
/// old primary, an old node its new peers on the bus, so each Secret's `ca.crt` must verify the
/// other's certificate for the cluster's name. `from` is only read here: a problem with it is
/// named as its own.
pub fn check_continuity(
    from: (&str, Option<&BTreeMap<String, ByteString>>),
    to: (&str, &BTreeMap<String, ByteString>),
    names: &ClusterNames,
) -> Result<(), TlsSecretProblem> {
    let ((from, from_data), (to, to_data)) = (from, to);
    let no_continuity = |detail: String| TlsSecretProblem::NoContinuity {
        from: from.to_owned(),
        to: to.to_owned(),
        detail,
    };
    let (Some(from_ca), Some(from_cert)) = (key(from_data, TLS_CA), key(from_data, TLS_CERT))
    else {
        return Err(no_continuity(format!(
            "{from:?} cannot be read for its {TLS_CA} and {TLS_CERT}"
        )));
    };
    let (to_ca, to_cert) = (key(Some(to_data), TLS_CA), key(Some(to_data), TLS_CERT));
    let (Some(to_ca), Some(to_cert)) = (to_ca, to_cert) else {
        return Err(no_continuity(format!(
            "{to:?} lacks {TLS_CA} or {TLS_CERT}"
        )));
    };
    let name = names.service();
    if !ca_verifies(to_ca, from_cert, name) {
        return Err(no_continuity(format!(
            "the {TLS_CA} of {to:?} does not verify the certificate of {from:?}"
        )));
    }
    if !ca_verifies(from_ca, to_cert, name) {
        return Err(no_continuity(format!(
            "the {TLS_CA} of {from:?} does not verify the certificate of {to:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::certs::write_dev_certificates;

    fn names() -> ClusterNames {
        ClusterNames::new("orders", "team-a", "cluster.local")
    }

    /// A Secret's data with a certificate for `dns_names`, signed by a fresh CA.
    fn secret_for(dns_names: &[&str]) -> BTreeMap<String, ByteString> {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = dns_names.iter().map(|n| n.to_string()).collect();
        let files = write_dev_certificates(dir.path(), &names, &[]).unwrap();
        let read = |path: &std::path::Path| ByteString(std::fs::read(path).unwrap());
        BTreeMap::from([
            (TLS_CERT.to_string(), read(&files.cert)),
            (TLS_KEY.to_string(), read(&files.key)),
            (TLS_CA.to_string(), read(&files.ca_cert)),
        ])
    }

    fn momentos() -> BTreeMap<String, ByteString> {
        secret_for(&[
            "orders.team-a.svc.cluster.local",
            "*.orders.team-a.svc.cluster.local",
        ])
    }

    fn problem(data: Option<&BTreeMap<String, ByteString>>) -> String {
        check_secret("orders-tls", data, &names())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_momento_shaped_secret_passes() {
        assert!(check_secret("orders-tls", Some(&momentos()), &names()).is_ok());
    }

    #[test]
    fn each_failure_reads_as_momentos_message() {
        assert_eq!(problem(None), r#"TLS Secret "orders-tls" has no data"#);
        assert_eq!(
            problem(Some(&BTreeMap::new())),
            r#"TLS Secret "orders-tls" has no data"#
        );
        for key in [TLS_CERT, TLS_KEY, TLS_CA] {
            let mut data = momentos();
            data.remove(key);
            assert_eq!(
                problem(Some(&data)),
                format!(r#"TLS Secret "orders-tls" missing required key "{key}""#)
            );
        }
        let mut data = momentos();
        data.insert(TLS_CERT.into(), ByteString(b"not a certificate".to_vec()));
        assert_eq!(
            problem(Some(&data)),
            r#"TLS Secret "orders-tls": tls.crt is not valid PEM"#
        );
        let garbage = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
        data.insert(TLS_CERT.into(), ByteString(garbage.as_bytes().to_vec()));
        assert_eq!(
            problem(Some(&data)),
            r#"TLS Secret "orders-tls": tls.crt is not a valid X.509 certificate"#
        );
        let service_only = secret_for(&["orders.team-a.svc.cluster.local"]);
        assert_eq!(
            problem(Some(&service_only)),
            r#"TLS cert in Secret "orders-tls" missing SAN "*.orders.team-a.svc.cluster.local""#
        );
        // A wildcard one level up would match the Service's name as a pattern; Momento
        // compares names, and so does this check.
        let wide = secret_for(&[
            "*.team-a.svc.cluster.local",
            "*.orders.team-a.svc.cluster.local",
        ]);
        assert_eq!(
            problem(Some(&wide)),
            r#"TLS cert in Secret "orders-tls" missing SAN "orders.team-a.svc.cluster.local""#
        );
        let mut data = momentos();
        data.insert(TLS_KEY.into(), ByteString(b"no key".to_vec()));
        assert_eq!(
            problem(Some(&data)),
            r#"TLS Secret "orders-tls": tls.key is not a PEM private key"#
        );
        let mut data = momentos();
        data.insert(TLS_CA.into(), ByteString(b"no CA".to_vec()));
        assert_eq!(
            problem(Some(&data)),
            r#"TLS Secret "orders-tls": ca.crt holds no PEM certificate"#
        );
    }

    /// Two Secrets from the same CA, and one from another.
    #[test]
    fn a_repointed_secret_must_trust_the_old_one_both_ways() {
        let names = names();
        let dir = tempfile::tempdir().unwrap();
        let momentos = [
            "orders.team-a.svc.cluster.local".to_string(),
            "*.orders.team-a.svc.cluster.local".to_string(),
        ];
        let read = |path: &std::path::Path| ByteString(std::fs::read(path).unwrap());
        let secret = |files: &crate::cli::certs::DevCertificates| {
            BTreeMap::from([
                (TLS_CERT.to_string(), read(&files.cert)),
                (TLS_KEY.to_string(), read(&files.key)),
                (TLS_CA.to_string(), read(&files.ca_cert)),
            ])
        };
        // The same folder keeps its CA: a renewed leaf from the same CA.
        let old = secret(&write_dev_certificates(dir.path(), &momentos, &[]).unwrap());
        let renewed = secret(&write_dev_certificates(dir.path(), &momentos, &[]).unwrap());
        assert_ne!(old[TLS_CERT], renewed[TLS_CERT]);
        assert!(check_continuity(("old", Some(&old)), ("new", &renewed), &names).is_ok());

        let other_dir = tempfile::tempdir().unwrap();
        let foreign = secret(&write_dev_certificates(other_dir.path(), &momentos, &[]).unwrap());
        let problem = check_continuity(("old", Some(&old)), ("new", &foreign), &names)
            .unwrap_err()
            .to_string();
        assert!(
            problem.contains(r#"the ca.crt of "new" does not verify the certificate of "old""#),
            "{problem}"
        );
        // The new Secret bundles both CAs, the old one only its own: one way is not enough.
        let mut bundled = foreign.clone();
        let mut both = foreign[TLS_CA].0.clone();
        both.extend_from_slice(&old[TLS_CA].0);
        bundled.insert(TLS_CA.into(), ByteString(both.clone()));
        let problem = check_continuity(("old", Some(&old)), ("new", &bundled), &names)
            .unwrap_err()
            .to_string();
        assert!(
            problem.contains(r#"the ca.crt of "old" does not verify the certificate of "new""#),
            "{problem}"
        );
        // Momento's bundle step done on both: the roll may go on.
        let mut old_bundled = old.clone();
        old_bundled.insert(TLS_CA.into(), ByteString(both));
        assert!(check_continuity(("old", Some(&old_bundled)), ("new", &bundled), &names).is_ok());
        // An old Secret that is gone cannot be checked.
        assert!(
            check_continuity(("old", None), ("new", &renewed), &names)
                .unwrap_err()
                .to_string()
                .contains(r#""old" cannot be read"#)
        );
    }
}
