//! A cluster's two credentials Secrets on the API server (what each holds and why is
//! [`crate::credentials`]): the private one in the operator's namespace, with the passwords,
//! and the mounted one in the cluster's, with `auth.conf` only. Read each pass, created when
//! absent (the mounted one owned by the cluster, never taken over), kept as the passwords make
//! them (an older operator's mounted Secret with the passwords in it is moved and rotated), and
//! a rotation moved on once every node took its last step.
//!
//! [`Known`](crate::controller::memory::credentials::Known) remembers the last credentials read per cluster, so a private Secret deleted by a
//! person comes back as a rotation from the passwords the nodes still have, not as new passwords
//! that would lock the operator out. With the Secrets' `resourceVersion`s as the metadata watch
//! last reported them ([`SecretVersions`](crate::controller::memory::credentials::SecretVersions)),
//! it also spares the reads: a pass whose Secrets have not changed since they were read (and not
//! been written by the operator since) uses what was read.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Map, Value, json};

use crate::api::ClusterKey;
use crate::api::annotations::ROTATE_CREDENTIALS;
use crate::api::field_managers::CONTROLLER as MANAGER;
use crate::api::secret_keys::OPERATOR_PASSWORD;
use crate::controller::build::render::ClusterRender;
use crate::controller::context::Context;
use crate::controller::error::Error;
use crate::controller::memory::credentials::Read;
use crate::credentials::{
    Passwords, Rotation, SystemCredentials, private_secret_name, secret_name,
};

/// Where a cluster's two Secrets are.
struct Places {
    /// The cluster's namespace and its mounted Secret there.
    mounted: (Api<Secret>, String),
    /// The operator's namespace and the private Secret there.
    private: (Api<Secret>, String),
}

impl Places {
    fn of(client: &Client, operator_namespace: &str, namespace: &str, cluster: &str) -> Self {
        Self {
            mounted: (
                Api::namespaced(client.clone(), namespace),
                secret_name(cluster),
            ),
            private: (
                Api::namespaced(client.clone(), operator_namespace),
                private_secret_name(namespace, cluster),
            ),
        }
    }
}

/// Reads the cluster's credentials, creating either Secret when absent and rewriting one whose
/// data is not what the passwords make.
/// `nodes_started_with_it`: some Pod of the cluster mounts the mounted Secret, so new passwords
/// (when none are remembered) would lock the operator out of its nodes: that is refused instead.
pub async fn ensure(
    ctx: &Context,
    render: &ClusterRender<'_>,
    namespace: &str,
    nodes_started_with_it: bool,
) -> Result<Read, Error> {
    let (client, known) = (&ctx.client, &ctx.memory.known_credentials);
    let home = &ctx.settings.operator_namespace;
    let cluster = render.cluster;
    let key = ClusterKey::new(namespace, cluster.name_any());
    let places = Places::of(client, home, namespace, &cluster.name_any());
    let current = versions_now(ctx, &places, namespace);
    if let Some(read) = known.unchanged(&key, current.as_deref()) {
        return Ok(read);
    }
    let (mounted_api, mounted_name) = &places.mounted;
    let mounted = mounted_api.get_opt(mounted_name).await?;
    if let Some(secret) = &mounted
        && !crate::controller::pass::membership::is_controlled_by(secret, render.owner_uid())
    {
        return Err(Error::NotOurs {
            kind: "Secret".into(),
            namespace: namespace.to_owned(),
            name: mounted_name.clone(),
        });
    }
    let mounted_data = mounted.as_ref().map(plain_data);
    let first = || {
        first_credentials(
            mounted_data.as_ref(),
            known.get(&key),
            nodes_started_with_it,
        )
    };
    let (credentials, mut wrote) = keep_private(&places, render, home, first).await?;
    let wanted = credentials.public_data();
    match &mounted_data {
        None => {
            let secret = new_secret(render, mounted_name, namespace, &credentials);
            mounted_api.create(&created(), &secret).await?;
            tracing::info!(secret = %mounted_name, %namespace, "created the cluster's credentials Secret");
            wrote = true;
        }
        Some(data) if stale(data, &wanted) => {
            write(mounted_api, mounted_name, data.keys(), &wanted, false).await?;
            wrote = true;
        }
        Some(_) => {}
    }
    let read = Read {
        credentials,
        rotate_asked: mounted
            .as_ref()
            .is_some_and(|s| s.annotations().contains_key(ROTATE_CREDENTIALS)),
    };
    // What was written is read back next pass; what was only read is reused at its versions.
    let version = if wrote { None } else { current };
    known.remember(&key, &read, version);
    Ok(read)
}

/// The private Secret's credentials, and whether it was written: read (and rewritten if its
/// data is not what its passwords make), or created from `first` when absent (a problem then is
/// the mounted Secret's: where the passwords were looked for).
async fn keep_private(
    places: &Places,
    render: &ClusterRender<'_>,
    home: &str,
    first: impl FnOnce() -> Result<SystemCredentials, String>,
) -> Result<(SystemCredentials, bool), Error> {
    let (api, name) = &places.private;
    let Some(secret) = api.get_opt(name).await? else {
        let credentials = first().map_err(|problem| Error::Credentials {
            namespace: render.cluster.namespace().unwrap_or_default(),
            name: places.mounted.1.clone(),
            problem,
        })?;
        let secret = operator_secret(render, name, home, credentials.to_data());
        api.create(&created(), &secret).await?;
        tracing::info!(secret = %name, namespace = %home, "created the cluster's private credentials Secret");
        return Ok((credentials, true));
    };
    let data = plain_data(&secret);
    let credentials =
        SystemCredentials::from_data(&data).map_err(|problem| Error::Credentials {
            namespace: home.to_owned(),
            name: name.clone(),
            problem,
        })?;
    let wanted = credentials.to_data();
    let rewrite = stale(&data, &wanted);
    if rewrite {
        write(api, name, data.keys(), &wanted, false).await?;
    }
    Ok((credentials, rewrite))
}

/// Both Secrets' versions as the watch last saw them, as one; `None` unless both are known.
fn versions_now(ctx: &Context, places: &Places, namespace: &str) -> Option<String> {
    let versions = &ctx.memory.secret_versions;
    let home = &ctx.settings.operator_namespace;
    let private = versions.current(home, &places.private.1)?;
    let mounted = versions.current(namespace, &places.mounted.1)?;
    Some(format!("{private}/{mounted}"))
}

/// How the operator creates what it owns: under its field manager.
pub(super) fn created() -> PostParams {
    PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// The credentials of a cluster whose private Secret is absent: an older operator's passwords
/// from the mounted Secret (the team could read them there: rotated at once), else a rotation
/// from the last ones read (the nodes still have those), else new ones for a new cluster.
fn first_credentials(
    mounted: Option<&BTreeMap<String, Vec<u8>>>,
    remembered: Option<SystemCredentials>,
    nodes_started_with_it: bool,
) -> Result<SystemCredentials, String> {
    if let Some(data) = mounted.filter(|data| data.contains_key(OPERATOR_PASSWORD)) {
        let older = SystemCredentials::from_data(data)?;
        return older.exposed().map_err(|e| e.to_string());
    }
    if remembered.is_none() && nodes_started_with_it {
        return Err(LOST.into());
    }
    replacement(remembered).map_err(|e| e.to_string())
}

/// Why a private Secret that is gone cannot be made again.
const LOST: &str = "its passwords are gone (the operator's private Secret was deleted), and the nodes were started with passwords this operator does not remember (it restarted, or another replica leads now): new ones would lock it out of them. Restore the private Secret from a backup";

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

/// Moves a rotation on when it can (see [`SystemCredentials::advanced`]): writes both Secrets'
/// new data, removing the annotation when a rotation starts. Returns what it moved to.
pub async fn advance(
    ctx: &Context,
    namespace: &str,
    cluster: &str,
    read: &Read,
    everywhere: bool,
) -> Result<Option<&'static str>, Error> {
    let places = Places::of(
        &ctx.client,
        &ctx.settings.operator_namespace,
        namespace,
        cluster,
    );
    let next = read
        .credentials
        .advanced(read.rotate_asked, everywhere, Passwords::generate)
        .map_err(|error| Error::Credentials {
            namespace: namespace.to_owned(),
            name: places.private.1.clone(),
            problem: error.to_string(),
        })?;
    let Some(next) = next else {
        return Ok(None);
    };
    let starting = read.credentials.rotation == Rotation::Steady;
    let known = &ctx.memory.known_credentials;
    known.written(&ClusterKey::new(namespace, cluster));
    // The passwords first: a pass that stops between the two writes finds them and writes
    // `auth.conf` again from them.
    let (api, name) = &places.private;
    let before = read.credentials.to_data();
    write(api, name, before.keys(), &next.to_data(), false).await?;
    let (api, name) = &places.mounted;
    let before = read.credentials.public_data();
    write(api, name, before.keys(), &next.public_data(), starting).await?;
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

/// Deletes a deleted cluster's Secrets in the operator's namespace, its private one and its
/// issued passwords ([`super::issued`]): nothing owns them across namespaces. One already gone
/// is fine.
pub async fn forget(ctx: &Context, namespace: &str, cluster: &str) -> Result<(), Error> {
    let places = Places::of(
        &ctx.client,
        &ctx.settings.operator_namespace,
        namespace,
        cluster,
    );
    let (api, private) = &places.private;
    for name in [
        private,
        &crate::credentials::issued_secret_name(namespace, cluster),
    ] {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// A Secret of the cluster `render` renders in the operator's namespace (its private one, its
/// issued passwords): labelled with the cluster's labels (its namespace is in the name), owned
/// by nothing (an owner must be in the same namespace; [`forget`] deletes it with the cluster).
pub(super) fn operator_secret(
    render: &ClusterRender<'_>,
    name: &str,
    namespace: &str,
    data: BTreeMap<String, String>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(render.labels(None)),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(encoded(data)),
        ..Default::default()
    }
}

fn encoded(data: BTreeMap<String, String>) -> BTreeMap<String, ByteString> {
    data.into_iter()
        .map(|(k, v)| (k, ByteString(v.into_bytes())))
        .collect()
}

/// A new mounted credentials Secret for the cluster `render` renders, owned by it: `auth.conf`
/// only.
pub fn new_secret(
    render: &ClusterRender<'_>,
    name: &str,
    namespace: &str,
    credentials: &SystemCredentials,
) -> Secret {
    let data = encoded(credentials.public_data());
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
pub(super) async fn write(
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
    use crate::controller::memory::credentials::Known;

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
        let wanted = credentials.public_data();
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
        // An older operator's mounted Secret, with the passwords in it.
        data.insert(OPERATOR_PASSWORD.into(), b"x".to_vec());
        assert!(stale(&data, &wanted), "a key too many");
    }

    #[test]
    fn passwords_found_in_the_mounted_secret_are_moved_and_rotated() {
        let older = SystemCredentials::fresh().unwrap();
        let mut data: BTreeMap<String, Vec<u8>> = older
            .to_data()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        let moved = first_credentials(Some(&data), None, true).unwrap();
        assert_eq!(
            moved.current, older.current,
            "the nodes' passwords are kept"
        );
        assert!(matches!(moved.rotation, Rotation::Adding(_)), "and rotated");
        // A mounted Secret with auth.conf only, nothing remembered, nodes started with it.
        data.retain(|k, _| k == crate::api::secret_keys::AUTH_CONF);
        let lost = first_credentials(Some(&data), None, true).unwrap_err();
        assert!(lost.contains("Restore the private Secret"), "{lost}");
        assert_eq!(
            first_credentials(None, None, false).unwrap().rotation,
            Rotation::Steady,
            "a new cluster"
        );
    }
}
