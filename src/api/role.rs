//! ValkeyRole: a reusable ACL permission set referenced by cluster ACL users (cluster-scoped).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A reusable set of command-category and command permissions.
#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "valkey.gomomento.com",
    version = "v1alpha1",
    kind = "ValkeyRole",
    shortname = "vkrole",
    category = "valkey",
    doc = "A reusable Valkey ACL permission set: command categories and commands, allowed or denied.",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyRoleSpec {
    /// Command categories, e.g. `{name: read, access: allow}` for `+@read`.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub categories: Vec<Permission>,
    /// Single commands, e.g. `{name: flushall, access: deny}` for `-flushall`.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub commands: Vec<Permission>,
}

/// One allowed or denied category or command.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Permission {
    /// A plain name: a letter, then letters, digits, `_`, `-` or `.`; a command may name a
    /// subcommand as `config|get`.
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z][A-Za-z0-9_.-]*(\|[A-Za-z][A-Za-z0-9_.-]*)?$")
    )]
    pub name: String,
    /// A command's subcommand, as Momento's operator spells it: `{name: config, subcommand:
    /// get}` is `config|get`. Categories have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z][A-Za-z0-9_.-]*$")
    )]
    pub subcommand: Option<String>,
    pub access: Access,
}

impl Permission {
    /// The name as ACL rules write it: `config|get` for a command with a subcommand.
    pub fn acl_name(&self) -> String {
        match &self.subcommand {
            Some(subcommand) => format!("{}|{subcommand}", self.name),
            None => self.name.clone(),
        }
    }
}

/// Whether a permission grants or removes access.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Allow,
    Deny,
}
