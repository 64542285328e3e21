//! The fleet index: the specs of every image, config and role, each cluster's `configRef` and the
//! roles its ACL users name, with reverse edges so that "which clusters resolve through this
//! config" costs the size of the answer, not a scan of every cluster. Fed by the watch streams (see
//! [`crate::fleet::caches`]); read by admission and resolution through [`Catalog`].
//!
//! Beside the index: [`caches`], the watches that feed it; [`resolve`], a config's `baseRef` chain
//! over it; [`rollout`], the rules of a fleet rollout over its clusters; [`policy`], what a
//! namespace's policies allow its clusters.

pub mod caches;
pub mod change;
pub mod policy;
pub mod resolve;
pub mod rollout;
pub mod window;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::api::{
    ClusterKey, ValkeyConfigSpec, ValkeyImageSpec, ValkeyNamespacePolicySpec, ValkeyRoleSpec,
};
use crate::fleet::policy::Member;
use crate::fleet::resolve::Catalog;

/// Images, configs, roles and cluster→config and cluster→role edges, with the reverse edges
/// kept in step.
#[derive(Debug, Default)]
pub struct Fleet {
    images: HashMap<String, ValkeyImageSpec>,
    configs: HashMap<String, ValkeyConfigSpec>,
    cluster_config: HashMap<ClusterKey, String>,
    clusters_by_config: HashMap<String, BTreeSet<ClusterKey>>,
    configs_by_base: HashMap<String, BTreeSet<String>>,
    configs_by_image: HashMap<String, BTreeSet<String>>,
    roles: HashMap<String, ValkeyRoleSpec>,
    cluster_roles: HashMap<ClusterKey, BTreeSet<String>>,
    clusters_by_role: HashMap<String, BTreeSet<ClusterKey>>,
    /// Secrets (of the cluster's own namespace) a cluster's users name, and back.
    cluster_secrets: HashMap<ClusterKey, BTreeSet<String>>,
    clusters_by_secret: HashMap<ClusterKey, BTreeSet<ClusterKey>>,
    /// Configs whose rollouts a person paused ([`ROLLOUT_PAUSED`](crate::api::annotations::ROLLOUT_PAUSED)).
    paused_configs: BTreeSet<String>,
    /// Each cluster's `rollout-wave` annotation ([`ROLLOUT_WAVE`](crate::api::annotations::ROLLOUT_WAVE)), for
    /// admission's words.
    cluster_waves: HashMap<ClusterKey, String>,
    /// What each cluster's ACL users cost apart from their roles (see [`crate::acl::Cost`]):
    /// admission of a role change reckons what it makes of every cluster granting it.
    cluster_acl_costs: HashMap<ClusterKey, Vec<crate::acl::UserCost>>,
    /// Each cluster's size and age for its namespace's caps, by namespace then name.
    cluster_members: BTreeMap<ClusterKey, Member>,
    /// The namespace policies, by name (a handful: scanned).
    policies: BTreeMap<String, ValkeyNamespacePolicySpec>,
}

fn unlink<K: Ord>(map: &mut HashMap<String, BTreeSet<K>>, key: &str, member: &K) {
    if let Some(set) = map.get_mut(key) {
        set.remove(member);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

impl Fleet {
    pub fn upsert_image(&mut self, name: &str, spec: ValkeyImageSpec) {
        self.images.insert(name.to_string(), spec);
    }

    pub fn remove_image(&mut self, name: &str) {
        self.images.remove(name);
    }

    pub fn upsert_config(&mut self, name: &str, spec: ValkeyConfigSpec) {
        self.remove_config(name);
        if let Some(base) = &spec.base_ref {
            self.configs_by_base
                .entry(base.clone())
                .or_default()
                .insert(name.to_string());
        }
        if let Some(image) = &spec.image_ref {
            self.configs_by_image
                .entry(image.clone())
                .or_default()
                .insert(name.to_string());
        }
        self.configs.insert(name.to_string(), spec);
    }

    /// Whether a config's rollouts are paused (kept apart from its spec: it is an annotation).
    pub fn set_paused(&mut self, name: &str, paused: bool) {
        if paused {
            self.paused_configs.insert(name.to_owned());
        } else {
            self.paused_configs.remove(name);
        }
    }

    pub fn is_paused(&self, name: &str) -> bool {
        self.paused_configs.contains(name)
    }

    /// Every config's name.
    pub fn config_names(&self) -> impl Iterator<Item = &String> {
        self.configs.keys()
    }

    /// Every image's name.
    pub fn image_names(&self) -> impl Iterator<Item = &String> {
        self.images.keys()
    }

    pub fn remove_config(&mut self, name: &str) {
        self.paused_configs.remove(name);
        let Some(old) = self.configs.remove(name) else {
            return;
        };
        let name = name.to_string();
        if let Some(base) = &old.base_ref {
            unlink(&mut self.configs_by_base, base, &name);
        }
        if let Some(image) = &old.image_ref {
            unlink(&mut self.configs_by_image, image, &name);
        }
    }

    pub fn upsert_cluster(&mut self, key: ClusterKey, config_ref: &str) {
        self.remove_cluster(&key);
        self.clusters_by_config
            .entry(config_ref.to_string())
            .or_default()
            .insert(key.clone());
        self.cluster_config.insert(key, config_ref.to_string());
    }

    /// A cluster's size and creation time, as its namespace's caps count it.
    pub fn set_cluster_member(&mut self, key: &ClusterKey, member: Member) {
        self.cluster_members.insert(key.clone(), member);
    }

    /// The clusters of a namespace with their sizes, by name.
    pub fn members_of<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = (&'a ClusterKey, &'a Member)> + 'a {
        self.cluster_members
            .range(ClusterKey::new(namespace, "")..)
            .take_while(move |(key, _)| key.namespace == namespace)
    }

    pub fn upsert_policy(&mut self, name: &str, spec: ValkeyNamespacePolicySpec) {
        self.policies.insert(name.to_owned(), spec);
    }

    pub fn remove_policy(&mut self, name: &str) {
        self.policies.remove(name);
    }

    pub fn policy(&self, name: &str) -> Option<&ValkeyNamespacePolicySpec> {
        self.policies.get(name)
    }

    /// The policies that name `namespace`, by name.
    pub fn policies_governing<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a ValkeyNamespacePolicySpec)> + 'a {
        self.policies
            .iter()
            .filter(move |(_, policy)| policy.governs(namespace))
    }

    /// The `rollout-wave` annotation its owner put on a cluster, if any.
    pub fn set_cluster_wave_annotation(&mut self, key: &ClusterKey, value: Option<&str>) {
        match value {
            Some(value) => self.cluster_waves.insert(key.clone(), value.to_owned()),
            None => self.cluster_waves.remove(key),
        };
    }

    pub fn cluster_wave_annotation(&self, key: &ClusterKey) -> Option<&str> {
        self.cluster_waves.get(key).map(String::as_str)
    }

    pub fn remove_cluster(&mut self, key: &ClusterKey) {
        self.cluster_waves.remove(key);
        self.cluster_members.remove(key);
        self.cluster_acl_costs.remove(key);
        if let Some(old) = self.cluster_config.remove(key) {
            unlink(&mut self.clusters_by_config, &old, key);
        }
        self.set_cluster_roles(key, BTreeSet::new());
        self.set_cluster_secrets(key, BTreeSet::new());
    }

    /// The Secrets a cluster reads, by name in its own namespace (replacing what it read before).
    pub fn set_cluster_secrets(&mut self, key: &ClusterKey, secrets: BTreeSet<String>) {
        for secret in self.cluster_secrets.remove(key).into_iter().flatten() {
            let secret = ClusterKey::new(&key.namespace, secret);
            if let Some(clusters) = self.clusters_by_secret.get_mut(&secret) {
                clusters.remove(key);
                if clusters.is_empty() {
                    self.clusters_by_secret.remove(&secret);
                }
            }
        }
        for secret in &secrets {
            self.clusters_by_secret
                .entry(ClusterKey::new(&key.namespace, secret))
                .or_default()
                .insert(key.clone());
        }
        if !secrets.is_empty() {
            self.cluster_secrets.insert(key.clone(), secrets);
        }
    }

    /// Clusters that read the Secret `namespace/name`.
    pub fn clusters_using_secret(&self, namespace: &str, name: &str) -> Vec<ClusterKey> {
        let secret = ClusterKey::new(namespace, name);
        self.clusters_by_secret
            .get(&secret)
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The ValkeyRoles a cluster's ACL users name (replacing what it named before).
    pub fn set_cluster_roles(&mut self, key: &ClusterKey, roles: BTreeSet<String>) {
        if let Some(old) = self.cluster_roles.remove(key) {
            for role in &old {
                unlink(&mut self.clusters_by_role, role, key);
            }
        }
        for role in &roles {
            self.clusters_by_role
                .entry(role.clone())
                .or_default()
                .insert(key.clone());
        }
        if !roles.is_empty() {
            self.cluster_roles.insert(key.clone(), roles);
        }
    }

    pub fn upsert_role(&mut self, name: &str, spec: ValkeyRoleSpec) {
        self.roles.insert(name.to_string(), spec);
    }

    pub fn remove_role(&mut self, name: &str) {
        self.roles.remove(name);
    }

    pub fn role(&self, name: &str) -> Option<&ValkeyRoleSpec> {
        self.roles.get(name)
    }

    /// What a cluster's ACL users cost apart from their roles (none kept for a cluster with
    /// no users).
    pub fn set_cluster_acl_costs(&mut self, key: &ClusterKey, costs: Vec<crate::acl::UserCost>) {
        if costs.is_empty() {
            self.cluster_acl_costs.remove(key);
        } else {
            self.cluster_acl_costs.insert(key.clone(), costs);
        }
    }

    pub fn cluster_acl_costs(&self, key: &ClusterKey) -> &[crate::acl::UserCost] {
        self.cluster_acl_costs.get(key).map_or(&[], Vec::as_slice)
    }

    /// What the role of that name costs each permission granting it, if it exists.
    pub fn role_cost(&self, name: &str) -> Option<crate::acl::Cost> {
        self.role(name).map(crate::acl::role_cost)
    }

    /// Clusters with an ACL user granted this role: by their own `spec.acl`, or by the `acl`
    /// of a config they resolve through (all of that config's clusters: one whose nearer config
    /// replaces the list is woken for nothing, which costs a pass). Sorted.
    pub fn clusters_using_role(&self, role: &str) -> Vec<ClusterKey> {
        let mut clusters: BTreeSet<ClusterKey> = self
            .clusters_by_role
            .get(role)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        for (name, spec) in &self.configs {
            let grants = spec
                .acl
                .iter()
                .flatten()
                .flat_map(|user| &user.permissions)
                .any(|permission| permission.role_ref == role);
            if grants {
                clusters.extend(self.clusters_resolving_through(name));
            }
        }
        clusters.into_iter().collect()
    }

    /// The config a cluster names in `configRef`.
    pub fn cluster_config_ref(&self, key: &ClusterKey) -> Option<&str> {
        self.cluster_config.get(key).map(String::as_str)
    }

    /// Clusters whose `configRef` names this config directly.
    pub fn clusters_using(&self, config: &str) -> impl Iterator<Item = &ClusterKey> {
        self.clusters_by_config.get(config).into_iter().flatten()
    }

    /// Configs whose `baseRef` names this config.
    pub fn configs_based_on(&self, config: &str) -> impl Iterator<Item = &String> {
        self.configs_by_base.get(config).into_iter().flatten()
    }

    /// Configs whose own `imageRef` names this image.
    pub fn configs_using_image(&self, image: &str) -> impl Iterator<Item = &String> {
        self.configs_by_image.get(image).into_iter().flatten()
    }

    /// The config and every config that inherits from it, directly or through other configs,
    /// nearest first. A cycle in stored data is walked once.
    pub fn config_and_descendants(&self, config: &str) -> Vec<String> {
        let mut seen = BTreeSet::from([config.to_string()]);
        let mut order = vec![config.to_string()];
        let mut queue = VecDeque::from([config.to_string()]);
        while let Some(current) = queue.pop_front() {
            for child in self.configs_based_on(&current) {
                if seen.insert(child.clone()) {
                    order.push(child.clone());
                    queue.push_back(child.clone());
                }
            }
        }
        order
    }

    /// Every cluster that resolves through this config: its own clusters and those of every
    /// config that inherits from it. Sorted.
    pub fn clusters_resolving_through(&self, config: &str) -> Vec<ClusterKey> {
        let mut clusters: Vec<ClusterKey> = self
            .config_and_descendants(config)
            .iter()
            .flat_map(|c| self.clusters_using(c).cloned())
            .collect();
        clusters.sort();
        clusters
    }

    pub fn image_count(&self) -> usize {
        self.images.len()
    }

    pub fn config_count(&self) -> usize {
        self.configs.len()
    }

    pub fn cluster_count(&self) -> usize {
        self.cluster_config.len()
    }

    /// The rollout group of a config `chain` (its own config first): the nearest config with a
    /// `spec.rollout` policy, and that policy.
    pub fn rollout_group<'a>(
        &'a self,
        chain: &'a [String],
    ) -> Option<(&'a String, &'a crate::api::RolloutPolicy)> {
        chain.iter().find_map(|name| {
            let policy = self.configs.get(name)?.rollout.as_ref()?;
            Some((name, policy))
        })
    }
}

impl Catalog for Fleet {
    fn config(&self, name: &str) -> Option<&ValkeyConfigSpec> {
        self.configs.get(name)
    }

    fn image(&self, name: &str) -> Option<&ValkeyImageSpec> {
        self.images.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(image: Option<&str>, base: Option<&str>) -> ValkeyConfigSpec {
        ValkeyConfigSpec {
            image_ref: image.map(Into::into),
            base_ref: base.map(Into::into),
            ..Default::default()
        }
    }

    fn names(keys: &[ClusterKey]) -> Vec<String> {
        keys.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_base_inherited_by_two_others_reaches_the_clusters_of_all_three() {
        let mut fleet = Fleet::default();
        fleet.upsert_config("standard", config(Some("v9"), None));
        fleet.upsert_config("large", config(None, Some("standard")));
        fleet.upsert_config("cache", config(None, Some("standard")));
        fleet.upsert_config("other", config(Some("v9"), None));
        fleet.upsert_cluster(ClusterKey::new("a", "one"), "standard");
        fleet.upsert_cluster(ClusterKey::new("b", "two"), "large");
        fleet.upsert_cluster(ClusterKey::new("c", "three"), "cache");
        fleet.upsert_cluster(ClusterKey::new("d", "four"), "other");

        assert_eq!(
            names(&fleet.clusters_resolving_through("standard")),
            ["a/one", "b/two", "c/three"]
        );
        assert_eq!(names(&fleet.clusters_resolving_through("large")), ["b/two"]);
        assert_eq!(
            names(&fleet.clusters_resolving_through("other")),
            ["d/four"]
        );
    }

    #[test]
    fn a_secret_reaches_the_clusters_of_its_namespace_that_read_it() {
        let mut fleet = Fleet::default();
        let one = ClusterKey::new("a", "one");
        let two = ClusterKey::new("a", "two");
        let other = ClusterKey::new("b", "one");
        for key in [&one, &two, &other] {
            fleet.upsert_cluster(key.clone(), "standard");
            fleet.set_cluster_secrets(key, ["app-password".to_string()].into());
        }
        assert_eq!(
            names(&fleet.clusters_using_secret("a", "app-password")),
            ["a/one", "a/two"]
        );
        fleet.set_cluster_secrets(&two, ["rotated".to_string()].into());
        assert_eq!(
            names(&fleet.clusters_using_secret("a", "app-password")),
            ["a/one"]
        );
        assert_eq!(
            names(&fleet.clusters_using_secret("a", "rotated")),
            ["a/two"]
        );
        fleet.remove_cluster(&one);
        assert!(fleet.clusters_using_secret("a", "app-password").is_empty());
        assert_eq!(
            names(&fleet.clusters_using_secret("b", "app-password")),
            ["b/one"]
        );
    }

    #[test]
    fn updates_move_the_reverse_edges() {
        let mut fleet = Fleet::default();
        fleet.upsert_config("base", config(Some("v9"), None));
        fleet.upsert_config("child", config(None, Some("base")));
        fleet.upsert_cluster(ClusterKey::new("ns", "c"), "child");
        assert_eq!(fleet.clusters_resolving_through("base").len(), 1);

        // The child stops inheriting; the cluster moves to another config; then it goes away.
        fleet.upsert_config("child", config(Some("v9"), None));
        assert!(fleet.clusters_resolving_through("base").is_empty());
        assert_eq!(fleet.configs_using_image("v9").count(), 2);
        fleet.upsert_cluster(ClusterKey::new("ns", "c"), "base");
        assert!(fleet.clusters_using("child").next().is_none());
        assert_eq!(fleet.clusters_resolving_through("base").len(), 1);
        fleet.remove_cluster(&ClusterKey::new("ns", "c"));
        fleet.remove_config("child");
        assert_eq!(fleet.cluster_count(), 0);
        assert_eq!(
            fleet.configs_using_image("v9").collect::<Vec<_>>(),
            ["base"]
        );
    }

    #[test]
    fn a_stored_cycle_is_walked_once() {
        let mut fleet = Fleet::default();
        fleet.upsert_config("a", config(None, Some("b")));
        fleet.upsert_config("b", config(None, Some("a")));
        fleet.upsert_cluster(ClusterKey::new("ns", "x"), "a");
        assert_eq!(fleet.config_and_descendants("a"), ["a", "b"]);
        assert_eq!(fleet.clusters_resolving_through("b").len(), 1);
    }
}
