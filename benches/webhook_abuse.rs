//! The admission server under abuse (a load test that prints figures, not a test): while two
//! well-behaved clients send valid AdmissionReviews back to back over keep-alive HTTPS, for a
//! fixed window the same server, with the product's default `ServerLimits`, is hit by
//!
//! - slow-body clients ("slowloris"): request headers with a 1 MiB Content-Length, then one byte
//!   of body every 500 ms, over raw TLS connections that reconnect after each answer;
//! - slow-header clients: the request headers themselves one byte every 500 ms;
//! - oversized clients: 6 MiB bodies, again and again;
//! - a connection flood: plain TCP connections that never start TLS, held open (and reopened
//!   when the server closes them) up to well past `max_connections`.
//!
//! It prints the well-behaved requests' latency (p50/p99/max, quiet before and under abuse),
//! how many of them got something other than 200, how a valid review on a new connection fares
//! (every 250 ms, as the API server opens connections now and then: the connection cap cannot
//! tell it from the flood), what the abusive clients were answered (408, 413, 429, closed), the
//! server's `valkey_operator_server_refusals_total` counters, and the process's memory before,
//! at peak and after. Targets: well-behaved p99 under 2 ms, and memory within the server's
//! bound of `max_in_flight × max_body_bytes` over the baseline.
//!
//! The well-behaved clients and the new-connection probe connect from 127.0.0.2, as the API
//! server is another host than the abusers (127.0.0.1); the server's per-peer limits rely on
//! that.
//!
//! Reading the memory figures: the clients run in the same process as the server (loopback,
//! one runtime), so RSS includes their buffers too (the shared 6 MiB body, TLS and reqwest
//! buffers of a few hundred connections). What the limits promise is the server's bound; a
//! peak far under it says the gate works, one above it needs a look at whose buffers grew.
//!
//! Timing is printed, not asserted: a noisy 2-core machine must not fail a benchmark. The run
//! exits non-zero only when a well-behaved request fails outright (a transport error or a
//! timeout, not a refusal status) or the server stops answering.
//!
//! Run: `cargo bench --bench webhook_abuse` (about 20 s once built, loopback only).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use harness::https::{
    TestServer, admission_review, client_trusting, client_trusting_from, object,
    rustls_client_config, standard_fleet,
};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Barrier;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use valkey_operator::admission::Policy;
use valkey_operator::admission::http::{VALIDATE_CLUSTERS, VALIDATE_CONFIGS};
use valkey_operator::fleet::Fleet;
use valkey_operator::server::limits::ServerLimits;

/// How long the abuse lasts while the well-behaved clients are measured.
const WINDOW: Duration = Duration::from_secs(15);
/// The well-behaved clients connect from here, the abusers from 127.0.0.1: the API server is
/// another host than an abuser, and the server's per-peer limits tell hosts apart.
const API_SERVER_ADDRESS: std::net::IpAddr =
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
const WELL_BEHAVED_CLIENTS: usize = 2;
/// How often a valid review is sent on a new connection, as the API server does now and then:
/// the connection cap does not tell it from the flood.
const FRESH_CONNECTION_EVERY: Duration = Duration::from_millis(250);
/// Requests each well-behaved client sends before the abuse starts: warm connections, and the
/// quiet latency to compare with.
const QUIET_REQUESTS: usize = 500;
/// With the oversized and well-behaved clients, just under `max_in_flight`: each holds a permit
/// while its body trickles, so from about 32 on they hold them all and valid reviews get 429.
const SLOW_BODY_CLIENTS: usize = 24;
const SLOW_HEADER_CLIENTS: usize = 8;
const OVERSIZED_CLIENTS: usize = 4;
const FLOOD_CONNECTIONS: usize = 400;
/// How often a slow client sends its next byte.
const DRIBBLE_EVERY: Duration = Duration::from_millis(500);
/// Announced by the slow-body clients: under the body limit, so only the body timeout stops them.
const SLOW_BODY_CONTENT_LENGTH: usize = 1024 * 1024;
/// Sent by the oversized clients: over the 4 MiB body limit.
const OVERSIZED_BODY_BYTES: usize = 6 * 1024 * 1024;
/// Pause of a flood connection or a client whose connection was refused before it reconnects,
/// so the refused ones do not spin both cores on connect and close.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// A flood connection closed sooner than this was refused at accept (over the connection cap);
/// later, it was the handshake timeout.
const CLOSED_AT_ONCE: Duration = Duration::from_secs(1);
/// Longest wait for one well-behaved answer before the server counts as not answering.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

const CLUSTERS: usize = 100;

/// `standard` on 9.0.0, inherited by `large`; 100 clusters on the two.
fn build_fleet() -> Fleet {
    let clusters: Vec<(String, String, &str)> = (0..CLUSTERS)
        .map(|cluster| {
            let config = if cluster % 2 == 0 {
                "standard"
            } else {
                "large"
            };
            (
                format!("ns-{}", cluster % 10),
                format!("cluster-{cluster}"),
                config,
            )
        })
        .collect();
    standard_fleet(
        clusters
            .iter()
            .map(|(namespace, name, config)| (namespace.as_str(), name.as_str(), *config)),
    )
}

/// The well-behaved requests, taken in turn: a new cluster on `large` and a change of
/// `standard`'s image (allowed, with warnings about the clusters it rolls).
fn well_behaved_requests() -> Vec<(&'static str, Vec<u8>)> {
    let cluster = object(
        "ValkeyCluster",
        "feed",
        Some("team-c"),
        json!({"configRef": "large", "shards": 3, "replicasPerShard": 1}),
    );
    let create_cluster = admission_review(
        "ValkeyCluster",
        "CREATE",
        "feed",
        Some("team-c"),
        Some(cluster),
        None,
    );
    let old = object(
        "ValkeyConfig",
        "standard",
        None,
        json!({"imageRef": "valkey-9-0-0"}),
    );
    let new = object(
        "ValkeyConfig",
        "standard",
        None,
        json!({"imageRef": "valkey-9-1-2"}),
    );
    let update_config = admission_review(
        "ValkeyConfig",
        "UPDATE",
        "standard",
        None,
        Some(new),
        Some(old),
    );
    vec![
        (
            VALIDATE_CLUSTERS,
            serde_json::to_vec(&create_cluster).unwrap(),
        ),
        (
            VALIDATE_CONFIGS,
            serde_json::to_vec(&update_config).unwrap(),
        ),
    ]
}

/// What one well-behaved client saw.
#[derive(Default)]
struct WellBehavedReport {
    quiet: Vec<Duration>,
    under_abuse: Vec<Duration>,
    /// Answers other than 200 during the window, by status.
    not_ok: BTreeMap<u16, u64>,
    first_not_ok: Option<String>,
    /// Requests that got no answer at all: the run fails.
    failures: Vec<String>,
}

/// One valid request after another on one keep-alive connection: `QUIET_REQUESTS` before the
/// abuse (then it waits at `start`), and for `WINDOW` during it.
async fn well_behaved_client(
    ca: PathBuf,
    base_url: String,
    start: Arc<Barrier>,
) -> WellBehavedReport {
    let client = client_trusting_from(&ca, API_SERVER_ADDRESS);
    let requests = well_behaved_requests();
    let mut report = WellBehavedReport::default();
    let mut sent = 0usize;
    // Sends the next request; its latency, or why it did not count.
    let mut send = async || -> Result<Duration, (Option<u16>, String)> {
        let (path, body) = &requests[sent % requests.len()];
        sent += 1;
        let started = Instant::now();
        let request = client
            .post(format!("{base_url}{path}"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send();
        let answer = timeout(ANSWER_TIMEOUT, async {
            let response = request.await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let body = response.bytes().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((status, body))
        });
        let (status, text) = match answer.await {
            Err(_) => return Err((None, format!("no answer within {ANSWER_TIMEOUT:?}"))),
            Ok(Err(error)) => return Err((None, error.to_string())),
            Ok(Ok(answered)) => answered,
        };
        let elapsed = started.elapsed();
        let text = String::from_utf8_lossy(&text).into_owned();
        if status != 200 {
            return Err((Some(status), text));
        }
        let review: Value =
            serde_json::from_str(&text).map_err(|e| (None, format!("{e}: {text}")))?;
        if review["response"]["allowed"] != true {
            return Err((None, format!("a valid request was denied: {text}")));
        }
        Ok(elapsed)
    };
    for _ in 0..QUIET_REQUESTS {
        match send().await {
            Ok(latency) => report.quiet.push(latency),
            Err((status, text)) => panic!("before any abuse, a request got {status:?}: {text}"),
        }
    }
    start.wait().await;
    let deadline = Instant::now() + WINDOW;
    while Instant::now() < deadline {
        match send().await {
            Ok(latency) => report.under_abuse.push(latency),
            Err((Some(status), text)) => {
                *report.not_ok.entry(status).or_default() += 1;
                report.first_not_ok.get_or_insert(text);
            }
            Err((None, failure)) => report.failures.push(failure),
        }
    }
    report
}

/// Counts of what one kind of abusive client was answered, by outcome.
#[derive(Clone, Default)]
struct Tally(Arc<Mutex<BTreeMap<String, u64>>>);

impl Tally {
    fn count(&self, outcome: impl Into<String>) {
        *self.0.lock().unwrap().entry(outcome.into()).or_default() += 1;
    }

    fn render(&self) -> String {
        let counts = self.0.lock().unwrap();
        if counts.is_empty() {
            return "nothing".into();
        }
        counts
            .iter()
            .map(|(outcome, count)| format!("{outcome}: {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How a raw connection ended.
fn outcome_label(status: Option<u16>) -> String {
    match status {
        Some(status) => status.to_string(),
        None => "closed".into(),
    }
}

/// The status code of an HTTP/1.1 answer once its status line has arrived.
fn status_of(answer: &[u8]) -> Option<u16> {
    let line_end = answer.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&answer[..line_end]).ok()?;
    line.split(' ').nth(1)?.parse().ok()
}

async fn connect_tls(port: u16, connector: &TlsConnector) -> std::io::Result<TlsStream<TcpStream>> {
    let connecting = async {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from("localhost").unwrap();
        connector.connect(name, tcp).await
    };
    timeout(Duration::from_secs(10), connecting)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("TLS connect timed out")))
}

/// Reads until the status line arrives or the connection ends; `None` when it closed first.
async fn read_status(reader: &mut (impl AsyncRead + Unpin), answer: &mut Vec<u8>) -> Option<u16> {
    let mut buffer = [0u8; 1024];
    loop {
        if let Some(status) = status_of(answer) {
            return Some(status);
        }
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => return status_of(answer),
            Ok(read) => answer.extend_from_slice(&buffer[..read]),
        }
    }
}

/// Sends `head` at once, then one byte of `trickle` (over and over) every `DRIBBLE_EVERY`,
/// until the server answers or closes: its status, `None` if it closed without one. Gives up
/// (`Err`) at the deadline.
async fn dribble(
    stream: TlsStream<TcpStream>,
    head: &[u8],
    trickle: &[u8],
    deadline: Instant,
) -> Result<Option<u16>, ()> {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut answer = Vec::new();
    let written = async {
        writer.write_all(head).await?;
        writer.flush().await?;
        for byte in trickle.iter().cycle() {
            writer.write_all(std::slice::from_ref(byte)).await?;
            writer.flush().await?;
            sleep(DRIBBLE_EVERY).await;
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::select! {
        _ = sleep_until(deadline) => Err(()),
        status = read_status(&mut reader, &mut answer) => Ok(status),
        // The server closed the connection under a write: whatever it answered before is
        // still in the read buffer.
        _ = written => match timeout(Duration::from_secs(1), read_status(&mut reader, &mut answer)).await {
            Ok(status) => Ok(status),
            Err(_) => Ok(None),
        },
    }
}

/// A slow client: one connection after another, each dribbling `trickle` after `head`.
async fn slow_client(
    port: u16,
    connector: TlsConnector,
    head: Vec<u8>,
    trickle: Vec<u8>,
    deadline: Instant,
    tally: Tally,
) {
    while Instant::now() < deadline {
        let stream = match connect_tls(port, &connector).await {
            Ok(stream) => stream,
            Err(_) => {
                tally.count("refused before TLS");
                sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        match dribble(stream, &head, &trickle, deadline).await {
            Ok(status) => tally.count(outcome_label(status)),
            Err(()) => return,
        }
    }
}

fn slow_body_head(path: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {SLOW_BODY_CONTENT_LENGTH}\r\n\r\n"
    )
    .into_bytes()
}

/// POSTs an oversized body over and over on one client (a new connection whenever the server
/// closed the last one).
async fn oversized_client(ca: PathBuf, url: String, body: Bytes, deadline: Instant, tally: Tally) {
    let client = client_trusting(&ca);
    while Instant::now() < deadline {
        let request = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send();
        match tokio::time::timeout_at(deadline, request).await {
            Err(_) => return,
            Ok(Ok(response)) => {
                tally.count(outcome_label(Some(response.status().as_u16())));
                let _ = response.bytes().await;
            }
            Ok(Err(error)) => {
                // A connect error is the connection cap (the flood) closing it before TLS;
                // anything else, the server closing it mid-upload after its 413.
                tally.count(if error.is_connect() {
                    "refused before TLS"
                } else {
                    "closed"
                });
                sleep(RECONNECT_PAUSE).await;
            }
        }
    }
}

/// One flood connection, reopened whenever the server closes it: plain TCP that never starts
/// TLS, so the server holds it until its handshake timeout unless it refuses it at accept.
async fn flood_connection(
    port: u16,
    deadline: Instant,
    tally: Tally,
    open: Arc<AtomicUsize>,
    most_open: Arc<AtomicUsize>,
) {
    while Instant::now() < deadline {
        let connected =
            tokio::time::timeout_at(deadline, TcpStream::connect(("127.0.0.1", port))).await;
        let mut tcp = match connected {
            Err(_) => return,
            Ok(Err(_)) => {
                tally.count("connect failed");
                sleep(RECONNECT_PAUSE).await;
                continue;
            }
            Ok(Ok(tcp)) => tcp,
        };
        let opened = Instant::now();
        let now_open = open.fetch_add(1, Ordering::Relaxed) + 1;
        most_open.fetch_max(now_open, Ordering::Relaxed);
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout_at(deadline, tcp.read(&mut byte)).await;
        open.fetch_sub(1, Ordering::Relaxed);
        if closed.is_err() {
            return;
        }
        if opened.elapsed() < CLOSED_AT_ONCE {
            tally.count("closed at once");
        } else {
            tally.count("closed after a while");
        }
        sleep(RECONNECT_PAUSE).await;
    }
}

/// `VmRSS` or `VmHWM` of this process, in MiB.
fn memory_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    kib / 1024.0
}

/// Resets `VmHWM` to the current RSS, so the peak is the abuse window's.
fn reset_peak_memory() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn latency_line(mut latencies: Vec<Duration>) -> String {
    if latencies.is_empty() {
        return "none answered".into();
    }
    latencies.sort();
    format!(
        "n={} p50={:.3} ms p90={:.3} ms p99={:.3} ms p99.9={:.3} ms max={:.3} ms",
        latencies.len(),
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.90)),
        ms(percentile(&latencies, 0.99)),
        ms(percentile(&latencies, 0.999)),
        ms(*latencies.last().unwrap()),
    )
}

/// Sends a valid review on a new connection every `FRESH_CONNECTION_EVERY`; how each went.
async fn fresh_connection_probe(ca: PathBuf, base_url: String, deadline: Instant) -> Tally {
    let tally = Tally::default();
    let (path, body) = well_behaved_requests().swap_remove(0);
    while Instant::now() < deadline {
        // A new client has an empty pool: a new connection and TLS handshake.
        let client = client_trusting_from(&ca, API_SERVER_ADDRESS);
        let request = client
            .post(format!("{base_url}{path}"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send();
        match timeout(ANSWER_TIMEOUT, request).await {
            Err(_) => tally.count("no answer"),
            Ok(Ok(response)) => tally.count(outcome_label(Some(response.status().as_u16()))),
            Ok(Err(error)) if error.is_connect() => tally.count("refused before TLS"),
            Ok(Err(_)) => tally.count("closed"),
        }
        sleep(FRESH_CONNECTION_EVERY).await;
    }
    tally
}

/// Whether the server still answers a new connection: `/healthz` and one valid review.
async fn still_answers(ca: &Path, base_url: &str) -> Result<(), String> {
    let client = client_trusting(ca);
    let health = timeout(
        ANSWER_TIMEOUT,
        client.get(format!("{base_url}/healthz")).send(),
    )
    .await
    .map_err(|_| "/healthz did not answer".to_string())?
    .map_err(|e| format!("/healthz: {e}"))?;
    if health.status() != 200 {
        return Err(format!("/healthz answered {}", health.status()));
    }
    let (path, body) = well_behaved_requests().swap_remove(0);
    let review = timeout(
        ANSWER_TIMEOUT,
        client.post(format!("{base_url}{path}")).body(body).send(),
    )
    .await
    .map_err(|_| "a review did not answer".to_string())?
    .map_err(|e| format!("a review: {e}"))?;
    if review.status() != 200 {
        return Err(format!("a review answered {}", review.status()));
    }
    Ok(())
}

async fn refusal_metrics(ca: &Path, base_url: &str) -> String {
    let text = client_trusting(ca)
        .get(format!("{base_url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("valkey_operator_server_refusals_total"))
        .collect();
    if lines.is_empty() {
        "  (no refusals counted)".into()
    } else {
        lines
            .iter()
            .map(|line| format!("  {line}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[tokio::main]
async fn main() {
    let limits = ServerLimits::default();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    let server =
        TestServer::start_limited(dir.path(), build_fleet(), Policy::default(), limits.clone())
            .await;
    let (port, base_url) = (server.port, server.base_url.clone());
    let worker_threads = tokio::runtime::Handle::current().metrics().num_workers();
    println!(
        "server: 127.0.0.1:{port}, default limits: {} connections, {} in flight, {} MiB bodies, header {:?}, body {:?}, request {:?}; {worker_threads} runtime workers shared with the clients",
        limits.max_connections,
        limits.max_in_flight,
        limits.max_body_bytes / (1024 * 1024),
        limits.header_timeout,
        limits.body_timeout,
        limits.request_timeout,
    );

    let start = Arc::new(Barrier::new(WELL_BEHAVED_CLIENTS + 1));
    let well_behaved: Vec<_> = (0..WELL_BEHAVED_CLIENTS)
        .map(|_| {
            tokio::spawn(well_behaved_client(
                ca.clone(),
                base_url.clone(),
                start.clone(),
            ))
        })
        .collect();
    // A client that failed its quiet requests panicked and never arrives.
    timeout(Duration::from_secs(120), start.wait())
        .await
        .expect("the well-behaved clients finish their quiet requests");

    let rss_before = memory_mib("VmRSS");
    let peak_reset = reset_peak_memory();
    let deadline = Instant::now() + WINDOW;
    let connector = TlsConnector::from(Arc::new(rustls_client_config(&ca)));
    let (slow_body, slow_header, oversized, flood) = (
        Tally::default(),
        Tally::default(),
        Tally::default(),
        Tally::default(),
    );
    let mut abusers = Vec::new();
    for client in 0..SLOW_BODY_CLIENTS {
        let path = if client % 2 == 0 {
            VALIDATE_CLUSTERS
        } else {
            VALIDATE_CONFIGS
        };
        abusers.push(tokio::spawn(slow_client(
            port,
            connector.clone(),
            slow_body_head(path),
            b" ".to_vec(),
            deadline,
            slow_body.clone(),
        )));
    }
    for _ in 0..SLOW_HEADER_CLIENTS {
        abusers.push(tokio::spawn(slow_client(
            port,
            connector.clone(),
            Vec::new(),
            slow_body_head(VALIDATE_CLUSTERS),
            deadline,
            slow_header.clone(),
        )));
    }
    // One allocation shared by every oversized request.
    let huge = Bytes::from(vec![b' '; OVERSIZED_BODY_BYTES]);
    for _ in 0..OVERSIZED_CLIENTS {
        abusers.push(tokio::spawn(oversized_client(
            ca.clone(),
            format!("{base_url}{VALIDATE_CLUSTERS}"),
            huge.clone(),
            deadline,
            oversized.clone(),
        )));
    }
    let (open, most_open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    for _ in 0..FLOOD_CONNECTIONS {
        abusers.push(tokio::spawn(flood_connection(
            port,
            deadline,
            flood.clone(),
            open.clone(),
            most_open.clone(),
        )));
    }

    let probe = tokio::spawn(fresh_connection_probe(
        ca.clone(),
        base_url.clone(),
        deadline,
    ));

    let mut reports = Vec::new();
    for client in well_behaved {
        reports.push(client.await.unwrap());
    }
    let rss_peak = memory_mib("VmHWM");
    // Every abuser stops at the deadline; one stuck past it would be a bug of this benchmark.
    for abuser in abusers {
        if timeout(Duration::from_secs(5), abuser).await.is_err() {
            println!("warning: an abusive client did not stop at the deadline");
        }
    }
    let fresh_connections = probe.await.unwrap();
    drop(huge);
    sleep(Duration::from_millis(500)).await;
    let rss_after = memory_mib("VmRSS");
    let answers = still_answers(&ca, &base_url).await;
    let refusals = refusal_metrics(&ca, &base_url).await;

    let quiet: Vec<Duration> = reports
        .iter()
        .flat_map(|r| r.quiet.iter().copied())
        .collect();
    let under_abuse: Vec<Duration> = reports
        .iter()
        .flat_map(|r| r.under_abuse.iter().copied())
        .collect();
    let mut not_ok: BTreeMap<u16, u64> = BTreeMap::new();
    for report in &reports {
        for (status, count) in &report.not_ok {
            *not_ok.entry(*status).or_default() += count;
        }
    }
    let not_ok_total: u64 = not_ok.values().sum();
    let failures: Vec<&String> = reports.iter().flat_map(|r| &r.failures).collect();
    let bound_mib = (limits.max_in_flight * limits.max_body_bytes) as f64 / (1024.0 * 1024.0);

    println!(
        "\n== {WINDOW:?} of abuse: {SLOW_BODY_CLIENTS} slow-body, {SLOW_HEADER_CLIENTS} slow-header, {OVERSIZED_CLIENTS} oversized (6 MiB) clients, {FLOOD_CONNECTIONS} flood connections =="
    );
    println!("well-behaved, quiet (before):   {}", latency_line(quiet));
    println!(
        "well-behaved, under abuse:      {}  (target: p99 under 2 ms)",
        latency_line(under_abuse.clone())
    );
    println!(
        "well-behaved answered 200: {}; other statuses: {not_ok_total} {not_ok:?}; failed outright: {}",
        under_abuse.len(),
        failures.len()
    );
    if let Some(text) = reports.iter().find_map(|r| r.first_not_ok.as_ref()) {
        println!("  first non-200 body: {}", text.trim_end());
    }
    for failure in failures.iter().take(5) {
        println!("  failure: {failure}");
    }
    println!(
        "valid reviews on a new connection every {FRESH_CONNECTION_EVERY:?}: {}",
        fresh_connections.render()
    );
    println!("slow-body clients were answered:   {}", slow_body.render());
    println!(
        "slow-header clients were answered: {}",
        slow_header.render()
    );
    println!("oversized clients were answered:   {}", oversized.render());
    println!(
        "flood connections: {} (at most {} open at once, counted by the client: the listen backlog too; the server's cap is {})",
        flood.render(),
        most_open.load(Ordering::Relaxed),
        limits.max_connections
    );
    println!("server refusals (/metrics):\n{refusals}");
    println!(
        "memory (RSS, clients included): before {rss_before:.1} MiB, peak {rss_peak:.1} MiB{}, after {rss_after:.1} MiB; bound: baseline + max_in_flight × max_body_bytes = {rss_before:.1} + {} × {} MiB = {:.1} MiB",
        if peak_reset {
            ""
        } else {
            " (VmHWM not reset: peak of the whole run)"
        },
        limits.max_in_flight,
        limits.max_body_bytes / (1024 * 1024),
        rss_before + bound_mib
    );
    match &answers {
        Ok(()) => println!("after the abuse, a new connection gets /healthz and a review answered"),
        Err(problem) => println!("after the abuse, the server does not answer: {problem}"),
    }

    let mut failed = false;
    if !failures.is_empty() {
        println!(
            "FAIL: {} well-behaved requests failed outright",
            failures.len()
        );
        failed = true;
    }
    if under_abuse.is_empty() {
        println!("FAIL: no well-behaved request was answered during the abuse");
        failed = true;
    }
    if answers.is_err() {
        println!("FAIL: the server stopped answering");
        failed = true;
    }
    if failed {
        std::process::exit(1);
    }
    server.stop().await;
}
