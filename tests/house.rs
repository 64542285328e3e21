//! The house rules a reviewer would otherwise check by eye, checked on the source text (no
//! build products, no network, so it is part of `make test-unit`):
//! - no function of the product (`src/`, tests left out) is longer than [`LONGEST_FUNCTION`] lines;
//! - no import circle between the product's files: the files, with an edge from each file to every
//!   file whose items it names (through `crate::`, `super::`, `self::` or a child module's name,
//!   following `pub use` re-exports to the file that defines the item), form no cycle. The one
//!   edge left out is a `mod.rs` naming its own direct children: a module is made of them;
//! - no module uses one of a lower layer: `src/lib.rs` declares the top-level modules in layers
//!   (blocks of `pub mod` lines, top first), and every edge above goes to the same layer or up;
//! - unit tests live in one of two places: a `mod tests` at the end of the file they test, or,
//!   when that would make the file long, `<file>_tests.rs` beside it, included by that file with
//!   `#[cfg(test)] #[path = "<file>_tests.rs"] mod tests;` (what the tests of several files of
//!   a module share is in its `fixtures.rs`, itself `#[cfg(test)]`);
//! - a test target's tier is its file name: `e2e_*` needs the Kubernetes or Prometheus binaries,
//!   `cluster_*` starts real Valkey clusters; every other target needs at most a valkey-server and
//!   is in `make test-unit`. The Makefile lists no test by hand;
//! - the Dockerfile builds with the toolchain `rust-toolchain.toml` pins.
//!
//! The parsing is line-based and relies on `cargo fmt`'s layout (a function's closing brace at its
//! own indentation), which `make lint` enforces.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a product function may be, in lines from its signature to its closing brace.
const LONGEST_FUNCTION: usize = 80;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// Every file of `src/` with its module path (`controller::pass::plan`; the crate root is "").
fn modules() -> BTreeMap<String, PathBuf> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(root().join("src")).unwrap();
            let mut parts: Vec<String> = relative
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            (parts.join("::"), path)
        })
        .collect()
}

fn is_test_file(path: &Path) -> bool {
    path.file_stem()
        .is_some_and(|s| s.to_string_lossy().ends_with("_tests"))
}

fn is_directory_module(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs")
}

/// The file's lines before its `#[cfg(test)] mod …` (the product's part of it).
fn product_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i] == "#[cfg(test)]"
                && lines[i + 1..]
                    .iter()
                    .take(2)
                    .any(|l| l.starts_with("mod tests"))
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// The line's code, its `//` comment cut (a `//` inside a string cuts too early, which only
/// loses paths, never invents one).
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |at| &line[..at])
}

/// `(name, first line, length)` of every function in `lines`.
fn functions(lines: &[&str]) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let mut rest = line.trim_start();
        for qualifier in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ] {
            rest = rest.strip_prefix(qualifier).unwrap_or(rest);
        }
        let Some(signature) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = signature
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if code(line).trim_end().ends_with('}') || code(line).trim_end().ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let end = (start + 1..lines.len()).find(|&i| lines[i] == close);
        // A trait's method declared over several lines ends with `;`, not a body.
        let declared = (start..lines.len())
            .take_while(|&i| !code(lines[i]).contains('{'))
            .any(|i| code(lines[i]).trim_end().ends_with(';'));
        if let (Some(end), false) = (end, declared) {
            found.push((name, start + 1, end - start + 1));
        }
    }
    found
}

#[test]
fn no_product_function_is_longer_than_the_limit() {
    let mut long = Vec::new();
    let mut counted = 0;
    for (module, path) in modules() {
        if is_test_file(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (name, line, length) in functions(&product_lines(&text)) {
            counted += 1;
            if length > LONGEST_FUNCTION {
                long.push(format!("{module}::{name} ({length} lines, line {line})"));
            }
        }
    }
    assert!(counted > 500, "the scan found only {counted} functions");
    assert!(
        long.is_empty(),
        "functions over {LONGEST_FUNCTION} lines: {long:#?}"
    );
}

#[test]
fn the_function_scan_measures_what_it_should() {
    let text = "fn one() -> u8 { 1 }\n\
                pub async fn two(\n    a: u8,\n) -> u8 {\n    a\n}\n\
                trait T {\n    fn declared(&self)\n        -> u8;\n}\n";
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(functions(&lines), vec![("two".to_string(), 2, 5)]);
}

/// The paths a line of code names: `a::b::C`, and every path of a `use a::{b, c::D}` group.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts_path = is_ident(chars[i]) && (i == 0 || !is_ident_or_colon(chars[i - 1]));
        if !starts_path {
            i += 1;
            continue;
        }
        let (prefix, next) = path_at(&chars, i);
        i = next;
        if prefix.len() > 1 || chars.get(i) == Some(&'{') {
            if chars.get(i) == Some(&'{') {
                let close = matching_brace(&chars, i).max(i + 1);
                let inner: String = chars[i + 1..close].iter().collect();
                for item in split_top_level(&inner) {
                    for tail in group_item(&item) {
                        found.push(prefix.iter().cloned().chain(tail).collect());
                    }
                }
                i = close + 1;
            } else {
                found.push(prefix);
            }
        }
    }
    found
}

/// The paths of one item of a `{…}` group: `B`, `a::B`, `self` or a nested group.
fn group_item(item: &str) -> Vec<Vec<String>> {
    let item = item.split(" as ").next().unwrap_or_default().trim();
    if item.is_empty() {
        return Vec::new();
    }
    let nested = paths(item);
    if nested.is_empty() {
        vec![vec![item.to_string()]]
    } else {
        nested
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_ident_or_colon(c: char) -> bool {
    is_ident(c) || c == ':'
}

/// The `a::b::` segments starting at `start`, and where they end (at a `{` if a group follows).
fn path_at(chars: &[char], start: usize) -> (Vec<String>, usize) {
    let mut segments = Vec::new();
    let mut i = start;
    loop {
        let begin = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        segments.push(chars[begin..i].iter().collect());
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
            if chars.get(i).is_some_and(|c| is_ident(*c)) {
                continue;
            }
        }
        return (segments, i);
    }
}

fn matching_brace(chars: &[char], open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    chars.len() - 1
}

fn split_top_level(text: &str) -> Vec<String> {
    let mut items = vec![String::new()];
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        items.last_mut().unwrap().push(c);
    }
    items
}

/// The source files and what each names, resolved to files.
struct Graph {
    modules: BTreeMap<String, PathBuf>,
    /// module → (item name → the module a `pub use` brings it from).
    reexports: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    fn new() -> Self {
        let modules = modules();
        let mut graph = Graph {
            modules,
            reexports: BTreeMap::new(),
        };
        for (module, path) in graph.modules.clone() {
            let text = std::fs::read_to_string(&path).unwrap();
            let joined = product_lines(&text)
                .iter()
                .map(|l| code(l))
                .collect::<Vec<_>>()
                .join(" ");
            let mut reexported = BTreeMap::new();
            for statement in joined.split(';') {
                let statement = statement.trim();
                let Some(at) = statement.find("use ") else {
                    continue;
                };
                if !statement[..at].trim().starts_with("pub") {
                    continue;
                }
                for path in paths(&statement[at + 4..]) {
                    let Some((item, from)) = path.split_last() else {
                        continue;
                    };
                    if let Some(target) = graph.module_of(&module, from, false) {
                        reexported.insert(item.clone(), target);
                    }
                }
            }
            graph.reexports.insert(module, reexported);
        }
        graph
    }

    /// The file a path written in `module` names, if it is one of the crate's.
    fn module_of(&self, module: &str, path: &[String], follow: bool) -> Option<String> {
        let here: Vec<String> = if module.is_empty() {
            Vec::new()
        } else {
            module.split("::").map(String::from).collect()
        };
        let (mut base, rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (here.clone(), &path[1..]),
            "super" => {
                let mut base = here.clone();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
                (base, rest)
            }
            child if self.modules.contains_key(&join(&here, child)) => (here.clone(), path),
            _ => return None,
        };
        base.extend(rest.iter().cloned());
        let known = (0..=base.len())
            .rev()
            .find(|&n| self.modules.contains_key(&base[..n].join("::")))?;
        let found = base[..known].join("::");
        let reexported = base
            .get(known)
            .and_then(|item| self.reexports.get(&found)?.get(item));
        match reexported {
            Some(target) if follow && *target != found => Some(target.clone()),
            _ => Some(found),
        }
    }

    fn edges(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges = BTreeMap::new();
        for (module, path) in &self.modules {
            if is_test_file(path) {
                continue;
            }
            let text = std::fs::read_to_string(path).unwrap();
            let product: Vec<&str> = product_lines(&text).into_iter().map(code).collect();
            let mut named = BTreeSet::new();
            for path in paths(&product.join("\n")) {
                if let Some(target) = self.module_of(module, &path, true) {
                    named.insert(target);
                }
            }
            named.remove(module);
            if is_directory_module(path) {
                named.retain(|target| !is_child(module, target));
            }
            edges.insert(module.clone(), named);
        }
        edges
    }
}

fn join(here: &[String], child: &str) -> String {
    here.iter()
        .map(String::as_str)
        .chain([child])
        .collect::<Vec<_>>()
        .join("::")
}

fn is_child(parent: &str, module: &str) -> bool {
    let rest = if parent.is_empty() {
        Some(module)
    } else {
        module
            .strip_prefix(parent)
            .and_then(|r| r.strip_prefix("::"))
    };
    rest.is_some_and(|r| !r.is_empty() && !r.contains("::"))
}

/// A cycle of `edges`, if there is one, as the files in order.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let from = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut found = stack[from..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(found) = visit(next, edges, marks, stack) {
                        return Some(found);
                    }
                }
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in edges.keys() {
        if !marks.contains_key(node)
            && let Some(found) = visit(node, edges, &mut marks, &mut Vec::new())
        {
            return Some(found);
        }
    }
    None
}

#[test]
fn no_import_circle_between_the_products_files() {
    let edges = Graph::new().edges();
    let named: usize = edges.values().map(BTreeSet::len).sum();
    assert!(named > 300, "the scan found only {named} edges");
    if let Some(found) = cycle(&edges) {
        panic!("an import circle: {}", found.join(" → "));
    }
}

/// The layers `src/lib.rs` declares: its blocks of `pub mod …;` lines, separated by blank
/// lines, top first. A module may use its own layer and the ones above it.
fn layers() -> Vec<Vec<String>> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let mut layers: Vec<Vec<String>> = vec![Vec::new()];
    for line in lib.lines() {
        if let Some(name) = line
            .strip_prefix("pub mod ")
            .and_then(|rest| rest.strip_suffix(';'))
        {
            layers.last_mut().unwrap().push(name.to_string());
        } else if line.trim().is_empty() && !layers.last().unwrap().is_empty() {
            layers.push(Vec::new());
        }
    }
    layers.retain(|layer| !layer.is_empty());
    layers
}

/// Every edge of `edges` from a module to one in a lower layer of `layers` (by their top-level
/// module), as `from → to`.
fn upward_imports(
    edges: &BTreeMap<String, BTreeSet<String>>,
    layers: &[Vec<String>],
) -> Vec<String> {
    let layer_of = |module: &str| {
        let top = module.split("::").next().unwrap_or_default();
        layers
            .iter()
            .position(|layer| layer.iter().any(|m| m == top))
    };
    let mut found = Vec::new();
    for (from, targets) in edges {
        let Some(here) = layer_of(from) else { continue };
        for to in targets {
            if layer_of(to).is_some_and(|there| there > here) {
                found.push(format!("{from} → {to}"));
            }
        }
    }
    found
}

#[test]
fn no_module_uses_one_of_a_lower_layer() {
    let layers = layers();
    assert!(layers.len() >= 5, "src/lib.rs's layers: {layers:?}");
    let upward = upward_imports(&Graph::new().edges(), &layers);
    assert!(
        upward.is_empty(),
        "imports from a layer to a lower one (src/lib.rs lists the layers):\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_layer_check_sees_an_upward_import() {
    let layers = vec![vec!["api".to_string()], vec!["controller".to_string()]];
    let edges = BTreeMap::from([
        (
            "controller::pass".to_string(),
            BTreeSet::from(["api::names".to_string()]),
        ),
        (
            "api::names".to_string(),
            BTreeSet::from(["controller::build::status".to_string()]),
        ),
    ]);
    assert_eq!(
        upward_imports(&edges, &layers),
        ["api::names → controller::build::status"]
    );
}

#[test]
fn the_import_scan_sees_paths_groups_and_circles() {
    assert_eq!(
        paths("use super::{a::B, c, d::{E, F}};"),
        [
            vec!["super", "a", "B"],
            vec!["super", "c"],
            vec!["super", "d", "E"],
            vec!["super", "d", "F"]
        ]
    );
    assert_eq!(
        paths("let x = crate::fleet::ClusterKey::of(&c);"),
        [vec!["crate", "fleet", "ClusterKey", "of"]]
    );
    let edges = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(cycle(&edges).unwrap(), ["a", "b", "c", "a"]);
    assert!(is_child("controller", "controller::pass"));
    assert!(!is_child("controller", "controller::pass::plan"));
    assert!(is_child("", "fleet"));
}

#[test]
fn unit_tests_live_in_the_file_or_beside_it() {
    let mut wrong = Vec::new();
    for (module, path) in modules() {
        let text = std::fs::read_to_string(&path).unwrap();
        if is_test_file(&path) {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let tested = path.with_file_name(format!("{}.rs", stem.trim_end_matches("_tests")));
            let include = format!("#[path = \"{stem}.rs\"]");
            let included = std::fs::read_to_string(&tested)
                .is_ok_and(|t| t.contains(&format!("#[cfg(test)]\n{include}\nmod tests;")));
            if !included {
                wrong.push(format!("{module}: not included by {}", tested.display()));
            }
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        let product = product_lines(&text).len();
        if product < lines.len() {
            // What follows the product's part is the test module and nothing else.
            let module_line = lines[product + 1..]
                .iter()
                .find(|l| !l.starts_with("#["))
                .copied()
                .unwrap_or("");
            if module_line != "mod tests {" && module_line != "mod tests;" {
                wrong.push(format!("{module}: test module `{module_line}`"));
            }
        }
    }
    let directories: Vec<_> = modules()
        .into_keys()
        .filter(|m| m.contains("_tests::"))
        .collect();
    assert!(directories.is_empty(), "test directories: {directories:?}");
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_fast_tier_is_every_target_but_the_slow_prefixes() {
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let mut targets = Vec::new();
    for entry in std::fs::read_dir(root().join("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            targets.push(path.file_stem().unwrap().to_string_lossy().into_owned());
        }
    }
    assert!(targets.len() > 30, "only {} test targets", targets.len());
    let named: BTreeSet<&str> = makefile
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .flat_map(|line| line.split(|c: char| !(c.is_alphanumeric() || c == '_')))
        .collect();
    for target in &targets {
        assert!(
            !named.contains(target.as_str()),
            "the Makefile names the test target {target}: its tier is its file name"
        );
    }
    // What only a slow target may use: the test control plane, Prometheus, and clusters of real
    // Valkey nodes. `make test-unit` only fetches valkey-server, so a fast target that needs more
    // would fail there (or make the fast tier slow).
    for target in targets
        .iter()
        .filter(|t| !t.starts_with("e2e_") && !t.starts_with("cluster_"))
    {
        let text = std::fs::read_to_string(root().join(format!("tests/{target}.rs"))).unwrap();
        // Spelt in halves, so that this file does not name them itself.
        let has = |a: &str, b: &str| text.matches(&format!("{a}{b}")).count();
        let control_plane =
            has("testenv", "::") > has("testenv", "::valkey_bin_root") || has("harness", "::k") > 0;
        for (slow, uses) in [
            ("the test control plane", control_plane),
            ("Prometheus", has("harness", "::prometheus") > 0),
            ("a cluster of real nodes", has("converge", "(") > 0),
        ] {
            assert!(
                !uses,
                "{target} uses {slow}: name it e2e_{target} or cluster_{target}"
            );
        }
    }
}

#[test]
fn the_dockerfile_builds_with_the_pinned_toolchain() {
    let toolchain = std::fs::read_to_string(root().join("rust-toolchain.toml")).unwrap();
    let channel = toolchain
        .lines()
        .find_map(|line| line.trim().strip_prefix("channel = "))
        .map(|value| value.trim_matches('"'))
        .unwrap();
    // The image tag names major.minor: `1.95.0` is built by `rust:1.95-…`.
    let minor = channel.rsplit_once('.').map_or(channel, |(minor, _)| minor);
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let image = dockerfile
        .lines()
        .find_map(|line| line.strip_prefix("FROM rust:"))
        .unwrap();
    assert!(
        image.starts_with(&format!("{minor}-")) || image.starts_with(&format!("{channel}-")),
        "the Dockerfile builds with rust:{image}, rust-toolchain.toml pins {channel}"
    );
}
