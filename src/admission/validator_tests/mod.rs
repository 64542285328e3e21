//! Table-driven tests of the pure validators over a small fleet: the shared fixtures here, the
//! tests of each kind in their own file.

mod cluster;
mod config;
mod image;
mod node_role;

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use kube::core::admission::Operation;

use super::*;
use crate::api::*;
use crate::fleet::{ClusterKey, Fleet};

fn image(version: &str) -> ValkeyImage {
    ValkeyImage::new(
        &format!("valkey-{}", version.replace('.', "-")),
        ValkeyImageSpec {
            repository: "valkey/valkey".into(),
            tag: version.into(),
            version: version.into(),
        },
    )
}

fn config_spec(image: Option<&str>, base: Option<&str>) -> ValkeyConfigSpec {
    ValkeyConfigSpec {
        image_ref: image.map(Into::into),
        base_ref: base.map(Into::into),
        ..Default::default()
    }
}

fn config(name: &str, spec: ValkeyConfigSpec) -> ValkeyConfig {
    ValkeyConfig::new(name, spec)
}

fn cluster(namespace: &str, name: &str, config_ref: &str) -> ValkeyCluster {
    let mut cluster = ValkeyCluster::new(
        name,
        ValkeyClusterSpec {
            config_ref: config_ref.into(),
            shards: 3,
            replicas_per_shard: 1,
            acl: vec![],
            tls: None,
            placement: None,
            pod_annotations: BTreeMap::new(),
            network: None,
        },
    );
    cluster.metadata.namespace = Some(namespace.into());
    cluster
}

/// Images 8.1.4 (stored before the webhook existed), 9.0.0 and 9.1.2; `standard` on 9.0.0
/// inherited by `large` and `cache`; `other` on 9.1.2; one cluster on each config.
fn fleet() -> Fleet {
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

fn review<'a, T>(
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
    }
}

fn joined(verdict: &Verdict) -> String {
    verdict.denials.join("; ")
}
