//! The operator's API: the six custom resource kinds of `valkey.gomomento.com/v1alpha1`, the
//! labels and annotations the operator owns, and the CRD YAML printed by `valkey-operator crd`.

// kube's repeated `printcolumn(type_ = ...)` arguments read as duplicates to clippy.
#![allow(clippy::duplicated_attributes)]

pub mod bounds;
mod cluster;
mod config;
mod image;
pub mod names;
mod node;
mod policy;
mod role;
pub mod setting_impact;
pub mod write_bound;

pub use cluster::*;
pub use config::*;
pub use image::*;
pub use node::*;
pub use policy::*;
pub use role::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSON,
};
use kube::CustomResourceExt;

/// The API group of every kind.
pub const GROUP: &str = "valkey.gomomento.com";
/// The API version of every kind.
pub const VERSION: &str = "v1alpha1";
/// The prefix reserved for the operator's own labels and annotations.
pub const RESERVED_PREFIX: &str = "valkey.gomomento.com/";

/// Labels the operator puts on every object it creates, so a fleet dashboard can select by them.
/// `NAME`, `INSTANCE`, `SHARD_INDEX` and `JOIN_TYPE` are the Momento operator's documented
/// labels, kept so that its users' NetworkPolicies and selectors work here unchanged.
pub mod labels {
    /// On every object of a cluster: the ValkeyCluster's name. The operator's own selector (on
    /// objects of every version of this operator, so an upgrade finds what it made before).
    pub const CLUSTER: &str = "valkey.gomomento.com/cluster";
    /// On every object of a cluster: [`NAME_VALUE`], the same for all clusters.
    pub const NAME: &str = "app.kubernetes.io/name";
    pub const NAME_VALUE: &str = "valkey";
    /// On every object of a cluster: the ValkeyCluster's name; with [`NAME`], the selector of the
    /// cluster's Service, as Momento documents it.
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    /// On a node's ValkeyNode and Pod: its shard (the operator's index, not Valkey's shard id).
    pub const SHARD_INDEX: &str = "valkey.gomomento.com/shard-index";
    /// On a ValkeyNode: how it joined, a [`JoinType`](crate::api::JoinType); `shard` is taken
    /// off when the node is `Active`, the other two stay.
    pub const JOIN_TYPE: &str = "valkey.gomomento.com/join-type";
    /// On a node's Pod: `primary` or `replica`, kept in step with what the node says.
    pub const ROLE: &str = "valkey.gomomento.com/role";
    /// On a node's Pod: its ValkeyNode's name.
    pub const NODE: &str = "valkey.gomomento.com/node";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const MANAGED_BY_VALUE: &str = "valkey-operator";
}

/// Annotations: those users set to talk to the operator, and those it writes for itself.
pub mod annotations {
    /// On a ValkeyConfig, `"true"` pauses every rollout through it: no cluster resolving
    /// through it starts rolling, and clusters rolling finish the shard they are on and wait.
    pub const ROLLOUT_PAUSED: &str = "valkey.gomomento.com/rollout-paused";

    /// On a ValkeyCluster, `"true"` or an RFC 3339 time: hold it on its revision (until that
    /// time): it advances no roll from the next step on, even mid-shard (such a shard keeps its
    /// replacement beside the nodes it replaces), healing goes on, and the rest of its rollout
    /// goes on without it. `kubectl valkey hold` and `release` set and remove it.
    pub const ROLLOUT_HOLD: &str = "valkey.gomomento.com/rollout-hold";

    /// On a ValkeyCluster, its wave in its group's rollout (`"0"` for canaries).
    pub const ROLLOUT_WAVE: &str = "valkey.gomomento.com/rollout-wave";

    /// On a cluster's credentials Secret (any value): rotate both passwords; removed when the
    /// rotation starts.
    pub const ROTATE_CREDENTIALS: &str = "valkey.gomomento.com/rotate-credentials";

    /// The operator's own, on a ValkeyNode created as a replica: the ValkeyNode it replicates.
    pub const REPLICA_OF: &str = "valkey.gomomento.com/replica-of";

    /// The operator's own, on Pods and ValkeyNodes: the revision they were created from.
    pub const REVISION: &str = "valkey.gomomento.com/revision";

    /// Set on a ValkeyConfig to acknowledge a fleet-wide roll when the operator's
    /// `fleetRollAckThreshold` is exceeded. Its value must name the new image (the ValkeyImage
    /// name the config will resolve to), so an acknowledgement never carries over to a later change.
    pub const ACKNOWLEDGE_FLEET_ROLL: &str = "valkey.gomomento.com/acknowledge-fleet-roll";

    /// Set on a ValkeyNode by the eviction webhook (its value the RFC 3339 time of the deferred
    /// Eviction) when its Pod is a primary: the controller hands the shard to a replica, and
    /// the retried Eviction then goes through. A person may set it too, to move a primary off
    /// a node by hand. It counts for [`HANDOVER_WINDOW`] after that time.
    pub const HANDOVER_REQUESTED: &str = "valkey.gomomento.com/handover-requested";

    /// On a ValkeyCluster, a switchover asked for, as JSON: `{"shard": 1}` hands shard 1's
    /// primary role to its most caught-up synced replica (up-to-date ones first),
    /// `{"shard": 1, "to": "<ValkeyNode>"}` to that replica. Carried out once (the roll's memory,
    /// `status.roll.switchover`, records it); to ask again, write a new request (the plugin's
    /// `kubectl valkey switchover` adds `"requestedAt"`). With `rollout.primaryUpdate:
    /// Supervised` on its config, it is also how a roll's primary is failed over.
    pub const SWITCHOVER: &str = "valkey.gomomento.com/switchover";

    /// Set on a ValkeyCluster whose roll stalled because a shard's failover never took effect
    /// (`FailoverIncomplete`), once a person has looked: its value must be the roll's revision
    /// (`status.roll.revision`), so it never carries over to a later roll. The controller gives
    /// each such shard its attempts again and removes the annotation.
    pub const RETRY_FAILOVERS: &str = "valkey.gomomento.com/retry-failovers";

    /// How long a handover request counts: long enough for a drain's retries, short enough
    /// that a drain given up long ago never moves a primary again.
    pub const HANDOVER_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);
}

/// The finalizers the operator puts on its objects.
pub mod finalizers {
    /// On every ValkeyCluster: its nodes are retired before it goes.
    pub const RETIRE_NODES: &str = "valkey.gomomento.com/retire-nodes";

    /// On every ValkeyNode the operator runs: a ValkeyNode deleted by hand stays until the
    /// operator has replaced it like an outdated node (a primary hands its shard over first; a
    /// shard without replicas gets one first), so a `kubectl delete` loses no data and leaves
    /// no slot unserved. The operator's own retirement releases it.
    pub const RETIRE_NODE: &str = "valkey.gomomento.com/retire";
}

/// The field managers the operator writes under (server-side apply and merge patches).
pub mod field_managers {
    /// Everything the controller writes but the roll memory.
    pub const CONTROLLER: &str = "valkey-operator";
    /// `status.roll`, apart so the status apply never removes it.
    pub const ROLL: &str = "valkey-operator-roll";
    /// The eviction webhook's handover annotation.
    pub const EVICTION: &str = "valkey-operator-eviction";
}

/// The keys of the Secrets the operator writes (a cluster's credentials) and reads (a TLS
/// cluster's, by cert-manager's names).
pub mod secret_keys {
    /// The password of the user the operator connects as (`valkey-operator`).
    pub const OPERATOR_PASSWORD: &str = "operator-password";
    /// The password replicas authenticate to their primary with (`valkey-replication`).
    pub const REPLICATION_PASSWORD: &str = "replication-password";
    /// The users file every node includes: the two users by hash, `default` closed.
    pub const AUTH_CONF: &str = "auth.conf";
    /// During a rotation, the new password beside each current one (`next-operator-password`).
    pub const NEXT: &str = "next-";
    /// After a rotation, the old password kept until every node has the new one.
    pub const PREVIOUS: &str = "previous-";
    /// A TLS cluster's CA certificate, the only root its nodes are trusted by.
    pub const TLS_CA: &str = "ca.crt";
    /// A TLS cluster's node certificate and its key.
    pub const TLS_CERT: &str = "tls.crt";
    pub const TLS_KEY: &str = "tls.key";
}

/// The CustomResourceDefinitions of all six kinds, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        ValkeyImage::crd(),
        ValkeyConfig::crd(),
        ValkeyRole::crd(),
        with_state_creating(ValkeyCluster::crd()),
        ValkeyNode::crd(),
        ValkeyNamespacePolicy::crd(),
    ]
}

/// A ValkeyCluster whose status no pass has written yet reads `state: Creating` (Momento's
/// schema default): the API server fills it in whenever it reads such an object, so
/// `kubectl get` and tools never see a cluster without a state.
fn with_state_creating(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let status = version
            .schema
            .as_mut()
            .and_then(|schema| schema.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut())
            .and_then(|properties| properties.get_mut("status"));
        let Some(status) = status else { continue };
        status.default = Some(JSON(serde_json::json!({})));
        if let Some(state) = status.properties.as_mut().and_then(|p| p.get_mut("state")) {
            state.default = Some(JSON(serde_json::json!("Creating")));
        }
    }
    crd
}

/// The CRDs as one multi-document YAML stream, as committed under `charts/valkey-operator/crds/`.
pub fn crds_yaml() -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::from(
        "# Generated by `valkey-operator crd`; do not edit. Regenerate with `make crds`.\n",
    );
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd)?);
    }
    Ok(out)
}
