//! Liveness probes on the test kubelet. Its containers are local processes without an image,
//! so an `exec` probe cannot run inside one; the probe the operator renders (`valkey-cli -s
//! SOCKET PING`, or `-h HOST -p PORT`) is run by the kubelet itself, as valkey-cli would run
//! it: connect, send `PING`, and count any answer (`+PONG`, `-NOAUTH`, `-LOADING`: valkey-cli
//! exits 0 on an error reply) as alive; no connection, or no answer within the probe's
//! timeout, fails. After `failureThreshold` failures in a row the container is killed
//! (SIGTERM, then SIGKILL after the grace a kubelet would give: the Pod's when the Pod is
//! killed whole, with `restartPolicy: Never`, else the probe's own, else the Pod's).

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::container::map_mounts;

/// Where the probe connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Socket(PathBuf),
    Tcp(String, u16),
}

/// A liveness probe the test kubelet can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Liveness {
    pub target: Target,
    pub period: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    /// The probe's own `terminationGracePeriodSeconds`, else the Pod's.
    pub grace: Option<Duration>,
    pub initial_delay: Duration,
}

impl Liveness {
    /// The probe of a container, its paths mapped to the Pod's folders by `mounts`. `Ok(None)`
    /// without a liveness probe; an error names what the test kubelet cannot run.
    pub fn from_probe(
        probe: Option<&Probe>,
        mounts: &[(String, PathBuf)],
    ) -> Result<Option<Self>, String> {
        let Some(probe) = probe else {
            return Ok(None);
        };
        let command = probe
            .exec
            .as_ref()
            .and_then(|exec| exec.command.clone())
            .ok_or("the test kubelet runs only exec liveness probes (valkey-cli PING)")?;
        let target = valkey_cli_target(&command, mounts)?;
        let seconds = |value: Option<i32>, default: u64| {
            value.map_or(Duration::from_secs(default), |s| {
                Duration::from_secs(u64::try_from(s).unwrap_or(0))
            })
        };
        Ok(Some(Self {
            target,
            period: seconds(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: seconds(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1).unsigned_abs(),
            grace: probe
                .termination_grace_period_seconds
                .map(|s| Duration::from_secs(s.max(0).unsigned_abs())),
            initial_delay: seconds(probe.initial_delay_seconds, 0),
        }))
    }
}

/// Where `valkey-cli [-s SOCKET | -h HOST -p PORT] PING` connects.
fn valkey_cli_target(command: &[String], mounts: &[(String, PathBuf)]) -> Result<Target, String> {
    let unsupported = || format!("the test kubelet cannot run the liveness command {command:?}");
    let (program, args) = command.split_first().ok_or_else(unsupported)?;
    if !program.ends_with("valkey-cli") {
        return Err(unsupported());
    }
    let (mut socket, mut host, mut port) = (None, "127.0.0.1".to_string(), 6379u16);
    let mut words = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-s" => {
                socket = Some(PathBuf::from(map_mounts(
                    args.next().ok_or_else(unsupported)?,
                    mounts,
                )))
            }
            "-h" => host = args.next().ok_or_else(unsupported)?.clone(),
            "-p" => {
                port = args
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(unsupported)?;
            }
            flag if flag.starts_with('-') => return Err(unsupported()),
            word => words.push(word.to_ascii_uppercase()),
        }
    }
    if words != ["PING"] {
        return Err(unsupported());
    }
    Ok(socket.map_or(Target::Tcp(host, port), Target::Socket))
}

/// One probe: true when the server answers `PING` at all within `timeout`.
pub async fn answers(target: &Target, timeout: Duration) -> bool {
    async fn ping<S: AsyncReadExt + AsyncWriteExt + Unpin>(mut stream: S) -> Option<()> {
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut reply = [0u8; 64];
        let n = stream.read(&mut reply).await.ok()?;
        matches!(reply.first(), Some(b'+' | b'-'))
            .then_some(())
            .filter(|()| n > 0)
    }
    let attempt = async {
        match target {
            Target::Socket(path) => ping(tokio::net::UnixStream::connect(path).await.ok()?).await,
            Target::Tcp(host, port) => {
                ping(
                    tokio::net::TcpStream::connect((host.as_str(), *port))
                        .await
                        .ok()?,
                )
                .await
            }
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .ok()
        .flatten()
        .is_some()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ExecAction;

    use super::*;

    fn exec(command: &[&str]) -> Probe {
        Probe {
            exec: Some(ExecAction {
                command: Some(command.iter().map(ToString::to_string).collect()),
            }),
            period_seconds: Some(5),
            timeout_seconds: Some(3),
            failure_threshold: Some(3),
            termination_grace_period_seconds: Some(2),
            ..Default::default()
        }
    }

    #[test]
    fn the_operators_probe_pings_the_socket_in_the_pods_data_folder() {
        let mounts = vec![("/data".to_string(), PathBuf::from("/pod/volumes/data"))];
        let probe = exec(&["valkey-cli", "-s", "/data/valkey.sock", "PING"]);
        let liveness = Liveness::from_probe(Some(&probe), &mounts)
            .unwrap()
            .unwrap();
        assert_eq!(
            liveness.target,
            Target::Socket(PathBuf::from("/pod/volumes/data/valkey.sock"))
        );
        assert_eq!(liveness.period, Duration::from_secs(5));
        assert_eq!(liveness.timeout, Duration::from_secs(3));
        assert_eq!(liveness.failure_threshold, 3);
        assert_eq!(liveness.grace, Some(Duration::from_secs(2)));
    }

    #[test]
    fn probes_it_cannot_run_are_named() {
        for command in [
            &["sh", "-c", "valkey-cli PING"][..],
            &["valkey-cli", "--tls", "PING"],
            &["valkey-cli", "-s", "/data/valkey.sock", "INFO"],
        ] {
            let error = Liveness::from_probe(Some(&exec(command)), &[]).unwrap_err();
            assert!(error.contains("cannot run"), "{command:?}: {error}");
        }
        assert_eq!(Liveness::from_probe(None, &[]), Ok(None));
    }

    #[tokio::test]
    async fn any_answer_is_alive_and_silence_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let target = Target::Socket(path.clone());
        let server = tokio::spawn(async move {
            // The first client gets an error reply, the second nothing at all.
            let (mut first, _) = listener.accept().await.unwrap();
            let mut buffer = [0u8; 16];
            let _ = first.read(&mut buffer).await;
            first
                .write_all(b"-NOAUTH Authentication required.\r\n")
                .await
                .unwrap();
            let (_second, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        assert!(answers(&target, Duration::from_secs(2)).await);
        assert!(!answers(&target, Duration::from_millis(300)).await);
        server.abort();
        let gone = Target::Socket(dir.path().join("none.sock"));
        assert!(!answers(&gone, Duration::from_secs(1)).await);
    }
}
