//! Validating admission for the five kinds. Each kind has a pure validator (one file each) that
//! takes the object under review, the [`Fleet`](crate::fleet::Fleet) index and the operator's
//! [`Policy`], and returns every violation and warning at once; [`http`] turns AdmissionReviews
//! into calls of those validators and their verdicts into responses.

mod cluster;
mod config;
mod effects;
pub mod eviction;
#[cfg(test)]
mod fixtures;
pub mod http;
mod image;
mod impact;
mod node;
mod role;
mod users;
pub mod version;

pub use cluster::validate_cluster;
pub use config::validate_config;
pub use image::validate_image;
pub use node::validate_node;
pub use role::validate_role;

use kube::core::admission::Operation;

use crate::api::bounds::Caps;
use crate::settings::OperatorSettings;
use crate::words::some_of;

/// Operator settings that change what admission allows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Above this many clusters, a change that rolls clusters at once is refused unless the
    /// config carries the acknowledgement annotation. `None`: only warn (the default).
    pub fleet_roll_ack_threshold: Option<usize>,
    /// The largest cluster a tenant may create or grow to.
    pub caps: Caps,
    /// The only user that may create a ValkeyNode or change its spec: the operator's own
    /// identity. `None` (an admission server without a controller, as in tests): anyone.
    pub node_writer: Option<String>,
}

impl Policy {
    /// Admission's share of the operator's settings; `node_writer` is the operator's identity.
    pub fn of(settings: &OperatorSettings, node_writer: Option<String>) -> Self {
        Self {
            fleet_roll_ack_threshold: settings.fleet_roll_ack_threshold,
            caps: settings.caps,
            node_writer,
        }
    }
}

/// The object under review, as the validators see it.
#[derive(Clone, Debug)]
pub struct Review<'a, T> {
    pub operation: Operation,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    /// The new object (create, update).
    pub object: Option<&'a T>,
    /// The stored object (update, delete).
    pub old: Option<&'a T>,
    /// Who sent the request, as the API server authenticated them.
    pub user: Option<&'a str>,
    /// When it is judged: what a maintenance window allows depends on it.
    pub now: k8s_openapi::jiff::Timestamp,
}

/// What a validator decided: the request is allowed when `denials` is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub denials: Vec<String>,
    pub warnings: Vec<String>,
}

impl Verdict {
    pub fn deny(&mut self, reason: impl Into<String>) {
        self.denials.push(reason.into());
    }

    pub fn warn(&mut self, warning: impl Into<String>) {
        self.warnings.push(warning.into());
    }

    pub fn allowed(&self) -> bool {
        self.denials.is_empty()
    }
}

/// The API server truncates warnings past 256 characters; keep each one whole and readable.
const MAX_WARNING_CHARS: usize = 256;

fn clip(text: String) -> String {
    crate::words::clip_chars(text, MAX_WARNING_CHARS)
}

fn plural(count: usize, singular: &str) -> String {
    if count == 1 {
        format!("1 {singular}")
    } else {
        format!("{count} {singular}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_warnings_under_the_api_server_limit() {
        let long = "x".repeat(400);
        let clipped = clip(long);
        assert_eq!(clipped.chars().count(), MAX_WARNING_CHARS);
        assert!(clipped.ends_with('…'));
        assert_eq!(clip("short".into()), "short");
    }
}
