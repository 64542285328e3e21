//! The Kubernetes Events the operator records, as types: [`ClusterEvent`] on a ValkeyCluster,
//! [`RolloutEvent`] on a ValkeyConfig, both published by [`EventRecorder::record`] (the one way an
//! event is written). A cluster's event names the ValkeyNode it concerns, because kube's recorder
//! folds events with the same reason and related object into one series (keeping the first
//! note), so without it every join of a roll would show as the first one, counted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};

use crate::api::{ValkeyCluster, ValkeyNode};

/// Something a person watching `kubectl get events` should know about a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterEvent {
    /// A node was created to join the cluster. `what`, here and below, is the step's
    /// [`crate::roll::Step::headline`], the words the `Progressing` condition and the metrics use.
    NodeJoining {
        node: String,
        what: String,
    },
    NodeActive {
        node: String,
        shard: u32,
    },
    /// A planned failover onto `to` is being issued.
    Failover {
        to: String,
        what: String,
    },
    /// A primary whose Pod is being evicted hands its shard over to `to` (planned).
    HandOver {
        to: String,
        what: String,
    },
    /// A primary sharing a zone or a host with another of the cluster's hands its shard over to
    /// `to`, where primaries stand less crowded (planned).
    Rebalance {
        to: String,
        what: String,
    },
    /// A switchover a person asked for is being issued onto `to` (planned).
    Switchover {
        to: String,
        what: String,
    },
    /// `to` takes over a shard whose primary's server stopped (unplanned).
    TakeOver {
        to: String,
        what: String,
    },
    /// Slots are being moved to `to`.
    SlotMigration {
        to: String,
        what: String,
    },
    NodeRetired {
        node: String,
        what: String,
    },
    /// `what` is the stalled step's headline.
    RollStalled {
        what: String,
    },
    /// A person allowed more failover attempts for `shards` (the retry-failovers annotation).
    FailoversAllowed {
        shards: Vec<u32>,
    },
    /// `AclApplied` turned false, or changed why: what the condition says.
    AclNotApplied {
        problem: String,
    },
    /// A rotation of the operator's own passwords moved on: `stage` says to what.
    CredentialsRotation {
        stage: &'static str,
    },
    /// The cluster was deleted and its nodes retired.
    Deleted {
        nodes: usize,
    },
    /// The spec is outside the hard limits; the operator does nothing until it changes.
    SpecOutOfBounds {
        problems: String,
    },
    /// An object the cluster would own belongs to someone else and is left untouched.
    NameConflict {
        problem: String,
    },
    /// Another server answers at a node's address: what `Degraded` says.
    StrangerAtAddress {
        problem: String,
    },
    /// Nodes' Pods have not started, with Kubernetes' reasons: what `Degraded` says.
    PodNotStarted {
        problem: String,
    },
}

impl ClusterEvent {
    /// The ValkeyNode the event concerns, if one.
    pub fn node(&self) -> Option<&str> {
        match self {
            ClusterEvent::NodeJoining { node, .. }
            | ClusterEvent::NodeActive { node, .. }
            | ClusterEvent::NodeRetired { node, .. } => Some(node),
            ClusterEvent::Failover { to, .. }
            | ClusterEvent::HandOver { to, .. }
            | ClusterEvent::Rebalance { to, .. }
            | ClusterEvent::Switchover { to, .. }
            | ClusterEvent::TakeOver { to, .. }
            | ClusterEvent::SlotMigration { to, .. } => Some(to),
            _ => None,
        }
    }
}

/// A config's fleet rollout moved to another phase (its `status.rollout`); `counts` says where
/// its clusters stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutEvent {
    pub change: RolloutChange,
    pub counts: String,
}

/// The phase changes of a config's rollout that are told as events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutChange {
    /// From `Complete` to `Rolling`.
    Started,
    /// A cluster stalled on the change: no other starts until it is fixed.
    Halted,
    Paused,
    /// Back to `Rolling` from `Halted` or `Paused`.
    Resumed,
    Completed,
}

/// What an event says, whatever it is recorded on.
pub trait Said {
    /// The reason, as `kubectl get events` shows it.
    fn reason(&self) -> &'static str;
    fn note(&self) -> String;
    fn action(&self) -> &'static str;
    fn is_warning(&self) -> bool;
}

impl Said for ClusterEvent {
    /// The event's reason, as `kubectl get events` shows it.
    fn reason(&self) -> &'static str {
        match self {
            ClusterEvent::NodeJoining { .. } => "NodeJoining",
            ClusterEvent::NodeActive { .. } => "NodeActive",
            ClusterEvent::Failover { .. } => "Failover",
            ClusterEvent::HandOver { .. } => "HandOver",
            ClusterEvent::Rebalance { .. } => "Rebalance",
            ClusterEvent::Switchover { .. } => "Switchover",
            ClusterEvent::TakeOver { .. } => "TakeOver",
            ClusterEvent::SlotMigration { .. } => "SlotMigration",
            ClusterEvent::NodeRetired { .. } => "NodeRetired",
            ClusterEvent::RollStalled { .. } => "RollStalled",
            ClusterEvent::FailoversAllowed { .. } => "FailoverRetryAllowed",
            ClusterEvent::AclNotApplied { .. } => "AclNotApplied",
            ClusterEvent::CredentialsRotation { .. } => "CredentialsRotation",
            ClusterEvent::Deleted { .. } => "Deleted",
            ClusterEvent::SpecOutOfBounds { .. } => "SpecOutOfBounds",
            ClusterEvent::NameConflict { .. } => "NameConflict",
            ClusterEvent::StrangerAtAddress { .. } => "StrangerAtAddress",
            ClusterEvent::PodNotStarted { .. } => "PodNotStarted",
        }
    }

    fn action(&self) -> &'static str {
        match self {
            ClusterEvent::NodeJoining { .. } => "Join",
            ClusterEvent::NodeActive { .. } => "Activate",
            ClusterEvent::Failover { .. }
            | ClusterEvent::HandOver { .. }
            | ClusterEvent::Rebalance { .. }
            | ClusterEvent::Switchover { .. }
            | ClusterEvent::TakeOver { .. } => "Failover",
            ClusterEvent::SlotMigration { .. } => "MigrateSlots",
            ClusterEvent::NodeRetired { .. } => "Retire",
            ClusterEvent::RollStalled { .. } | ClusterEvent::FailoversAllowed { .. } => "Plan",
            ClusterEvent::AclNotApplied { .. } | ClusterEvent::CredentialsRotation { .. } => {
                "ApplyAcl"
            }
            ClusterEvent::Deleted { .. } => "Cleanup",
            ClusterEvent::SpecOutOfBounds { .. } => "Validate",
            ClusterEvent::NameConflict { .. } => "Apply",
            ClusterEvent::StrangerAtAddress { .. } => "Connect",
            ClusterEvent::PodNotStarted { .. } => "Start",
        }
    }

    fn is_warning(&self) -> bool {
        matches!(
            self,
            ClusterEvent::RollStalled { .. }
                | ClusterEvent::AclNotApplied { .. }
                | ClusterEvent::TakeOver { .. }
                | ClusterEvent::SpecOutOfBounds { .. }
                | ClusterEvent::NameConflict { .. }
                | ClusterEvent::StrangerAtAddress { .. }
                | ClusterEvent::PodNotStarted { .. }
        )
    }

    fn note(&self) -> String {
        match self {
            ClusterEvent::NodeJoining { node, what } => format!("{what}: created {node}"),
            ClusterEvent::NodeActive { node, shard } => {
                format!("{node} is an active member of shard {shard}")
            }
            ClusterEvent::Failover { what, .. }
            | ClusterEvent::HandOver { what, .. }
            | ClusterEvent::Rebalance { what, .. }
            | ClusterEvent::Switchover { what, .. }
            | ClusterEvent::TakeOver { what, .. }
            | ClusterEvent::SlotMigration { what, .. }
            | ClusterEvent::NodeRetired { what, .. } => what.clone(),
            ClusterEvent::RollStalled { what } => what.clone(),
            ClusterEvent::FailoversAllowed { shards } => format!(
                "a person allowed more failover attempts for shards {shards:?}; the roll resumes"
            ),
            ClusterEvent::AclNotApplied { problem } => format!("spec.acl: {problem}"),
            ClusterEvent::CredentialsRotation { stage } => stage.to_string(),
            ClusterEvent::Deleted { nodes } => format!("retired {nodes} nodes"),
            ClusterEvent::SpecOutOfBounds { problems } => {
                format!(
                    "the spec is outside the operator's limits, nothing is done until it changes: {problems}"
                )
            }
            ClusterEvent::NameConflict { problem }
            | ClusterEvent::StrangerAtAddress { problem }
            | ClusterEvent::PodNotStarted { problem } => problem.clone(),
        }
    }
}

impl Said for RolloutEvent {
    fn reason(&self) -> &'static str {
        match self.change {
            RolloutChange::Started => "RolloutStarted",
            RolloutChange::Halted => "RolloutHalted",
            RolloutChange::Paused => "RolloutPaused",
            RolloutChange::Resumed => "RolloutResumed",
            RolloutChange::Completed => "RolloutCompleted",
        }
    }

    fn note(&self) -> String {
        match self.change {
            RolloutChange::Halted => format!("a cluster stalled: {}", self.counts),
            _ => self.counts.clone(),
        }
    }
    fn action(&self) -> &'static str {
        "Rollout"
    }
    fn is_warning(&self) -> bool {
        self.change == RolloutChange::Halted
    }
}

/// kube's [`Recorder`], renewed after [`RENEW_AFTER_EVENTS`] events or [`RENEW_AFTER`]. A
/// recorder keeps every event it published, to fold a repeat into a series, and drops old ones
/// only when it next publishes: a fleet's burst of events (a node joining each of 10,000
/// clusters) would stay in memory, 3 KiB each, until then. A renewed recorder starts a new
/// series for a repeat; repeats a few seconds apart (a conflict said each pass) still fold.
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    current: Arc<Mutex<Current>>,
}

struct Current {
    recorder: Recorder,
    since: Instant,
    published: usize,
}

/// Events one recorder publishes before it is renewed.
pub const RENEW_AFTER_EVENTS: usize = 500;
/// kube's own time to forget an event.
pub const RENEW_AFTER: Duration = Duration::from_secs(6 * 60);

impl EventRecorder {
    pub fn new(client: Client) -> Self {
        let current = Current {
            recorder: Self::fresh(&client),
            since: Instant::now(),
            published: 0,
        };
        Self {
            client,
            current: Arc::new(Mutex::new(current)),
        }
    }

    fn fresh(client: &Client) -> Recorder {
        Recorder::new(client.clone(), Reporter::from("valkey-operator"))
    }

    /// Records `event` on `about`, with `related` as its second object; a failure to record is
    /// logged, never fatal. The operator's one way to write an event.
    pub async fn record(
        &self,
        about: &ObjectReference,
        related: Option<ObjectReference>,
        event: &impl Said,
    ) {
        let recorded = Event {
            type_: if event.is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: event.reason().into(),
            note: Some(event.note()),
            action: event.action().into(),
            secondary: related,
        };
        if let Err(error) = self.take().publish(&recorded, about).await {
            let name = about.name.as_deref().unwrap_or_default();
            tracing::warn!(%error, %name, reason = event.reason(), "could not record an event");
        }
    }

    /// The recorder to publish one event with.
    fn take(&self) -> Recorder {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.published >= RENEW_AFTER_EVENTS || current.since.elapsed() >= RENEW_AFTER {
            current.recorder = Self::fresh(&self.client);
            current.since = Instant::now();
            current.published = 0;
        }
        current.published += 1;
        current.recorder.clone()
    }
}

/// Records `event` on `cluster`, related to the ValkeyNode it concerns.
pub async fn publish(recorder: &EventRecorder, cluster: &ValkeyCluster, event: &ClusterEvent) {
    let node = event.node().map(|name| ObjectReference {
        api_version: Some(ValkeyNode::api_version(&()).into_owned()),
        kind: Some(ValkeyNode::kind(&()).into_owned()),
        name: Some(name.to_string()),
        namespace: cluster.namespace(),
        ..Default::default()
    });
    recorder.record(&cluster.object_ref(&()), node, event).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_events_name_their_node_and_warnings_are_warnings() {
        let joining = ClusterEvent::NodeJoining {
            node: "c-0-abcde".into(),
            what: "join a new replica of c-0-x to shard 0".into(),
        };
        assert_eq!(joining.node(), Some("c-0-abcde"));
        assert_eq!(
            joining.note(),
            "join a new replica of c-0-x to shard 0: created c-0-abcde"
        );
        assert!(!joining.is_warning());
        let stalled = ClusterEvent::RollStalled {
            what: "shard 0, Stalled (NoPrimary): shard 0 has no live primary".into(),
        };
        assert_eq!((stalled.reason(), stalled.node()), ("RollStalled", None));
        assert!(stalled.is_warning());
        let failover = ClusterEvent::Failover {
            to: "c-0-new".into(),
            what: "fail over".into(),
        };
        assert_eq!(failover.node(), Some("c-0-new"));
        assert_eq!(ClusterEvent::Deleted { nodes: 3 }.note(), "retired 3 nodes");
    }
}
