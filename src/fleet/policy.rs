//! Namespace policies ([`ValkeyNamespacePolicy`](crate::api::ValkeyNamespacePolicy)): which
//! configs the clusters of a namespace may name, and how many clusters, shards and nodes the
//! namespace may run. No I/O: admission and the controller ask [`breaches`] over the fleet index.
//!
//! The rules, in the order [`judge`] checks them, for each policy that governs the namespace:
//! 1. `spec.configRef` names a config the policy allows (any, when it lists none);
//! 2. the namespace's clusters, with this one, are at most `maxClusters`;
//! 3. their shards together are at most `maxShards`;
//! 4. their nodes together (shards × (1 + replicasPerShard)) are at most `maxNodes`.
//!
//! Who counts as the namespace's other clusters is the caller's choice ([`Counted`]): admission
//! counts every other cluster it knows; the controller, re-checking a cluster that has not
//! started, counts those created before it, so a cluster never loses its place to a newer one.
//!
//! An update is judged on what it makes worse, as every admission rule here is: a cluster that
//! predates a policy (or a tighter one) may still be changed as long as it does not move to a
//! config the policy forbids, nor grow past a cap.
//!
//! Admission judges each change alone, so two changes admitted at once (or any change while
//! admission was off) could together grow a namespace past a cap. The controller therefore
//! grants a running cluster's growth again ([`grant`]), counting every other cluster at its
//! spec: of two clusters growing at once past a cap, one waits (both, if the controller saw
//! both specs before either grew), rather than both grow.

use std::fmt;

use k8s_openapi::jiff::Timestamp;

use crate::api::ClusterKey;
use crate::api::{GrantedShape, ValkeyClusterSpec, ValkeyNamespacePolicySpec};
use crate::fleet::Fleet;

/// What a cluster runs, as a namespace's caps count it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub shards: u32,
    /// Shards × (1 + replicas per shard): the nodes it runs when no roll is in flight.
    pub nodes: u32,
}

impl Footprint {
    pub fn of(spec: &ValkeyClusterSpec) -> Self {
        Shape::of(spec).footprint()
    }
}

/// A cluster's shape: its shards, and the replicas of each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    pub shards: u32,
    pub replicas_per_shard: u32,
}

impl From<GrantedShape> for Shape {
    fn from(granted: GrantedShape) -> Self {
        Self {
            shards: u32::try_from(granted.shards).unwrap_or(0),
            replicas_per_shard: u32::try_from(granted.replicas_per_shard).unwrap_or(0),
        }
    }
}

impl From<Shape> for GrantedShape {
    fn from(shape: Shape) -> Self {
        Self {
            shards: i32::try_from(shape.shards).unwrap_or(i32::MAX),
            replicas_per_shard: i32::try_from(shape.replicas_per_shard).unwrap_or(i32::MAX),
        }
    }
}

impl Shape {
    pub fn of(spec: &ValkeyClusterSpec) -> Self {
        Self {
            shards: u32::try_from(spec.shards).unwrap_or(0),
            replicas_per_shard: u32::try_from(spec.replicas_per_shard).unwrap_or(0),
        }
    }

    pub fn footprint(self) -> Footprint {
        Footprint {
            shards: self.shards,
            nodes: self
                .shards
                .saturating_mul(self.replicas_per_shard.saturating_add(1)),
        }
    }

    /// Each dimension the smaller of the two: `self` where it shrinks, `other` where it grows.
    fn at_most(self, other: Shape) -> Shape {
        Shape {
            shards: self.shards.min(other.shards),
            replicas_per_shard: self.replicas_per_shard.min(other.replicas_per_shard),
        }
    }
}

/// A cluster as the index keeps it for the caps: its footprint and when it was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub footprint: Footprint,
    pub created: Option<Timestamp>,
}

/// The namespace's other clusters, added up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub clusters: u32,
    pub shards: u32,
    pub nodes: u32,
}

impl Usage {
    fn add(mut self, footprint: Footprint) -> Self {
        self.clusters = self.clusters.saturating_add(1);
        self.shards = self.shards.saturating_add(footprint.shards);
        self.nodes = self.nodes.saturating_add(footprint.nodes);
        self
    }
}

/// Which of the namespace's other clusters count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Every other cluster (admission).
    All,
    /// Those created before a cluster created then (the controller's re-check).
    CreatedBefore(Option<Timestamp>),
}

/// The cluster asking: what it would be, and what it was (an update).
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub config_ref: &'a str,
    pub footprint: Footprint,
    pub before: Option<Before<'a>>,
}

/// A cluster as it was before an update.
#[derive(Clone, Copy, Debug)]
pub struct Before<'a> {
    pub config_ref: &'a str,
    pub footprint: Footprint,
}

/// One rule of one policy that a cluster would break.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breach {
    pub policy: String,
    /// The field of the cluster's spec it is about, as a user writes it.
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: ValkeyNamespacePolicy {} {}",
            self.field, self.policy, self.message
        )
    }
}

/// Every rule of every policy governing `key`'s namespace that the request would break.
pub fn breaches(
    fleet: &Fleet,
    key: &ClusterKey,
    request: &Request<'_>,
    counted: Counted,
) -> Vec<Breach> {
    let mut policies = fleet.policies_governing(&key.namespace).peekable();
    if policies.peek().is_none() {
        return Vec::new();
    }
    let usage = fleet
        .members_of(&key.namespace)
        .filter(|(other, _)| other.name != key.name)
        .filter(|(other, member)| counts(counted, member, &other.name, &key.name))
        .fold(Usage::default(), |usage, (_, member)| {
            usage.add(member.footprint)
        });
    policies
        .flat_map(|(name, policy)| judge(name, policy, &key.namespace, request, usage))
        .collect()
}

/// The shape running cluster `key` (on `config_ref`) may have now, and why it may not have all
/// of `wanted`: `wanted` itself when it is no larger than `granted` (what it was let have
/// before) or when growing to it breaches no policy, counting every other cluster at its spec;
/// else `granted` where `wanted` grows and `wanted` where it shrinks, with the breaches.
pub fn grant(
    fleet: &Fleet,
    key: &ClusterKey,
    config_ref: &str,
    (wanted, granted): (Shape, Shape),
) -> (Shape, Vec<Breach>) {
    if wanted.at_most(granted) == wanted {
        return (wanted, Vec::new());
    }
    let request = Request {
        config_ref,
        footprint: wanted.footprint(),
        before: Some(Before {
            config_ref,
            footprint: granted.footprint(),
        }),
    };
    let breaches = breaches(fleet, key, &request, Counted::All);
    if breaches.is_empty() {
        (wanted, breaches)
    } else {
        (wanted.at_most(granted), breaches)
    }
}

/// Whether another cluster counts before this one: created earlier, or at the same second with
/// a name that sorts first (creation times have a second's resolution).
fn counts(counted: Counted, other: &Member, other_name: &str, name: &str) -> bool {
    match counted {
        Counted::All => true,
        Counted::CreatedBefore(created) => {
            (other.created, other_name) < (created.or(Some(Timestamp::MAX)), name)
        }
    }
}

/// What one policy says of the request, given the namespace's other clusters.
pub fn judge(
    name: &str,
    policy: &ValkeyNamespacePolicySpec,
    namespace: &str,
    request: &Request<'_>,
    others: Usage,
) -> Vec<Breach> {
    let breach = |field, message| Breach {
        policy: name.to_owned(),
        field,
        message,
    };
    let mut breaches = Vec::new();
    let config = request.config_ref;
    let moved = request.before.is_none_or(|b| b.config_ref != config);
    if moved
        && !policy.allowed_configs.is_empty()
        && !policy.allowed_configs.iter().any(|c| c == config)
    {
        breaches.push(breach(
            "spec.configRef",
            format!(
                "lets the clusters of namespace {namespace} use only ValkeyConfigs {}, not {config}",
                policy.allowed_configs.join(", ")
            ),
        ));
    }
    let created = request.before.is_none();
    if let Some(cap) = policy.max_clusters
        && created
        && others.clusters >= cap
    {
        breaches.push(breach(
            "metadata.name",
            format!(
                "allows at most {cap} ValkeyClusters in namespace {namespace}, which has {} already",
                others.clusters
            ),
        ));
    }
    let own = request.footprint;
    let was = request.before.map(|b| b.footprint);
    if let Some(cap) = policy.max_shards
        && was.is_none_or(|was| own.shards > was.shards)
        && others.shards.saturating_add(own.shards) > cap
    {
        breaches.push(breach(
            "spec.shards",
            format!(
                "allows at most {cap} shards in namespace {namespace}: its other clusters run {}, and this one asks for {}",
                others.shards, own.shards
            ),
        ));
    }
    if let Some(cap) = policy.max_nodes
        && was.is_none_or(|was| own.nodes > was.nodes)
        && others.nodes.saturating_add(own.nodes) > cap
    {
        breaches.push(breach(
            "spec.replicasPerShard",
            format!(
                "allows at most {cap} Valkey nodes in namespace {namespace}: its other clusters run {}, and this one asks for {} (shards × (1 + replicasPerShard))",
                others.nodes, own.nodes
            ),
        ));
    }
    breaches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(
        configs: &[&str],
        clusters: Option<u32>,
        shards: Option<u32>,
        nodes: Option<u32>,
    ) -> ValkeyNamespacePolicySpec {
        ValkeyNamespacePolicySpec {
            namespaces: vec!["team-a".into()],
            allowed_configs: configs.iter().map(|c| c.to_string()).collect(),
            max_clusters: clusters,
            max_shards: shards,
            max_nodes: nodes,
        }
    }

    fn create(config_ref: &str, shards: u32, nodes: u32) -> Request<'_> {
        Request {
            config_ref,
            footprint: Footprint { shards, nodes },
            before: None,
        }
    }

    fn shape(shards: u32, replicas_per_shard: u32) -> Shape {
        Shape {
            shards,
            replicas_per_shard,
        }
    }

    /// Namespace team-a under a policy of at most `nodes` nodes, with clusters `(name, shards,
    /// replicas per shard)` as their specs ask.
    fn fleet_of(nodes: u32, specs: &[(&str, i32, i32)]) -> Fleet {
        let mut fleet = Fleet::default();
        fleet.upsert_policy("limits", policy(&[], None, None, Some(nodes)));
        for (name, shards, replicas) in specs {
            let spec = ValkeyClusterSpec::new("standard", *shards, *replicas);
            let member = Member {
                footprint: Footprint::of(&spec),
                created: None,
            };
            fleet.set_cluster_member(&ClusterKey::new("team-a", *name), member);
        }
        fleet
    }

    #[test]
    fn two_clusters_growing_at_once_past_a_cap_both_wait_and_one_grows_once_the_other_gives_up() {
        // a and b run 1 shard, no replica (2 nodes of 3); both specs now ask for a replica.
        let fleet = fleet_of(3, &[("a", 1, 1), ("b", 1, 1)]);
        let (running, wanted) = (shape(1, 0), shape(1, 1));
        let grant_to = |fleet: &Fleet, name: &str| {
            grant(
                fleet,
                &ClusterKey::new("team-a", name),
                "standard",
                (wanted, running),
            )
        };
        for name in ["a", "b"] {
            let (granted, breaches) = grant_to(&fleet, name);
            assert_eq!(granted, running, "{name} grew past the cap");
            assert_eq!(fields(&breaches), ["spec.replicasPerShard"]);
        }
        // b's spec is put back: a may grow (2 + 1 nodes).
        let fleet = fleet_of(3, &[("a", 1, 1), ("b", 1, 0)]);
        assert_eq!(grant_to(&fleet, "a"), (wanted, vec![]));
    }

    #[test]
    fn shrinking_is_always_granted_and_a_held_dimension_keeps_what_it_had() {
        let fleet = fleet_of(3, &[("a", 1, 0), ("b", 1, 1)]);
        let key = ClusterKey::new("team-a", "b");
        assert_eq!(
            grant(&fleet, &key, "standard", (shape(1, 0), shape(1, 1))),
            (shape(1, 0), vec![])
        );
        // Fewer shards but more replicas, past the cap: the shards shrink, the replicas wait.
        let fleet = fleet_of(3, &[("a", 1, 0), ("b", 1, 5)]);
        let (granted, breaches) = grant(&fleet, &key, "standard", (shape(1, 5), shape(2, 0)));
        assert_eq!(granted, shape(1, 0));
        assert!(!breaches.is_empty());
    }

    fn fields(breaches: &[Breach]) -> Vec<&str> {
        breaches.iter().map(|b| b.field).collect()
    }

    #[test]
    fn a_config_the_policy_does_not_list_is_refused_naming_the_policy() {
        let p = policy(&["standard"], None, None, None);
        let breaches = judge(
            "team-a",
            &p,
            "team-a",
            &create("large", 1, 2),
            Usage::default(),
        );
        assert_eq!(fields(&breaches), ["spec.configRef"]);
        let said = breaches[0].to_string();
        assert!(
            said.contains("ValkeyNamespacePolicy team-a") && said.contains("standard"),
            "{said}"
        );
        assert!(
            judge(
                "team-a",
                &p,
                "team-a",
                &create("standard", 1, 2),
                Usage::default()
            )
            .is_empty()
        );
        let any = policy(&[], None, None, None);
        assert!(
            judge(
                "open",
                &any,
                "team-a",
                &create("large", 1, 2),
                Usage::default()
            )
            .is_empty()
        );
    }

    #[test]
    fn each_cap_counts_the_other_clusters_with_this_one() {
        let p = policy(&[], Some(2), Some(6), Some(12));
        let others = Usage {
            clusters: 1,
            shards: 3,
            nodes: 6,
        };
        assert!(judge("p", &p, "team-a", &create("c", 3, 6), others).is_empty());
        assert_eq!(
            fields(&judge("p", &p, "team-a", &create("c", 4, 8), others)),
            ["spec.shards", "spec.replicasPerShard"]
        );
        assert_eq!(
            fields(&judge("p", &p, "team-a", &create("c", 3, 9), others)),
            ["spec.replicasPerShard"]
        );
        let full = Usage {
            clusters: 2,
            ..others
        };
        assert_eq!(
            fields(&judge("p", &p, "team-a", &create("c", 1, 1), full)),
            ["metadata.name"]
        );
    }

    #[test]
    fn an_update_is_refused_only_for_what_it_makes_worse() {
        let p = policy(&["standard"], Some(1), Some(4), Some(8));
        let over = Usage {
            clusters: 3,
            shards: 10,
            nodes: 20,
        };
        let before = Before {
            config_ref: "large",
            footprint: Footprint {
                shards: 2,
                nodes: 4,
            },
        };
        let same = Request {
            before: Some(before),
            ..create("large", 2, 4)
        };
        assert!(
            judge("p", &p, "team-a", &same, over).is_empty(),
            "a cluster from before the policy can still be changed"
        );
        let shrunk = Request {
            before: Some(before),
            ..create("large", 1, 2)
        };
        assert!(judge("p", &p, "team-a", &shrunk, over).is_empty());
        let grown = Request {
            before: Some(before),
            ..create("large", 3, 6)
        };
        assert_eq!(
            fields(&judge("p", &p, "team-a", &grown, over)),
            ["spec.shards", "spec.replicasPerShard"]
        );
        let moved = Request {
            before: Some(before),
            ..create("other", 2, 4)
        };
        assert_eq!(
            fields(&judge("p", &p, "team-a", &moved, over)),
            ["spec.configRef"]
        );
    }

    #[test]
    fn the_controller_counts_only_the_clusters_created_before() {
        let at = |s: i64| Timestamp::from_second(s).ok();
        let member = |s| Member {
            footprint: Footprint {
                shards: 1,
                nodes: 1,
            },
            created: at(s),
        };
        assert!(counts(Counted::CreatedBefore(at(10)), &member(5), "z", "a"));
        assert!(!counts(
            Counted::CreatedBefore(at(10)),
            &member(15),
            "a",
            "z"
        ));
        // The same second: the name decides, so two clusters never both count before the other.
        assert!(counts(
            Counted::CreatedBefore(at(10)),
            &member(10),
            "a",
            "b"
        ));
        assert!(!counts(
            Counted::CreatedBefore(at(10)),
            &member(10),
            "b",
            "a"
        ));
        assert!(counts(Counted::All, &member(15), "a", "z"));
    }

    #[test]
    fn every_policy_naming_the_namespace_holds_and_others_do_not() {
        let mut fleet = Fleet::default();
        fleet.upsert_policy("configs", policy(&["standard"], None, None, None));
        fleet.upsert_policy("caps", policy(&[], Some(1), None, None));
        let mut elsewhere = policy(&[], Some(0), None, None);
        elsewhere.namespaces = vec!["team-b".into()];
        fleet.upsert_policy("elsewhere", elsewhere);
        let member = Member {
            footprint: Footprint {
                shards: 1,
                nodes: 2,
            },
            created: None,
        };
        fleet.set_cluster_member(&ClusterKey::new("team-a", "old"), member);
        let key = ClusterKey::new("team-a", "new");
        let said: Vec<String> = breaches(&fleet, &key, &create("large", 1, 2), Counted::All)
            .iter()
            .map(|b| b.policy.clone())
            .collect();
        assert_eq!(said, ["caps", "configs"]);
        // Its own entry (an update seen by the index) never counts against it.
        fleet.set_cluster_member(&key, member);
        let update = Request {
            before: Some(Before {
                config_ref: "standard",
                footprint: member.footprint,
            }),
            ..create("standard", 1, 2)
        };
        assert!(breaches(&fleet, &key, &update, Counted::All).is_empty());
        fleet.remove_cluster(&key);
        fleet.remove_policy("caps");
        assert!(breaches(&fleet, &key, &create("standard", 1, 2), Counted::All).is_empty());
    }
}
