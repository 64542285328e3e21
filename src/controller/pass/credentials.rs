//! A cluster's credentials Secret on the API server (what it holds and why is
//! [`crate::credentials`]): read each pass, created when absent (owned by the cluster, never taken
//! over), its `auth.conf` kept as the passwords make it (rewritten where an older operator wrote it
//! otherwise), and a rotation moved on once every node took its last step.
//!
//! [`Known`] remembers the last credentials read per cluster, so a Secret deleted by a person comes
//! back as a rotation from the passwords the nodes still have, not as new passwords that would lock
//! the operator out. With the Secret's `resourceVersion` as the metadata watch last reported it
//! ([`SecretVersions`](crate::controller::memory::credentials::SecretVersions)), it also spares the
//! read: a pass whose Secret has not changed since it was read (and not been written by the
//! operator since) uses what was read.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Map, Value, json};

use crate::api::annotations::ROTATE_CREDENTIALS;
use crate::api::field_managers::CONTROLLER as MANAGER;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::memory::credentials::Known;
use crate::controller::memory::credentials::Read;
use crate::controller::render::ClusterRender;
use crate::credentials::{Passwords, Rotation, SystemCredentials, secret_name};
use crate::fleet::ClusterKey;

/// Reads the cluster's credentials Secret, creating it when absent and rewriting its data when
/// it is not what the passwords make (an `auth.conf` an older operator wrote, which left
/// `default` one subcommand on 9.0 nodes).
/// `nodes_started_with_it`: some Pod of the cluster mounts the Secret, so new passwords (when
/// none are remembered) would lock the operator out of its nodes: that is refused instead.
pub async fn ensure(
    ctx: &Context,
    render: &ClusterRender<'_>,
    namespace: &str,
    nodes_started_with_it: bool,
) -> Result<Read, Error> {
    let (client, known) = (&ctx.client, &ctx.memory.known_credentials);
    let versions = &ctx.memory.secret_versions;
    let cluster = render.cluster;
    let key = ClusterKey::new(namespace, cluster.name_any());
    let name = secret_name(&cluster.name_any());
    let current = versions.current(namespace, &name);
    if let Some(read) = known.unchanged(&key, current.as_deref()) {
        return Ok(read);
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    // The version read, unless this pass writes the Secret (then it is read back next pass).
    let mut version = None;
    let problem = |problem: String| Error::Credentials {
        namespace: namespace.to_owned(),
        name: name.clone(),
        problem,
    };
    let read = match api.get_opt(&name).await? {
        None => {
            let remembered = known.get(&key);
            if remembered.is_none() && nodes_started_with_it {
                return Err(problem(LOST.into()));
            }
            let credentials = replacement(remembered).map_err(|e| problem(e.to_string()))?;
            let secret = new_secret(render, &name, namespace, &credentials);
            let create = PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            api.create(&create, &secret).await?;
            tracing::info!(secret = %name, %namespace, "created the cluster's credentials Secret");
            Read {
                credentials,
                rotate_asked: false,
            }
        }
        Some(secret) => {
            if !crate::controller::pass::membership::is_controlled_by(&secret, render.owner_uid()) {
                return Err(Error::NotOurs {
                    kind: "Secret".into(),
                    namespace: namespace.to_owned(),
                    name,
                });
            }
            let data = plain_data(&secret);
            let credentials = SystemCredentials::from_data(&data).map_err(problem)?;
            let wanted = credentials.to_data();
            if stale(&data, &wanted) {
                write(&api, &name, data.keys(), &wanted, false).await?;
            } else {
                version = secret.metadata.resource_version.clone();
            }
            Read {
                credentials,
                rotate_asked: secret.annotations().contains_key(ROTATE_CREDENTIALS),
            }
        }
    };
    known.remember(&key, &read, version);
    Ok(read)
}

/// Why a Secret that is gone cannot be made again.
const LOST: &str = "it is gone, and the nodes were started with passwords this operator does not remember (it restarted, or another replica leads now): new ones would lock it out of them. Restore the Secret from a backup";

/// Credentials for a Secret that is gone: a rotation from the last ones read when there are
/// any (the nodes still have those), or new ones for a new cluster.
fn replacement(known: Option<SystemCredentials>) -> Result<SystemCredentials, getrandom::Error> {
    match known {
        Some(known) => Ok(SystemCredentials {
            current: known.current,
            rotation: Rotation::Adding(Passwords::generate()?),
        }),
        None => SystemCredentials::fresh(),
    }
}

/// Moves a rotation on when it can (see [`SystemCredentials::advanced`]): writes the Secret's
/// new data, removing the annotation when a rotation starts. Returns what it moved to.
pub async fn advance(
    client: &Client,
    namespace: &str,
    cluster: &str,
    read: &Read,
    everywhere: bool,
    known: &Known,
) -> Result<Option<&'static str>, Error> {
    let name = secret_name(cluster);
    let next = read
        .credentials
        .advanced(read.rotate_asked, everywhere, Passwords::generate)
        .map_err(|error| Error::Credentials {
            namespace: namespace.to_owned(),
            name: name.clone(),
            problem: error.to_string(),
        })?;
    let Some(next) = next else {
        return Ok(None);
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let before = read.credentials.to_data();
    let starting = read.credentials.rotation == Rotation::Steady;
    known.written(&ClusterKey::new(namespace, cluster));
    write(&api, &name, before.keys(), &next.to_data(), starting).await?;
    Ok(Some(match next.rotation {
        Rotation::Adding(_) => {
            "rotating the operator's passwords: adding the new ones on every node"
        }
        Rotation::Dropping(_) => {
            "rotating the operator's passwords: switched to the new ones; removing the old"
        }
        Rotation::Steady => {
            "rotated the operator's passwords: the old ones are gone from every node"
        }
    }))
}

/// A new credentials Secret for the cluster `render` renders, owned by it.
pub fn new_secret(
    render: &ClusterRender<'_>,
    name: &str,
    namespace: &str,
    credentials: &SystemCredentials,
) -> Secret {
    let data = credentials
        .to_data()
        .into_iter()
        .map(|(k, v)| (k, ByteString(v.into_bytes())))
        .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(render.labels(None)),
            owner_references: render.cluster.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}

fn plain_data(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

fn stale(data: &BTreeMap<String, Vec<u8>>, wanted: &BTreeMap<String, String>) -> bool {
    data.len() != wanted.len()
        || wanted
            .iter()
            .any(|(k, v)| data.get(k).map(Vec::as_slice) != Some(v.as_bytes()))
}

/// Replaces the Secret's data (`old_keys`) with `wanted` (keys it no longer has removed), and
/// its rotate annotation when `clear_annotation`, in one merge patch.
async fn write(
    api: &Api<Secret>,
    name: &str,
    old_keys: impl Iterator<Item = &String>,
    wanted: &BTreeMap<String, String>,
    clear_annotation: bool,
) -> Result<(), Error> {
    let mut patch_data: Map<String, Value> = old_keys.map(|k| (k.clone(), Value::Null)).collect();
    for (key, value) in wanted {
        let encoded =
            serde_json::to_value(ByteString(value.clone().into_bytes())).unwrap_or(Value::Null);
        patch_data.insert(key.clone(), encoded);
    }
    let mut patch = json!({ "data": patch_data });
    if clear_annotation {
        patch["metadata"] = json!({"annotations": {ROTATE_CREDENTIALS: null}});
    }
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_reused_only_at_its_version_and_never_after_a_write() {
        let known = Known::default();
        let key = ClusterKey::new("shop", "orders");
        let read = Read {
            credentials: SystemCredentials::fresh().unwrap(),
            rotate_asked: true,
        };
        known.remember(&key, &read, Some("5".into()));
        let reused = known.unchanged(&key, Some("5")).expect("same version");
        assert_eq!(reused.credentials, read.credentials);
        assert!(reused.rotate_asked, "the rotation asked for is kept");
        assert!(known.unchanged(&key, Some("6")).is_none(), "changed");
        assert!(known.unchanged(&key, None).is_none(), "no version seen");
        known.written(&key);
        assert!(known.unchanged(&key, Some("5")).is_none(), "written since");
        assert_eq!(
            known.get(&key),
            Some(read.credentials.clone()),
            "still remembered"
        );
        known.remember(&key, &read, None);
        assert!(
            known.unchanged(&key, Some("5")).is_none(),
            "created, not read"
        );
    }

    #[test]
    fn a_deleted_secret_comes_back_as_a_rotation_from_what_the_nodes_have() {
        let known = SystemCredentials::fresh().unwrap();
        let back = replacement(Some(known.clone())).unwrap();
        assert_eq!(back.current, known.current);
        assert!(matches!(back.rotation, Rotation::Adding(ref next) if *next != known.current));
        assert_eq!(replacement(None).unwrap().rotation, Rotation::Steady);
    }

    #[test]
    fn only_data_that_differs_is_rewritten() {
        let credentials = SystemCredentials::fresh().unwrap();
        let wanted = credentials.to_data();
        let mut data: BTreeMap<String, Vec<u8>> = wanted
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
            .collect();
        assert!(!stale(&data, &wanted));
        // What an older operator wrote for a 9.0 cluster: `default` kept one subcommand.
        let mut older = data.clone();
        let conf = String::from_utf8(older[crate::api::secret_keys::AUTH_CONF].clone()).unwrap();
        let open = conf.replace(
            "user default reset off",
            "user default reset on nopass +cluster|syncslots",
        );
        older.insert(crate::api::secret_keys::AUTH_CONF.into(), open.into_bytes());
        assert!(
            stale(&older, &wanted),
            "an auth.conf that leaves default open"
        );
        data.insert("next-operator-password".into(), b"x".to_vec());
        assert!(stale(&data, &wanted), "a key too many");
    }
}
