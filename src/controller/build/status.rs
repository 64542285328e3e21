//! The ValkeyCluster status, computed purely from one pass's observations: the summary columns
//! (`state`, `version`, `outdatedNodes`) that make a roll visible in
//! `kubectl get valkeycluster -w`, and the conditions `Ready`, `Progressing` and `Degraded`,
//! whose `lastTransitionTime` moves only on a real transition. The roll memory
//! (`status.roll`) is not written here: the executor saves it before a failover.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::acl::AclError;
use crate::api::{
    ClusterNodeStatus, ClusterState, GrantedShape, NodeRole, RolloutProgress, ShardStatus,
    ValkeyClusterStatus, ValkeyNode,
};
use crate::execute::acl::Refusal;
use crate::fleet::policy::Breach;
use crate::metrics::{NodeGauges, RollProgress};
use crate::roll::slots::SLOT_COUNT;
use crate::roll::{DesiredShape, Lifecycle, ObservedNode, Role, Step};
use crate::words::{clip, first_of};

/// The conditions a ValkeyCluster reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionType {
    /// Every slot is served.
    Ready,
    /// The planner has work to do (a roll, a join, a scale).
    Progressing,
    /// Something stops the work: a stall, a failed step, a config that does not resolve.
    Degraded,
    /// Every reachable node has the users `spec.acl` names, as written.
    AclApplied,
    /// On a ValkeyConfig or ValkeyImage: a stalled cluster holds its rollout back.
    Halted,
}

/// Why a condition has its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    AllSlotsServed,
    SlotsUnserved,
    Rolling,
    UpToDate,
    Healthy,
    RollStalled,
    StepFailed,
    ConfigUnresolved,
    /// The spec is outside the hard limits (it slipped past admission); nothing is done.
    SpecOutOfBounds,
    /// An object the cluster would own (its Service or budget) belongs to someone else.
    NameConflict,
    /// Every user is written on every reachable node.
    UsersApplied,
    /// A user names a ValkeyRole that does not exist (that user is left as it is).
    RoleMissing,
    /// A user's patterns or its roles' names cannot be ACL rules (that user is left as it is).
    InvalidAcl,
    /// A node refused a user's rules; its words are in the message.
    NodeRefused,
    /// A user's `passwordSecretRef` names a Secret or key that cannot be read.
    SecretUnreadable,
    /// Users' rules expand past the bounds of `crate::acl::Cost` (those users are left as
    /// they are).
    AclTooLarge,
    /// A TLS cluster's Secret (its CA) cannot be read: its nodes are not touched.
    TlsUnavailable,
    /// The cluster's credentials Secret cannot be used: its nodes are not touched.
    CredentialsUnusable,
    /// Something other than a node answers at its address: nothing is sent there.
    StrangerAtAddress,
    /// Nodes refuse the operator's login: nothing can be done on them.
    LoginRefused,
    /// Nodes present a TLS certificate that fails the operator's check (expired, say): nothing
    /// can be done on them, and they are not taken for dead.
    CertificateRefused,
    /// A cluster not started yet is past a ValkeyNamespacePolicy of its namespace: nothing is
    /// created.
    NamespacePolicy,
    /// Nodes' Pods have not started, for a reason Kubernetes gives (not schedulable, an image
    /// not pulled, a container failing): the cluster waits for them.
    PodNotStarted,
}

impl ConditionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::Ready => "Ready",
            ConditionType::Progressing => "Progressing",
            ConditionType::Degraded => "Degraded",
            ConditionType::AclApplied => "AclApplied",
            ConditionType::Halted => "Halted",
        }
    }
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::AllSlotsServed => "AllSlotsServed",
            Reason::SlotsUnserved => "SlotsUnserved",
            Reason::Rolling => "Rolling",
            Reason::UpToDate => "UpToDate",
            Reason::Healthy => "Healthy",
            Reason::RollStalled => "RollStalled",
            Reason::StepFailed => "StepFailed",
            Reason::ConfigUnresolved => "ConfigUnresolved",
            Reason::SpecOutOfBounds => "SpecOutOfBounds",
            Reason::NameConflict => "NameConflict",
            Reason::UsersApplied => "UsersApplied",
            Reason::RoleMissing => "RoleMissing",
            Reason::InvalidAcl => "InvalidAcl",
            Reason::NodeRefused => "NodeRefused",
            Reason::SecretUnreadable => "SecretUnreadable",
            Reason::AclTooLarge => "AclTooLarge",
            Reason::TlsUnavailable => "TlsUnavailable",
            Reason::CredentialsUnusable => "CredentialsUnusable",
            Reason::StrangerAtAddress => "StrangerAtAddress",
            Reason::LoginRefused => "LoginRefused",
            Reason::CertificateRefused => "CertificateRefused",
            Reason::NamespacePolicy => "NamespacePolicy",
            Reason::PodNotStarted => "PodNotStarted",
        }
    }
}

impl fmt::Display for ConditionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One condition as a pass decides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub type_: ConditionType,
    pub status: bool,
    pub reason: Reason,
    pub message: String,
}

/// Sets a condition, keeping its `lastTransitionTime` unless its status changes.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    verdict: Verdict,
    observed_generation: Option<i64>,
    now: Time,
) {
    let type_ = verdict.type_.as_str();
    let status = if verdict.status { "True" } else { "False" }.to_string();
    let updated = |last_transition_time| Condition {
        type_: type_.to_string(),
        status: status.clone(),
        reason: verdict.reason.as_str().to_string(),
        message: verdict.message.clone(),
        observed_generation,
        last_transition_time,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            let since = if existing.status == status {
                existing.last_transition_time.clone()
            } else {
                now
            };
            *existing = updated(since);
        }
        None => conditions.push(updated(now)),
    }
}

/// `Degraded=True` with `reason`: what a pass that cannot plan says.
pub fn degraded(reason: Reason, message: String) -> Verdict {
    Verdict {
        type_: ConditionType::Degraded,
        status: true,
        reason,
        message,
    }
}

/// A false verdict the stored conditions did not already hold (for the same reason): worth an
/// event, once.
pub fn newly_failing(stored: &[Condition], verdict: &Verdict) -> bool {
    let type_ = verdict.type_.as_str();
    let before = stored.iter().find(|c| c.type_ == type_);
    !verdict.status
        && before.is_none_or(|c| c.status != "False" || c.reason != verdict.reason.as_str())
}

/// The `Degraded` condition, while it says the roll is stalled.
fn stall(conditions: &[Condition]) -> Option<&Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Degraded.as_str())
        .filter(|c| c.status == "True" && c.reason == Reason::RollStalled.as_str())
}

/// Whether `now`'s conditions hold a stall the stored ones did not (a stall began, or it is
/// another one): worth one `RollStalled` event. A stall seen again on every pass is not news.
pub fn stall_is_new(stored: &[Condition], now: &[Condition]) -> bool {
    stall(now).is_some_and(|now| stall(stored).is_none_or(|before| before.message != now.message))
}

/// How long the cluster has been stalled at `now` (since its `Degraded` condition turned True),
/// if it is; zero if that time lies ahead of this clock.
pub fn stalled_for(conditions: &[Condition], now: &Time) -> Option<Duration> {
    stall(conditions).map(|c| {
        Duration::try_from(now.0.duration_since(c.last_transition_time.0)).unwrap_or_default()
    })
}

/// `AclApplied`: false while a node refuses a user or a user cannot be built, naming them.
pub fn acl_applied(unbuilt: &[AclError], refusals: &[NodeRefusal]) -> Verdict {
    const SHOWN: usize = 3;
    let (status, reason, message) = if !refusals.is_empty() {
        let said: Vec<String> = refusals
            .iter()
            .map(|r| format!("node {}: {}", r.node, r.refusal))
            .collect();
        (false, Reason::NodeRefused, first_of(&said, SHOWN))
    } else if let Some(first) = unbuilt.first() {
        let reason = match first {
            AclError::RoleMissing { .. } => Reason::RoleMissing,
            AclError::Invalid { .. } => Reason::InvalidAcl,
            AclError::SecretUnreadable { .. } => Reason::SecretUnreadable,
            AclError::TooLarge { .. } => Reason::AclTooLarge,
        };
        let message = format!(
            "not applied (left as they are): {}",
            first_of(unbuilt, SHOWN)
        );
        (false, reason, message)
    } else {
        let message = "every node took every user in spec.acl when last written".to_string();
        (true, Reason::UsersApplied, message)
    };
    Verdict {
        type_: ConditionType::AclApplied,
        status,
        reason,
        // Valkey's refusal quotes the whole rule; the event that repeats this must fit 1 KiB.
        message: clip(message, 900),
    }
}

/// The engine versions running, lowest first, joined for the `Version` column: `9.0.0`, or
/// mid-roll `9.0.0,9.1.2`.
pub fn versions_running<'a>(versions: impl IntoIterator<Item = &'a str>) -> String {
    let mut distinct: Vec<&str> = versions
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Semantic-version precedence (10.0.0 after 9.1.2); anything unparsable sorts first, by text.
    distinct.sort_by_cached_key(|v| (semver::Version::parse(v).ok(), *v));
    distinct.join(",")
}

/// Everything one pass knows that the status reports.
pub struct PassReport<'a> {
    pub generation: Option<i64>,
    pub shards: i32,
    pub nodes: &'a [ValkeyNode],
    pub observed: &'a [ObservedNode],
    pub desired: &'a DesiredShape,
    pub step: &'a Step,
    /// The planned step failed with this error.
    pub failure: Option<String>,
    /// Where the gate put the cluster in its fleet rollout.
    pub rollout: Option<RolloutProgress>,
    /// The shape the cluster may have now, and the policies that hold its growth back.
    pub granted: Option<(GrantedShape, &'a [Breach])>,
}

/// The status after a pass, from the status before it (for `state` and transition times).
pub fn summarize(
    previous: &ValkeyClusterStatus,
    pass: &PassReport,
    now: Time,
) -> ValkeyClusterStatus {
    let all_served = slots_served(pass.observed) == SLOT_COUNT;
    let state = Some(next_state(
        previous.state,
        all_served && complete(pass.desired, pass.observed),
    ));
    let outdated = pass
        .observed
        .iter()
        .filter(|o| !o.is_up_to_date(pass.desired))
        .count();
    let mut status = ValkeyClusterStatus {
        state,
        observed_generation: pass.generation,
        version: Some(versions_running(
            pass.nodes.iter().map(|n| n.spec.version.as_str()),
        )),
        outdated_nodes: Some(i32::try_from(outdated).unwrap_or(i32::MAX)),
        shards: shard_statuses(pass),
        nodes: node_statuses(pass),
        conditions: previous.conditions.clone(),
        // From the conditions as they are written: see [`needs_a_person`].
        message: None,
        desired_revision: Some(pass.desired.revision.clone()),
        roll: None,
        rollout: pass.rollout,
        granted: pass.granted.map(|(shape, _)| shape),
    };
    for verdict in verdicts(pass, all_served) {
        set_condition(
            &mut status.conditions,
            verdict,
            pass.generation,
            now.clone(),
        );
    }
    status
}

/// `Active` once the cluster is whole (and from then on, also during rolls and heals, which
/// the conditions describe); `Creating` before, and again after `Invalid` (a spec the operator
/// could not accept, now fixed), as Momento's operator says it.
fn next_state(previous: Option<ClusterState>, whole: bool) -> ClusterState {
    match previous {
        Some(ClusterState::Active) => ClusterState::Active,
        _ if whole => ClusterState::Active,
        _ => ClusterState::Creating,
    }
}

/// Every slot served, every desired shard with a live primary and its replicas in sync:
/// what creation waits for before `Active`.
fn complete(desired: &DesiredShape, observed: &[ObservedNode]) -> bool {
    (0..desired.shards).all(|shard| {
        has_live_primary(observed, shard)
            && in_sync_replicas(observed, shard) >= desired.replicas_per_shard
    })
}

/// The sentence for `status.message`: what needs a person now (the `Degraded` condition's
/// message, else a user not applied), nothing once it is resolved.
pub fn needs_a_person(conditions: &[Condition]) -> Option<String> {
    let failing = |type_: ConditionType, failing: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_.as_str() && c.status == failing)
            .map(|c| c.message.clone())
            .filter(|m| !m.is_empty())
    };
    failing(ConditionType::Degraded, "True").or_else(|| failing(ConditionType::AclApplied, "False"))
}

/// Slots served by primaries that answer, or that every node answering sees up (only the
/// operator's path to them is cut: clients are served).
fn slots_served(observed: &[ObservedNode]) -> u32 {
    observed
        .iter()
        .filter(|o| (o.reachable || o.alive_to_peers) && o.role == Role::Primary)
        .map(ObservedNode::slot_count)
        .sum()
}

/// The API's name for a role the planner observed.
pub fn node_role(role: Role) -> NodeRole {
    match role {
        Role::Primary => NodeRole::Primary,
        Role::Replica => NodeRole::Replica,
    }
}

fn node_statuses(pass: &PassReport) -> Vec<ClusterNodeStatus> {
    pass.nodes
        .iter()
        .map(|node| {
            let name = node.metadata.name.clone().unwrap_or_default();
            let seen = pass.observed.iter().find(|o| o.name == name);
            ClusterNodeStatus {
                role: seen.filter(|o| o.reachable).map(|o| node_role(o.role)),
                lifecycle: node.status.as_ref().and_then(|s| s.lifecycle),
                version: node.spec.version.clone(),
                outdated: node.spec.revision != pass.desired.revision,
                shard: node.spec.shard,
                name,
            }
        })
        .collect()
}

fn shard_statuses(pass: &PassReport) -> Vec<ShardStatus> {
    (0..pass.shards)
        .map(|index| ShardStatus {
            index,
            primary: pass
                .observed
                .iter()
                .find(|o| {
                    o.reachable
                        && o.role == Role::Primary
                        && i64::from(o.shard) == i64::from(index)
                        && o.slot_count() > 0
                })
                .map(|o| o.name.clone()),
        })
        .collect()
}

/// What `Degraded` says while nodes' Pods have not started for a reason Kubernetes gives (not
/// schedulable, an image not pulled, a container failing), if any: the first two, with why.
fn not_started(pass: &PassReport) -> Option<String> {
    let stuck: Vec<String> = (pass.observed.iter())
        .filter(|o| !o.reachable)
        .filter_map(|o| Some(format!("{} ({})", o.name, o.not_started.as_deref()?)))
        .collect();
    (!stuck.is_empty()).then(|| {
        format!(
            "Pods have not started, the cluster waits for them: {}",
            first_of(&stuck, 2)
        )
    })
}

/// What `Degraded` says while a namespace policy holds the cluster's growth, if one does.
fn held_growth(pass: &PassReport) -> Option<String> {
    let (shape, breaches) = pass.granted?;
    (!breaches.is_empty()).then(|| {
        format!(
            "growth held at {} shards of {} replicas: {}; it grows once the namespace has room or the policy allows it",
            shape.shards,
            shape.replicas_per_shard,
            first_of(breaches, 3)
        )
    })
}

/// The three conditions after a pass.
fn verdicts(pass: &PassReport, all_served: bool) -> [Verdict; 3] {
    let ready = Verdict {
        type_: ConditionType::Ready,
        status: all_served,
        reason: if all_served {
            Reason::AllSlotsServed
        } else {
            Reason::SlotsUnserved
        },
        message: if all_served {
            "every slot is served"
        } else {
            "not every slot is served yet"
        }
        .into(),
    };
    let converged = matches!(pass.step, Step::Converged);
    let progressing = Verdict {
        type_: ConditionType::Progressing,
        status: !converged,
        reason: if converged {
            Reason::UpToDate
        } else {
            Reason::Rolling
        },
        message: pass.step.headline(),
    };
    let names = |flag: fn(&ObservedNode) -> bool| -> Vec<&str> {
        let flagged = pass.observed.iter().filter(|o| flag(o));
        flagged.map(|o| o.name.as_str()).collect()
    };
    let strangers = names(|o| o.stranger);
    let locked_out = names(|o| o.locked_out);
    let untrusted = names(|o| o.untrusted);
    let held = held_growth(pass);
    let not_started = not_started(pass);
    let degraded = match (pass.step, &pass.failure) {
        _ if !locked_out.is_empty() => degraded(
            Reason::LoginRefused,
            format!(
                "{} refuse the operator's login: its credentials Secret (<cluster>-credentials) or the nodes' users were changed by hand; restore the Secret from a backup, or rotate from the passwords the nodes still have",
                first_of(&locked_out, 5)
            ),
        ),
        _ if !untrusted.is_empty() => degraded(
            Reason::CertificateRefused,
            format!(
                "{} present a TLS certificate that fails the operator's check (expired, not from the cluster's CA, or not naming the node; the operator's log says which): clients checking it fail too. Renew the certificate in the cluster's TLS Secret (the nodes reload it without a restart); meanwhile nothing is done on them and they are not taken for dead",
                first_of(&untrusted, 5)
            ),
        ),
        (Step::Stalled { .. }, _) => degraded(Reason::RollStalled, pass.step.headline()),
        _ if held.is_some() => degraded(Reason::NamespacePolicy, held.unwrap_or_default()),
        _ if not_started.is_some() => {
            degraded(Reason::PodNotStarted, not_started.unwrap_or_default())
        }
        _ if !strangers.is_empty() => {
            degraded(Reason::StrangerAtAddress, stranger_message(&strangers))
        }
        (step, Some(error)) => {
            degraded(Reason::StepFailed, format!("{}: {error}", step.headline()))
        }
        _ => Verdict {
            type_: ConditionType::Degraded,
            status: false,
            reason: Reason::Healthy,
            message: String::new(),
        },
    };
    [ready, progressing, degraded]
}

/// What `Degraded` says while strangers answer at some nodes' addresses.
fn stranger_message(nodes: &[&str]) -> String {
    format!(
        "another server answers at the address of {} (its Pod's IP was handed on, or its Pod's \
         status is stale): no credentials and no step are sent there; the node counts as \
         unreachable and is replaced",
        first_of(nodes, 5)
    )
}

/// What `now`'s `Degraded` says for `reason` when the stored one did not say the same (a
/// stranger at other nodes' addresses, Pods not started for another cause): worth one event.
pub fn degraded_anew(reason: Reason, stored: &[Condition], now: &[Condition]) -> Option<String> {
    let saying = |conditions: &[Condition]| {
        conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Degraded.as_str())
            .filter(|c| c.status == "True" && c.reason == reason.as_str())
            .map(|c| c.message.clone())
    };
    let now = saying(now)?;
    (saying(stored).as_ref() != Some(&now)).then_some(now)
}

/// The roll-progress figures of one pass, for the metrics.
pub fn progress(desired: &DesiredShape, observed: &[ObservedNode], step: &Step) -> RollProgress {
    let shards: BTreeSet<u32> = observed.iter().map(|o| o.shard).collect();
    let up_to_date = (0..desired.shards)
        .filter(|shard| {
            let mut in_shard = observed.iter().filter(|o| o.shard == *shard).peekable();
            in_shard.peek().is_some() && in_shard.all(|o| o.is_up_to_date(desired))
        })
        .count();
    RollProgress {
        shards: usize::try_from(desired.shards)
            .unwrap_or(usize::MAX)
            .max(shards.len()),
        shards_up_to_date: up_to_date,
        outdated_nodes: observed
            .iter()
            .filter(|o| !o.is_up_to_date(desired))
            .count(),
        in_progress: !matches!(step, Step::Converged),
        shards_below_replica_target: (0..desired.shards)
            .filter(|shard| in_sync_replicas(observed, *shard) < desired.replicas_per_shard)
            .count(),
        words: step.words(),
        nodes: observed
            .iter()
            .filter(|o| o.reachable)
            .map(|o| NodeGauges {
                name: o.name.clone(),
                shard: o.shard,
                role: o.role,
                // Only against a primary that answered: an unread primary offset is 0, which
                // would read as "caught up" exactly when the primary is gone.
                lag_bytes: o
                    .sync
                    .filter(|_| o.role == Role::Replica && has_live_primary(observed, o.shard))
                    .map(|s| s.primary_offset.saturating_sub(s.offset)),
            })
            .collect(),
    }
}

fn has_live_primary(observed: &[ObservedNode], shard: u32) -> bool {
    observed
        .iter()
        .any(|o| o.shard == shard && o.reachable && o.role == Role::Primary)
}

/// Active replicas of `shard` whose link to their primary is up and not in a full sync.
fn in_sync_replicas(observed: &[ObservedNode], shard: u32) -> u32 {
    let count = observed
        .iter()
        .filter(|o| o.shard == shard && o.reachable && o.role == Role::Replica)
        .filter(|o| o.lifecycle == Lifecycle::Active)
        .filter(|o| o.sync.is_some_and(|s| s.link_up && !s.sync_in_progress))
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// A node's refusal of one of its users.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRefusal {
    pub node: String,
    pub refusal: Refusal,
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
