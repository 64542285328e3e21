//! The CRD YAML committed in the chart must be exactly what `valkey-operator crd` prints.

#[test]
fn committed_crds_match_the_binary() {
    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_valkey-operator"))
        .arg("crd")
        .output()
        .expect("run valkey-operator crd");
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/valkey-operator/crds/crds.yaml"
    );
    let committed = std::fs::read_to_string(path).expect("read the chart's CRDs");
    assert!(
        committed == String::from_utf8_lossy(&printed.stdout),
        "{path} differs from `valkey-operator crd`; run `make crds` and commit the result"
    );
    for kind in [
        "ValkeyImage",
        "ValkeyConfig",
        "ValkeyRole",
        "ValkeyCluster",
        "ValkeyNode",
    ] {
        assert!(
            committed.contains(&format!("kind: {kind}\n")),
            "{kind} missing"
        );
    }
}
