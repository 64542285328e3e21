//! The passwords a cluster's users keep in Secrets of its namespace (`passwordSecretRef`): each
//! Secret read once per pass and each password hashed at once, so only its SHA-256 leaves this
//! module, never the password (not in logs, status or events either). A Secret that cannot be
//! read is an answer too: that user is left as it is and `AclApplied` says why.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::acl::password_hash;
use crate::api::{SecretKeyRef, ValkeyCluster};

/// Per `(Secret, key)`: the password's SHA-256 as 64 hex digits, or why there is none.
#[derive(Debug, Default)]
pub struct PasswordHashes(BTreeMap<(String, String), Result<String, String>>);

impl PasswordHashes {
    /// The hash of the password `secret` names, or why there is none.
    pub fn get(&self, secret: &SecretKeyRef) -> Result<String, String> {
        self.0
            .get(&(secret.name.clone(), secret.key.clone()))
            .cloned()
            .unwrap_or_else(|| Err(format!("Secret {} was not read", secret.name)))
    }
}

/// Reads every Secret the cluster's users name, once each.
pub async fn read_password_hashes(
    client: &Client,
    namespace: &str,
    cluster: &ValkeyCluster,
) -> PasswordHashes {
    let refs: Vec<&SecretKeyRef> = cluster
        .spec
        .acl
        .iter()
        .filter_map(|user| user.password_secret_ref.as_ref())
        .collect();
    let names: BTreeSet<&str> = refs.iter().map(|r| r.name.as_str()).collect();
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut read = BTreeMap::new();
    for name in names {
        read.insert(name, api.get_opt(name).await);
    }
    let mut hashes = PasswordHashes::default();
    for secret in refs {
        let hash = match &read[secret.name.as_str()] {
            Ok(Some(found)) => hash_of_key(found, &secret.name, &secret.key),
            Ok(None) => Err(format!(
                "Secret {} does not exist in namespace {namespace}",
                secret.name
            )),
            Err(error) => Err(format!("reading Secret {}: {error}", secret.name)),
        };
        hashes
            .0
            .insert((secret.name.clone(), secret.key.clone()), hash);
    }
    hashes
}

fn hash_of_key(secret: &Secret, name: &str, key: &str) -> Result<String, String> {
    let password = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .ok_or_else(|| format!("Secret {name} has no key {key:?}"))?;
    if password.0.is_empty() {
        return Err(format!("Secret {name}: key {key:?} is empty"));
    }
    Ok(password_hash(&password.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn a_password_becomes_its_sha256_and_nothing_else() {
        // `echo -n "correct horse" | sha256sum`
        assert_eq!(
            password_hash(b"correct horse"),
            "4104d36f8da2c254349f85836793ebe029e0c957063a34c91c2e9203187b5631"
        );
        let secret = Secret {
            data: Some(BTreeMap::from([
                (
                    "password".to_string(),
                    ByteString(b"correct horse".to_vec()),
                ),
                ("empty".to_string(), ByteString(Vec::new())),
            ])),
            ..Default::default()
        };
        assert_eq!(
            hash_of_key(&secret, "app", "password"),
            Ok(password_hash(b"correct horse"))
        );
        assert_eq!(
            hash_of_key(&secret, "app", "missing"),
            Err("Secret app has no key \"missing\"".to_string())
        );
        assert!(
            hash_of_key(&secret, "app", "empty")
                .unwrap_err()
                .contains("is empty")
        );
    }
}
