//! How the operator reaches one cluster's nodes, and `kubectl valkey` the same way: plain, or
//! over TLS trusting only the CA of the cluster's `spec.tls.secretRef` for each node's name
//! under the Kubernetes cluster's DNS domain ([`reach`]), the Secret checked as Momento's
//! operator checks it ([`tls_secret`]). The logins go into the [`Reach`] from the cluster's
//! private credentials Secret (the controller's credentials step, or the plugin's read).

pub mod tls_secret;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};

use crate::access::tls_secret::{TlsSecretProblem, check_continuity, check_secret};
use crate::api::ValkeyCluster;
use crate::credentials::secret_name;
use crate::valkey::Reach;
use crate::valkey::tls::ClusterNames;

/// How to reach the cluster's nodes: over TLS, trusting only the `ca.crt` of its
/// `spec.tls.secretRef` for its nodes' names under the Kubernetes DNS `domain`, when it has one
/// (with the Secret's resourceVersion, which changes when the certificate is renewed); or why it
/// cannot be reached, as `status.message` says it. `mounted` are the Secrets the cluster's
/// Pods mount: a TLS Secret among them other than `spec.tls.secretRef` (the nodes are rolling
/// onto a repointed one) must trust the new one both ways, else the cluster cannot be reached.
pub async fn reach(
    client: &Client,
    namespace: &str,
    cluster: &ValkeyCluster,
    domain: &str,
    call_timeout: std::time::Duration,
    mounted: &BTreeSet<&str>,
) -> Result<(Reach, Option<String>), String> {
    let Some(tls) = &cluster.spec.tls else {
        return Ok((Reach::plain(call_timeout), None));
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = api
        .get_opt(&tls.secret_ref)
        .await
        .map_err(|error| format!("reading the TLS Secret {}: {error}", tls.secret_ref))?
        .ok_or_else(|| {
            TlsSecretProblem::NotFound {
                secret: tls.secret_ref.clone(),
                namespace: namespace.to_owned(),
            }
            .to_string()
        })?;
    let names = ClusterNames::new(&cluster.name_any(), namespace, domain);
    let trust = check_secret(&tls.secret_ref, secret.data.as_ref(), &names)
        .map_err(|problem| problem.to_string())?;
    let credentials = secret_name(&cluster.name_any());
    let earlier = mounted
        .iter()
        .copied()
        .filter(|name| *name != tls.secret_ref && *name != credentials);
    let current = secret.data.clone().unwrap_or_default();
    // The nodes reload their files when any Secret they mount changes: a bundle of both CAs
    // put into the earlier Secret must reach the nodes still on it.
    let mut version = secret.resource_version().unwrap_or_default();
    for earlier in earlier {
        let read = api
            .get_opt(earlier)
            .await
            .map_err(|error| format!("reading the TLS Secret {earlier}: {error}"))?;
        let data = read.as_ref().and_then(|secret| secret.data.as_ref());
        check_continuity((earlier, data), (&tls.secret_ref, &current), &names)
            .map_err(|problem| problem.to_string())?;
        let earlier_version = read.and_then(|secret| secret.resource_version());
        version = format!(
            "{version} {earlier}@{}",
            earlier_version.unwrap_or_default()
        );
    }
    let reach = Reach {
        tls: Some(trust),
        ..Reach::plain(call_timeout)
    };
    Ok((reach, Some(version)))
}
