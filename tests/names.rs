//! The names a user or another program sees (labels, annotations, finalizers, field managers)
//! are defined in one place, `src/api/mod.rs`, and the docs name exactly those: a name the code
//! uses but no page documents, a page naming one the code does not have, or a name spelled out
//! anywhere else in `src/` fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use valkey_operator::api::{annotations, field_managers, finalizers, labels};

/// The API group's prefix, on every label, annotation and finalizer of the operator's own.
const PREFIX: &str = "valkey.gomomento.com/";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every name `src/api/mod.rs` defines, as the code sees them.
fn defined() -> BTreeSet<&'static str> {
    BTreeSet::from([
        labels::CLUSTER,
        labels::SHARD,
        labels::ROLE,
        labels::NODE,
        annotations::ACKNOWLEDGE_FLEET_ROLL,
        annotations::HANDOVER_REQUESTED,
        annotations::RETRY_FAILOVERS,
        annotations::ROLLOUT_PAUSED,
        annotations::ROLLOUT_WAVE,
        annotations::ROTATE_CREDENTIALS,
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
