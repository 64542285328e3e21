//! Which watch events of a cluster's ValkeyNodes and Pods wake it: only those that change what
//! a pass reads of them, or come from someone other than the operator. A pass writes its nodes'
//! status (lifecycle, id, role) and then requeues by its step anyway; an event for each such
//! write would wake a second pass that reads everything again to learn what the first one
//! wrote, which in a fleet roll is most of the API server's work.
//!
//! A deletion always passes, and so does an object seen for the first time.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::api::ValkeyNode;

/// What of a ValkeyNode a person (or the eviction webhook) may change: its status is the
/// operator's own.
pub fn node_fingerprint(node: &ValkeyNode) -> u64 {
    let mut hasher = DefaultHasher::new();
    node.metadata.generation.hash(&mut hasher);
    node.labels().hash(&mut hasher);
    node.annotations().hash(&mut hasher);
    node.finalizers().hash(&mut hasher);
    deletion(node).hash(&mut hasher);
    hasher.finish()
}

/// What of a Pod a pass reads: where it answers, whether it runs, serves and stays, and the
/// labels and annotations the operator keeps in step. Not its binding to a node, nor the
/// kubelet's other status fields.
pub fn pod_fingerprint(pod: &Pod) -> u64 {
    let mut hasher = DefaultHasher::new();
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()).hash(&mut hasher);
    status.and_then(|s| s.pod_ip.as_deref()).hash(&mut hasher);
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|ready| ready.status.as_str());
    ready.hash(&mut hasher);
    pod.labels().hash(&mut hasher);
    pod.annotations().hash(&mut hasher);
    deletion(pod).hash(&mut hasher);
    hasher.finish()
}

fn deletion<K: Resource>(object: &K) -> Option<String> {
    let at = object.meta().deletion_timestamp.as_ref()?;
    Some(at.0.to_string())
}

/// An object's identity in the map of fingerprints: a digest of its namespace and name
/// (two strings per object would cost more than the fingerprint they key).
fn identity<K: Resource>(object: &K) -> u64 {
    let mut hasher = DefaultHasher::new();
    object.meta().namespace.hash(&mut hasher);
    object.meta().name.hash(&mut hasher);
    hasher.finish()
}

/// The last fingerprint of every object a watch has shown, and those a re-list in progress
/// has listed again.
#[derive(Debug, Default)]
struct Seen {
    prints: HashMap<u64, u64>,
    relisted: HashSet<u64>,
}

impl Seen {
    /// Whether the event should wake the object's cluster.
    fn passes<K: Resource>(&mut self, event: &watcher::Event<K>, print: fn(&K) -> u64) -> bool {
        match event {
            watcher::Event::Apply(object) => {
                self.prints.insert(identity(object), print(object)) != Some(print(object))
            }
            watcher::Event::InitApply(object) => {
                self.relisted.insert(identity(object));
                self.prints.insert(identity(object), print(object)) != Some(print(object))
            }
            watcher::Event::Delete(object) => {
                self.prints.remove(&identity(object));
                true
            }
            watcher::Event::Init => {
                self.relisted.clear();
                false
            }
            // What a re-list no longer has went while the watch was down: forgotten.
            watcher::Event::InitDone => {
                let relisted = std::mem::take(&mut self.relisted);
                self.prints.retain(|id, _| relisted.contains(id));
                false
            }
        }
    }
}

/// The objects of `events` whose fingerprint changed (or that were deleted), as the controller's
/// `watches_stream` takes them.
pub fn changed_only<K, S>(
    events: S,
    print: fn(&K) -> u64,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Send + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let mut seen = Seen::default();
    events.filter_map(move |event| {
        let passed = match event {
            Ok(event) if seen.passes(&event, print) => match event {
                watcher::Event::Apply(object)
                | watcher::Event::InitApply(object)
                | watcher::Event::Delete(object) => Some(Ok(object)),
                watcher::Event::Init | watcher::Event::InitDone => None,
            },
            Ok(_) => None,
            Err(error) => Some(Err(error)),
        };
        futures::future::ready(passed)
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::api::{NodeLifecycle, ValkeyNodeStatus};

    fn pod(name: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("shop".into());
        pod
    }

    fn running(mut pod: Pod, ip: &str, ready: &str) -> Pod {
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some(ip.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn a_pod_wakes_its_cluster_for_what_a_pass_reads() {
        let mut seen = Seen::default();
        let mut passes =
            |pod: &Pod| seen.passes(&watcher::Event::Apply(pod.clone()), pod_fingerprint);
        let created = pod("orders-0-a1b2c");
        assert!(passes(&created), "first seen");
        let mut bound = created.clone();
        bound.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("node-1".into()),
            ..Default::default()
        });
        assert!(!passes(&bound), "bound to a node: nothing a pass reads");
        let started = running(bound, "127.0.0.5", "False");
        assert!(passes(&started), "an address");
        assert!(
            passes(&running(pod("orders-0-a1b2c"), "127.0.0.5", "True")),
            "ready"
        );
        assert!(
            !passes(&running(pod("orders-0-a1b2c"), "127.0.0.5", "True")),
            "the same again"
        );
        let mut leaving = running(pod("orders-0-a1b2c"), "127.0.0.5", "True");
        leaving.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(passes(&leaving), "terminating");
        assert!(
            seen.passes(&watcher::Event::Delete(leaving.clone()), pod_fingerprint),
            "a deletion always wakes, though it says nothing new"
        );
    }

    #[test]
    fn the_operators_own_node_status_writes_wake_nobody() {
        let mut seen = Seen::default();
        let spec = crate::api::ValkeyNodeSpec {
            cluster: "orders".into(),
            shard: 0,
            image: "valkey/valkey:9.0.0".into(),
            version: "9.0.0".into(),
            revision: "r1".into(),
        };
        let mut node = ValkeyNode::new("orders-0-a1b2c", spec);
        node.metadata.namespace = Some("shop".into());
        let mut passes =
            |node: &ValkeyNode| seen.passes(&watcher::Event::Apply(node.clone()), node_fingerprint);
        assert!(passes(&node));
        node.status = Some(ValkeyNodeStatus {
            lifecycle: Some(NodeLifecycle::Active),
            ..Default::default()
        });
        assert!(!passes(&node), "the operator wrote its status");
        node.annotations_mut().insert(
            crate::api::annotations::HANDOVER_REQUESTED.into(),
            "now".into(),
        );
        assert!(passes(&node), "the eviction webhook asked for a handover");
        node.finalizers_mut().clear();
        node.finalizers_mut().push("someone/else".into());
        assert!(passes(&node), "finalizers");
    }

    #[test]
    fn a_relist_wakes_only_what_changed_and_forgets_what_went() {
        let mut seen = Seen::default();
        let a = running(pod("a"), "127.0.0.2", "True");
        let b = running(pod("b"), "127.0.0.3", "True");
        for p in [&a, &b] {
            assert!(seen.passes(&watcher::Event::Apply(p.clone()), pod_fingerprint));
        }
        assert!(!seen.passes(&watcher::Event::<Pod>::Init, pod_fingerprint));
        let a_unchanged = seen.passes(&watcher::Event::InitApply(a.clone()), pod_fingerprint);
        assert!(!a_unchanged, "unchanged across the re-list");
        assert!(!seen.passes(&watcher::Event::<Pod>::InitDone, pod_fingerprint));
        assert_eq!(seen.prints.len(), 1, "b went while the watch was down");
        assert!(
            seen.passes(&watcher::Event::Apply(b), pod_fingerprint),
            "b again is new"
        );
    }
}
