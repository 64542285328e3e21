//! Passwords the operator issues to a config's users, one per cluster. A user a ValkeyConfig's
//! `spec.acl` puts on every cluster with `passwordHashes` has that one password everywhere: a
//! team that becomes admin on its own nodes could make one of them capture it and then log in
//! on every other team's cluster of the config. A config user that brings no password
//! (`passwordHashes` empty, no `passwordSecretRef`) is issued one per cluster instead, kept in
//! the Secret `<namespace>.<cluster>.issued` ([`issued_secret_name`], one key per user) in the
//! operator's namespace, where the platform's clients read the one of each cluster they talk
//! to and no team can read it. A password captured on one cluster opens no other.
//!
//! Only hashes leave this module; a user the config no longer has, or that brings its own
//! password now, loses its issued one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

use crate::acl::password_hash;
use crate::api::AclUser;
use crate::controller::build::render::ClusterRender;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::pass::credentials::{created, operator_secret, write};
use crate::credentials::{issued_secret_name, random_password};

/// The config's users the operator issues a password to: those that bring none.
pub fn needs_issuing(user: &AclUser) -> bool {
    user.password_hashes.is_empty() && user.password_secret_ref.is_none()
}

/// The SHA-256 of each issued password, by user name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IssuedHashes(BTreeMap<String, String>);

impl IssuedHashes {
    /// `user` as the nodes get it: with its issued password's hash when it was issued one.
    pub fn applied_to(&self, user: &AclUser) -> AclUser {
        match self.0.get(&user.username) {
            Some(hash) if needs_issuing(user) => AclUser {
                password_hashes: vec![crate::api::PasswordHash(hash.clone())],
                ..user.clone()
            },
            _ => user.clone(),
        }
    }
}

/// Reads the cluster's issued passwords, issuing one to each config user that needs one and
/// dropping those no user needs any more; their hashes.
pub async fn ensure(
    ctx: &Context,
    render: &ClusterRender<'_>,
    namespace: &str,
) -> Result<IssuedHashes, Error> {
    let users: Vec<&str> = render
        .effective
        .acl
        .iter()
        .filter(|user| needs_issuing(user))
        .map(|user| user.username.as_str())
        .collect();
    let home = &ctx.settings.operator_namespace;
    let name = issued_secret_name(namespace, &render.cluster.name_any());
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), home);
    let problem = |problem: String| Error::Credentials {
        namespace: home.clone(),
        name: name.clone(),
        problem,
    };
    // Most clusters' configs issue nothing: no read for them.
    if users.is_empty() {
        return Ok(IssuedHashes::default());
    }
    let found = api.get_opt(&name).await?;
    let held: BTreeMap<String, String> = found
        .iter()
        .flat_map(|secret| secret.data.iter().flatten())
        .filter_map(|(user, password)| {
            let password = String::from_utf8(password.0.clone()).ok()?;
            Some((user.clone(), password))
        })
        .collect();
    let wanted = issue(&users, &held).map_err(|e| problem(e.to_string()))?;
    if found.is_none() {
        let secret = operator_secret(render, &name, home, wanted.clone());
        api.create(&created(), &secret).await?;
    } else if wanted != held {
        write(&api, &name, held.keys(), &wanted, false).await?;
    }
    let hashes = wanted
        .iter()
        .map(|(user, password)| (user.clone(), password_hash(password.as_bytes())))
        .collect();
    Ok(IssuedHashes(hashes))
}

/// The passwords `users` should hold: the one each holds already when it is one the operator
/// could have issued, else a new one; nobody else's.
fn issue(
    users: &[&str],
    held: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, getrandom::Error> {
    let mut wanted = BTreeMap::new();
    for user in users {
        let password = match held.get(*user) {
            Some(password) if is_issued(password) => password.clone(),
            _ => random_password()?,
        };
        wanted.insert((*user).to_owned(), password);
    }
    Ok(wanted)
}

/// What the operator issues: 64 hex digits (256 random bits). Anything else in the Secret was
/// not issued by it, and is replaced.
fn is_issued(password: &str) -> bool {
    password.len() == 64 && password.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, hashes: &[&str]) -> AclUser {
        AclUser {
            username: name.into(),
            password_hashes: hashes
                .iter()
                .map(|h| crate::api::PasswordHash((*h).into()))
                .collect(),
            password_secret_ref: None,
            permissions: Vec::new(),
        }
    }

    #[test]
    fn each_user_without_a_password_keeps_its_issued_one_and_no_one_else_gets_one() {
        let first = issue(&["mon", "backup"], &BTreeMap::new()).unwrap();
        assert_eq!(first.keys().collect::<Vec<_>>(), ["backup", "mon"]);
        assert!(first.values().all(|p| is_issued(p)));
        assert_ne!(first["mon"], first["backup"]);
        // Kept while the user needs it; dropped once it does not; a forged one replaced.
        let mut held = first.clone();
        held.insert("stranger".into(), "x".repeat(64));
        held.insert("backup".into(), "not-one-the-operator-issued".into());
        let again = issue(&["mon", "backup"], &held).unwrap();
        assert_eq!(again["mon"], first["mon"]);
        assert!(is_issued(&again["backup"]) && again["backup"] != held["backup"]);
        assert!(!again.contains_key("stranger"));
    }

    #[test]
    fn two_clusters_never_get_the_same_password() {
        let a = issue(&["mon"], &BTreeMap::new()).unwrap();
        let b = issue(&["mon"], &BTreeMap::new()).unwrap();
        assert_ne!(a["mon"], b["mon"]);
    }

    #[test]
    fn only_users_that_bring_no_password_get_the_issued_hash() {
        let hashes = IssuedHashes(BTreeMap::from([
            ("mon".to_owned(), "a".repeat(64)),
            ("own".to_owned(), "b".repeat(64)),
        ]));
        let issued = hashes.applied_to(&user("mon", &[]));
        assert_eq!(issued.password_hashes[0].0, "a".repeat(64));
        let own = "c".repeat(64);
        let kept = hashes.applied_to(&user("own", &[&own]));
        assert_eq!(kept.password_hashes.len(), 1);
        assert_eq!(kept.password_hashes[0].0, own, "a password of its own wins");
    }
}
