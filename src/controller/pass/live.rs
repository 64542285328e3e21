//! Step 8 of a pass, live: changes applied to running nodes in place, without a roll: the cluster's
//! ACL users (with their ValkeyRoles from the fleet index), on every pass, during rolls and stalls
//! too; a credentials rotation moved on; and the Valkey settings `CONFIG SET` can change, once the
//! cluster has converged. A new node also gets the users before it becomes Active (see
//! `crate::execute`).
//!
//! A TLS cluster's nodes are given their per-Pod name to announce (`cluster-announce-hostname`)
//! on every pass until each has it: a Pod made by an operator before names were announced was
//! started without one, and a node made since, which names nodes by hostname in redirects,
//! would otherwise describe it as `?`.
//!
//! A TLS cluster's nodes also reload their certificate files (`CONFIG SET tls-cert-file`, which
//! re-reads all of them) when its Secret changes: the kubelet swaps the mounted files a while after
//! the Secret changes, so the reload is repeated on each pass for
//! [`RELOAD_WINDOW`](crate::controller::memory::certificates::RELOAD_WINDOW) after the operator
//! first saw the new Secret, then not again.
//!
//! [`Applied`] remembers what each node was last given, so a pass writes a node's users only when
//! they changed, the node is new, it refused some, or
//! [`REFRESH`](crate::controller::memory::REFRESH) has passed: a converged cluster costs no ACL
//! call but one every ten minutes. The memory is cleared at each new term of leadership (another
//! replica may have written meanwhile).

use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use crate::acl::{self};
use crate::api::ClusterKey;
use crate::api::secret_keys::TLS_CERT;
use crate::controller::build::render::{ClusterRender, tls_file};
use crate::controller::build::status::NodeRefusal;
use crate::controller::events::{ClusterEvent, publish};
use crate::controller::host::KubeHost;
use crate::controller::memory::applied::Applied;
use crate::controller::pass::Pass;
use crate::controller::pass::credentials;
use crate::controller::pass::keep::Seen;
use crate::controller::pass::plan::Planned;
use crate::credentials::Rotation;
use crate::execute::acl::{DesiredAcl, apply_users};
use crate::execute::{Member, NodeHost};
use crate::roll::{ObservedNode, Step};
use crate::valkey::tls::ClusterNames;
use crate::valkey::{Expected, NodeClient, Reach};

/// What step 8 did: the members it worked on, the users' outcome, and whether nothing is left
/// to redo on the nodes (with a converged step, the cluster settles on those members).
pub struct Lived {
    pub members: Vec<Member>,
    pub acl: AclOutcome,
    pub quiet: bool,
}

/// The users on every pass (so a removed user or a rotated password holds during a long
/// roll), the credentials rotation moved on, certificate reloads while a Secret change is
/// recent, and once converged, settings applied in place.
pub async fn live(
    pass: &Pass<'_>,
    host: &KubeHost<'_>,
    planned: &Planned,
    seen: &Seen,
    render: &ClusterRender<'_>,
) -> Lived {
    let (ctx, key, reach) = (pass.ctx, &pass.key, &seen.reach);
    let observed = &planned.observed;
    let members = host.members();
    let users = &planned.users;
    let applied_acl = &ctx.memory.applied_acl;
    let acl = apply_acl(applied_acl, key, &members, observed, users, reach).await;
    let mut quiet = move_rotation_on(pass, seen, acl.everywhere).await;
    if pass.cluster.spec.tls.is_some() {
        let names = render.dns_names();
        let applied = &ctx.memory.applied_names;
        announce_names(applied, key, &members, observed, &names, reach).await;
    }
    if let Some(version) = &seen.certificate {
        let reloads = reload_certificates(pass, &members, observed, version, reach).await;
        let (namespace, name) = (&pass.namespace, &key.name);
        ctx.metrics
            .node_certificate_reloads(namespace, name, reloads.ok, reloads.failed);
        // Reloads repeat each pass for a while after a Secret change.
        quiet &= reloads == Reloads::default();
    }
    if matches!(planned.step, Step::Converged) {
        let settings = render.live_settings();
        let applied = &ctx.memory.applied_settings;
        apply_settings(applied, key, &members, observed, &settings, reach).await;
    }
    Lived {
        members,
        acl,
        quiet,
    }
}

/// Moves a credentials rotation on once every node has the users; whether none is under way.
async fn move_rotation_on(pass: &Pass<'_>, seen: &Seen, everywhere: bool) -> bool {
    let ctx = pass.ctx;
    let login = &seen.login;
    let steady = login.credentials.rotation == Rotation::Steady && !login.rotate_asked;
    let (namespace, name) = (&pass.namespace, &pass.key.name);
    match credentials::advance(ctx, namespace, name, login, everywhere).await {
        Ok(Some(stage)) => {
            let event = ClusterEvent::CredentialsRotation { stage };
            publish(&ctx.recorder, pass.cluster, &event).await;
            false
        }
        Ok(None) => steady,
        // Tried again next pass; the nodes keep accepting both passwords meanwhile.
        Err(error) => {
            tracing::warn!(cluster = %name, %error, "could not move the credentials rotation on");
            false
        }
    }
}

fn digest(desired: &DesiredAcl) -> u64 {
    let mut hasher = DefaultHasher::new();
    let system = desired.system.as_ref();
    let users = system
        .into_iter()
        .flat_map(|s| &s.users)
        .chain(&desired.users);
    for (user, rules) in users {
        user.hash(&mut hasher);
        acl::arguments(rules).hash(&mut hasher);
    }
    if let Some(system) = system {
        acl::arguments(&system.default).hash(&mut hasher);
        system.replication.username.hash(&mut hasher);
        acl::password_hash(system.replication.password.as_bytes()).hash(&mut hasher);
    }
    desired.keep.hash(&mut hasher);
    hasher.finish()
}

/// The reachable members (answered in this pass's observation) with their addresses.
fn reachable<'a>(
    members: &'a [Member],
    observed: &'a [ObservedNode],
) -> impl Iterator<Item = (&'a str, Expected<'a>)> {
    observed.iter().filter(|o| o.reachable).filter_map(|node| {
        let member = members.iter().find(|m| m.name == node.name)?;
        Some((member.name.as_str(), member.expected()?))
    })
}

/// What [`apply_acl`] left behind.
#[derive(Debug, Default)]
pub struct AclOutcome {
    /// What the members refused when last written.
    pub refusals: Vec<NodeRefusal>,
    /// Every member has the users as desired now (a credentials rotation may move on).
    pub everywhere: bool,
}

/// Writes `users` on every reachable node that does not have them whole yet (a node that
/// refused is tried again each pass, one that cannot be reached next pass).
///
/// `default` closes in a pass only once every live member has been written the operator's
/// users and the replication login and none let the operator in only as `default` (a node
/// made before the operator closed it): until then `default` is left as it is, so no replica
/// loses its link to a primary that closed before the replica had `masterauth`.
pub async fn apply_acl(
    applied: &Applied,
    cluster: &ClusterKey,
    members: &[Member],
    observed: &[ObservedNode],
    users: &DesiredAcl,
    reach: &Reach,
) -> AclOutcome {
    applied.keep_only(cluster, members);
    let digest = digest(users);
    let open = users.leaving_default_open();
    let open_digest = self::digest(&open);
    let unwritten = members
        .iter()
        .filter(|m| !m.terminated)
        .any(|m| !applied.written_here(cluster, m));
    let mut due = Vec::new();
    for (node, expected) in reachable(members, observed) {
        let address = expected.address;
        let current = |d| applied.is_current(cluster, node, address, d);
        if current(digest) || (unwritten && current(open_digest)) {
            continue;
        }
        match NodeClient::open(&expected, reach).await {
            Ok(client) => due.push((node, address, client)),
            Err(error) => tracing::warn!(%node, %error, "could not reach a node to apply users"),
        }
    }
    let opening =
        users.system.is_some() && (unwritten || due.iter().any(|(_, _, c)| !c.is_logged_in()));
    let (given, given_digest) = if opening {
        (open, open_digest)
    } else {
        (users.clone(), digest)
    };
    for (node, address, client) in due {
        match apply_users(&client, &given).await {
            Ok(refused) => applied.record(cluster, node, address, given_digest, refused),
            Err(error) => tracing::warn!(%node, %error, "could not apply the ACL users"),
        }
    }
    AclOutcome {
        refusals: applied.refusals(cluster, &[digest, open_digest]),
        everywhere: applied.everywhere(cluster, members, digest),
    }
}

/// Gives every reachable node of a TLS cluster its per-Pod name to announce, unless it was
/// given it here before (a Pod this operator made starts with it; a `CONFIG SET` of the same
/// name is harmless). A node that fails is logged and tried again next pass.
async fn announce_names(
    applied: &Applied,
    cluster: &ClusterKey,
    members: &[Member],
    observed: &[ObservedNode],
    names: &ClusterNames,
    reach: &Reach,
) {
    applied.keep_only(cluster, members);
    for (node, expected) in reachable(members, observed) {
        let (address, name) = (expected.address, names.node(node));
        let digest = text_digest(&name);
        if applied.is_current(cluster, node, address, digest) {
            continue;
        }
        let announced = match NodeClient::open(&expected, reach).await {
            Ok(client) => client.config_set(ANNOUNCED_NAME, &name).await,
            Err(error) => Err(error),
        };
        match announced {
            Ok(()) => applied.record(cluster, node, address, digest, Vec::new()),
            Err(error) => tracing::warn!(%node, %error, "could not set the name a node announces"),
        }
    }
}

/// The setting a node's announced DNS name is in.
const ANNOUNCED_NAME: &str = "cluster-announce-hostname";

/// Makes every reachable node of a TLS cluster re-read its certificate files, until it has done so
/// after [`RELOAD_WINDOW`](crate::controller::memory::certificates::RELOAD_WINDOW) for this
/// `version` of the Secret. A node that fails is logged and tried again next pass.
async fn reload_certificates(
    pass: &Pass<'_>,
    members: &[Member],
    observed: &[ObservedNode],
    version: &str,
    reach: &Reach,
) -> Reloads {
    let memory = &pass.ctx.memory;
    let (applied, versions) = (&memory.applied_tls, &memory.certificate_versions);
    let cluster = &pass.key;
    let mut reloads = Reloads::default();
    applied.keep_only(cluster, members);
    let settled = versions.settled(cluster, version);
    let digest = text_digest(version);
    for (node, expected) in reachable(members, observed) {
        let address = expected.address;
        if applied.is_current(cluster, node, address, digest) {
            continue;
        }
        let reloaded = match NodeClient::open(&expected, reach).await {
            Ok(client) => {
                client
                    .config_set("tls-cert-file", &tls_file(TLS_CERT))
                    .await
            }
            Err(error) => Err(error),
        };
        match reloaded {
            Ok(()) if settled => {
                reloads.ok += 1;
                applied.record(cluster, node, address, digest, Vec::new())
            }
            Ok(()) => reloads.ok += 1,
            Err(error) => {
                reloads.failed += 1;
                tracing::warn!(%node, %error, "could not reload the TLS certificate")
            }
        }
    }
    reloads
}

/// How many nodes reloaded their certificate in one pass, and how many could not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reloads {
    pub ok: u64,
    pub failed: u64,
}

fn text_digest(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// Applies `settings` on every reachable node that was not given exactly these recently (a
/// converged cluster costs no `CONFIG SET` per pass; a node is set again after
/// [`REFRESH`](crate::controller::memory::REFRESH), so a setting changed by hand is repaired).
pub async fn apply_settings(
    applied: &Applied,
    cluster: &ClusterKey,
    members: &[Member],
    observed: &[ObservedNode],
    settings: &BTreeMap<String, String>,
    reach: &Reach,
) {
    applied.keep_only(cluster, members);
    let digest = text_digest(&format!("{settings:?}"));
    for (node, expected) in reachable(members, observed) {
        let address = expected.address;
        if applied.is_current(cluster, node, address, digest) {
            continue;
        }
        let client = match NodeClient::open(&expected, reach).await {
            Ok(client) => client,
            Err(error) => {
                tracing::warn!(%node, %error, "could not reach a node to apply settings");
                continue;
            }
        };
        let mut all_set = true;
        for (key, value) in settings {
            if let Err(error) = client.config_set(key, value).await {
                all_set = false;
                tracing::warn!(%node, %key, %error, "could not apply a setting live");
            }
        }
        if all_set {
            applied.record(cluster, node, address, digest, Vec::new());
        }
    }
}
