//! `kubectl valkey report <cluster>`: a support bundle in a folder. The cluster, its
//! ValkeyNodes, Pods, Service, budget and NetworkPolicy as YAML (without managed fields), its
//! events, the status screen, the operator's log lines about it (from the operator's Pods,
//! label `app=valkey-operator`), and each node's `INFO`, `CLUSTER NODES` and `CLUSTER SHARDS`.
//!
//! No Secret's data is written, and before anything is written every value the cluster's
//! Secrets hold (the operator's passwords, its users' passwords, the TLS key) is replaced by
//! `<redacted>` wherever it appears.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use super::nodes::{ClusterObjects, NodeAccess, Operator};
use super::status;
use crate::api::labels;
use crate::credentials::secret_name;

/// How many of the operator's latest log lines are searched, per Pod.
const LOG_LINES: i64 = 20_000;

/// What stands in for a secret value.
pub const REDACTED: &str = "<redacted>";

/// Writes the bundle into `out`; what was written, as a line per file.
pub async fn report(
    client: &Client,
    namespace: &str,
    operator: &Operator,
    name: &str,
    out: &Path,
) -> anyhow::Result<String> {
    let objects = ClusterObjects::read(client, namespace, name).await?;
    let secrets = secret_values(client, namespace, &objects).await?;
    let mut files: Vec<(String, String)> = vec![
        (
            "status.txt".into(),
            status::status(client, namespace, operator, name).await?,
        ),
        (
            "cluster.yaml".into(),
            yaml(std::slice::from_ref(&objects.cluster))?,
        ),
        ("valkeynodes.yaml".into(), yaml(&objects.nodes)?),
        ("pods.yaml".into(), yaml(&objects.pods)?),
        ("events.yaml".into(), yaml(&objects.events)?),
        (
            "owned.yaml".into(),
            owned_objects(client, namespace, name).await?,
        ),
        (
            "operator.log".into(),
            operator_lines(client, namespace, name).await,
        ),
    ];
    files.extend(node_reports(client, operator, &objects).await);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut said = format!(
        "support bundle of {namespace}/{name} in {}:\n",
        out.display()
    );
    for (file, text) in files {
        let path = out.join(&file);
        std::fs::write(&path, redact(&text, &secrets))
            .with_context(|| format!("writing {}", path.display()))?;
        let _ = writeln!(said, "  {file}");
    }
    Ok(said)
}

/// Every value the cluster's Secrets hold: its credentials Secret, its TLS Secret and the
/// Secrets its users' passwords are in.
async fn secret_values(
    client: &Client,
    namespace: &str,
    objects: &ClusterObjects,
) -> anyhow::Result<BTreeSet<String>> {
    let spec = &objects.cluster.spec;
    let mut names: BTreeSet<String> = BTreeSet::from([secret_name(&objects.cluster.name_any())]);
    names.extend(spec.tls.as_ref().map(|tls| tls.secret_ref.clone()));
    names.extend(
        spec.acl
            .iter()
            .filter_map(|user| Some(user.password_secret_ref.as_ref()?.name.clone())),
    );
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut values = BTreeSet::new();
    for name in names {
        let secret = api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading Secret {name}"))?;
        let data = secret.and_then(|s| s.data).unwrap_or_default();
        for value in data.into_values() {
            let text = String::from_utf8_lossy(&value.0).into_owned();
            // Each line too: a PEM block, a file of hashes.
            values.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| l.len() >= 8)
                    .map(String::from),
            );
            values.insert(text);
        }
    }
    values.retain(|value| value.trim().len() >= 8);
    Ok(values)
}

/// `text` with every one of `secrets` replaced, longest first.
pub fn redact(text: &str, secrets: &BTreeSet<String>) -> String {
    let mut ordered: Vec<&String> = secrets.iter().collect();
    ordered.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    let mut text = text.to_owned();
    for secret in ordered {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), REDACTED);
        }
    }
    text
}

/// Objects as a YAML stream, without their managed fields.
fn yaml<T: Serialize + Clone + kube::Resource>(objects: &[T]) -> anyhow::Result<String> {
    let mut out = String::new();
    for object in objects {
        let mut object = object.clone();
        object.meta_mut().managed_fields = None;
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&object).context("writing YAML")?);
    }
    Ok(out)
}

/// The cluster's Service, budget and NetworkPolicy.
async fn owned_objects(client: &Client, namespace: &str, name: &str) -> anyhow::Result<String> {
    let selector = ListParams::default().labels(&format!("{}={name}", labels::CLUSTER));
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), namespace);
    let mut out = yaml(
        &services
            .list(&selector)
            .await
            .context("listing Services")?
            .items,
    )?;
    out += &yaml(
        &budgets
            .list(&selector)
            .await
            .context("listing budgets")?
            .items,
    )?;
    out += &yaml(
        &policies
            .list(&selector)
            .await
            .context("listing NetworkPolicies")?
            .items,
    )?;
    Ok(out)
}

/// The operator's log lines that name the cluster, from every operator Pod; or why none.
async fn operator_lines(client: &Client, namespace: &str, name: &str) -> String {
    let pods: Api<Pod> = Api::all(client.clone());
    let operators = match pods
        .list(&ListParams::default().labels("app=valkey-operator"))
        .await
    {
        Ok(list) => list.items,
        Err(error) => return format!("could not list the operator's Pods: {error}\n"),
    };
    if operators.is_empty() {
        return "no operator Pod found (label app=valkey-operator): the operator may run outside \
                the cluster; its log is wherever it writes\n"
            .into();
    }
    let mut out = String::new();
    for pod in operators {
        let (pod_namespace, pod_name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod_namespace);
        let params = LogParams {
            tail_lines: Some(LOG_LINES),
            ..Default::default()
        };
        let _ = writeln!(out, "=== {pod_namespace}/{pod_name}");
        match api.logs(&pod_name, &params).await {
            Ok(log) => {
                let about = |line: &&str| mentions(line, namespace, name);
                for line in log.lines().filter(about) {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            Err(error) => {
                let _ = writeln!(out, "could not read its log: {error}");
            }
        }
    }
    out
}

/// Whether an operator log line (JSON or text) is about cluster `name` of `namespace`.
pub fn mentions(line: &str, namespace: &str, name: &str) -> bool {
    let json = line.contains(&format!("\"cluster\":\"{name}\""))
        && line.contains(&format!("\"namespace\":\"{namespace}\""));
    let text = has_field(line, "cluster", name) && has_field(line, "namespace", namespace);
    json || text
}

/// Whether `line` holds `key=value` with nothing more to the value (a text log's field).
fn has_field(line: &str, key: &str, value: &str) -> bool {
    let field = format!("{key}={value}");
    line.match_indices(&field).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + field.len()..].chars().next();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_');
        !word(before) && !word(after)
    })
}

/// Each node's own words, a file per node.
async fn node_reports(
    client: &Client,
    operator: &Operator,
    objects: &ClusterObjects,
) -> Vec<(String, String)> {
    let access = match NodeAccess::of(client, operator, objects).await {
        Ok(access) => access,
        Err(error) => {
            return vec![(
                "nodes.txt".into(),
                format!("the nodes were not asked: {error:#}\n"),
            )];
        }
    };
    let mut files = Vec::new();
    for node in &objects.nodes {
        let text = match access.open(node).await {
            Ok(connection) => match connection.diagnostics().await {
                Ok(said) => said,
                Err(error) => format!("asking it failed: {error}\n"),
            },
            Err(error) => format!("could not reach it: {error}\n"),
        };
        files.push((format!("node-{}.txt", node.name_any()), text));
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_secret_value_is_replaced_longest_first() {
        let secrets = BTreeSet::from([
            "s3cret-password".to_string(),
            "s3cret-password-2".to_string(),
        ]);
        assert_eq!(
            redact("a s3cret-password-2 and s3cret-password.", &secrets),
            "a <redacted> and <redacted>."
        );
    }

    #[test]
    fn a_log_line_is_about_a_cluster_when_it_names_both_cluster_and_namespace() {
        let json =
            r#"{"span":{"cluster":"orders","namespace":"team-a"},"fields":{"message":"planned"}}"#;
        assert!(mentions(json, "team-a", "orders"));
        assert!(!mentions(json, "team-b", "orders"));
        assert!(mentions(
            "pass{cluster=orders namespace=team-a}: planned",
            "team-a",
            "orders"
        ));
        assert!(!mentions(
            "pass{cluster=orders2 namespace=team-a}",
            "team-a",
            "orders"
        ));
    }
}
