//! The ValidatingWebhookConfiguration that routes the five kinds and Pod evictions to this server
//! (`valkey-operator webhook-config`), for local runs where the API server reaches the operator
//! by URL. The Helm chart renders the in-cluster equivalent with a Service reference.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::ObjectMeta;

use crate::admission::{eviction, http};
use crate::api::{GROUP, VERSION};

/// The configuration's name.
pub const NAME: &str = "valkey-operator";

/// (resource, path, operations) for each kind.
const WEBHOOKS: &[(&str, &str, &[&str])] = &[
    (
        "valkeyimages",
        http::VALIDATE_IMAGES,
        &["CREATE", "UPDATE", "DELETE"],
    ),
    (
        "valkeyconfigs",
        http::VALIDATE_CONFIGS,
        &["CREATE", "UPDATE", "DELETE"],
    ),
    ("valkeyroles", http::VALIDATE_ROLES, &["CREATE", "UPDATE"]),
    (
        "valkeyclusters",
        http::VALIDATE_CLUSTERS,
        &["CREATE", "UPDATE"],
    ),
    ("valkeynodes", http::VALIDATE_NODES, &["CREATE", "UPDATE"]),
];

/// A configuration pointing at `base_url` (e.g. `https://127.0.0.1:8443`), trusting `ca_pem`.
pub fn for_url(base_url: &str, ca_pem: &[u8]) -> ValidatingWebhookConfiguration {
    let base_url = base_url.trim_end_matches('/');
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            ..Default::default()
        },
        webhooks: Some(
            WEBHOOKS
                .iter()
                .map(|(resource, path, operations)| ValidatingWebhook {
                    name: format!("{resource}.{GROUP}"),
                    admission_review_versions: vec!["v1".into()],
                    client_config: WebhookClientConfig {
                        url: Some(format!("{base_url}{path}")),
                        ca_bundle: Some(ByteString(ca_pem.to_vec())),
                        service: None,
                    },
                    rules: Some(vec![RuleWithOperations {
                        api_groups: Some(vec![GROUP.into()]),
                        api_versions: Some(vec![VERSION.into()]),
                        operations: Some(operations.iter().map(|o| o.to_string()).collect()),
                        resources: Some(vec![resource.to_string()]),
                        scope: Some("*".into()),
                    }]),
                    failure_policy: Some("Fail".into()),
                    side_effects: "None".into(),
                    timeout_seconds: Some(5),
                    match_policy: Some("Equivalent".into()),
                    ..Default::default()
                })
                .chain([eviction_webhook(base_url, ca_pem)])
                .collect(),
        ),
    }
}

/// Evictions of any Pod (only ours are ever deferred; see [`crate::admission::eviction`]). It
/// fails open and marks a node for a handover, a side effect it skips on dry runs.
fn eviction_webhook(base_url: &str, ca_pem: &[u8]) -> ValidatingWebhook {
    ValidatingWebhook {
        name: format!("evictions.{GROUP}"),
        admission_review_versions: vec!["v1".into()],
        client_config: WebhookClientConfig {
            url: Some(format!("{base_url}{}", eviction::VALIDATE_EVICTIONS)),
            ca_bundle: Some(ByteString(ca_pem.to_vec())),
            service: None,
        },
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(vec!["CREATE".into()]),
            resources: Some(vec!["pods/eviction".into()]),
            scope: Some("Namespaced".into()),
        }]),
        failure_policy: Some("Ignore".into()),
        side_effects: "NoneOnDryRun".into(),
        timeout_seconds: Some(5),
        match_policy: Some("Equivalent".into()),
        ..Default::default()
    }
}
