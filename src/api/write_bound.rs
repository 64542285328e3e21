//! What the bound on lost writes (`min-replicas-to-write` / `min-replicas-max-lag`) needs from
//! the replication link's own settings, read from a config's effective `spec.valkey`.
//!
//! With the bound on, a primary refuses writes (`NOREPLICAS`) while too few replicas have
//! acknowledged within the lag. A partition drops packets without closing connections: after
//! it heals, both ends of a replication link still hold a connection whose retransmissions
//! back off for tens of seconds, and Valkey drops it only after `repl-timeout` (60 s by
//! default) without data. Until then the primary refuses every write, healed or not
//! (`tests/e2e_partition.rs` measured the writer stuck past the heal with the defaults, and
//! back within seconds with `repl-timeout 10`). The operator does not lower it itself: a
//! replica that loads a full sync for longer than `repl-timeout` is dropped by its primary
//! and syncs again, for ever, so only the config's owner knows how low it may go.

use std::collections::BTreeMap;

/// The highest `repl-timeout` the advice lets pass with the bound on: about what a healed
/// partition's stale link may then cost in refused writes.
pub const LINK_TIMEOUT_ADVISED: u64 = 10;

/// Valkey's defaults for the settings read here.
const DEFAULT_MAX_LAG: u64 = 10;
const DEFAULT_REPL_TIMEOUT: u64 = 60;
const DEFAULT_PING_PERIOD: u64 = 10;

/// A setting as Valkey would run it, by its name or its older alias: the config's value when
/// it is a whole number, else Valkey's default (a value Valkey refuses fails at `CONFIG SET`,
/// not here).
fn seconds(settings: &BTreeMap<String, String>, names: &[&str], default: u64) -> u64 {
    (names.iter())
        .find_map(|name| settings.get(*name))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(default)
}

/// Warnings for settings that make the bound, or the replication link, misbehave.
pub fn advice(settings: &BTreeMap<String, String>) -> Vec<String> {
    let replicas = seconds(
        settings,
        &["min-replicas-to-write", "min-slaves-to-write"],
        0,
    );
    let max_lag = seconds(
        settings,
        &["min-replicas-max-lag", "min-slaves-max-lag"],
        DEFAULT_MAX_LAG,
    );
    let timeout = seconds(settings, &["repl-timeout"], DEFAULT_REPL_TIMEOUT);
    let ping = seconds(
        settings,
        &["repl-ping-replica-period", "repl-ping-slave-period"],
        DEFAULT_PING_PERIOD,
    );
    let mut advice = Vec::new();
    if replicas > 0 && max_lag > 0 && timeout > LINK_TIMEOUT_ADVISED {
        advice.push(format!(
            "spec.valkey: with min-replicas-to-write, a replication link a healed partition left dead refuses writes until repl-timeout ({timeout} s) drops it; set repl-timeout: \"{LINK_TIMEOUT_ADVISED}\" (above a full sync's load time) and repl-ping-replica-period: \"1\""
        ));
    }
    if timeout <= ping {
        advice.push(format!(
            "spec.valkey: repl-timeout ({timeout} s) is not above repl-ping-replica-period ({ping} s): a replica of an idle primary drops its link between two pings and syncs again; make repl-timeout the larger"
        ));
    }
    advice
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        (pairs.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn valkeys_defaults_need_no_advice() {
        assert!(advice(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn the_bound_with_valkeys_link_timeout_is_advised_a_shorter_one() {
        let bound = settings(&[
            ("min-replicas-to-write", "1"),
            ("min-replicas-max-lag", "1"),
        ]);
        let advice = advice(&bound);
        assert_eq!(advice.len(), 1, "{advice:?}");
        assert!(advice[0].contains("repl-timeout (60 s)"), "{}", advice[0]);
        // The API server keeps warnings of up to 256 characters.
        assert!(advice[0].chars().count() <= 256, "{}", advice[0]);
    }

    #[test]
    fn the_bound_with_a_short_link_timeout_passes() {
        let bound = settings(&[
            ("min-replicas-to-write", "1"),
            ("repl-timeout", "10"),
            ("repl-ping-replica-period", "1"),
        ]);
        assert!(advice(&bound).is_empty());
    }

    #[test]
    fn valkeys_older_names_count_too() {
        let bound = settings(&[
            ("min-slaves-to-write", "1"),
            ("repl-ping-slave-period", "1"),
        ]);
        assert_eq!(advice(&bound).len(), 1, "{:?}", advice(&bound));
        let tuned = settings(&[
            ("min-slaves-to-write", "1"),
            ("repl-timeout", "10"),
            ("repl-ping-slave-period", "1"),
        ]);
        assert!(advice(&tuned).is_empty(), "{:?}", advice(&tuned));
    }

    #[test]
    fn a_zero_lag_turns_the_bound_off() {
        let off = settings(&[
            ("min-replicas-to-write", "1"),
            ("min-replicas-max-lag", "0"),
        ]);
        assert!(advice(&off).is_empty());
    }

    #[test]
    fn a_link_timeout_within_the_ping_period_is_advised_against() {
        let short = settings(&[("repl-timeout", "5")]);
        let advice = advice(&short);
        assert_eq!(advice.len(), 1, "{advice:?}");
        assert!(
            advice[0].contains("repl-ping-replica-period (10 s)"),
            "{}",
            advice[0]
        );
        assert!(advice[0].chars().count() <= 256, "{}", advice[0]);
    }
}
