//! What the validators' tests share: a small fleet, objects of each kind and a review of them
//! (the tests of each kind are beside its validator, in `<kind>_tests.rs`).

pub(crate) use std::collections::BTreeMap;

pub(crate) use kube::api::ObjectMeta;
pub(crate) use kube::core::admission::Operation;

pub(crate) use super::*;
pub(crate) use crate::api::ClusterKey;
pub(crate) use crate::api::*;
pub(crate) use crate::fleet::Fleet;

pub(crate) fn image(version: &str) -> ValkeyImage {
    ValkeyImage::new(
        &format!("valkey-{}", version.replace('.', "-")),
        ValkeyImageSpec {
            repository: "valkey/valkey".into(),
            tag: version.into(),
            version: version.into(),
        },
    )
}

pub(crate) fn config_spec(image: Option<&str>, base: Option<&str>) -> ValkeyConfigSpec {
    ValkeyConfigSpec {
        image_ref: image.map(Into::into),
        base_ref: base.map(Into::into),
        ..Default::default()
    }
}

pub(crate) fn config(name: &str, spec: ValkeyConfigSpec) -> ValkeyConfig {
    ValkeyConfig::new(name, spec)
}

pub(crate) fn cluster(namespace: &str, name: &str, config_ref: &str) -> ValkeyCluster {
    let mut cluster = ValkeyCluster::new(name, ValkeyClusterSpec::new(config_ref, 3, 1));
    cluster.metadata.namespace = Some(namespace.into());
    cluster
}

/// Images 8.1.4 (stored before the webhook existed), 9.0.0 and 9.1.2; `standard` on 9.0.0
/// inherited by `large` and `cache`; `other` on 9.1.2; one cluster on each config.
pub(crate) fn fleet() -> Fleet {
    let mut fleet = Fleet::default();
    for version in ["8.1.4", "9.0.0", "9.1.2"] {
        let image = image(version);
        fleet.upsert_image(&image.metadata.name.clone().unwrap(), image.spec);
    }
    fleet.upsert_config("standard", config_spec(Some("valkey-9-0-0"), None));
    fleet.upsert_config("large", config_spec(None, Some("standard")));
    fleet.upsert_config("cache", config_spec(None, Some("standard")));
    fleet.upsert_config("other", config_spec(Some("valkey-9-1-2"), None));
    for (ns, name, config) in [
        ("team-a", "orders", "standard"),
        ("team-b", "sessions", "large"),
        ("team-b", "feed", "cache"),
        ("team-c", "search", "other"),
    ] {
        fleet.upsert_cluster(ClusterKey::new(ns, name), config);
    }
    fleet
}

pub(crate) fn review<'a, T>(
    operation: Operation,
    name: &'a str,
    object: Option<&'a T>,
    old: Option<&'a T>,
) -> Review<'a, T> {
    Review {
        operation,
        name,
        namespace: None,
        object,
        old,
        user: None,
        now: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    }
}

pub(crate) fn joined(verdict: &Verdict) -> String {
    verdict.denials.join("; ")
}
