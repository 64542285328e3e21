//! The Kubernetes Nodes that Pods run on, as the planner needs them: each one's zone (its
//! `topology.kubernetes.io/zone` label), so that a cluster's primaries can be kept apart by
//! zone as well as by Node ([`crate::roll::spread`]). Fed by a watch of the Nodes' metadata
//! only: a Node's status (its images, its conditions) is most of its size and none of this.

use std::collections::HashMap;
use std::sync::RwLock;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::Event;

/// The label Kubernetes gives a Node for the zone it stands in.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Each Node's zone, by the Node's name (Nodes without a zone label are absent).
#[derive(Debug, Default)]
pub struct KubeNodes {
    zones: RwLock<HashMap<String, String>>,
    /// The zones of the list being read again (a watch's restart), swapped in at its end.
    relisting: RwLock<HashMap<String, String>>,
}

impl KubeNodes {
    /// The zone of the Node named `node`, if it has one.
    pub fn zone(&self, node: &str) -> Option<String> {
        let zones = self.zones.read().unwrap_or_else(|e| e.into_inner());
        zones.get(node).cloned()
    }

    /// Applies one event of the Nodes' metadata watch.
    pub fn node_event(&self, event: &Event<PartialObjectMeta<Node>>) {
        let zone_of = |node: &PartialObjectMeta<Node>| node.labels().get(ZONE_LABEL).cloned();
        let mut zones = self.zones.write().unwrap_or_else(|e| e.into_inner());
        let mut relisting = self.relisting.write().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Apply(node) => set(&mut zones, node.name_any(), zone_of(node)),
            Event::Delete(node) => {
                zones.remove(&node.name_any());
            }
            Event::Init => relisting.clear(),
            Event::InitApply(node) => set(&mut relisting, node.name_any(), zone_of(node)),
            Event::InitDone => *zones = std::mem::take(&mut *relisting),
        }
    }
}

fn set(zones: &mut HashMap<String, String>, node: String, zone: Option<String>) {
    match zone {
        Some(zone) => zones.insert(node, zone),
        None => zones.remove(&node),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, zone: Option<&str>) -> PartialObjectMeta<Node> {
        let mut node = PartialObjectMeta::<Node>::default();
        node.metadata.name = Some(name.into());
        if let Some(zone) = zone {
            node.metadata.labels = Some([(ZONE_LABEL.to_string(), zone.to_string())].into());
        }
        node
    }

    #[test]
    fn zones_follow_the_watch_and_a_relist_replaces_them_whole() {
        let nodes = KubeNodes::default();
        nodes.node_event(&Event::Apply(node("n1", Some("a"))));
        nodes.node_event(&Event::Apply(node("n2", Some("b"))));
        assert_eq!(nodes.zone("n1").as_deref(), Some("a"));
        // A label taken off, a Node deleted.
        nodes.node_event(&Event::Apply(node("n1", None)));
        nodes.node_event(&Event::Delete(node("n2", Some("b"))));
        assert_eq!((nodes.zone("n1"), nodes.zone("n2")), (None, None));
        // A relist: what it does not list is gone once it is done, not before.
        nodes.node_event(&Event::Apply(node("n3", Some("c"))));
        nodes.node_event(&Event::Init);
        nodes.node_event(&Event::InitApply(node("n4", Some("a"))));
        assert_eq!(nodes.zone("n3").as_deref(), Some("c"));
        nodes.node_event(&Event::InitDone);
        assert_eq!(nodes.zone("n3"), None);
        assert_eq!(nodes.zone("n4").as_deref(), Some("a"));
    }
}
