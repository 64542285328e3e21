//! One team reaches nothing beyond its own cluster, on a real API server with RBAC and real
//! valkey-server Pods. A team's person, impersonated with the usual RBAC of its namespace
//! (Secrets, Pods, `pods/exec`, ConfigMaps, ValkeyClusters), reads every Secret it may: none
//! holds a password that opens an administrative command on its own nodes (so it cannot
//! `CONFIG SET cluster-announce-ip` a listener of its own, the first step of capturing a
//! platform password), it cannot read the operator's Secrets, and the password the operator
//! issued to the platform's config user for its cluster opens no other team's cluster.

use std::time::Duration;

use harness::k8s::chart::NAMESPACE as OPERATOR_NAMESPACE;
use harness::k8s::manifest::Manifest;
use harness::k8s::{IMAGES, Product};
use k8s_openapi::ByteString;
use serde_json::Value;
use valkey_operator::acl::{OPERATOR_USER, REPLICATION_USER};
use valkey_operator::credentials::{Credentials, issued_secret_name, private_secret_name};
use valkey_operator::valkey::NodeClient;

const PLATFORM_USER: &str = "platform-mon";

const FLEET: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyRole
metadata: {name: monitor}
spec: {categories: [{name: read, access: allow}, {name: connection, access: allow}]}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: shared}
spec:
  imageRef: valkey-9-0-0
  valkey: {save: ""}
  acl:
  - username: platform-mon
    permissions:
    - roleRef: monitor
      keys: [{pattern: "*", access: read}]
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: a, namespace: team-a}
spec: {configRef: shared, shards: 1, replicasPerShard: 1}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: b, namespace: team-b}
spec: {configRef: shared, shards: 1, replicasPerShard: 0}
"#;

/// `kubectl` as alice, of team-a.
fn as_alice(product: &Product, args: &[&str]) -> (bool, String) {
    let mut all = vec!["--as", "alice"];
    all.extend_from_slice(args);
    product.try_kubectl(&all, None)
}

fn decode(value: &Value) -> String {
    let bytes: ByteString = serde_json::from_value(value.clone()).unwrap();
    String::from_utf8(bytes.0).unwrap()
}

/// Every value of every Secret alice can read in her namespace, and every line of each.
fn what_alice_reads(product: &Product) -> Vec<String> {
    let (read, secrets) = as_alice(product, &["get", "secrets", "-n", "team-a", "-o", "json"]);
    assert!(read, "alice reads her namespace's Secrets: {secrets}");
    let secrets: Value = serde_json::from_str(&secrets).unwrap();
    let mut values = Vec::new();
    for secret in secrets["items"].as_array().unwrap() {
        for value in secret["data"].as_object().into_iter().flatten() {
            let text = decode(value.1);
            values.extend(text.lines().map(str::to_owned));
            values.extend(text.split_whitespace().map(str::to_owned));
            values.push(text);
        }
    }
    values
}

async fn login(address: &str, username: &str, password: &str) -> Option<NodeClient> {
    let credentials = Credentials {
        username: username.into(),
        password: password.into(),
    };
    NodeClient::connect_as(address, Duration::from_secs(2), Some(&credentials))
        .await
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_reads_no_credential_that_changes_its_nodes_or_opens_another_teams() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(FLEET);
    product.apply(&Manifest::new().team_access("team-a", "alice").yaml());
    let clusters = [("team-a", "a"), ("team-b", "b")];
    product
        .wait_converged(&clusters, "9.0.0", Duration::from_secs(240))
        .await;

    // The operator's Secrets are out of alice's reach.
    for name in [
        private_secret_name("team-a", "a"),
        issued_secret_name("team-a", "a"),
    ] {
        let (read, said) = as_alice(
            &product,
            &["get", "secret", &name, "-n", OPERATOR_NAMESPACE],
        );
        assert!(!read && said.contains("Forbidden"), "{name}: {said}");
    }

    // Every word of every Secret she can read, tried as the operator's user and as the
    // replication user on every node of her cluster: no administrative command answers OK.
    let values = what_alice_reads(&product);
    let masterauth = values
        .iter()
        .find_map(|v| v.strip_prefix("masterauth "))
        .map(|p| p.trim().to_owned());
    let replication = masterauth.expect("auth.conf's replication login, which her Pods mount");
    let a = product.addresses("team-a", "a");
    let mut refused = 0;
    for address in a.values() {
        for value in &values {
            assert!(
                login(address, OPERATOR_USER, value).await.is_none(),
                "{address}: a value of team-a's Secrets logs in as the operator"
            );
        }
        let node = login(address, REPLICATION_USER, &replication)
            .await
            .expect("the replication user logs in with masterauth");
        let announce = node.config_set("cluster-announce-ip", "198.18.250.1").await;
        let error = announce.expect_err("CONFIG SET cluster-announce-ip as replication");
        assert!(
            error
                .to_string()
                .contains("no permissions to run the 'config|set' command"),
            "{error}"
        );
        let grant = node
            .acl_set_user("intruder", &["on".into(), "nopass".into(), "+@all".into()])
            .await;
        assert!(grant.is_err(), "ACL SETUSER as replication");
        refused += 1;
    }
    println!(
        "team-a's {} Secret values: none logs in as {OPERATOR_USER}; {REPLICATION_USER} refused \
         CONFIG SET and ACL SETUSER on {refused} nodes",
        values.len()
    );

    // The platform's config user: one password per cluster, each opening only its own.
    let issued = |namespace: &str, cluster: &str| {
        let name = issued_secret_name(namespace, cluster);
        let secret = product.kubectl(&[
            "get",
            "secret",
            &name,
            "-n",
            OPERATOR_NAMESPACE,
            "-o",
            "json",
        ]);
        let secret: Value = serde_json::from_str(&secret).unwrap();
        decode(&secret["data"][PLATFORM_USER])
    };
    let (for_a, for_b) = (issued("team-a", "a"), issued("team-b", "b"));
    assert_ne!(for_a, for_b);
    let b = product.addresses("team-b", "b");
    for (own, other, password) in [(&a, &b, &for_a), (&b, &a, &for_b)] {
        for address in own.values() {
            harness::eventually(
                format!("{PLATFORM_USER} to log in at {address} with its cluster's password"),
                Duration::from_secs(30),
                async || login(address, PLATFORM_USER, password).await,
            )
            .await;
        }
        for address in other.values() {
            assert!(
                login(address, PLATFORM_USER, password).await.is_none(),
                "{address}: another cluster's issued password logs in"
            );
        }
    }
    println!("{PLATFORM_USER}: each cluster's issued password logs in there only");

    // A deleted cluster's Secrets in the operator's namespace go with it (nothing owns them).
    product.kubectl(&[
        "delete",
        "valkeycluster",
        "b",
        "-n",
        "team-b",
        "--wait=false",
    ]);
    for name in [
        private_secret_name("team-b", "b"),
        issued_secret_name("team-b", "b"),
    ] {
        harness::eventually(
            format!("{name} to be deleted with its cluster"),
            Duration::from_secs(60),
            async || {
                let args = ["get", "secret", &name, "-n", OPERATOR_NAMESPACE];
                let (found, said) = product.try_kubectl(&args, None);
                (!found && said.contains("NotFound")).then_some(())
            },
        )
        .await;
    }
}
