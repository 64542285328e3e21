//! The manual holds together: every relative link in README.md and docs/*.md reaches a file in
//! the repository and, where it names an `#anchor`, a heading of that file; every file path in
//! backquotes exists; and the layout map in docs/design.md names every entry of `src/` and
//! every file of `src/controller/` and its folders, and nothing that does not exist. It only
//! reads files (no network, no build products), so it is part of `make test-unit`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Links with these beginnings leave the repository on purpose and are not followed.
const EXTERNAL: [&str; 3] = ["http://", "https://", "mailto:"];

/// The repository's root, canonical, so that a link's resolved path can be compared with it.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .canonicalize()
        .expect("canonicalize the repository's root")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The names in a folder, sorted, each with whether it is a folder itself.
fn entries_of(dir: &Path) -> Vec<(String, bool)> {
    let mut names: Vec<(String, bool)> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|entry| {
            let entry = entry.expect("a folder entry");
            let name = entry.file_name().into_string().expect("a UTF-8 name");
            (name, entry.path().is_dir())
        })
        .collect();
    names.sort();
    names
}

/// README.md and every page in docs/.
fn manual(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md")];
    for (name, is_dir) in entries_of(&root.join("docs")) {
        if !is_dir && name.ends_with(".md") {
            pages.push(root.join("docs").join(name));
        }
    }
    pages
}

/// The lines of a markdown text outside fenced code blocks, with their 1-based numbers: in a
/// shell sample `#` starts a comment, not a heading, and `](` is no link.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut in_fence = false;
    let mut prose = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence {
            prose.push((i + 1, line));
        }
    }
    prose
}

/// A heading's anchor as GitHub makes it: lowercase, each space a `-`, and every character but
/// letters, digits, `-` and `_` dropped (so backticks, colons, dots and parentheses go).
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown text's `#` headings. A repeated heading gets `-1`, `-2`, ... as on
/// GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let level = line.chars().take_while(|&c| c == '#').count();
        let Some(title) = line[level..].strip_prefix(' ') else {
            continue;
        };
        if !(1..=6).contains(&level) {
            continue;
        }
        let base = slug(title);
        let mut anchor = base.clone();
        let mut n = 0;
        while anchors.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        anchors.insert(anchor);
    }
    anchors
}

/// The target of every `[text](target)` outside code fences, with its line number. A link's
/// text may wrap from an earlier line; its `](target)` is on one line.
fn links(text: &str) -> Vec<(usize, &str)> {
    let mut links = Vec::new();
    for (number, line) in prose_lines(text) {
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            // A target with no `)` on its line is taken whole, so it is reported, not skipped.
            let end = after.find(')').unwrap_or(after.len());
            links.push((number, &after[..end]));
            rest = &after[end..];
        }
    }
    links
}

#[test]
fn every_link_between_the_docs_resolves() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in manual(&root) {
        let text = read(&page);
        let shown = page.strip_prefix(&root).unwrap().display().to_string();
        for (line, target) in links(&text) {
            if EXTERNAL.iter().any(|scheme| target.starts_with(scheme)) {
                continue;
            }
            checked += 1;
            let at = format!("{shown}:{line}: ({target})");
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target, None),
            };
            // A link is relative to the folder of the page that holds it.
            let linked = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let Ok(linked) = linked.canonicalize() else {
                broken.push(format!("{at}: no such file"));
                continue;
            };
            // The spec and other neighbours live outside the repository, where a reader of it
            // on GitHub cannot follow: they are named as plain text instead.
            if !linked.starts_with(&root) {
                broken.push(format!(
                    "{at}: outside the repository; name it as plain text"
                ));
                continue;
            }
            if let Some(anchor) = anchor {
                if linked.extension().is_none_or(|ext| ext != "md") {
                    broken.push(format!("{at}: an anchor into a file that is not markdown"));
                } else if !anchors(&read(&linked)).contains(anchor) {
                    broken.push(format!("{at}: no heading there has the anchor #{anchor}"));
                }
            }
        }
    }
    // Guards the parser: a manual in which it finds no link at all would pass vacuously.
    assert!(checked > 0, "found no relative link in README.md and docs/");
    assert!(
        broken.is_empty(),
        "{} broken links in the manual:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The layout map: the first fenced block after the `## Layout` heading of docs/design.md, as
/// entries. An entry is a line that starts with a path, with the indented lines after it (its
/// description and, for `src/controller/`, that folder's files).
fn layout_entries(root: &Path) -> Vec<(String, String)> {
    let design = read(&root.join("docs/design.md"));
    let (_, section) = design
        .split_once("\n## Layout\n")
        .expect("docs/design.md has a `## Layout` heading");
    let (_, fenced) = section
        .split_once("```")
        .expect("a fenced block under `## Layout`");
    // The rest of the opening fence's line (a language, if any) is not part of the map.
    let (_, block) = fenced.split_once('\n').expect("the fence's line");
    let (block, _) = block.split_once("```").expect("the layout block ends");
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        if line.starts_with(char::is_whitespace) {
            let (_, text) = entries
                .last_mut()
                .expect("the layout block starts with a path, not an indented line");
            text.push('\n');
            text.push_str(line);
        } else if let Some(path) = line.split_whitespace().next() {
            entries.push((path.to_string(), line.to_string()));
        }
    }
    entries
}

/// The words of a text that can name files: split at everything but letters, digits, `_`, `.`,
/// `/` and `-`, with a sentence's final dot trimmed.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || "_./-".contains(c)))
        .map(|word| word.trim_end_matches('.'))
        .filter(|word| !word.is_empty())
}

#[test]
fn the_layout_map_names_every_source_file_and_nothing_else() {
    let root = root();
    let entries = layout_entries(&root);
    let listed: BTreeSet<&str> = entries.iter().map(|(path, _)| path.as_str()).collect();
    // A set, so that a missing path named in two descriptions is reported once.
    let mut problems = BTreeSet::new();

    // Every file and folder directly under src/ has an entry of its own.
    for (name, is_dir) in entries_of(&root.join("src")) {
        let path = if is_dir {
            format!("src/{name}/")
        } else {
            format!("src/{name}")
        };
        if !listed.contains(path.as_str()) {
            problems.insert(format!("{path} exists but has no entry"));
        }
    }

    // Every file of src/controller/ and of its folders is named in that folder's entry.
    for folder in [
        "src/controller/",
        "src/controller/pass/",
        "src/controller/memory/",
    ] {
        let Some((_, entry)) = entries.iter().find(|(path, _)| path == folder) else {
            problems.insert(format!("the layout map has no entry {folder}"));
            continue;
        };
        let named: BTreeSet<&str> = words(entry).filter(|w| !w.contains('/')).collect();
        for (name, _) in entries_of(&root.join(folder)) {
            if name.ends_with(".rs") && !named.contains(name.as_str()) {
                problems.insert(format!("{folder}{name} exists but is not named"));
            }
        }
    }

    // Nothing named is missing: no entry's path, no `src/...` path anywhere in the map, and no
    // bare `*.rs` named in the entry of a folder under src/ (such a name is a file of it).
    for (path, text) in &entries {
        if !root.join(path).exists() {
            problems.insert(format!("{path} is listed but does not exist"));
        }
        let in_src_folder = path.starts_with("src/") && path.ends_with('/');
        // The entry's own path is reported above; here only the paths its description names.
        for word in words(text).filter(|word| *word != path.as_str()) {
            if word.starts_with("src/") && !root.join(word).exists() {
                problems.insert(format!("{word} is named but does not exist"));
            }
            if in_src_folder
                && !word.contains('/')
                && word.ends_with(".rs")
                && !root.join(path).join(word).exists()
            {
                problems.insert(format!("{path}{word} is named but does not exist"));
            }
        }
    }

    assert!(
        problems.is_empty(),
        "the layout map in docs/design.md is out of step with the source tree:\n{}",
        problems.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn every_file_path_the_docs_name_exists() {
    let root = root();
    let mut missing = Vec::new();
    let mut checked = 0;
    for page in manual(&root) {
        let text = read(&page);
        for (number, line) in text.lines().enumerate() {
            for quoted in line.split('`').skip(1).step_by(2) {
                let named = ["src/", "tests/", "benches/", "hack/", "charts/", "docs/"]
                    .iter()
                    .any(|top| quoted.starts_with(top));
                // A path, not a command line or a glob (`tests/e2e_*.rs`).
                if !named || quoted.contains([' ', '*', '<']) {
                    continue;
                }
                checked += 1;
                if !root.join(quoted).exists() {
                    let page = page.strip_prefix(&root).unwrap_or(&page).display();
                    missing.push(format!("{page}:{}: `{quoted}`", number + 1));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} paths found in the docs");
    assert!(
        missing.is_empty(),
        "the docs name files that do not exist:\n{}",
        missing.join("\n")
    );
}
