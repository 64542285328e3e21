//! Keeps `setting_impact` honest against real valkey-server binaries: for every version the
//! tests fetch, each setting that is neither operator-owned nor listed as restart-only must
//! apply live with CONFIG SET, and each listed one must be refused by CONFIG SET.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use harness::eventually;
use valkey_operator::api::setting_impact::{RESTART_ONLY, is_operator_owned, needs_restart};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn connect(port: u16) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    eventually(
        format!("valkey-server on {port} to answer"),
        Duration::from_secs(10),
        async || client.get_multiplexed_async_connection().await,
    )
    .await
}

#[tokio::test]
async fn restart_only_settings_match_real_valkey() {
    let root = testenv::valkey_bin_root();
    let versions = ["9.0.0", "9.1.2"];
    let mut seen_anywhere = BTreeSet::new();
    for version in versions {
        let binary = root.join(version).join("valkey-server");
        assert!(
            binary.exists(),
            "{} is missing: run hack/fetch-valkey.sh",
            binary.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let _server = Server(
            Command::new(&binary)
                .args([
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let mut connection = connect(port).await;
        let flat: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("*")
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(
            flat.len() > 200,
            "{version}: CONFIG GET * returned {} items",
            flat.len()
        );
        let mut wrong = Vec::new();
        for pair in flat.chunks(2) {
            let (name, value) = (&pair[0], &pair[1]);
            seen_anywhere.insert(name.clone());
            if is_operator_owned(name) {
                continue;
            }
            let applied: redis::RedisResult<()> = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query_async(&mut connection)
                .await;
            match (needs_restart(name), applied) {
                (false, Err(error)) => wrong.push(format!(
                    "{name}: listed as live but CONFIG SET failed: {error}"
                )),
                (true, Ok(())) => wrong.push(format!(
                    "{name}: listed as restart-only but CONFIG SET applied it"
                )),
                _ => {}
            }
        }
        assert!(wrong.is_empty(), "Valkey {version}:\n{}", wrong.join("\n"));
    }
    let unknown: Vec<_> = RESTART_ONLY
        .iter()
        .filter(|s| !seen_anywhere.contains(**s))
        .collect();
    assert!(
        unknown.is_empty(),
        "not settings of any tested Valkey: {unknown:?}"
    );
}
