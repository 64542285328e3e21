//! Configuration resolution, pure: a config name → its `baseRef` chain → the effective config
//! (merged root first) and the image it runs. Works over any [`Catalog`] of images and configs,
//! so admission can ask "what would this resolve to if the config under review were stored".

use std::collections::BTreeMap;
use std::fmt;

use crate::api::{AclUser, NodeResources, ValkeyConfigSpec, ValkeyImageSpec};

/// The longest `baseRef` chain accepted, counting the config itself.
pub const MAX_CHAIN_DEPTH: usize = 10;

/// Read access to the images and configs that resolution walks.
pub trait Catalog {
    fn config(&self, name: &str) -> Option<&ValkeyConfigSpec>;
    fn image(&self, name: &str) -> Option<&ValkeyImageSpec>;
}

/// A catalog seen as if one config had the given spec (`None`: as if it were deleted).
/// Admission uses it to resolve the object under review before it is stored.
pub struct WithConfig<'a, C: Catalog + ?Sized> {
    pub inner: &'a C,
    pub name: &'a str,
    pub spec: Option<&'a ValkeyConfigSpec>,
}

impl<C: Catalog + ?Sized> Catalog for WithConfig<'_, C> {
    fn config(&self, name: &str) -> Option<&ValkeyConfigSpec> {
        if name == self.name {
            self.spec
        } else {
            self.inner.config(name)
        }
    }

    fn image(&self, name: &str) -> Option<&ValkeyImageSpec> {
        self.inner.image(name)
    }
}

/// A chain of config names, printed `a → b → c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain(pub Vec<String>);

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(" → "))
    }
}

/// Why a config does not resolve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("ValkeyConfig {missing:?} does not exist (chain {chain})")]
    MissingConfig { missing: String, chain: Chain },
    #[error("baseRef cycle: {chain}")]
    Cycle { chain: Chain },
    #[error("baseRef chain {chain} is deeper than {MAX_CHAIN_DEPTH} configs")]
    TooDeep { chain: Chain },
    #[error("no config in the chain {chain} sets spec.imageRef")]
    NoImage { chain: Chain },
    #[error("ValkeyImage {image:?} does not exist (named by the chain {chain})")]
    MissingImage { image: String, chain: Chain },
}

impl ResolveError {
    /// Whether the error only means something has not been created yet (so `kubectl apply` of
    /// one file holding images, configs and clusters works in any order).
    pub fn is_missing_object(&self) -> bool {
        matches!(self, Self::MissingConfig { .. } | Self::MissingImage { .. })
    }
}

/// The image a config resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedImage {
    /// The ValkeyImage's name.
    pub name: String,
    pub spec: ValkeyImageSpec,
}

/// A config with its whole `baseRef` chain merged.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveConfig {
    /// The config first, then its base, up to the root.
    pub chain: Chain,
    pub image: ResolvedImage,
    pub resources: NodeResources,
    pub valkey: BTreeMap<String, String>,
    /// The platform's users: the `acl` of the nearest config in the chain that sets one.
    pub acl: Vec<AclUser>,
}

/// Walks `name`'s `baseRef` chain, child first, checking for cycles, depth and missing configs.
pub fn chain_of<'c>(
    name: &str,
    catalog: &'c (impl Catalog + ?Sized),
) -> Result<Vec<(String, &'c ValkeyConfigSpec)>, ResolveError> {
    let mut chain: Vec<(String, &ValkeyConfigSpec)> = Vec::new();
    let mut next = Some(name.to_string());
    while let Some(current) = next {
        let names = || Chain(chain.iter().map(|(n, _)| n.clone()).collect());
        if chain.iter().any(|(seen, _)| *seen == current) {
            let mut cycle = names();
            cycle.0.push(current);
            return Err(ResolveError::Cycle { chain: cycle });
        }
        if chain.len() == MAX_CHAIN_DEPTH {
            let mut deep = names();
            deep.0.push(current);
            return Err(ResolveError::TooDeep { chain: deep });
        }
        let Some(spec) = catalog.config(&current) else {
            let mut partial = names();
            partial.0.push(current.clone());
            return Err(ResolveError::MissingConfig {
                missing: current,
                chain: partial,
            });
        };
        next = spec.base_ref.clone();
        chain.push((current, spec));
    }
    Ok(chain)
}

/// Resolves a config to its effective form: root first, each child overriding its base's
/// fields, `valkey` settings merged key by key.
pub fn resolve(
    name: &str,
    catalog: &(impl Catalog + ?Sized),
) -> Result<EffectiveConfig, ResolveError> {
    let chain = chain_of(name, catalog)?;
    let names = Chain(chain.iter().map(|(n, _)| n.clone()).collect());
    let mut image_ref = None;
    let mut resources = NodeResources::default();
    let mut valkey = BTreeMap::new();
    let acl = chain
        .iter()
        .find_map(|(_, spec)| spec.acl.clone())
        .unwrap_or_default();
    for (_, spec) in chain.iter().rev() {
        if let Some(image) = &spec.image_ref {
            image_ref = Some(image.clone());
        }
        if let Some(own) = &spec.resources {
            if own.cpu.is_some() {
                resources.cpu = own.cpu.clone();
            }
            if own.memory.is_some() {
                resources.memory = own.memory.clone();
            }
        }
        valkey.extend(spec.valkey.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let image_name = image_ref.ok_or_else(|| ResolveError::NoImage {
        chain: names.clone(),
    })?;
    let image_spec = catalog
        .image(&image_name)
        .ok_or_else(|| ResolveError::MissingImage {
            image: image_name.clone(),
            chain: names.clone(),
        })?;
    Ok(EffectiveConfig {
        chain: names,
        image: ResolvedImage {
            name: image_name,
            spec: image_spec.clone(),
        },
        resources,
        valkey,
        acl,
    })
}

/// The name of the image a config resolves to, without requiring the image to exist.
pub fn image_name(name: &str, catalog: &(impl Catalog + ?Sized)) -> Result<String, ResolveError> {
    let chain = chain_of(name, catalog)?;
    chain
        .iter()
        .find_map(|(_, spec)| spec.image_ref.clone())
        .ok_or_else(|| ResolveError::NoImage {
            chain: Chain(chain.iter().map(|(n, _)| n.clone()).collect()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Fleet;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn image(version: &str) -> ValkeyImageSpec {
        ValkeyImageSpec {
            repository: "valkey/valkey".into(),
            tag: version.into(),
            version: version.into(),
        }
    }

    fn config(
        image: Option<&str>,
        base: Option<&str>,
        valkey: &[(&str, &str)],
    ) -> ValkeyConfigSpec {
        ValkeyConfigSpec {
            image_ref: image.map(Into::into),
            base_ref: base.map(Into::into),
            resources: None,
            valkey: valkey
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            rollout: None,
            acl: None,
        }
    }

    #[test]
    fn the_nearest_config_with_users_gives_them_all() {
        let user = |name: &str| crate::api::AclUser {
            username: name.into(),
            password_hashes: vec![],
            password_secret_ref: None,
            permissions: vec![],
        };
        let mut fleet = Fleet::default();
        fleet.upsert_image("v9", image("9.0.0"));
        let mut root = config(Some("v9"), None, &[]);
        root.acl = Some(vec![user("app"), user("ops")]);
        fleet.upsert_config("root", root);
        fleet.upsert_config("inherits", config(None, Some("root"), &[]));
        let mut replaces = config(None, Some("root"), &[]);
        replaces.acl = Some(vec![user("batch")]);
        fleet.upsert_config("replaces", replaces);
        let mut clears = config(None, Some("root"), &[]);
        clears.acl = Some(vec![]);
        fleet.upsert_config("clears", clears);
        let names = |config: &str| -> Vec<String> {
            let effective = resolve(config, &fleet).unwrap();
            effective.acl.into_iter().map(|u| u.username).collect()
        };
        assert_eq!(names("inherits"), ["app", "ops"]);
        assert_eq!(names("replaces"), ["batch"], "replaced, not merged");
        assert!(names("clears").is_empty());
    }

    #[test]
    fn three_config_chain_where_only_the_root_names_the_image() {
        let mut fleet = Fleet::default();
        fleet.upsert_image("v9", image("9.0.0"));
        let mut root = config(
            Some("v9"),
            None,
            &[("maxmemory", "1gb"), ("maxmemory-policy", "noeviction")],
        );
        root.resources = Some(NodeResources {
            cpu: Some(Quantity("1".into())),
            memory: Some(Quantity("2Gi".into())),
        });
        fleet.upsert_config("root", root);
        let mut middle = config(None, Some("root"), &[("maxmemory", "2gb")]);
        middle.resources = Some(NodeResources {
            cpu: None,
            memory: Some(Quantity("4Gi".into())),
        });
        fleet.upsert_config("middle", middle);
        fleet.upsert_config("leaf", config(None, Some("middle"), &[("hz", "20")]));

        let effective = resolve("leaf", &fleet).unwrap();
        assert_eq!(effective.chain.to_string(), "leaf → middle → root");
        assert_eq!(effective.image.name, "v9");
        assert_eq!(effective.image.spec.version, "9.0.0");
        assert_eq!(effective.resources.cpu, Some(Quantity("1".into())));
        assert_eq!(effective.resources.memory, Some(Quantity("4Gi".into())));
        let settings: Vec<_> = effective
            .valkey
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            settings,
            ["hz=20", "maxmemory=2gb", "maxmemory-policy=noeviction"]
        );
    }

    #[test]
    fn a_child_image_overrides_its_base() {
        let mut fleet = Fleet::default();
        fleet.upsert_image("old", image("9.0.0"));
        fleet.upsert_image("new", image("9.1.2"));
        fleet.upsert_config("base", config(Some("old"), None, &[]));
        fleet.upsert_config("child", config(Some("new"), Some("base"), &[]));
        assert_eq!(resolve("child", &fleet).unwrap().image.name, "new");
        assert_eq!(resolve("base", &fleet).unwrap().image.name, "old");
    }

    #[test]
    fn a_cycle_is_named_whole() {
        let mut fleet = Fleet::default();
        fleet.upsert_image("v9", image("9.0.0"));
        fleet.upsert_config("a", config(Some("v9"), Some("b"), &[]));
        fleet.upsert_config("b", config(None, Some("c"), &[]));
        fleet.upsert_config("c", config(None, Some("a"), &[]));
        let err = resolve("a", &fleet).unwrap_err();
        assert_eq!(err.to_string(), "baseRef cycle: a → b → c → a");
        assert!(!err.is_missing_object());
    }

    #[test]
    fn an_over_deep_chain_is_refused() {
        let mut fleet = Fleet::default();
        fleet.upsert_image("v9", image("9.0.0"));
        fleet.upsert_config("c0", config(Some("v9"), None, &[]));
        for i in 1..=MAX_CHAIN_DEPTH {
            fleet.upsert_config(
                &format!("c{i}"),
                config(None, Some(&format!("c{}", i - 1)), &[]),
            );
        }
        assert!(resolve(&format!("c{}", MAX_CHAIN_DEPTH - 1), &fleet).is_ok());
        let err = resolve(&format!("c{MAX_CHAIN_DEPTH}"), &fleet).unwrap_err();
        assert!(matches!(err, ResolveError::TooDeep { .. }), "{err}");
        assert!(
            err.to_string().starts_with("baseRef chain c10 → c9"),
            "{err}"
        );
    }

    #[test]
    fn missing_objects_are_told_apart_from_broken_chains() {
        let mut fleet = Fleet::default();
        fleet.upsert_config("child", config(None, Some("absent"), &[]));
        fleet.upsert_config("orphan", config(Some("no-such-image"), None, &[]));
        fleet.upsert_config("imageless", config(None, None, &[]));
        let missing_base = resolve("child", &fleet).unwrap_err();
        assert!(missing_base.is_missing_object());
        assert_eq!(
            missing_base.to_string(),
            "ValkeyConfig \"absent\" does not exist (chain child → absent)"
        );
        assert!(resolve("orphan", &fleet).unwrap_err().is_missing_object());
        assert_eq!(image_name("orphan", &fleet).unwrap(), "no-such-image");
        let none = resolve("imageless", &fleet).unwrap_err();
        assert_eq!(
            none,
            ResolveError::NoImage {
                chain: Chain(vec!["imageless".into()])
            }
        );
    }

    #[test]
    fn with_config_resolves_the_object_under_review() {
        let mut fleet = Fleet::default();
        fleet.upsert_image("old", image("9.0.0"));
        fleet.upsert_image("new", image("9.1.2"));
        fleet.upsert_config("base", config(Some("old"), None, &[]));
        fleet.upsert_config("child", config(None, Some("base"), &[]));
        let candidate = config(Some("new"), None, &[]);
        let view = WithConfig {
            inner: &fleet,
            name: "base",
            spec: Some(&candidate),
        };
        assert_eq!(resolve("child", &view).unwrap().image.name, "new");
        assert_eq!(resolve("child", &fleet).unwrap().image.name, "old");
    }
}
