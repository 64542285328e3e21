//! Hand-made damage heals, end to end: a ValkeyNode deleted by hand (its Pod goes with it, by
//! the garbage collector) is forgotten by every peer (`CLUSTER FORGET`) and its shard gets a new
//! node, so every slot is served again. With `replicasPerShard: 0` the deleted node's slots
//! stayed assigned to the gone node before, and the slot assignment failed in a loop.

// Test code reports failures by panicking; the house rules against it are for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::{IMAGES, Product};
use harness::valkey::wait_for_layout;
use valkey_operator::valkey::NodeClient;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: repair}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyConfig
metadata: {name: plain}
spec: {imageRef: valkey-9-0-0}
---
apiVersion: valkey.gomomento.com/v1alpha1
kind: ValkeyCluster
metadata: {name: ledger, namespace: repair}
spec: {configRef: plain, shards: 2, replicasPerShard: 0}
"#;

/// Every node the cluster's Pods answer with lists exactly the live nodes, none of them
/// `gone`, and sees every slot served.
async fn healed(addresses: &[String], gone: &str) -> Result<(), String> {
    for address in addresses {
        let client = NodeClient::connect(address, Duration::from_secs(2))
            .await
            .map_err(|e| e.to_string())?;
        let view = client.cluster_nodes().await.map_err(|e| e.to_string())?;
        if view.iter().any(|n| n.id == gone) || view.len() != addresses.len() {
            let ids: Vec<&str> = view.iter().map(|n| n.id.as_str()).collect();
            return Err(format!("{address} lists {ids:?}"));
        }
        if !client
            .cluster_info()
            .await
            .map_err(|e| e.to_string())?
            .state_ok
        {
            return Err(format!("{address}: cluster_state is not ok"));
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_valkeynode_deleted_by_hand_is_forgotten_by_every_peer_and_replaced() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(CLUSTER);
    product
        .wait_converged(&[("repair", "ledger")], "9.0.0", Duration::from_secs(180))
        .await;
    let before = product.addresses("repair", "ledger");
    assert_eq!(before.len(), 2, "{before:?}");
    let victim = before
        .keys()
        .find(|name| name.starts_with("ledger-1-"))
        .expect("a node of shard 1")
        .clone();
    let victim_id = product.kubectl(&[
        "get",
        "valkeynode",
        &victim,
        "-n",
        "repair",
        "-o",
        "jsonpath={.status.nodeId}",
    ]);
    assert_eq!(victim_id.trim().len(), 40, "node id {victim_id:?}");

    let deleted = Instant::now();
    product.kubectl(&["delete", "valkeynode", &victim, "-n", "repair"]);
    eventually(
        "the deleted node forgotten everywhere and its shard served again",
        Duration::from_secs(120),
        async || {
            let now = product.addresses("repair", "ledger");
            if now.contains_key(&victim) || now.len() != 2 {
                return Err(format!("Pods: {now:?}"));
            }
            let addresses: Vec<String> = now.into_values().collect();
            healed(&addresses, victim_id.trim()).await
        },
    )
    .await;
    println!(
        "hand-deleted ValkeyNode of a shard without replicas: whole again after {:.1} s",
        deleted.elapsed().as_secs_f64()
    );
    product
        .wait_converged(&[("repair", "ledger")], "9.0.0", Duration::from_secs(60))
        .await;
    let addresses: Vec<String> = product
        .addresses("repair", "ledger")
        .into_values()
        .collect();
    wait_for_layout(&addresses, &[(0, 8192), (0, 8192)]).await;
}
