//! Container images without a container engine: an OCI image archive (the layout `ctr images
//! import` reads) assembled from binaries already on this machine and the shared libraries
//! they load, one layer, nothing pulled. The Valkey images mirror the official image where a
//! Pod can tell (the `valkey` user 999, `/data` owned by it, `valkey-server` on `PATH`); the
//! sandbox ("pause") image holds a program that sleeps until it is killed. The operator's
//! image is the repository's Dockerfile without an engine: the binary alone with the C
//! libraries it loads, the distroless `nonroot` user 65532, no shell.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::Error;

/// The uid and gid of the `valkey` user in the official Valkey images.
pub const VALKEY_UID: u64 = 999;

/// The uid and gid of distroless's `nonroot` user, which the operator's image runs as.
pub const NONROOT_UID: u64 = 65532;

/// The sandbox image containerd is configured with; built here, never pulled.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// One image to assemble.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// The full reference containerd stores it under (`docker.io/valkey/valkey:9.0.0`).
    pub reference: String,
    /// Host binaries, each placed at the image path given, with every library it loads.
    pub binaries: Vec<(PathBuf, String)>,
    /// Empty folders: path, mode, owner uid/gid.
    pub folders: Vec<(String, u32, u64)>,
    /// Extra files: path and content (mode 0644, root-owned).
    pub files: Vec<(String, Vec<u8>)>,
    /// `config.User`; empty for root.
    pub user: String,
    pub working_dir: String,
    pub entrypoint: Vec<String>,
    /// `config.Cmd`: the entrypoint's default arguments.
    pub cmd: Vec<String>,
}

impl ImageSpec {
    /// The Valkey image of `version` as the samples name it (`valkey/valkey:<version>`), from
    /// the fetched `valkey-server` of that version, with `cli` as `valkey-cli` beside it (the
    /// liveness probe runs it).
    pub fn valkey(version: &str, server: &Path, cli: &Path) -> Self {
        let passwd = "root:x:0:0:root:/root:/sbin/nologin\nvalkey:x:999:999::/data:/sbin/nologin\n";
        let group = "root:x:0:\nvalkey:x:999:\n";
        Self {
            reference: format!("docker.io/valkey/valkey:{version}"),
            binaries: vec![
                (server.to_path_buf(), "/usr/local/bin/valkey-server".into()),
                (cli.to_path_buf(), "/usr/local/bin/valkey-cli".into()),
            ],
            folders: vec![
                ("/data".into(), 0o755, VALKEY_UID),
                ("/tmp".into(), 0o1777, 0),
            ],
            files: vec![
                ("/etc/passwd".into(), passwd.as_bytes().to_vec()),
                ("/etc/group".into(), group.as_bytes().to_vec()),
            ],
            user: String::new(),
            working_dir: "/data".into(),
            entrypoint: vec!["valkey-server".into()],
            cmd: Vec::new(),
        }
    }

    /// The sandbox image: the host's `sleep`, run as `sleep infinity` (a Pod's sandbox only
    /// holds its namespaces; containerd kills it with SIGKILL).
    pub fn pause() -> Self {
        Self {
            reference: PAUSE_IMAGE.into(),
            binaries: vec![(PathBuf::from("/bin/sleep"), "/pause".into())],
            folders: Vec::new(),
            files: Vec::new(),
            user: "65535:65535".into(),
            working_dir: "/".into(),
            entrypoint: vec!["/pause".into(), "infinity".into()],
            cmd: Vec::new(),
        }
    }

    /// The operator's image as the Dockerfile builds it, under `reference`, from `binary`:
    /// `/usr/local/bin/valkey-operator` as the entrypoint, run as 65532, serving on 8443.
    pub fn operator(reference: &str, binary: &Path) -> Self {
        let passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n";
        let group = "root:x:0:\nnonroot:x:65532:\n";
        let serve = "serve --listen 0.0.0.0:8443 --tls-cert /tls/tls.crt --tls-key /tls/tls.key";
        Self {
            reference: reference.into(),
            binaries: vec![(
                binary.to_path_buf(),
                "/usr/local/bin/valkey-operator".into(),
            )],
            folders: vec![("/home/nonroot".into(), 0o700, NONROOT_UID)],
            files: vec![
                ("/etc/passwd".into(), passwd.as_bytes().to_vec()),
                ("/etc/group".into(), group.as_bytes().to_vec()),
            ],
            user: format!("{NONROOT_UID}:{NONROOT_UID}"),
            working_dir: "/".into(),
            entrypoint: vec!["/usr/local/bin/valkey-operator".into()],
            cmd: serve.split(' ').map(Into::into).collect(),
        }
    }

    /// Writes the image as an OCI archive at `archive`.
    pub fn write_archive(&self, archive: &Path) -> Result<(), Error> {
        let layer = self.layer()?;
        let layer_digest = sha256(&layer);
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "User": self.user,
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "WorkingDir": self.working_dir,
                "Entrypoint": self.entrypoint,
                "Cmd": self.cmd,
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }))
        .map_err(|e| Error::Encoding(format!("an image config: {e}")))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", &layer)],
        }))
        .map_err(|e| Error::Encoding(format!("an image manifest: {e}")))?;
        let tag = self.reference.rsplit(':').next().unwrap_or("latest");
        let mut manifest_descriptor =
            descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
        manifest_descriptor["annotations"] = json!({
            "io.containerd.image.name": self.reference,
            "org.opencontainers.image.ref.name": tag,
        });
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [manifest_descriptor],
        }))
        .map_err(|e| Error::Encoding(format!("an image index: {e}")))?;

        let file = std::fs::File::create(archive)
            .map_err(Error::io(format!("creating {}", archive.display())))?;
        let mut tar = tar::Builder::new(file);
        let mut add = |path: String, data: &[u8]| {
            let mut header = header(tar::EntryType::Regular, data.len(), 0o644, 0);
            tar.append_data(&mut header, path, data)
        };
        let blob = |data: &[u8]| format!("blobs/sha256/{}", hex(&Sha256::digest(data)));
        add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#)
            .and_then(|()| add("index.json".into(), &index))
            .and_then(|()| add(blob(&manifest), &manifest))
            .and_then(|()| add(blob(&config), &config))
            .and_then(|()| add(blob(&layer), &layer))
            .and_then(|()| tar.finish())
            .map_err(Error::io(format!("writing {}", archive.display())))
    }

    /// The one layer: folders, files, each binary and the libraries it loads (at their host
    /// paths, so the binary's interpreter and search path find them).
    fn layer(&self) -> Result<Vec<u8>, Error> {
        let entries = self.entries()?;
        let mut tar = tar::Builder::new(Vec::new());
        let mut folders = BTreeSet::new();
        let mut write = || -> std::io::Result<()> {
            // A listed folder keeps its own owner and mode; the others above a path are root's.
            for (path, mode, owner) in &self.folders {
                add_parents(&mut tar, &mut folders, path)?;
                folders.insert(path.clone());
                tar.append_data(
                    &mut header(tar::EntryType::Directory, 0, *mode, *owner),
                    relative(path),
                    std::io::empty(),
                )?;
            }
            for (path, content, mode) in &entries {
                add_parents(&mut tar, &mut folders, path)?;
                let mut header = header(tar::EntryType::Regular, content.len(), *mode, 0);
                tar.append_data(&mut header, relative(path), content.as_slice())?;
            }
            tar.finish()
        };
        write().map_err(Error::io("assembling an image layer"))?;
        tar.into_inner()
            .map_err(Error::io("assembling an image layer"))
    }

    /// Every file of the layer: path, content, mode (all root's).
    fn entries(&self) -> Result<Vec<(String, Vec<u8>, u32)>, Error> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(Error::io(format!("reading {}", path.display())))
        };
        let mut entries = Vec::new();
        for (host, path) in &self.binaries {
            entries.push((path.clone(), read(host)?, 0o755));
            for library in libraries(host)? {
                entries.push((library.display().to_string(), read(&library)?, 0o755));
            }
        }
        for (path, content) in &self.files {
            entries.push((path.clone(), content.clone(), 0o644));
        }
        Ok(entries)
    }
}

/// The shared libraries `binary` loads, and its interpreter, as `ldd` lists them.
fn libraries(binary: &Path) -> Result<Vec<PathBuf>, Error> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(Error::io(format!("running ldd {}", binary.display())))?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "not a dynamic executable": a static binary needs nothing more.
    Ok(text
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, target)) => target.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Folders above `path` not yet in the layer, root-owned 0755.
fn add_parents(
    tar: &mut tar::Builder<Vec<u8>>,
    parents: &mut BTreeSet<String>,
    path: &str,
) -> std::io::Result<()> {
    let mut above: Vec<String> = Path::new(path)
        .ancestors()
        .skip(1)
        .map(|p| p.display().to_string())
        .filter(|p| p != "/" && !p.is_empty())
        .collect();
    above.reverse();
    for folder in above {
        if parents.insert(folder.clone()) {
            let mut header = header(tar::EntryType::Directory, 0, 0o755, 0);
            tar.append_data(&mut header, relative(&folder), std::io::empty())?;
        }
    }
    Ok(())
}

fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

fn header(kind: tar::EntryType, size: usize, mode: u32, owner: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_size(size as u64);
    header.set_mode(mode);
    header.set_uid(owner);
    header.set_gid(owner);
    header.set_mtime(0);
    header
}

fn descriptor(media_type: &str, content: &[u8]) -> serde_json::Value {
    json!({"mediaType": media_type, "digest": sha256(content), "size": content.len()})
}

fn sha256(content: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(content)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// What `spec`'s archive holds: its outer files, its layer's paths (mode, owner) and its
    /// image config.
    fn open(spec: &ImageSpec) -> (Vec<String>, BTreeMap<String, (u32, u64)>, serde_json::Value) {
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("image.tar");
        spec.write_archive(&archive).unwrap();

        let mut outer = tar::Archive::new(std::fs::File::open(&archive).unwrap());
        let mut names = Vec::new();
        let mut layer = Vec::new();
        let mut config = serde_json::Value::Null;
        for entry in outer.entries().unwrap() {
            let mut entry = entry.unwrap();
            names.push(entry.path().unwrap().display().to_string());
            let mut content = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut content).unwrap();
            match serde_json::from_slice::<serde_json::Value>(&content) {
                Ok(json) if json.get("rootfs").is_some() => config = json,
                Ok(_) => {}
                Err(_) if content.len() > 1_000_000 => layer = content,
                Err(_) => {}
            }
        }
        let mut inside = BTreeMap::new();
        for entry in tar::Archive::new(layer.as_slice()).entries().unwrap() {
            let entry = entry.unwrap();
            let header = entry.header();
            inside.insert(
                entry.path().unwrap().display().to_string(),
                (header.mode().unwrap(), header.uid().unwrap()),
            );
        }
        (names, inside, config)
    }

    #[test]
    fn a_valkey_image_holds_the_server_its_libraries_and_the_valkey_user_data_dir() {
        let sleep = Path::new("/bin/sleep");
        let (names, inside, _) = open(&ImageSpec::valkey("9.9.9", sleep, sleep));
        assert!(names.contains(&"index.json".to_string()), "{names:?}");
        assert!(names.contains(&"oci-layout".to_string()), "{names:?}");
        assert_eq!(inside["usr/local/bin/valkey-server"], (0o755, 0));
        assert_eq!(inside["usr/local/bin/valkey-cli"], (0o755, 0));
        assert_eq!(inside["data"], (0o755, VALKEY_UID));
        assert!(
            inside.keys().any(|path| path.contains("libc.so")),
            "the C library travels with the binary: {inside:?}"
        );
    }

    #[test]
    fn the_operator_image_runs_its_binary_as_nonroot_without_a_shell() {
        let spec = ImageSpec::operator(
            "docker.io/library/valkey-operator:t",
            Path::new("/bin/sleep"),
        );
        let (_, inside, config) = open(&spec);
        assert_eq!(inside["usr/local/bin/valkey-operator"], (0o755, 0));
        assert!(
            !inside
                .keys()
                .any(|path| path.ends_with("bin/sh") || path.ends_with("bash")),
            "a shell in the image: {inside:?}"
        );
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/usr/local/bin/valkey-operator"])
        );
        assert_eq!(config["config"]["Cmd"][0], "serve");
    }
}
