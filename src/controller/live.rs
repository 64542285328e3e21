//! Step 6 of a pass, live: changes applied to running nodes in place, without a roll: the
//! cluster's ACL users (with their ValkeyRoles from the fleet index), on every pass, during
//! rolls and stalls too; a credentials rotation moved on; and the Valkey settings `CONFIG SET`
//! can change, once the cluster has converged. A new node also gets the users before it
//! becomes Active (see `crate::execute`).
//!
//! A TLS cluster's nodes also reload their certificate files (`CONFIG SET tls-cert-file`, which
//! re-reads all of them) when its Secret changes: the kubelet swaps the mounted files a while
//! after the Secret changes, so the reload is repeated on each pass for [`RELOAD_WINDOW`] after
//! the operator first saw the new Secret, then not again.
//!
//! [`Applied`] remembers what each node was last given, so a pass writes a node's users only
//! when they changed, the node is new, it refused some, or [`REFRESH`] has passed: a converged
//! cluster costs no ACL call but one every ten minutes. The memory is cleared at each new term
//! of leadership (another replica may have written meanwhile).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use super::credentials;
use super::events::{ClusterEvent, publish};
use super::host::KubeHost;
use super::memory::{KeptPerCluster, PerCluster};
use super::observe::Seen;
use super::plan::Planned;
use super::reconcile::Pass;
use super::render::{ClusterRender, TLS_CERT_KEY, tls_file};
use super::secrets::PasswordHashes;
use crate::acl::{self, AclError, is_reserved};
use crate::api::ValkeyCluster;
use crate::credentials::{Rotation, SystemUsers};
use crate::execute::acl::{DesiredAcl, Refusal, apply_users};
use crate::execute::{Member, NodeHost};
use crate::fleet::{ClusterKey, Fleet};
use crate::roll::{ObservedNode, Step};
use crate::valkey::{Expected, NodeAddress, NodeClient, Reach};

/// The cluster's users as `ACL SETUSER` rules, with the operator's own (`system`), and why each
/// user that could not be built was not (that user is left as it is on the nodes).
pub fn desired_acl(
    fleet: &RwLock<Fleet>,
    cluster: &ValkeyCluster,
    passwords: &PasswordHashes,
    system: SystemUsers,
) -> (DesiredAcl, Vec<AclError>) {
    let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
    let mut desired = DesiredAcl::none();
    desired.system = Some(system);
    let mut problems = Vec::new();
    let too_large = too_large(&cluster.spec.acl, &fleet);
    for (index, user) in cluster.spec.acl.iter().enumerate() {
        desired.keep.insert(user.username.clone());
        if let Some(problem) = too_large.get(&index) {
            problems.push(AclError::TooLarge {
                user: user.username.clone(),
                problem: problem.clone(),
            });
            continue;
        }
        match acl::user_rules(user, |role| fleet.role(role), |s| passwords.get(s)) {
            Ok(rules) => desired.users.push((user.username.clone(), rules)),
            Err(problem) => problems.push(problem),
        }
    }
    (desired, problems)
}

/// The users (by index) whose rules are not written for being past the bounds of
/// [`acl::Cost`] (left as they are on the nodes): each user over its own bound, and when all
/// together would write too much on each node, every one of them.
fn too_large(users: &[crate::api::AclUser], fleet: &Fleet) -> BTreeMap<usize, String> {
    let costs: Vec<acl::UserCost> = users.iter().map(acl::UserCost::of).collect();
    let mut refused = BTreeMap::new();
    for (index, problem) in acl::cost_problems(&costs, |role| fleet.role_cost(role)) {
        match index {
            Some(index) => {
                refused.insert(index, problem);
            }
            None => {
                for index in 0..users.len() {
                    refused
                        .entry(index)
                        .or_insert_with(|| format!("spec.acl {problem}"));
                }
            }
        }
    }
    refused
}

/// A node's refusal of one of its users.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRefusal {
    pub node: String,
    pub refusal: Refusal,
}

/// How long a write is trusted: after this a node is written again, so a node changed by hand
/// is repaired and the memory never vouches for long for what it did not see.
pub const REFRESH: Duration = Duration::from_secs(600);

/// What step 6 did: the members it worked on, the users' outcome, and whether nothing is left
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
    let known = &ctx.memory.known_credentials;
    let (namespace, name) = (&pass.namespace, &pass.key.name);
    match credentials::advance(&ctx.client, namespace, name, login, everywhere, known).await {
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

/// What each node of each cluster was last given: its address (a new server at a new address
/// starts with nothing), a digest of what it was given (its users, or the certificate it
/// reloaded), when, and what it refused of it.
#[derive(Debug, Default)]
pub struct Applied(PerCluster<HashMap<String, Written>>);

#[derive(Clone, Debug)]
pub(super) struct Written {
    at: NodeAddress,
    digest: u64,
    when: Instant,
    refusals: Vec<Refusal>,
}

impl Written {
    /// It holds the operator's own users and the replication login: every write carries them,
    /// and it refused none of them (a tenant's refusal locks nobody out).
    fn has_system_users(&self) -> bool {
        !self.refusals.iter().any(|r| is_reserved(&r.user))
    }
}

impl Applied {
    /// Whether `node` of `cluster` was written, and that write passes `test`.
    fn written(
        &self,
        cluster: &ClusterKey,
        node: &str,
        test: impl FnOnce(&Written) -> bool,
    ) -> bool {
        let applied = self.0.lock();
        applied
            .get(cluster)
            .and_then(|nodes| nodes.get(node))
            .is_some_and(test)
    }

    /// Whether the node took exactly this, whole, recently enough.
    fn is_current(&self, cluster: &ClusterKey, node: &str, at: NodeAddress, digest: u64) -> bool {
        self.is_current_at(cluster, node, at, digest, Instant::now())
    }

    fn is_current_at(
        &self,
        cluster: &ClusterKey,
        node: &str,
        at: NodeAddress,
        digest: u64,
        now: Instant,
    ) -> bool {
        self.written(cluster, node, |w| {
            w.at == at
                && w.digest == digest
                && w.refusals.is_empty()
                && now.saturating_duration_since(w.when) < REFRESH
        })
    }

    fn record(
        &self,
        cluster: &ClusterKey,
        node: &str,
        at: NodeAddress,
        digest: u64,
        refusals: Vec<Refusal>,
    ) {
        let mut applied = self.0.lock();
        let written = Written {
            at,
            digest,
            when: Instant::now(),
            refusals,
        };
        applied
            .entry(cluster.clone())
            .or_default()
            .insert(node.to_owned(), written);
    }

    /// What the members refused of what is desired now (`digests`: the users with `default`
    /// closed, and the same with it left open) when last written, reachable now or not, so a
    /// node that misses one pass does not turn the condition true.
    fn refusals(&self, cluster: &ClusterKey, digests: &[u64]) -> Vec<NodeRefusal> {
        let applied = self.0.lock();
        let nodes = applied.get(cluster).into_iter().flatten();
        let mut refusals: Vec<NodeRefusal> = nodes
            .filter(|(_, w)| digests.contains(&w.digest))
            .flat_map(|(node, w)| {
                w.refusals.iter().map(|refusal| NodeRefusal {
                    node: node.clone(),
                    refusal: refusal.clone(),
                })
            })
            .collect();
        refusals.sort_by(|a, b| a.node.cmp(&b.node));
        refusals
    }

    /// Whether every member took `digest` at the address it has now, the operator's own users
    /// included (a tenant user refused does not count: it does not lock anyone out).
    fn everywhere(&self, cluster: &ClusterKey, members: &[Member], digest: u64) -> bool {
        members.iter().all(|member| {
            self.written(cluster, &member.name, |w| {
                Some(w.at) == member.address && w.digest == digest && w.has_system_users()
            })
        })
    }

    /// Whether the member was written at the address it has now, whatever with (every write
    /// carries the operator's users and the replication login).
    fn written_here(&self, cluster: &ClusterKey, member: &Member) -> bool {
        self.written(cluster, &member.name, |w| {
            Some(w.at) == member.address && w.has_system_users()
        })
    }

    /// Keeps only the cluster's current members (retired nodes are forgotten).
    fn keep_only(&self, cluster: &ClusterKey, members: &[Member]) {
        let mut applied = self.0.lock();
        if let Some(nodes) = applied.get_mut(cluster) {
            nodes.retain(|node, _| members.iter().any(|m| &m.name == node));
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

/// How long after a Secret change its certificate is still reloaded each pass: a kubelet
/// refreshes mounted Secrets within about a minute (its sync period plus cache).
pub const RELOAD_WINDOW: Duration = Duration::from_secs(150);

/// A TLS cluster's certificate as the Secret holds it now, and when the operator first saw
/// that version.
#[derive(Debug, Default)]
pub struct CertificateVersions(PerCluster<(String, Instant)>);

impl CertificateVersions {
    /// Whether `version` was first seen long enough ago that a reload now finds the new files.
    fn settled(&self, cluster: &ClusterKey, version: &str) -> bool {
        self.settled_at(cluster, version, Instant::now())
    }

    fn settled_at(&self, cluster: &ClusterKey, version: &str, now: Instant) -> bool {
        let mut seen = self.0.lock();
        match seen.get(cluster) {
            Some((known, since)) if known == version => {
                now.saturating_duration_since(*since) > RELOAD_WINDOW
            }
            _ => {
                seen.insert(cluster.clone(), (version.to_owned(), now));
                false
            }
        }
    }
}

/// Makes every reachable node of a TLS cluster re-read its certificate files, until it has done
/// so after [`RELOAD_WINDOW`] for this `version` of the Secret. A node that fails is logged and
/// tried again next pass.
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
                    .config_set("tls-cert-file", &tls_file(TLS_CERT_KEY))
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
/// converged cluster costs no `CONFIG SET` per pass; a node is set again after [`REFRESH`], so
/// a setting changed by hand is repaired).
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

impl KeptPerCluster for Applied {
    type Entry = HashMap<String, Written>;

    fn entries(&self) -> &PerCluster<Self::Entry> {
        &self.0
    }

    #[cfg(test)]
    fn sample_entry() -> Self::Entry {
        HashMap::new()
    }
}

impl KeptPerCluster for CertificateVersions {
    type Entry = (String, Instant);

    fn entries(&self) -> &PerCluster<Self::Entry> {
        &self.0
    }

    #[cfg(test)]
    fn sample_entry() -> Self::Entry {
        (String::new(), Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::memory::ClusterMemory;

    fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            shard: 0,
            revision: "r".into(),
            lifecycle: crate::roll::Lifecycle::Active,
            join_overdue: false,
            address: None,
            id: None,
            closed: true,
            replica_of: None,
            handover_requested: false,
            terminated: false,
            leaving: false,
        }
    }

    fn refusal() -> Refusal {
        Refusal {
            user: "batch".into(),
            error: "ERR Unknown command 'nosuchcommand'".into(),
        }
    }

    #[test]
    fn a_node_is_written_again_when_anything_it_was_given_changes_or_it_refused() {
        let applied = Applied::default();
        let cluster = ClusterKey::new("a", "orders");
        let at: NodeAddress = "127.0.0.2:6379".parse().unwrap();
        let elsewhere: NodeAddress = "127.0.0.3:6379".parse().unwrap();
        let now = Instant::now();
        assert!(!applied.is_current_at(&cluster, "n1", at, 7, now));
        applied.record(&cluster, "n1", at, 7, Vec::new());
        assert!(applied.is_current(&cluster, "n1", at, 7));
        assert!(!applied.is_current(&cluster, "n1", at, 8), "new users");
        assert!(
            !applied.is_current(&cluster, "n1", elsewhere, 7),
            "a new server"
        );
        assert!(
            !applied.is_current_at(&cluster, "n1", at, 7, Instant::now() + REFRESH),
            "trusted for REFRESH only"
        );
        applied.reset();
        assert!(
            !applied.is_current(&cluster, "n1", at, 7),
            "a new term trusts nothing"
        );
    }

    #[test]
    fn refusals_outlive_a_missed_pass_and_go_with_their_node() {
        let applied = Applied::default();
        let cluster = ClusterKey::new("a", "orders");
        let at: NodeAddress = "127.0.0.2:6379".parse().unwrap();
        applied.record(&cluster, "n1", at, 7, vec![refusal()]);
        applied.record(&cluster, "n2", at, 7, Vec::new());
        // Retried each pass, and reported even when n1 does not answer in the next one.
        assert!(!applied.is_current(&cluster, "n1", at, 7));
        let reported = applied.refusals(&cluster, &[7]);
        assert_eq!(reported.len(), 1);
        assert_eq!(reported[0].node, "n1");
        // Only refusals of what is desired now count, with `default` closed or left open.
        assert!(applied.refusals(&cluster, &[8]).is_empty());
        assert_eq!(applied.refusals(&cluster, &[8, 7]).len(), 1);
        // A retired node's refusals go with it.
        applied.keep_only(&cluster, &[member("n2")]);
        assert!(applied.refusals(&cluster, &[7]).is_empty());
    }

    #[test]
    fn default_waits_for_every_live_member_to_have_been_written_where_it_is_now() {
        let applied = Applied::default();
        let cluster = ClusterKey::new("a", "orders");
        let at: NodeAddress = "127.0.0.2:6379".parse().unwrap();
        let elsewhere: NodeAddress = "127.0.0.3:6379".parse().unwrap();
        let mut n1 = member("n1");
        n1.address = Some(at);
        assert!(!applied.written_here(&cluster, &n1), "never written");
        applied.record(&cluster, "n1", at, 7, Vec::new());
        assert!(
            applied.written_here(&cluster, &n1),
            "any write carries the users"
        );
        n1.address = Some(elsewhere);
        assert!(
            !applied.written_here(&cluster, &n1),
            "a new server at a new address"
        );
        n1.address = Some(at);
        let refused_own = Refusal {
            user: "valkey-replication".into(),
            error: "ERR".into(),
        };
        applied.record(&cluster, "n1", at, 7, vec![refused_own]);
        assert!(
            !applied.written_here(&cluster, &n1),
            "it refused the operator's users"
        );
        applied.record(&cluster, "n1", at, 7, vec![refusal()]);
        assert!(
            applied.written_here(&cluster, &n1),
            "a tenant's refusal does not count"
        );
        // Every member, at its address, with the digest desired now, for a rotation to move on.
        let mut n2 = member("n2");
        n2.address = Some(elsewhere);
        assert!(!applied.everywhere(&cluster, &[n1.clone(), n2.clone()], 7));
        applied.record(&cluster, "n2", elsewhere, 7, Vec::new());
        assert!(applied.everywhere(&cluster, &[n1.clone(), n2.clone()], 7));
        assert!(!applied.everywhere(&cluster, &[n1, n2], 8));
    }

    #[test]
    fn a_certificate_is_reloaded_until_the_window_after_its_first_sighting() {
        let versions = CertificateVersions::default();
        let cluster = ClusterKey::new("a", "orders");
        let start = Instant::now();
        assert!(!versions.settled_at(&cluster, "v1", start));
        assert!(!versions.settled_at(&cluster, "v1", start + RELOAD_WINDOW / 2));
        assert!(versions.settled_at(&cluster, "v1", start + RELOAD_WINDOW * 2));
        // A renewal starts the window again.
        let later = start + RELOAD_WINDOW * 3;
        assert!(!versions.settled_at(&cluster, "v2", later));
        assert!(versions.settled_at(&cluster, "v2", later + RELOAD_WINDOW * 2));
    }
}
