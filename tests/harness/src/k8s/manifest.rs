//! The objects most end-to-end tests start from, as the YAML a user applies: namespaces, a
//! ValkeyConfig, and clusters on it. One place writes their `apiVersion`, `kind` and
//! `metadata`, so a test says only what is its own (names, image, settings, shape).

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

    /// The documents, `---` between them.
    pub fn yaml(&self) -> String {
        self.documents.join("---\n")
    }
}

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
}
