//! Step 6 of a pass, plan: the roll's memory (as step 5 left it, with the joiners lost lately),
//! the pure planner's one next step, held back by the fleet rollout's gate where its group says
//! so, and the ACL users the nodes get. It writes nothing.

use std::collections::BTreeMap;
use std::sync::RwLock;

use kube::ResourceExt;

use crate::acl::AclError;
use crate::acl::{self};
use crate::api::{
    AclUser, PrimarySpreadPolicy, PrimaryUpdatePolicy, RolloutProgress, ValkeyCluster,
};
use crate::controller::build::render::ClusterRender;
use crate::controller::build::status::progress;
use crate::controller::pass::Pass;
use crate::controller::pass::gate;
use crate::controller::pass::keep::Seen;
use crate::controller::pass::secrets::PasswordHashes;
use crate::credentials::SystemUsers;
use crate::execute::acl::DesiredAcl;
use crate::fleet::Fleet;
use crate::fleet::policy::{self, Breach, Shape};
use crate::roll::{
    DesiredShape, ObservedNode, PrimarySpread, PrimaryUpdate, RollMemory, Step, Switchover,
};

/// What the pass decided, and from what: the nodes as observed, the shape wanted, the roll's
/// memory, the step, the users.
pub struct Planned {
    pub observed: Vec<ObservedNode>,
    pub desired: DesiredShape,
    pub memory: RollMemory,
    pub step: Step,
    /// Where the gate put the cluster in its fleet rollout.
    pub rollout: Option<RolloutProgress>,
    /// The shape the cluster may have now, and the policies that hold its growth back.
    pub granted: (Shape, Vec<Breach>),
    pub users: DesiredAcl,
    /// Users of the spec that could not be made into ACL rules, with why.
    pub unbuilt: Vec<AclError>,
}

/// Plans the pass's one step.
pub fn plan(
    pass: &Pass<'_>,
    render: &ClusterRender<'_>,
    observed: Vec<ObservedNode>,
    mut memory: RollMemory,
    seen: &Seen,
) -> Planned {
    let (ctx, cluster) = (pass.ctx, pass.cluster);
    let (desired, granted) = {
        let fleet = ctx.fleet.read().unwrap_or_else(|p| p.into_inner());
        let granted = granted_shape(pass, &fleet);
        (desired_shape(cluster, render, &fleet, granted.0), granted)
    };
    let lost_joins = &ctx.memory.lost_joins;
    let lost = lost_joins.count(&pass.key, &desired, &observed);
    (memory.lost_joins, memory.removed_joins) = (lost.failed, lost.removed);
    let step = {
        let planned = crate::roll::plan(&desired, &observed, &memory);
        let fleet = ctx.fleet.read().unwrap_or_else(|p| p.into_inner());
        let rollouts = &ctx.memory.rollouts;
        let effective = render.effective;
        gate::gated(
            rollouts, &fleet, cluster, effective, &observed, &desired, planned,
        )
    };
    let rollout = ctx.memory.rollouts.progress(&pass.key);
    for queued in ctx.memory.rollouts.take_wakes() {
        // No receiver only while the controller is not running: nothing to wake then.
        let _ = ctx.wake.send(queued);
    }
    let progress = progress(&desired, &observed, &step);
    ctx.metrics
        .roll_progress(&pass.namespace, &pass.key.name, &progress);
    tracing::info!(cluster = %pass.key.name, namespace = %pass.namespace, %step, "planned");
    let system = seen.login.credentials.system_users();
    let platform = &render.effective.acl;
    let platform: Vec<AclUser> = platform.iter().map(|u| seen.issued.applied_to(u)).collect();
    let (users, unbuilt) = desired_acl(&ctx.fleet, &platform, cluster, &seen.passwords, system);
    Planned {
        observed,
        desired,
        memory,
        step,
        rollout,
        granted,
        users,
        unbuilt,
    }
}

/// The shape the cluster may have now ([`policy::grant`]): what it was let have before, grown
/// to its spec when no namespace policy is breached. A cluster without a record (one that has
/// not started, checked whole in step 1; or one from an operator that kept none) gets its spec.
fn granted_shape(pass: &Pass<'_>, fleet: &Fleet) -> (Shape, Vec<Breach>) {
    let spec = &pass.cluster.spec;
    let wanted = Shape::of(spec);
    match pass.stored.status.granted {
        Some(before) => policy::grant(fleet, &pass.key, &spec.config_ref, (wanted, before.into())),
        None => (wanted, Vec::new()),
    }
}

/// The `granted` shape, with a person's switchover request, who fails a roll's primaries
/// over (the rollout group's policy) and whether primaries are moved apart (the cluster's).
fn desired_shape(
    cluster: &ValkeyCluster,
    render: &ClusterRender<'_>,
    fleet: &Fleet,
    granted: Shape,
) -> DesiredShape {
    let supervised = fleet
        .rollout_group(&render.effective.chain.0)
        .is_some_and(|(_, policy)| policy.primary_update == PrimaryUpdatePolicy::Supervised);
    DesiredShape {
        shards: granted.shards.max(1),
        replicas_per_shard: granted.replicas_per_shard,
        revision: render.revision(),
        switchover: switchover_request(cluster),
        primary_update: if supervised {
            PrimaryUpdate::Supervised
        } else {
            PrimaryUpdate::Automatic
        },
        primary_spread: match cluster
            .spec
            .placement
            .as_ref()
            .and_then(|p| p.primary_spread)
        {
            Some(PrimarySpreadPolicy::Disabled) => PrimarySpread::Off,
            Some(PrimarySpreadPolicy::Rebalance) | None => PrimarySpread::Rebalance,
        },
    }
}

/// The switchover a person asked for, if the annotation holds one (admission refuses one that
/// does not; one from before is ignored, and said so in the log).
fn switchover_request(cluster: &ValkeyCluster) -> Option<Switchover> {
    match cluster.switchover_request()? {
        Ok((request, id)) => Some(Switchover {
            id: id.to_owned(),
            shard: request.shard,
            to: request.to,
        }),
        Err(problem) => {
            tracing::warn!(cluster = %cluster.name_any(), %problem, "switchover request ignored");
            None
        }
    }
}

/// The cluster's users as `ACL SETUSER` rules: the platform's (its config's `acl`), then its
/// own, with the operator's (`system`); and why each user that could not be built was not
/// (that user is left as it is on the nodes). A cluster's user that reuses a platform user's
/// name is not written: the platform's stands.
pub fn desired_acl(
    fleet: &RwLock<Fleet>,
    platform: &[AclUser],
    cluster: &ValkeyCluster,
    passwords: &PasswordHashes,
    system: SystemUsers,
) -> (DesiredAcl, Vec<AclError>) {
    let fleet = fleet.read().unwrap_or_else(|p| p.into_inner());
    let mut desired = DesiredAcl::none();
    desired.system = Some(system);
    let mut problems = Vec::new();
    let (own, shadowing): (Vec<&AclUser>, Vec<&AclUser>) = cluster
        .spec
        .acl
        .iter()
        .partition(|user| !platform.iter().any(|p| p.username == user.username));
    for user in shadowing {
        problems.push(AclError::Invalid {
            user: user.username.clone(),
            field: "username".into(),
            message: "the cluster's ValkeyConfig defines this user; a cluster adds users beside the config's, under other names".into(),
        });
    }
    let users: Vec<AclUser> = platform.iter().chain(own).cloned().collect();
    let too_large = too_large(&users, &fleet);
    for (index, user) in users.iter().enumerate() {
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
