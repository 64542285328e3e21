//! The operator's own credentials per cluster as last read, and the version of each managed
//! Secret the watch saw, so an unchanged credentials Secret is not read again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use crate::api::ClusterKey;
use crate::controller::memory::{ClusterMemory, KeptPerCluster, PerCluster};
use crate::credentials::{CREDENTIALS_SUFFIX, SystemCredentials, secret_name};

/// The last credentials read for each cluster, with the Secret version they were read at
/// (`None` once the operator wrote the Secret: what it wrote must be read back first).
#[derive(Debug, Default)]
pub struct Known(PerCluster<(SystemCredentials, Option<ReadAt>)>);

/// The Secret as a pass read it: its version, and whether a person asked for a rotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::controller) struct ReadAt {
    resource_version: String,
    rotate_asked: bool,
}

impl Known {
    pub fn get(&self, cluster: &ClusterKey) -> Option<SystemCredentials> {
        let known = self.0.lock();
        known
            .get(cluster)
            .map(|(credentials, _)| credentials.clone())
    }

    /// What was read, if the Secret is still at the version `current` it was read at.
    pub fn unchanged(&self, cluster: &ClusterKey, current: Option<&str>) -> Option<Read> {
        let known = self.0.lock();
        let (credentials, at) = known.get(cluster)?;
        let at = at.as_ref()?;
        let same = Some(at.resource_version.as_str()) == current;
        same.then(|| Read {
            credentials: credentials.clone(),
            rotate_asked: at.rotate_asked,
        })
    }

    pub fn remember(&self, cluster: &ClusterKey, read: &Read, version: Option<String>) {
        let at = version.map(|resource_version| ReadAt {
            resource_version,
            rotate_asked: read.rotate_asked,
        });
        let mut known = self.0.lock();
        known.insert(cluster.clone(), (read.credentials.clone(), at));
    }

    /// The operator wrote the cluster's Secret: the next pass reads it again.
    pub fn written(&self, cluster: &ClusterKey) {
        let mut known = self.0.lock();
        if let Some((_, at)) = known.get_mut(cluster) {
            *at = None;
        }
    }
}

/// The `resourceVersion` of each Secret the operator manages, as the metadata watch last
/// reported it: a Secret still at the version a pass read it at need not be read again.
#[derive(Debug, Default)]
pub struct SecretVersions(Mutex<HashMap<(String, String), String>>);

impl SecretVersions {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The watch saw the Secret at `version`, or deleted (`None`).
    pub fn saw(&self, namespace: &str, name: &str, version: Option<String>) {
        let mut versions = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        match version {
            Some(version) => versions.insert(key, version),
            None => versions.remove(&key),
        };
    }

    pub fn current(&self, namespace: &str, name: &str) -> Option<String> {
        let versions = self.lock();
        versions
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }
}

impl ClusterMemory for SecretVersions {
    fn forget(&self, cluster: &ClusterKey) {
        self.lock().remove(&secret_of(cluster));
    }

    /// A new watch (a new term of leadership) reports every Secret again.
    fn reset(&self) {
        self.lock().clear();
    }

    fn clusters(&self) -> BTreeSet<ClusterKey> {
        let versions = self.lock();
        let clusters = versions.keys().filter_map(|(namespace, name)| {
            let cluster = name.strip_suffix(CREDENTIALS_SUFFIX)?;
            Some(ClusterKey::new(namespace.clone(), cluster.to_owned()))
        });
        clusters.collect()
    }

    #[cfg(test)]
    fn sample(&self, cluster: &ClusterKey) {
        self.lock().insert(secret_of(cluster), "1".to_owned());
    }
}

impl KeptPerCluster for Known {
    type Entry = (SystemCredentials, Option<ReadAt>);

    fn entries(&self) -> &PerCluster<Self::Entry> {
        &self.0
    }

    #[cfg(test)]
    fn sample_entry() -> Self::Entry {
        let current = crate::credentials::Passwords {
            operator: String::new(),
            replication: String::new(),
        };
        let rotation = crate::credentials::Rotation::Steady;
        (SystemCredentials { current, rotation }, None)
    }
}

/// The credentials as the Secret holds them after this pass's reading, and whether a person
/// asked for a rotation.
#[derive(Clone, Debug)]
pub struct Read {
    pub credentials: SystemCredentials,
    pub rotate_asked: bool,
}

/// The Secrets a cluster's memory covers: its credentials.
pub fn secret_of(cluster: &ClusterKey) -> (String, String) {
    (cluster.namespace.clone(), secret_name(&cluster.name))
}
