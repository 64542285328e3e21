//! What each node of each cluster was last given by the live step (its users, its reloaded
//! certificate), so that a node that has it is not written again each pass.

use std::collections::HashMap;
use std::time::Instant;

use crate::acl::is_reserved;
use crate::api::ClusterKey;
use crate::controller::build::status::NodeRefusal;
use crate::controller::memory::REFRESH;
use crate::controller::memory::{KeptPerCluster, PerCluster};
use crate::execute::Member;
use crate::execute::acl::Refusal;
use crate::valkey::NodeAddress;

/// What each node of each cluster was last given: its address (a new server at a new address
/// starts with nothing), a digest of what it was given (its users, or the certificate it
/// reloaded), when, and what it refused of it.
#[derive(Debug, Default)]
pub struct Applied(PerCluster<HashMap<String, Written>>);

#[derive(Clone, Debug)]
pub(in crate::controller) struct Written {
    at: NodeAddress,
    digest: u64,
    when: Instant,
    refusals: Vec<Refusal>,
}

impl Written {
    /// It holds the operator's own users and the replication login: every write carries them,
    /// and it refused none of them (a tenant's refusal locks nobody out).
    pub fn has_system_users(&self) -> bool {
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
    pub fn is_current(
        &self,
        cluster: &ClusterKey,
        node: &str,
        at: NodeAddress,
        digest: u64,
    ) -> bool {
        self.is_current_at(cluster, node, at, digest, Instant::now())
    }

    pub fn is_current_at(
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

    pub fn record(
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
    pub fn refusals(&self, cluster: &ClusterKey, digests: &[u64]) -> Vec<NodeRefusal> {
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
    pub fn everywhere(&self, cluster: &ClusterKey, members: &[Member], digest: u64) -> bool {
        members.iter().all(|member| {
            self.written(cluster, &member.name, |w| {
                Some(w.at) == member.address && w.digest == digest && w.has_system_users()
            })
        })
    }

    /// Whether the member was written at the address it has now, whatever with (every write
    /// carries the operator's users and the replication login).
    pub fn written_here(&self, cluster: &ClusterKey, member: &Member) -> bool {
        self.written(cluster, &member.name, |w| {
            Some(w.at) == member.address && w.has_system_users()
        })
    }

    /// Keeps only the cluster's current members (retired nodes are forgotten).
    pub fn keep_only(&self, cluster: &ClusterKey, members: &[Member]) {
        let mut applied = self.0.lock();
        if let Some(nodes) = applied.get_mut(cluster) {
            nodes.retain(|node, _| members.iter().any(|m| &m.name == node));
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
            removed: false,
            leaving: false,
            not_started: None,
            location: Default::default(),
            silent: false,
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
}
