//! How a container spec becomes a local process (pure functions): which Valkey version an
//! image names, Kubernetes' `$(VAR)` expansion, the image entrypoint's argument rules, and
//! the mapping of volume mount paths to per-Pod folders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::KeyToPath;

/// The Valkey version an image's tag names: `valkey/valkey:9.1.2` and
/// `docker.io/valkey/valkey:9.1.2-alpine` name `9.1.2`; an untagged or non-version tag
/// names none.
pub fn valkey_version(image: &str) -> Option<String> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let (name, tag) = without_digest.rsplit_once(':')?;
    if tag.contains('/') || name.is_empty() {
        return None; // the colon belonged to a registry port
    }
    let version = tag.split('-').next().unwrap_or(tag);
    let parts: Vec<&str> = version.split('.').collect();
    let numeric = parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    numeric.then(|| version.to_string())
}

/// Kubernetes' expansion of `$(VAR)` in env values, command and args: a defined variable
/// is replaced, an undefined one is left as written, and `$$` escapes a `$`.
pub fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(close) = body.find(')')
        {
            let name = &body[..close];
            match vars.get(name) {
                Some(value) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The argv a Valkey image would run for this container. Without `command` the image's
/// entrypoint applies: no args runs `valkey-server`, and args that start with `-` or name
/// a `.conf` file are passed to `valkey-server`. An explicit `docker-entrypoint.sh` is
/// handled the same way.
pub fn argv(command: &[String], args: &[String]) -> Vec<String> {
    let mut argv: Vec<String> = command.iter().chain(args).cloned().collect();
    let through_entrypoint = command.is_empty() || basename(&argv[0]) == "docker-entrypoint.sh";
    if !command.is_empty() && through_entrypoint {
        argv.remove(0);
    }
    let needs_server = argv
        .first()
        .is_none_or(|first| first.starts_with('-') || first.ends_with(".conf"));
    if through_entrypoint && needs_server {
        argv.insert(0, "valkey-server".to_string());
    }
    argv
}

/// The program to execute for `argv[0]`: `valkey-server` by any path is the binary of
/// the image's version; anything else is looked up on PATH (which the kubelet starts with
/// that binary's folder, so `sh -c "exec valkey-server ..."` works too).
pub fn program(argv0: &str, valkey_server: &Path) -> PathBuf {
    if basename(argv0) == "valkey-server" {
        valkey_server.to_path_buf()
    } else {
        PathBuf::from(argv0)
    }
}

/// A Secret or ConfigMap volume's files: every key, or with `items` only the keys listed, each
/// at its `path` (a key listed but absent fails the volume, as on a real kubelet).
pub fn project(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let Some(items) = items else {
        return Ok(data);
    };
    items
        .iter()
        .map(|item| {
            let content = data
                .get(&item.key)
                .ok_or_else(|| format!("key {:?} not found", item.key))?;
            Ok((item.path.clone(), content.clone()))
        })
        .collect()
}

/// Rewrites an argument that names a path under a volume mount to the Pod's folder for
/// that volume: with `/data` mounted, `/data/nodes.conf` becomes `<pod>/volumes/data/nodes.conf`.
/// Mounts are `(mount path, host folder)`; the longest matching mount wins.
pub fn map_mounts(arg: &str, mounts: &[(String, PathBuf)]) -> String {
    mounts
        .iter()
        .filter_map(|(mount, host)| {
            let mount = mount.trim_end_matches('/');
            let rest = arg.strip_prefix(mount)?;
            (rest.is_empty() || rest.starts_with('/')).then_some((mount.len(), host, rest))
        })
        .max_by_key(|(len, _, _)| *len)
        .map(|(_, host, rest)| format!("{}{rest}", host.display()))
        .unwrap_or_else(|| arg.to_string())
}

/// The client port the container serves Valkey on: `--port N` in its argv, else 6379.
pub fn valkey_port(argv: &[String]) -> u16 {
    argv.windows(2)
        .find(|pair| pair[0] == "--port")
        .and_then(|pair| pair[1].parse().ok())
        .unwrap_or(6379)
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_choose_the_keys_and_their_paths() {
        let data = BTreeMap::from([
            ("password".to_string(), b"p".to_vec()),
            ("auth.conf".to_string(), b"user default off".to_vec()),
        ]);
        assert_eq!(project(data.clone(), None).unwrap(), data);
        let only = [KeyToPath {
            key: "auth.conf".into(),
            path: "conf/auth.conf".into(),
            mode: None,
        }];
        assert_eq!(
            project(data.clone(), Some(&only)).unwrap(),
            BTreeMap::from([("conf/auth.conf".to_string(), b"user default off".to_vec())])
        );
        let missing = [KeyToPath {
            key: "nope".into(),
            path: "nope".into(),
            mode: None,
        }];
        assert_eq!(
            project(data, Some(&missing)).unwrap_err(),
            "key \"nope\" not found"
        );
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn versions_come_from_the_tag() {
        assert_eq!(
            valkey_version("valkey/valkey:9.1.2").as_deref(),
            Some("9.1.2")
        );
        assert_eq!(
            valkey_version("docker.io/valkey/valkey:9.0.0-alpine").as_deref(),
            Some("9.0.0")
        );
        assert_eq!(
            valkey_version("registry:5000/valkey/valkey:9.0.0@sha256:abc").as_deref(),
            Some("9.0.0")
        );
        assert_eq!(valkey_version("registry:5000/valkey/valkey"), None);
        assert_eq!(valkey_version("valkey/valkey:latest"), None);
        assert_eq!(valkey_version("valkey/valkey"), None);
        assert_eq!(valkey_version("busybox:1.36"), None);
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let vars = BTreeMap::from([
            ("POD_IP".to_string(), "127.0.0.7".to_string()),
            ("NAME".to_string(), "shard-0".to_string()),
        ]);
        assert_eq!(
            expand("--cluster-announce-ip $(POD_IP)", &vars),
            "--cluster-announce-ip 127.0.0.7"
        );
        assert_eq!(expand("$(NAME).$(POD_IP)", &vars), "shard-0.127.0.0.7");
        assert_eq!(expand("$(MISSING)", &vars), "$(MISSING)");
        assert_eq!(expand("$$(POD_IP)", &vars), "$(POD_IP)");
        assert_eq!(expand("cost $5 $(", &vars), "cost $5 $(");
    }

    #[test]
    fn entrypoint_rules_pick_valkey_server() {
        assert_eq!(argv(&[], &[]), strings(&["valkey-server"]));
        assert_eq!(
            argv(&[], &strings(&["--port", "6379"])),
            strings(&["valkey-server", "--port", "6379"])
        );
        assert_eq!(
            argv(
                &strings(&["docker-entrypoint.sh"]),
                &strings(&["/etc/valkey.conf"])
            ),
            strings(&["valkey-server", "/etc/valkey.conf"])
        );
        assert_eq!(
            argv(&strings(&["sh", "-c"]), &strings(&["exec valkey-server"])),
            strings(&["sh", "-c", "exec valkey-server"])
        );
        let server = Path::new("/cache/9.1.2/valkey-server");
        assert_eq!(program("/usr/local/bin/valkey-server", server), server);
        assert_eq!(program("sh", server), Path::new("sh"));
    }

    #[test]
    fn mount_paths_map_to_pod_folders() {
        let mounts = vec![
            ("/data".to_string(), PathBuf::from("/pod/volumes/data")),
            (
                "/data/conf/".to_string(),
                PathBuf::from("/pod/volumes/conf"),
            ),
        ];
        assert_eq!(map_mounts("/data", &mounts), "/pod/volumes/data");
        assert_eq!(
            map_mounts("/data/x.rdb", &mounts),
            "/pod/volumes/data/x.rdb"
        );
        assert_eq!(
            map_mounts("/data/conf/a.conf", &mounts),
            "/pod/volumes/conf/a.conf"
        );
        assert_eq!(map_mounts("/database", &mounts), "/database");
        assert_eq!(map_mounts("--port", &mounts), "--port");
    }

    #[test]
    fn port_comes_from_argv() {
        assert_eq!(valkey_port(&strings(&["valkey-server"])), 6379);
        assert_eq!(
            valkey_port(&strings(&["valkey-server", "--port", "7000"])),
            7000
        );
    }
}
