//! The objects most end-to-end tests start from, as the YAML a user applies: namespaces, a
//! ValkeyConfig, clusters on it, and a team's access to its namespace. One place writes their
//! `apiVersion`, `kind` and `metadata`, so a test says only what is its own (names, image,
//! settings, shape).

/// A test's objects, in the order they are applied.
#[derive(Default)]
pub struct Manifest {
    documents: Vec<String>,
}

impl Manifest {
    pub fn new() -> Self {
        Self::default()
    }

    /// A Namespace.
    pub fn namespace(mut self, name: &str) -> Self {
        self.documents.push(format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}}}\n"
        ));
        self
    }

    /// A ValkeyConfig whose spec is `spec`, a YAML mapping (`{imageRef: valkey-9-0-0}`).
    pub fn config(mut self, name: &str, spec: &str) -> Self {
        self.documents.push(format!(
            "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyConfig\nmetadata: {{name: {name}}}\nspec: {spec}\n"
        ));
        self
    }

    /// A ValkeyCluster of `shards` shards with `replicas` replicas each on config `config`.
    pub fn cluster(
        mut self,
        (namespace, name): (&str, &str),
        config: &str,
        shards: u32,
        replicas: u32,
    ) -> Self {
        self.documents.push(format!(
            "apiVersion: valkey.gomomento.com/v1alpha1\nkind: ValkeyCluster\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {{configRef: {config}, shards: {shards}, replicasPerShard: {replicas}}}\n"
        ));
        self
    }

    /// What a product team holds in `namespace` and nothing elsewhere, bound to `user`: every
    /// verb on its Secrets, Pods (`pods/exec` and logs too), ConfigMaps and ValkeyClusters.
    pub fn team_access(mut self, namespace: &str, user: &str) -> Self {
        self.documents.push(format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n\
             metadata: {{name: team, namespace: {namespace}}}\nrules:\n\
             - apiGroups: [\"\"]\n  resources: [secrets, pods, pods/exec, pods/log, configmaps]\n  verbs: [\"*\"]\n\
             - apiGroups: [valkey.gomomento.com]\n  resources: [valkeyclusters]\n  verbs: [\"*\"]\n"
        ));
        self.documents.push(format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
             metadata: {{name: team, namespace: {namespace}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: team}}\n\
             subjects:\n- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}\n"
        ));
        self
    }

    /// The documents, `---` between them.
    pub fn yaml(&self) -> String {
        self.documents.join("---\n")
    }
}

/// Momento's worked NetworkPolicy from `security/networking.md`, as it is printed there (in
/// namespace `my-app`).
pub const MOMENTO_NETWORK_POLICY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: valkey-ingress
  namespace: my-app
spec:
  podSelector:
    matchLabels:
      app.kubernetes.io/name: valkey
  policyTypes: ["Ingress"]
  ingress:
    - from:
        - podSelector:
            matchLabels:
              valkey-client: "true"
      ports:
        - port: 6379
    - from:
        - namespaceSelector:
            matchLabels:
              kubernetes.io/metadata.name: valkey-operator
          podSelector:
            matchLabels:
              app: valkey-operator
      ports:
        - port: 6379
    - from:
        - podSelector:
            matchLabels:
              app.kubernetes.io/name: valkey
      ports:
        - port: 6379
        - port: 16379
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documents_read_as_the_objects_they_name() {
        let yaml = Manifest::new()
            .namespace("heal")
            .config(
                "heal-config",
                r#"{imageRef: valkey-9-1-2, valkey: {save: ""}}"#,
            )
            .cluster(("heal", "cart"), "heal-config", 3, 1)
            .yaml();
        let documents: Vec<serde_json::Value> = yaml
            .split("---\n")
            .map(|document| serde_yaml_ng::from_str(document).unwrap())
            .collect();
        assert_eq!(documents.len(), 3);
        assert_eq!(documents[0]["kind"], "Namespace");
        assert_eq!(documents[1]["spec"]["valkey"]["save"], "");
        assert_eq!(documents[2]["metadata"]["namespace"], "heal");
        assert_eq!(documents[2]["spec"]["replicasPerShard"], 1);
    }

    #[test]
    fn a_teams_access_is_a_role_in_its_namespace_bound_to_its_person() {
        let yaml = Manifest::new().team_access("team-b", "alice").yaml();
        let documents: Vec<serde_json::Value> = yaml
            .split("---\n")
            .map(|document| serde_yaml_ng::from_str(document).unwrap())
            .collect();
        assert_eq!(documents[0]["kind"], "Role");
        assert_eq!(documents[0]["metadata"]["namespace"], "team-b");
        assert_eq!(documents[0]["rules"][0]["resources"][2], "pods/exec");
        assert_eq!(documents[1]["kind"], "RoleBinding");
        assert_eq!(documents[1]["subjects"][0]["name"], "alice");
    }
}
