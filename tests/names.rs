//! The names a user or another program sees (labels, annotations, finalizers, field managers,
//! Secret keys) are defined in one place, `src/api/mod.rs`, and the docs name exactly those: a
//! name the code uses but no page documents, a page naming one the code does not have, or a
//! name spelled out anywhere else in `src/` fails here. Condition types and reasons and event
//! reasons are each defined by one enum (`controller::build::status`, `controller::events`); every one
//! of them is documented, and the docs' lists of events and of `Degraded`'s reasons name only
//! those.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use valkey_operator::api::{annotations, field_managers, finalizers, labels, secret_keys};
use valkey_operator::controller::build::status::{ConditionType, Reason};
use valkey_operator::controller::events::{ClusterEvent, RolloutChange, RolloutEvent, Said};

/// The API group's prefix, on every label, annotation and finalizer of the operator's own.
const PREFIX: &str = "valkey.gomomento.com/";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every name `src/api/mod.rs` defines, as the code sees them.
fn defined() -> BTreeSet<&'static str> {
    BTreeSet::from([
        labels::CLUSTER,
        labels::SHARD_INDEX,
        labels::JOIN_TYPE,
        labels::ROLE,
        labels::NODE,
        annotations::ACKNOWLEDGE_FLEET_ROLL,
        annotations::HANDOVER_REQUESTED,
        annotations::RETRY_FAILOVERS,
        annotations::ROLLOUT_PAUSED,
        annotations::ROLLOUT_WAVE,
        annotations::ROLLOUT_HOLD,
        annotations::ROTATE_CREDENTIALS,
        annotations::SWITCHOVER,
        annotations::REPLICA_OF,
        annotations::REVISION,
        finalizers::RETIRE_NODES,
        finalizers::RETIRE_NODE,
    ])
}

fn files(dir: &Path, extension: &str, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, extension, found);
        } else if path.extension().is_some_and(|e| e == extension) {
            found.push(path);
        }
    }
}

/// The `valkey.gomomento.com/<name>` tokens of `text`, the API version left out.
fn prefixed(text: &str) -> BTreeSet<String> {
    text.match_indices(PREFIX)
        .map(|(at, _)| {
            let rest = &text[at + PREFIX.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
                .unwrap_or(rest.len());
            // `name-` is kubectl's "remove this label or annotation".
            format!("{PREFIX}{}", rest[..end].trim_end_matches('-'))
        })
        .filter(|name| name.len() > PREFIX.len() && !name.ends_with("/v1alpha1"))
        .collect()
}

fn docs() -> String {
    let mut pages = vec![root().join("README.md")];
    files(&root().join("docs"), "md", &mut pages);
    pages
        .iter()
        .map(|page| std::fs::read_to_string(page).unwrap())
        .collect()
}

#[test]
fn every_prefixed_name_the_code_defines_is_in_the_api_module() {
    let module = std::fs::read_to_string(root().join("src/api/mod.rs")).unwrap();
    let in_module = prefixed(&module);
    let defined: BTreeSet<String> = defined().into_iter().map(String::from).collect();
    assert_eq!(
        in_module, defined,
        "src/api/mod.rs defines names this test does not list, or the reverse"
    );
}

#[test]
fn no_source_file_spells_a_name_out_but_the_api_module() {
    let mut sources = Vec::new();
    files(&root().join("src"), "rs", &mut sources);
    let api = root().join("src/api/mod.rs");
    let mut spelled = Vec::new();
    for source in sources.iter().filter(|path| **path != api) {
        let text = std::fs::read_to_string(source).unwrap();
        // Tests may spell a name out (they check what a user would type), and so may comments
        // (a CRD's field docs are its schema's descriptions).
        let product = text.split("#[cfg(test)]").next().unwrap_or_default();
        if source.to_string_lossy().contains("tests") {
            continue;
        }
        let code: String = product
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for name in prefixed(&code) {
            spelled.push(format!("{}: {name}", source.display()));
        }
    }
    assert!(
        spelled.is_empty(),
        "names spelled out outside src/api/mod.rs (use its constants): {spelled:#?}"
    );
}

#[test]
fn the_docs_name_exactly_the_names_the_code_has() {
    let documented = prefixed(&docs());
    let defined: BTreeSet<String> = defined().into_iter().map(String::from).collect();
    let undocumented: Vec<_> = defined.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&defined).collect();
    assert!(
        undocumented.is_empty(),
        "no page of README.md or docs/ names {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "the docs name {unknown:?}, which the code does not have"
    );
}

#[test]
fn the_docs_name_every_field_manager() {
    let docs = docs();
    let managers = [
        field_managers::CONTROLLER,
        field_managers::ROLL,
        field_managers::EVICTION,
    ];
    let missing: Vec<_> = managers
        .iter()
        .filter(|manager| !docs.contains(&format!("`{manager}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "no page names the field managers {missing:?}"
    );
}

/// Every event reason, one value of each variant (a new variant does not compile until it is
/// listed here: the `match` has no wildcard).
fn event_reasons() -> (BTreeSet<&'static str>, BTreeSet<&'static str>) {
    let text = String::new;
    let cluster = [
        ClusterEvent::NodeJoining {
            node: text(),
            what: text(),
        },
        ClusterEvent::NodeActive {
            node: text(),
            shard: 0,
        },
        ClusterEvent::Failover {
            to: text(),
            what: text(),
        },
        ClusterEvent::HandOver {
            to: text(),
            what: text(),
        },
        ClusterEvent::Rebalance {
            to: text(),
            what: text(),
        },
        ClusterEvent::Switchover {
            to: text(),
            what: text(),
        },
        ClusterEvent::TakeOver {
            to: text(),
            what: text(),
        },
        ClusterEvent::SlotMigration {
            to: text(),
            what: text(),
        },
        ClusterEvent::NodeRetired {
            node: text(),
            what: text(),
        },
        ClusterEvent::RollStalled { what: text() },
        ClusterEvent::FailoversAllowed { shards: Vec::new() },
        ClusterEvent::AclNotApplied { problem: text() },
        ClusterEvent::CredentialsRotation { stage: "" },
        ClusterEvent::Deleted { nodes: 0 },
        ClusterEvent::SpecOutOfBounds { problems: text() },
        ClusterEvent::NameConflict { problem: text() },
        ClusterEvent::StrangerAtAddress { problem: text() },
        ClusterEvent::PodNotStarted { problem: text() },
    ];
    for event in &cluster {
        match event {
            ClusterEvent::NodeJoining { .. }
            | ClusterEvent::NodeActive { .. }
            | ClusterEvent::Failover { .. }
            | ClusterEvent::HandOver { .. }
            | ClusterEvent::Rebalance { .. }
            | ClusterEvent::Switchover { .. }
            | ClusterEvent::TakeOver { .. }
            | ClusterEvent::SlotMigration { .. }
            | ClusterEvent::NodeRetired { .. }
            | ClusterEvent::RollStalled { .. }
            | ClusterEvent::FailoversAllowed { .. }
            | ClusterEvent::AclNotApplied { .. }
            | ClusterEvent::CredentialsRotation { .. }
            | ClusterEvent::Deleted { .. }
            | ClusterEvent::SpecOutOfBounds { .. }
            | ClusterEvent::NameConflict { .. }
            | ClusterEvent::StrangerAtAddress { .. }
            | ClusterEvent::PodNotStarted { .. } => {}
        }
    }
    let changes = [
        RolloutChange::Started,
        RolloutChange::Halted,
        RolloutChange::Paused,
        RolloutChange::Resumed,
        RolloutChange::Completed,
    ];
    for change in changes {
        match change {
            RolloutChange::Started
            | RolloutChange::Halted
            | RolloutChange::Paused
            | RolloutChange::Resumed
            | RolloutChange::Completed => {}
        }
    }
    let rollout = changes.map(|change| RolloutEvent {
        change,
        counts: text(),
    });
    (
        cluster.iter().map(ClusterEvent::reason).collect(),
        rollout.iter().map(RolloutEvent::reason).collect(),
    )
}

/// Every condition type and reason (exhaustive as above).
fn conditions() -> (BTreeSet<&'static str>, BTreeSet<&'static str>) {
    use ConditionType as C;
    use Reason as R;
    let types = [
        C::Ready,
        C::Progressing,
        C::Degraded,
        C::AclApplied,
        C::Halted,
    ];
    for kind in types {
        match kind {
            C::Ready | C::Progressing | C::Degraded | C::AclApplied | C::Halted => {}
        }
    }
    let reasons = [
        R::AllSlotsServed,
        R::SlotsUnserved,
        R::Rolling,
        R::UpToDate,
        R::Healthy,
        R::RollStalled,
        R::StepFailed,
        R::ConfigUnresolved,
        R::SpecOutOfBounds,
        R::NameConflict,
        R::UsersApplied,
        R::RoleMissing,
        R::InvalidAcl,
        R::NodeRefused,
        R::SecretUnreadable,
        R::AclTooLarge,
        R::TlsUnavailable,
        R::CredentialsUnusable,
        R::StrangerAtAddress,
        R::LoginRefused,
        R::CertificateRefused,
        R::NamespacePolicy,
        R::PodNotStarted,
    ];
    for reason in reasons {
        match reason {
            R::AllSlotsServed
            | R::SlotsUnserved
            | R::Rolling
            | R::UpToDate
            | R::Healthy
            | R::RollStalled
            | R::StepFailed
            | R::ConfigUnresolved
            | R::SpecOutOfBounds
            | R::NameConflict
            | R::UsersApplied
            | R::RoleMissing
            | R::InvalidAcl
            | R::NodeRefused
            | R::SecretUnreadable
            | R::AclTooLarge
            | R::TlsUnavailable
            | R::CredentialsUnusable
            | R::StrangerAtAddress
            | R::LoginRefused
            | R::CertificateRefused
            | R::NamespacePolicy
            | R::PodNotStarted => {}
        }
    }
    (
        types.map(ConditionType::as_str).into(),
        reasons.map(Reason::as_str).into(),
    )
}

/// The backquoted words of the docs' sentence that starts at `start` and ends at `end`.
fn listed(docs: &str, start: &str, end: &str) -> BTreeSet<String> {
    let (_, after) = docs
        .split_once(start)
        .unwrap_or_else(|| panic!("the docs have no `{start}`"));
    let (sentence, _) = after
        .split_once(end)
        .unwrap_or_else(|| panic!("`{start}` is not followed by `{end}`"));
    sentence
        .split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

#[test]
fn every_reason_and_condition_is_documented() {
    let docs = docs();
    let (cluster_events, rollout_events) = event_reasons();
    let (types, reasons) = conditions();
    let all = cluster_events
        .iter()
        .chain(&rollout_events)
        .chain(&types)
        .chain(&reasons);
    let missing: Vec<_> = all
        .filter(|name| !docs.contains(&format!("`{name}`")))
        .collect();
    assert!(missing.is_empty(), "no page names {missing:?}");
}

#[test]
fn the_docs_lists_of_events_and_reasons_name_only_the_codes() {
    let docs = docs();
    let (cluster_events, rollout_events) = event_reasons();
    let (_, reasons) = conditions();
    let as_strings = |set: &BTreeSet<&str>| -> BTreeSet<String> {
        set.iter().map(|name| name.to_string()).collect()
    };
    assert_eq!(
        listed(&docs, "Events: ", "\n`Degraded`'s reasons"),
        as_strings(&cluster_events),
        "design.md's list of a cluster's events"
    );
    assert_eq!(
        listed(&docs, "The config gets ", " events"),
        as_strings(&rollout_events),
        "operating.md's list of a config's rollout events"
    );
    let degraded = listed(&docs, "`Degraded`'s reasons: ", "\n\n");
    let unknown: Vec<_> = degraded
        .iter()
        .filter(|name| !reasons.contains(name.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "`Degraded`'s reasons in the docs that are no Reason: {unknown:?}"
    );
}

#[test]
fn every_secret_key_is_documented() {
    let docs = docs();
    let keys = [
        secret_keys::OPERATOR_PASSWORD,
        secret_keys::REPLICATION_PASSWORD,
        secret_keys::AUTH_CONF,
        secret_keys::TLS_CA,
        secret_keys::TLS_CERT,
        secret_keys::TLS_KEY,
    ];
    let mut missing: Vec<String> = keys
        .iter()
        .filter(|key| !docs.contains(&format!("`{key}`")))
        .map(|key| key.to_string())
        .collect();
    // The rotation's keys are the passwords' keys with a prefix.
    for prefix in [secret_keys::NEXT, secret_keys::PREVIOUS] {
        let key = format!("{prefix}{}", secret_keys::OPERATOR_PASSWORD);
        if !docs.contains(&key) {
            missing.push(key);
        }
    }
    assert!(
        missing.is_empty(),
        "no page names the Secret keys {missing:?}"
    );
}
