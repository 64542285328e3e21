//! A ValkeyCluster's `spec.acl` as Valkey ACL rules. Each user is written whole with one
//! `ACL SETUSER name reset on #hash… (selector)…` (one command, so a client never sees a user
//! half-changed), and each permission becomes one selector: the role's categories and commands
//! on that permission's key patterns, so a role granted on `orders:*` reaches no other key.

use crate::api::{Access, AclPermission, AclUser, KeyAccess, ValkeyRoleSpec};

/// Valkey's built-in user: never rewritten or deleted by the operator.
pub const DEFAULT_USER: &str = "default";

/// The `ACL SETUSER` rules of one user, or the first role it names that does not exist.
pub fn user_rules<'a>(
    user: &AclUser,
    role: impl Fn(&str) -> Option<&'a ValkeyRoleSpec>,
) -> Result<Vec<String>, String> {
    let mut rules = vec!["reset".to_string(), "on".to_string()];
    rules.extend(
        user.password_hashes
            .iter()
            .map(|hash| format!("#{}", hash.0)),
    );
    for permission in &user.permissions {
        let spec = role(&permission.role_ref).ok_or_else(|| {
            format!(
                "user {}: ValkeyRole {} does not exist",
                user.username, permission.role_ref
            )
        })?;
        rules.push(selector(permission, spec));
    }
    Ok(rules)
}

/// `(%R~pattern … +@category … -command …)`: categories first, so a single command can be
/// carved out of (or added to) a category.
fn selector(permission: &AclPermission, role: &ValkeyRoleSpec) -> String {
    let keys = permission.keys.iter().map(|key| {
        let prefix = match key.access {
            KeyAccess::Read => "%R~",
            KeyAccess::Write => "%W~",
            KeyAccess::Readwrite => "~",
        };
        format!("{prefix}{}", key.pattern)
    });
    let categories = role
        .categories
        .iter()
        .map(|c| format!("{}@{}", sign(c.access), c.name.to_ascii_lowercase()));
    let commands = role
        .commands
        .iter()
        .map(|c| format!("{}{}", sign(c.access), c.name.to_ascii_lowercase()));
    let parts: Vec<String> = keys.chain(categories).chain(commands).collect();
    format!("({})", parts.join(" "))
}

fn sign(access: Access) -> char {
    match access {
        Access::Allow => '+',
        Access::Deny => '-',
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{KeyPermission, PasswordHash, Permission};

    fn reader() -> ValkeyRoleSpec {
        ValkeyRoleSpec {
            categories: vec![Permission {
                name: "read".into(),
                access: Access::Allow,
            }],
            commands: vec![Permission {
                name: "KEYS".into(),
                access: Access::Deny,
            }],
        }
    }

    fn user(role_ref: &str) -> AclUser {
        AclUser {
            username: "app".into(),
            password_hashes: vec![PasswordHash("ab".repeat(32))],
            permissions: vec![AclPermission {
                role_ref: role_ref.into(),
                keys: vec![
                    KeyPermission {
                        pattern: "orders:*".into(),
                        access: KeyAccess::Read,
                    },
                    KeyPermission {
                        pattern: "cache:*".into(),
                        access: KeyAccess::Readwrite,
                    },
                ],
            }],
        }
    }

    #[test]
    fn a_permission_is_one_selector_over_its_keys() {
        let role = reader();
        let rules = user_rules(&user("reader"), |name| (name == "reader").then_some(&role));
        assert_eq!(
            rules.unwrap(),
            [
                "reset".to_string(),
                "on".into(),
                format!("#{}", "ab".repeat(32)),
                "(%R~orders:* ~cache:* +@read -keys)".into(),
            ]
        );
    }

    #[test]
    fn a_missing_role_is_named() {
        let error = user_rules(&user("ghost"), |_| None).unwrap_err();
        assert_eq!(error, "user app: ValkeyRole ghost does not exist");
    }
}
