//! The operator's own settings, from the optional ConfigMap `valkey-operator-config` read at
//! start. An invalid value stops the operator with a message naming the key.

use std::collections::BTreeMap;

use crate::api::ZoneSpread;
use crate::api::bounds::{Caps, MAX_REPLICAS_PER_SHARD, MAX_SHARDS};

/// The ConfigMap's name.
pub const CONFIG_MAP: &str = "valkey-operator-config";

/// The Kubernetes cluster's DNS domain unless the ConfigMap sets `clusterDomain`.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// Settings with their defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorSettings {
    /// Zone spreading for clusters that do not set `placement.zoneSpread`.
    pub default_zone_spread: ZoneSpread,
    /// The Kubernetes cluster's DNS domain: a TLS node announces
    /// `<pod>.<cluster>.<namespace>.svc.<domain>` and is verified by that name.
    pub cluster_domain: String,
    /// See [`crate::admission::Policy::fleet_roll_ack_threshold`].
    pub fleet_roll_ack_threshold: Option<usize>,
    /// The largest cluster admission lets a tenant create or grow to.
    pub caps: Caps,
    /// The namespace the operator runs in (its own, not a ConfigMap key): every cluster's
    /// NetworkPolicy lets the operator's Pods in from there.
    pub operator_namespace: String,
    /// How many clusters the controller reconciles at once (a flag, not a ConfigMap key;
    /// 0: no bound).
    pub max_concurrent_reconciles: u16,
}

impl Default for OperatorSettings {
    fn default() -> Self {
        Self {
            default_zone_spread: ZoneSpread::default(),
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_string(),
            fleet_roll_ack_threshold: None,
            caps: Caps::default(),
            operator_namespace: String::new(),
            max_concurrent_reconciles: 0,
        }
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("ConfigMap {CONFIG_MAP}: defaultZoneSpread is {0:?}; use bestEffort or required")]
    ZoneSpread(String),
    #[error(
        "environment variable {ZONE_SPREAD_VARIABLE} is {0:?}; use bestEffort or required (or unset it)"
    )]
    ZoneSpreadVariable(String),
    #[error(
        "ConfigMap {CONFIG_MAP}: fleetRollAckThreshold is {0:?}; use a whole number of clusters (e.g. \"20\") or remove the key to only warn"
    )]
    Threshold(String),
    #[error(
        "ConfigMap {CONFIG_MAP}: {key} is {value:?}; use a whole number from 1 to {limit} (the CRD's own limit)"
    )]
    Cap {
        key: &'static str,
        value: String,
        limit: i32,
    },
    #[error(
        "ConfigMap {CONFIG_MAP}: clusterDomain is {0:?}; use the cluster's DNS domain, lowercase labels of letters, digits and '-' joined by dots (e.g. \"cluster.local\")"
    )]
    ClusterDomain(String),
    #[error(
        "ConfigMap {CONFIG_MAP}: unknown key {0:?}; known keys are defaultZoneSpread, clusterDomain, fleetRollAckThreshold, maxShards and maxReplicasPerShard"
    )]
    UnknownKey(String),
}

impl OperatorSettings {
    /// Parses the ConfigMap's data; a missing ConfigMap is an empty one.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, SettingsError> {
        let mut settings = Self::default();
        for (key, value) in data {
            let value = value.trim();
            match key.as_str() {
                "defaultZoneSpread" => {
                    settings.default_zone_spread =
                        zone_spread(value).ok_or_else(|| SettingsError::ZoneSpread(value.into()))?
                }
                "clusterDomain" => {
                    if !is_dns_name(value) {
                        return Err(SettingsError::ClusterDomain(value.into()));
                    }
                    settings.cluster_domain = value.to_string();
                }
                "fleetRollAckThreshold" => {
                    settings.fleet_roll_ack_threshold = Some(
                        value
                            .parse()
                            .map_err(|_| SettingsError::Threshold(value.into()))?,
                    )
                }
                "maxShards" => settings.caps.max_shards = cap("maxShards", value, 1, MAX_SHARDS)?,
                "maxReplicasPerShard" => {
                    settings.caps.max_replicas_per_shard =
                        cap("maxReplicasPerShard", value, 0, MAX_REPLICAS_PER_SHARD)?
                }
                other => return Err(SettingsError::UnknownKey(other.into())),
            }
        }
        Ok(settings)
    }

    /// [`Self::from_data`], then Momento's `DEFAULT_ZONE_SPREAD` environment variable (its
    /// value given here) where the ConfigMap does not set `defaultZoneSpread`.
    pub fn from_sources(
        data: &BTreeMap<String, String>,
        zone_spread_variable: Option<&str>,
    ) -> Result<Self, SettingsError> {
        let mut settings = Self::from_data(data)?;
        if let Some(value) = zone_spread_variable
            && !data.contains_key("defaultZoneSpread")
        {
            settings.default_zone_spread = zone_spread(value.trim())
                .ok_or_else(|| SettingsError::ZoneSpreadVariable(value.into()))?;
        }
        Ok(settings)
    }
}

/// The environment variable Momento's operator reads its default zone spread from.
pub const ZONE_SPREAD_VARIABLE: &str = "DEFAULT_ZONE_SPREAD";

fn zone_spread(value: &str) -> Option<ZoneSpread> {
    match value {
        "bestEffort" => Some(ZoneSpread::BestEffort),
        "required" => Some(ZoneSpread::Required),
        _ => None,
    }
}

/// Lowercase DNS labels (letters, digits, inner `-`, at most 63 each) joined by dots, at most
/// 200 characters so a node's full name still fits a DNS name.
fn is_dns_name(value: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    value.len() <= 200 && value.split('.').all(label)
}

/// A cap between `min` and the CRD's hard `limit`.
fn cap(key: &'static str, value: &str, min: i32, limit: i32) -> Result<i32, SettingsError> {
    value
        .parse()
        .ok()
        .filter(|n| (min..=limit).contains(n))
        .ok_or_else(|| SettingsError::Cap {
            key,
            value: value.into(),
            limit,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_and_values() {
        assert_eq!(
            OperatorSettings::from_data(&data(&[])).unwrap(),
            OperatorSettings::default()
        );
        let parsed = OperatorSettings::from_data(&data(&[
            ("defaultZoneSpread", "required"),
            ("fleetRollAckThreshold", "20"),
        ]))
        .unwrap();
        assert_eq!(parsed.default_zone_spread, ZoneSpread::Required);
        assert_eq!(parsed.fleet_roll_ack_threshold, Some(20));
        assert_eq!(parsed.caps, Caps::default());
        let capped = OperatorSettings::from_data(&data(&[
            ("maxShards", "16"),
            ("maxReplicasPerShard", "0"),
        ]))
        .unwrap();
        assert_eq!(
            capped.caps,
            Caps {
                max_shards: 16,
                max_replicas_per_shard: 0
            }
        );
    }

    #[test]
    fn momentos_zone_spread_variable_counts_where_the_config_map_is_silent() {
        let empty = data(&[]);
        let from_variable = OperatorSettings::from_sources(&empty, Some("required")).unwrap();
        assert_eq!(from_variable.default_zone_spread, ZoneSpread::Required);
        let both = data(&[("defaultZoneSpread", "bestEffort")]);
        let config_map_wins = OperatorSettings::from_sources(&both, Some("required")).unwrap();
        assert_eq!(config_map_wins.default_zone_spread, ZoneSpread::BestEffort);
        let error = OperatorSettings::from_sources(&empty, Some("always")).unwrap_err();
        assert!(error.to_string().contains("DEFAULT_ZONE_SPREAD"), "{error}");
    }

    #[test]
    fn the_cluster_domain_is_a_dns_name_and_defaults_to_cluster_local() {
        assert_eq!(OperatorSettings::default().cluster_domain, "cluster.local");
        let set = OperatorSettings::from_data(&data(&[("clusterDomain", "corp.example")])).unwrap();
        assert_eq!(set.cluster_domain, "corp.example");
        for bad in [
            "",
            "Cluster.Local",
            "cluster..local",
            "-a.local",
            "a_b.local",
            ".local",
        ] {
            let err = OperatorSettings::from_data(&data(&[("clusterDomain", bad)])).unwrap_err();
            assert_eq!(err, SettingsError::ClusterDomain(bad.into()), "{bad:?}");
        }
    }

    #[test]
    fn caps_stay_within_the_crd_limits() {
        for (key, value) in [
            ("maxShards", "0"),
            ("maxShards", "16385"),
            ("maxShards", "many"),
            ("maxReplicasPerShard", "16"),
        ] {
            let err = OperatorSettings::from_data(&data(&[(key, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn invalid_values_name_the_key() {
        let err =
            OperatorSettings::from_data(&data(&[("defaultZoneSpread", "sometimes")])).unwrap_err();
        assert!(
            err.to_string()
                .contains("defaultZoneSpread is \"sometimes\"")
        );
        let err =
            OperatorSettings::from_data(&data(&[("fleetRollAckThreshold", "-3")])).unwrap_err();
        assert!(err.to_string().contains("fleetRollAckThreshold"));
        let err = OperatorSettings::from_data(&data(&[("fleetRollAckTreshold", "3")])).unwrap_err();
        assert_eq!(
            err,
            SettingsError::UnknownKey("fleetRollAckTreshold".into())
        );
    }
}
