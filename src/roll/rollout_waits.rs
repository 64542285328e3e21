//! Why a fleet rollout holds a cluster's roll step back ([`WaitFor`]) and a cluster's place in
//! its rollout ([`Wave`]): the words the planner's [`WaitReason::Rollout`](super::WaitReason)
//! carries. The rules that decide them are the fleet's ([`crate::fleet::rollout`]) and the
//! controller's gate; the types live here so that the planner, above both, can name them.

use std::fmt;

use k8s_openapi::jiff::Timestamp;

use crate::api::ClusterKey;
use crate::api::annotations::ROLLOUT_PAUSED;

/// A cluster's wave: a number, or the last wave (after every numbered one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Wave {
    Numbered(u32),
    Last,
}

impl Wave {
    /// The wave an annotation value names; missing or not a number is the last wave.
    pub fn from_annotation(value: Option<&str>) -> Self {
        match value.and_then(|v| v.trim().parse().ok()) {
            Some(number) => Wave::Numbered(number),
            None => Wave::Last,
        }
    }
}

impl fmt::Display for Wave {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wave::Numbered(number) => write!(f, "wave {number}"),
            Wave::Last => f.write_str("the last wave"),
        }
    }
}

/// Why a cluster may not start (or go on) rolling now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitFor {
    Paused,
    /// This leader has not yet seen `unseen` clusters of the group.
    Learning {
        unseen: usize,
    },
    /// `stalled` is stalled on the same target.
    Halted {
        stalled: ClusterKey,
    },
    /// `behind` of an earlier wave is not up to date yet.
    EarlierWave {
        wave: Wave,
        behind: ClusterKey,
    },
    /// The group already has `rolling` clusters rolling, its cap.
    Capped {
        rolling: u32,
    },
    /// Some of the cluster's own nodes refuse the operator's login: it is stuck for a cause of
    /// its own (the controller's gate says so, not [`crate::fleet::rollout::gate`]), and rolls on once they let it in.
    LoginRefused,
    /// Outside every maintenance window of the group's policy: the next opens at `opens`.
    OutsideWindow {
        opens: Timestamp,
    },
    /// A person holds the cluster on its revision (the controller's gate says so): until
    /// `until` (an RFC 3339 time), or until the annotation is removed.
    Held {
        until: Option<String>,
    },
}

impl WaitFor {
    /// A short, bounded name (a condition reason).
    pub fn kind(&self) -> &'static str {
        match self {
            WaitFor::Paused => "RolloutPaused",
            WaitFor::Learning { .. } => "RolloutLearning",
            WaitFor::Halted { .. } => "RolloutHalted",
            WaitFor::EarlierWave { .. } => "WaitingForWave",
            WaitFor::Capped { .. } => "RolloutCapped",
            WaitFor::LoginRefused => "LoginRefused",
            WaitFor::Held { .. } => "RolloutHeld",
            WaitFor::OutsideWindow { .. } => "OutsideMaintenanceWindow",
        }
    }
}

impl fmt::Display for WaitFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitFor::Paused => write!(
                f,
                "the rollout is paused ({ROLLOUT_PAUSED} on a config it resolves through)"
            ),
            WaitFor::Learning { unseen } => write!(
                f,
                "the operator has not yet seen {unseen} clusters of the rollout since it started leading"
            ),
            WaitFor::Halted { stalled } => write!(
                f,
                "the rollout is halted: {stalled} stalled on the same change; fix it (or the \
                 config) and the rollout resumes"
            ),
            WaitFor::EarlierWave { wave, behind } => {
                write!(
                    f,
                    "waiting for {wave} to complete ({behind} is not up to date)"
                )
            }
            WaitFor::Capped { rolling } => write!(
                f,
                "{rolling} clusters of the rollout are rolling, its maxConcurrent"
            ),
            WaitFor::OutsideWindow { opens } => write!(
                f,
                "outside the rollout's maintenance windows: it starts rolling when the next \
                 opens, at {opens}"
            ),
            WaitFor::LoginRefused => f.write_str(
                "some of its nodes refuse the operator's login: it rolls on once they let it in",
            ),
            WaitFor::Held { until } => {
                let hold = crate::api::annotations::ROLLOUT_HOLD;
                match until {
                    Some(until) => write!(f, "held on its revision by {hold} until {until}"),
                    None => write!(f, "held on its revision by {hold}"),
                }?;
                f.write_str(
                    "; the rest of its rollout goes on without it (remove the annotation, or \
                     kubectl valkey release, to let it roll)",
                )
            }
        }
    }
}
