//! Property test of the one rule of a change (`fleet::change`): for any two resolutions of a
//! cluster's config, the rule says it rolls exactly when the controller renders its nodes a
//! different revision, says `nothing` only when the controller would set nothing live either,
//! and `live` only when it would set something live without replacing a node.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proptest::prelude::*;
use valkey_operator::api::{
    AclUser, NodeResources, ValkeyCluster, ValkeyClusterSpec, ValkeyImageSpec, ZoneSpread,
};
use valkey_operator::controller::build::render::ClusterRender;
use valkey_operator::fleet::change::{Change, change};
use valkey_operator::fleet::resolve::{Chain, EffectiveConfig, ResolvedImage};

fn cluster() -> ValkeyCluster {
    let mut cluster = ValkeyCluster::new("orders", ValkeyClusterSpec::new("standard", 3, 1));
    cluster.metadata.namespace = Some("team-a".into());
    cluster
}

/// Settings a config may set: some live, some Valkey reads only at start.
const SETTINGS: [&str; 6] = [
    "maxmemory",
    "maxmemory-policy",
    "hz",
    "databases",
    "io-threads",
    "appendonly",
];

/// A resolution drawn from a small space, so that two draws are often equal in part.
fn effective() -> impl Strategy<Value = EffectiveConfig> {
    let image = prop::sample::select(vec![
        ("valkey-9-0-0", "valkey/valkey", "9.0.0", "9.0.0"),
        ("valkey-9-1-2", "valkey/valkey", "9.1.2", "9.1.2"),
        // The same image under another name: not a roll.
        ("valkey-9-1-2-copy", "valkey/valkey", "9.1.2", "9.1.2"),
        // The same tag declaring another version: a roll.
        ("valkey-9-1-2-relabel", "valkey/valkey", "9.1.2", "9.1.3"),
    ]);
    let memory = prop::option::of(prop::sample::select(vec!["1Gi", "2Gi"]));
    let settings = prop::collection::btree_map(
        prop::sample::select(SETTINGS.to_vec()),
        prop::sample::select(vec!["1", "2", "yes"]),
        0..4,
    );
    let users = prop::collection::vec(prop::sample::select(vec!["metrics", "backup"]), 0..2);
    (image, memory, settings, users).prop_map(|(image, memory, settings, users)| {
        let (name, repository, tag, version) = image;
        EffectiveConfig {
            chain: Chain(vec!["standard".into()]),
            image: ResolvedImage {
                name: name.into(),
                spec: ValkeyImageSpec {
                    repository: repository.into(),
                    tag: tag.into(),
                    version: version.into(),
                },
            },
            resources: NodeResources {
                cpu: None,
                memory: memory.map(|m| Quantity(m.into())),
            },
            valkey: settings
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            acl: users
                .into_iter()
                .map(|username| AclUser {
                    username: username.into(),
                    password_hashes: vec![],
                    password_secret_ref: None,
                    permissions: vec![],
                })
                .collect(),
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_rule_rolls_exactly_when_the_rendered_revision_moves(
        before in effective(),
        after in effective(),
    ) {
        let cluster = cluster();
        let render = |effective| ClusterRender {
            cluster: &cluster,
            effective,
            default_zone_spread: ZoneSpread::BestEffort,
            cluster_domain: "cluster.local",
        };
        let (old, new) = (render(&before), render(&after));
        let revision_moves = old.revision() != new.revision();
        let sets_live = old.live_settings() != new.live_settings() || before.acl != after.acl;
        let said = change(Some(&before), Some(&after));
        prop_assert_eq!(matches!(said, Change::Rolls(_)), revision_moves, "{}", said);
        match said {
            Change::Nothing => prop_assert!(!sets_live),
            Change::Live { .. } => prop_assert!(sets_live),
            _ => {}
        }
    }
}
