//! Every reply the operator reads from a node is bounded (`valkey::REPLY_LIMIT`): a real
//! valkey-server given a username of tens of megabytes (what a tenant who is admin on its node
//! can do) answers `ACL USERS` with all of it; the operator's call fails with `TooLarge`, naming
//! the limit, while this process's peak memory grows by far less than the reply.

use std::time::Duration;

use harness::eventually;
use harness::valkey::OLD;
use harness::valkey::roller::LocalRuntime;
use harness::valkey::runtime::{NodeRuntime, NodeSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use valkey_operator::valkey::{EngineError, NodeClient, REPLY_LIMIT};

const CALL: Duration = Duration::from_secs(10);

/// Sends `ACL SETUSER <name of `len` bytes>` from a small buffer, so this process never holds the
/// name: what it sees of the reply is then the operator client's doing alone.
async fn make_user_with_a_name_of(addr: &str, len: usize) {
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("*3\r\n$3\r\nACL\r\n$7\r\nSETUSER\r\n${len}\r\n");
    socket.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'u'; 64 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        socket.write_all(&chunk[..n]).await.unwrap();
        left -= n;
    }
    socket.write_all(b"\r\n").await.unwrap();
    let mut reply = [0; 5];
    socket.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply, b"+OK\r\n", "ACL SETUSER of a {len}-byte name");
}

/// This process's peak resident memory in KiB since the last [`reset_peak`].
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_past_the_limit_fails_the_call_and_costs_little_memory() {
    let runtime = LocalRuntime::new(52).unwrap();
    let spec = NodeSpec {
        name: "tenant".into(),
        shard: 0,
        revision: OLD.into(),
    };
    let addr = runtime.start_node(&spec).await.unwrap().to_string();
    let client = eventually("the node to answer", Duration::from_secs(10), async || {
        let client = NodeClient::connect(&addr, CALL).await.ok()?;
        client.ping().await.ok()?;
        Some(client)
    })
    .await;
    let users = client.acl_users().await.unwrap();
    assert_eq!(users, vec!["default".to_owned()]);

    // Within the limit: a long name is read like any other.
    let within = REPLY_LIMIT / 2;
    make_user_with_a_name_of(&addr, within).await;
    let users = client.acl_users().await.unwrap();
    assert!(
        users.iter().any(|u| u.len() == within),
        "{} users",
        users.len()
    );

    let huge = 64 * 1024 * 1024;
    make_user_with_a_name_of(&addr, huge).await;
    let client = NodeClient::connect(&addr, CALL).await.unwrap();
    reset_peak();
    let before = resident_kib();
    let error = client.acl_users().await.unwrap_err();
    let peak = peak_kib();
    println!(
        "ACL USERS answering {} MiB: resident {before} KiB before, peak {peak} KiB during \
         (+{} KiB); limit {REPLY_LIMIT} bytes",
        huge >> 20,
        peak.saturating_sub(before)
    );
    match &error {
        EngineError::TooLarge { command, limit, .. } => {
            assert_eq!(command, "ACL USERS");
            assert_eq!(*limit, REPLY_LIMIT);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(
        error
            .to_string()
            .contains(&format!("a reply over its {REPLY_LIMIT}-byte limit")),
        "{error}"
    );
    assert!(
        !error.is_silence(),
        "a node that answered too much is not silent"
    );
    // The reply was 64 MiB; reading it cost at most a few limits.
    assert!(
        peak.saturating_sub(before) < 4 * (REPLY_LIMIT as u64 >> 10),
        "peak grew by {} KiB",
        peak - before
    );
    // The node itself is fine: a new connection reads what is small.
    let again = NodeClient::connect(&addr, CALL).await.unwrap();
    again.ping().await.unwrap();
}
