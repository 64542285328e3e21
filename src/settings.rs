//! The operator's own settings, from the optional ConfigMap `valkey-operator-config` read at
//! start. An invalid value stops the operator with a message naming the key.

use std::collections::BTreeMap;

use crate::admission::Policy;
use crate::api::ZoneSpread;
use crate::api::bounds::{Caps, MAX_REPLICAS_PER_SHARD, MAX_SHARDS};

/// The ConfigMap's name.
pub const CONFIG_MAP: &str = "valkey-operator-config";

/// Settings with their defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorSettings {
    /// Zone spreading for clusters that do not set `placement.zoneSpread`.
    pub default_zone_spread: ZoneSpread,
    /// See [`Policy::fleet_roll_ack_threshold`].
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

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("ConfigMap {CONFIG_MAP}: defaultZoneSpread is {0:?}; use bestEffort or required")]
    ZoneSpread(String),
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
        "ConfigMap {CONFIG_MAP}: unknown key {0:?}; known keys are defaultZoneSpread, fleetRollAckThreshold, maxShards and maxReplicasPerShard"
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
                    settings.default_zone_spread = match value {
                        "bestEffort" => ZoneSpread::BestEffort,
                        "required" => ZoneSpread::Required,
                        other => return Err(SettingsError::ZoneSpread(other.into())),
                    }
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

    pub fn admission_policy(&self, node_writer: Option<String>) -> Policy {
        Policy {
            fleet_roll_ack_threshold: self.fleet_roll_ack_threshold,
            caps: self.caps,
            node_writer,
        }
    }
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
        assert_eq!(
            parsed.admission_policy(None).fleet_roll_ack_threshold,
            Some(20)
        );
        assert_eq!(parsed.caps, Caps::default());
        let capped = OperatorSettings::from_data(&data(&[
            ("maxShards", "16"),
            ("maxReplicasPerShard", "0"),
        ]))
        .unwrap();
        assert_eq!(
            capped.admission_policy(None).caps,
            Caps {
                max_shards: 16,
                max_replicas_per_shard: 0
            }
        );
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
