//! Tests of the one rule of a change: what rolls, what is live, what is nothing, and chains
//! that stop or start resolving.

use std::collections::BTreeMap;

use super::*;
use crate::api::{AclUser, NodeResources, ValkeyConfigSpec, ValkeyImageSpec};
use crate::fleet::resolve::{Chain, ResolvedImage};

fn effective(tag: &str, settings: &[(&str, &str)]) -> EffectiveConfig {
    EffectiveConfig {
        chain: Chain(vec!["c".into()]),
        image: ResolvedImage {
            name: format!("valkey-{tag}"),
            spec: ValkeyImageSpec {
                repository: "valkey/valkey".into(),
                tag: tag.into(),
                version: tag.into(),
            },
        },
        resources: NodeResources::default(),
        valkey: settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        acl: Vec::new(),
    }
}

#[test]
fn an_image_or_a_start_only_setting_rolls_a_live_setting_is_set_and_the_rest_is_nothing() {
    let old = effective("9.0.0", &[("maxmemory", "1gb")]);
    let change = |new: &EffectiveConfig| super::change(Some(&old), Some(new));
    assert_eq!(
        change(&effective("9.1.2", &[("maxmemory", "1gb")])),
        Change::Rolls(RollReason::Image {
            from: "valkey-9.0.0".into(),
            to: "valkey-9.1.2".into()
        })
    );
    assert_eq!(
        change(&effective("9.0.0", &[("maxmemory", "2gb")])),
        Change::Live {
            set: vec!["maxmemory".into()],
            removed: vec![],
            users: false,
        }
    );
    assert_eq!(
        change(&effective("9.0.0", &[])).to_string(),
        "maxmemory removed: nodes keep the value until replaced"
    );
    let restart = effective("9.0.0", &[("maxmemory", "1gb"), ("databases", "4")]);
    assert_eq!(
        change(&restart),
        Change::Rolls(RollReason::StartOnly(vec!["databases".into()]))
    );
    let mut bigger = old.clone();
    bigger.resources.memory = Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
        "2Gi".into(),
    ));
    assert_eq!(change(&bigger), Change::Rolls(RollReason::Resources));
    assert_eq!(change(&old.clone()), Change::Nothing);
}

#[test]
fn the_config_users_are_set_live() {
    let old = effective("9.0.0", &[]);
    let mut with_user = old.clone();
    with_user.acl = vec![AclUser {
        username: "reader".into(),
        password_hashes: Vec::new(),
        password_secret_ref: None,
        permissions: Vec::new(),
    }];
    let change = change(Some(&old), Some(&with_user));
    assert_eq!(
        change,
        Change::Live {
            set: vec![],
            removed: vec![],
            users: true
        }
    );
    assert_eq!(change.to_string(), "the config's users set live");
    assert_eq!(change.word(), "live");
}

#[test]
fn a_chain_that_stops_or_starts_resolving_is_said_so() {
    let config = effective("9.0.0", &[]);
    assert_eq!(change(Some(&config), None), Change::StopsResolving);
    assert_eq!(change(None, Some(&config)), Change::ResolvesAgain);
    assert_eq!(change(None, None), Change::Nothing);
    assert_eq!(Change::StopsResolving.word(), "unresolved");
}

#[test]
fn the_digest_moves_exactly_with_the_rolling_inputs() {
    let old = effective("9.0.0", &[("maxmemory", "1gb"), ("databases", "16")]);
    let digest = |e: &EffectiveConfig| RollingInputs::of(e).digest();
    let live = effective("9.0.0", &[("maxmemory", "2gb"), ("databases", "16")]);
    assert_eq!(digest(&old), digest(&live));
    let restart = effective("9.0.0", &[("maxmemory", "1gb"), ("databases", "32")]);
    assert_ne!(digest(&old), digest(&restart));
    assert_eq!(digest(&old).len(), 12);
}

fn fleet() -> Fleet {
    let mut fleet = Fleet::default();
    for (name, version) in [("valkey-9-0-0", "9.0.0"), ("valkey-9-1-2", "9.1.2")] {
        fleet.upsert_image(
            name,
            ValkeyImageSpec {
                repository: "valkey/valkey".into(),
                tag: version.into(),
                version: version.into(),
            },
        );
    }
    let base = ValkeyConfigSpec {
        image_ref: Some("valkey-9-0-0".into()),
        ..Default::default()
    };
    fleet.upsert_config("base", base);
    let child = ValkeyConfigSpec {
        base_ref: Some("base".into()),
        ..Default::default()
    };
    fleet.upsert_config("child", child);
    fleet.upsert_cluster(ClusterKey::new("a", "orders"), "child");
    fleet.upsert_cluster(ClusterKey::new("a", "carts"), "base");
    fleet
}

#[test]
fn every_cluster_through_a_config_is_judged_by_its_own_chain() {
    let fleet = fleet();
    let spec = |image: &str, valkey: &[(&str, &str)]| ValkeyConfigSpec {
        image_ref: Some(image.into()),
        valkey: valkey
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let words = |name: &str, spec: &ValkeyConfigSpec| {
        changes_through(&fleet, name, Some(spec))
            .into_iter()
            .map(|(key, change)| (key, change.word()))
            .collect::<BTreeMap<_, _>>()
    };
    let all = |word| {
        BTreeMap::from([
            (ClusterKey::new("a", "carts"), word),
            (ClusterKey::new("a", "orders"), word),
        ])
    };
    assert_eq!(words("base", &spec("valkey-9-1-2", &[])), all("rolls"));
    let tuned = spec("valkey-9-0-0", &[("maxmemory-policy", "allkeys-lru")]);
    assert_eq!(words("base", &tuned), all("live"));
    assert_eq!(words("base", &spec("valkey-9-0-0", &[])), all("nothing"));
    let child_only = ValkeyConfigSpec {
        base_ref: Some("base".into()),
        image_ref: Some("valkey-9-1-2".into()),
        ..Default::default()
    };
    assert_eq!(
        words("child", &child_only),
        BTreeMap::from([(ClusterKey::new("a", "orders"), "rolls")])
    );
}
