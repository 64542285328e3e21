//! The ValkeyCluster status the controller writes, computed purely: conditions whose
//! `lastTransitionTime` moves only on a real transition, and the summary columns (`version`,
//! `outdatedNodes`) that make a roll visible in `kubectl get valkeycluster -w`.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Sets condition `type_`, keeping its `lastTransitionTime` unless its status changes.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Time,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let updated = |last_transition_time| Condition {
        type_: type_.to_string(),
        status: status.clone(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation,
        last_transition_time,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            let since = if existing.status == status {
                existing.last_transition_time.clone()
            } else {
                now
            };
            *existing = updated(since);
        }
        None => conditions.push(updated(now)),
    }
}

/// The engine versions running, lowest first, joined for the `Version` column: `9.0.0`, or
/// mid-roll `9.0.0,9.1.2`.
pub fn versions_running<'a>(versions: impl IntoIterator<Item = &'a str>) -> String {
    let mut distinct: Vec<&str> = versions
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Semantic-version precedence (10.0.0 after 9.1.2); anything unparsable sorts first, by text.
    distinct.sort_by_cached_key(|v| (semver::Version::parse(v).ok(), *v));
    distinct.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_a_transition() {
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            "Progressing",
            true,
            "Rolling",
            "shard 0: join",
            Some(2),
            at(100),
        );
        set_condition(
            &mut conditions,
            "Progressing",
            true,
            "Rolling",
            "shard 1: failover",
            Some(2),
            at(200),
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, at(100));
        assert_eq!(conditions[0].message, "shard 1: failover");
        set_condition(
            &mut conditions,
            "Progressing",
            false,
            "Converged",
            "up to date",
            Some(3),
            at(300),
        );
        assert_eq!(conditions[0].last_transition_time, at(300));
        assert_eq!(conditions[0].status, "False");
        assert_eq!(conditions[0].observed_generation, Some(3));
        set_condition(
            &mut conditions,
            "Ready",
            true,
            "AllSlotsServed",
            "",
            Some(3),
            at(300),
        );
        assert_eq!(conditions.len(), 2);
    }

    #[test]
    fn versions_sort_by_precedence() {
        assert_eq!(versions_running(["9.1.2", "9.0.0", "9.1.2"]), "9.0.0,9.1.2");
        assert_eq!(versions_running(["10.0.0", "9.1.2"]), "9.1.2,10.0.0");
        assert_eq!(versions_running([]), "");
    }
}
