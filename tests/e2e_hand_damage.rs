//! Hand-made damage heals, end to end: a ValkeyNode deleted by hand is held by the operator's
//! finalizer until it has been replaced like an outdated node. In a shard without replicas, a
//! replica joins first, the shard is handed over to it, and only then does the deleted node go
//! (its Pod with it, forgotten by every peer): every slot stays served and no acknowledged
//! write is lost. (Before, the node's Pod went at once with its data, its slots stayed assigned
//! to the gone node, and the slot assignment failed in a loop.) And the objects the cluster
//! owns (its Service, PodDisruptionBudget and NetworkPolicy), which a settled cluster no longer
//! applies on every pass, are put back within seconds when deleted by hand.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use harness::eventually;
use harness::k8s::manifest::Manifest;
use harness::k8s::{ClusterWatch, IMAGES, Product};
use harness::valkey::{logins, wait_for_layout};

static CLUSTER: LazyLock<String> = LazyLock::new(|| {
    Manifest::new()
        .namespace("repair")
        .config("plain", "{imageRef: valkey-9-0-0}")
        .cluster(("repair", "ledger"), "plain", 2, 0)
        .yaml()
});

/// Every node the cluster's Pods answer with lists exactly the live nodes, none of them
/// `gone`, and sees every slot served.
async fn healed(addresses: &[String], gone: &str) -> Result<(), String> {
    for address in addresses {
        let client = logins::admin(address, Duration::from_secs(2))
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
async fn a_valkeynode_deleted_by_hand_is_replaced_before_it_goes_and_loses_nothing() {
    let product = Product::start(None, &[]).await;
    product.apply(IMAGES);
    product.apply(&CLUSTER);
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

    let watch = ClusterWatch::start(&product, "repair", "ledger").await;
    let deleted = Instant::now();
    // `--wait=false`: the finalizer holds it until it has been replaced.
    product.kubectl(&[
        "delete",
        "valkeynode",
        &victim,
        "-n",
        "repair",
        "--wait=false",
    ]);
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
    let whole_after = deleted.elapsed();
    let report = watch.finish(&product).await;
    println!(
        "hand-deleted ValkeyNode of a shard without replicas: whole again after {:.1} s, \
         {} acknowledged writes, none lost, longest write gap {:.3} s",
        whole_after.as_secs_f64(),
        report.log.acked,
        report.longest_write_gap().as_secs_f64()
    );
    product
        .wait_converged(&[("repair", "ledger")], "9.0.0", Duration::from_secs(60))
        .await;
    let addresses: Vec<String> = product
        .addresses("repair", "ledger")
        .into_values()
        .collect();
    wait_for_layout(&addresses, &[(0, 8192), (0, 8192)]).await;

    for kind in ["service", "poddisruptionbudget", "networkpolicy"] {
        let uid = |product: &Product| {
            product
                .try_kubectl(
                    &[
                        "get",
                        kind,
                        "ledger",
                        "-n",
                        "repair",
                        "-o",
                        "jsonpath={.metadata.uid}",
                    ],
                    None,
                )
                .1
        };
        let before = uid(&product);
        assert!(!before.trim().is_empty(), "the cluster's {kind} exists");
        let deleted = Instant::now();
        product.kubectl(&["delete", kind, "ledger", "-n", "repair"]);
        // Well under the 60 s requeue of a settled cluster: the deletion itself wakes it.
        eventually(
            &format!("the {kind} deleted by hand put back"),
            Duration::from_secs(20),
            async || {
                let now = uid(&product);
                if now.trim().is_empty() || now == before {
                    return Err(format!("uid {now:?}"));
                }
                Ok(())
            },
        )
        .await;
        println!(
            "{kind} deleted by hand: back after {:.1} s",
            deleted.elapsed().as_secs_f64()
        );
    }
}
