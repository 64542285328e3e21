//! A ValkeyCluster's `spec.acl` as Valkey ACL rules, built from typed parts. Each user is
//! written whole with one `ACL SETUSER name reset on #hash… (selector)…` (one command, so a
//! client never sees a user half-changed), and each permission becomes one selector: the
//! role's categories and commands on that permission's key patterns, so a role granted on
//! `orders:*` reaches no other key.
//!
//! Valkey splits a selector on spaces and honours quotes inside it, so a key pattern such as
//! `* +@all` pasted into one would grant every command. Key patterns and names are therefore
//! checked here when a rule is built (the same checks admission makes, see
//! [`crate::api::bounds::acl_syntax_problems`]): a rule holds only text Valkey reads as one
//! token.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::api::{Access, AclPermission, AclUser, KeyAccess, SecretKeyRef, ValkeyRoleSpec};

/// Valkey's built-in user: never rewritten or deleted by the operator.
pub const DEFAULT_USER: &str = "default";
/// The user the operator connects as (its grants: [`crate::credentials`]).
pub const OPERATOR_USER: &str = "valkey-operator";
/// The user replicas authenticate to their primary as.
pub const REPLICATION_USER: &str = "valkey-replication";

/// User names no `spec.acl` may take: Valkey's own, and the two the operator keeps for itself
/// (its own connection and replication, see `docs/credentials.md`), reserved before they exist
/// so that no tenant holds one when they arrive. The operator never writes nor deletes them
/// as a tenant's.
pub const RESERVED_USERS: [&str; 3] = [DEFAULT_USER, OPERATOR_USER, REPLICATION_USER];

/// SHA-256 of a password, as Valkey's `#<hash>` rule takes it.
pub fn password_hash(password: &[u8]) -> String {
    Sha256::digest(password)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Whether `name` is one of [`RESERVED_USERS`].
pub fn is_reserved(name: &str) -> bool {
    RESERVED_USERS.contains(&name)
}

/// Characters a key pattern may not hold: Valkey's ACL parser splits on whitespace and quotes
/// on `"` and `'`; parentheses delimit selectors.
const PATTERN_FORBIDDEN: &[char] = &['"', '\'', '(', ')'];

/// Why a key pattern cannot be an ACL rule, if it cannot.
pub fn check_key_pattern(pattern: &str) -> Result<(), String> {
    check_pattern(pattern, "a key pattern")
}

/// Why a Pub/Sub channel pattern cannot be an ACL rule, if it cannot.
pub fn check_channel_pattern(pattern: &str) -> Result<(), String> {
    check_pattern(pattern, "a channel pattern")
}

fn check_pattern(pattern: &str, what: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err(format!("{what} cannot be empty"));
    }
    match pattern
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || PATTERN_FORBIDDEN.contains(c))
    {
        Some(found) => Err(format!(
            "{pattern:?} holds {found:?}; {what} may not hold whitespace, quotes, parentheses or control characters (Valkey's ACL parser would read it as more than one rule)"
        )),
        None => Ok(()),
    }
}

/// ACL syntax a name might be written with; the `access` field says allow or deny instead.
const SIGILS: [char; 5] = ['@', '+', '-', '~', '&'];

/// Why a command-category name is not a plain name (`read`, `keyspace`), if it is not.
pub fn check_category(name: &str) -> Result<(), String> {
    if plain_name(name) {
        Ok(())
    } else {
        Err(not_plain(
            name,
            "a category name: a letter, then letters, digits, '_', '-' or '.'",
        ))
    }
}

/// The refusal of a name, with the plain name when ACL syntax was written around it.
fn not_plain(name: &str, what: &str) -> String {
    let bare = name.trim_start_matches(SIGILS);
    if bare.len() < name.len() && (plain_name(bare) || bare.contains('|')) {
        format!("write {bare:?} without ACL syntax (the access field says allow or deny)")
    } else {
        format!("{name:?} is not {what}")
    }
}

/// Why a command name is not a plain name (`get`, `config|get`), if it is not.
pub fn check_command(name: &str) -> Result<(), String> {
    let mut parts = name.splitn(2, '|');
    let command = parts.next().unwrap_or_default();
    if plain_name(command) && parts.next().is_none_or(plain_name) {
        Ok(())
    } else {
        Err(not_plain(
            name,
            "a command name: a letter, then letters, digits, '_', '-' or '.', optionally '|' and a subcommand",
        ))
    }
}

fn plain_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Why a password hash is not 64 lowercase hex digits, if it is not.
pub fn check_password_hash(hash: &str) -> Result<(), String> {
    if hash.len() == 64 && hash.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')) {
        Ok(())
    } else {
        Err("a password hash is the SHA-256 of the password as 64 lowercase hex digits".into())
    }
}

/// One argument of `ACL SETUSER`, each known to be read by Valkey as exactly one rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Forget every earlier rule of the user: the user is written whole.
    Reset,
    /// The user may log in.
    On,
    /// The user may not log in (connections already logged in as it lose every command).
    Off,
    /// One command, `command|subcommand` or `@category` allowed outside any key pattern: the
    /// operator's own users, whose grants are constants of [`crate::credentials`].
    Allow(&'static str),
    /// The same, taken away.
    Deny(&'static str),
    /// Every key (`~*`), and every channel (`&*`): only the replication user, whose login
    /// runs the data a slot migration moves.
    AllKeys,
    AllChannels,
    /// One password, by its SHA-256.
    PasswordHash(String),
    /// Commands on key patterns.
    Selector(Selector),
}

/// Taken from every tenant selector, whatever its role grants, and last so no grant comes
/// after: administrative commands (`CONFIG`, `ACL`, `CLUSTER MEET`/`RESET`/`FAILOVER`,
/// `SHUTDOWN`, `DEBUG`, …) are the operator's, and the keyless commands that reach every key
/// would cross the key patterns that keep one user's keys from another's. (`@write` alone
/// grants `FLUSHALL`.)
pub const ALWAYS_DENIED: [&str; 4] = ["-@admin", "-flushall", "-flushdb", "-swapdb"];

/// Taken from every selector that may not read every key: the commands that list key names
/// whatever the key patterns (Valkey checks patterns against the keys a command names, and
/// these name none), so a user limited to `orders:*` would read every other user's key names.
/// `CLIENT TRACKING` (in `@connection`) is one too: in `BCAST` mode it sends the connection
/// the name of every key anyone writes under its prefixes. A selector that reads `*` keeps
/// them (`SCAN` is how tools walk a keyspace).
pub const LIST_KEY_NAMES: [&str; 5] = [
    "-keys",
    "-scan",
    "-randomkey",
    "-cluster|getkeysinslot",
    "-client|tracking",
];

/// `(%R~pattern … &channel … +@category … -command … -@admin …)`: categories first, so a
/// single command can be carved out of (or added to) a category, then [`ALWAYS_DENIED`] and,
/// unless it reads every key, [`LIST_KEY_NAMES`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    keys: Vec<(KeyAccess, String)>,
    channels: Vec<String>,
    categories: Vec<(Access, String)>,
    commands: Vec<(Access, String)>,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Reset => f.write_str("reset"),
            Rule::On => f.write_str("on"),
            Rule::Off => f.write_str("off"),
            Rule::Allow(command) => write!(f, "+{command}"),
            Rule::Deny(command) => write!(f, "-{command}"),
            Rule::AllKeys => f.write_str("~*"),
            Rule::AllChannels => f.write_str("&*"),
            Rule::PasswordHash(hash) => write!(f, "#{hash}"),
            Rule::Selector(selector) => write!(f, "{selector}"),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self.keys.iter().map(|(access, pattern)| {
            let prefix = match access {
                KeyAccess::Read => "%R~",
                KeyAccess::Write => "%W~",
                KeyAccess::Readwrite => "~",
            };
            format!("{prefix}{pattern}")
        });
        let channels = self.channels.iter().map(|pattern| format!("&{pattern}"));
        let categories = self
            .categories
            .iter()
            .map(|(access, name)| format!("{}@{name}", sign(*access)));
        let commands = self
            .commands
            .iter()
            .map(|(access, name)| format!("{}{name}", sign(*access)));
        let reads_every_key = self
            .keys
            .iter()
            .any(|(access, pattern)| pattern == "*" && *access != KeyAccess::Write);
        let listing: &[&str] = if reads_every_key {
            &[]
        } else {
            &LIST_KEY_NAMES
        };
        let denied = ALWAYS_DENIED.iter().chain(listing).map(ToString::to_string);
        let parts: Vec<String> = keys
            .chain(channels)
            .chain(categories)
            .chain(commands)
            .chain(denied)
            .collect();
        write!(f, "({})", parts.join(" "))
    }
}

fn sign(access: Access) -> char {
    match access {
        Access::Allow => '+',
        Access::Deny => '-',
    }
}

/// Why a user's rules could not be built; that user is left as it is on the nodes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("user {user}: ValkeyRole {role} does not exist")]
    RoleMissing { user: String, role: String },
    #[error("user {user}: {field}: {message}")]
    Invalid {
        user: String,
        field: String,
        message: String,
    },
    #[error("user {user}: passwordSecretRef: {problem}")]
    SecretUnreadable { user: String, problem: String },
    /// The user's rules, or all users' together, are past the bounds of [`Cost`].
    #[error("user {user}: {problem}")]
    TooLarge { user: String, problem: String },
}

/// The `ACL SETUSER` rules of one user, or why there are none. `secret_hash` gives the SHA-256
/// of the password a Secret holds (the password itself never reaches this module).
pub fn user_rules<'a>(
    user: &AclUser,
    role: impl Fn(&str) -> Option<&'a ValkeyRoleSpec>,
    secret_hash: impl Fn(&SecretKeyRef) -> Result<String, String>,
) -> Result<Vec<Rule>, AclError> {
    let invalid = |field: String, message: String| AclError::Invalid {
        user: user.username.clone(),
        field,
        message,
    };
    if is_reserved(&user.username) {
        let message = format!("{:?} is reserved for Valkey or the operator", user.username);
        return Err(invalid("username".into(), message));
    }
    let mut rules = vec![Rule::Reset, Rule::On];
    for hash in &user.password_hashes {
        check_password_hash(&hash.0).map_err(|m| invalid("passwordHashes".into(), m))?;
        rules.push(Rule::PasswordHash(hash.0.clone()));
    }
    if let Some(secret) = &user.password_secret_ref {
        let hash = secret_hash(secret).map_err(|problem| AclError::SecretUnreadable {
            user: user.username.clone(),
            problem,
        })?;
        rules.push(Rule::PasswordHash(hash));
    }
    for permission in &user.permissions {
        let spec = role(&permission.role_ref).ok_or_else(|| AclError::RoleMissing {
            user: user.username.clone(),
            role: permission.role_ref.clone(),
        })?;
        let selector = selector(permission, spec).map_err(|(field, m)| invalid(field, m))?;
        rules.push(Rule::Selector(selector));
    }
    Ok(rules)
}

/// One permission's selector, every part checked.
fn selector(
    permission: &AclPermission,
    role: &ValkeyRoleSpec,
) -> Result<Selector, (String, String)> {
    let mut keys = Vec::new();
    for key in &permission.keys {
        check_key_pattern(&key.pattern).map_err(|m| ("key pattern".to_string(), m))?;
        keys.push((key.access, key.pattern.clone()));
    }
    let mut channels = Vec::new();
    for channel in &permission.channels {
        check_channel_pattern(&channel.0).map_err(|m| ("channel".to_string(), m))?;
        channels.push(channel.0.clone());
    }
    let named =
        |entries: &[crate::api::Permission], field: &str, check: fn(&str) -> Result<(), String>| {
            entries
                .iter()
                .map(|entry| {
                    let name = entry.acl_name();
                    check(&name)
                        .map(|()| (entry.access, name.to_ascii_lowercase()))
                        .map_err(|m| (format!("ValkeyRole {} {field}", permission.role_ref), m))
                })
                .collect::<Result<Vec<_>, _>>()
        };
    Ok(Selector {
        keys,
        channels,
        categories: named(&role.categories, "category", check_category)?,
        commands: named(&role.commands, "command", check_command)?,
    })
}

/// The rules as `ACL SETUSER`'s arguments.
pub fn arguments(rules: &[Rule]) -> Vec<String> {
    rules.iter().map(ToString::to_string).collect()
}

/// What ACL rules cost a node: the tokens Valkey parses (each key pattern, category and command
/// of a selector is one) and the bytes `ACL SETUSER` carries. Each permission copies its role's
/// entries, so a spec within every per-list limit can still expand to a million tokens (64 users
/// × 32 permissions × 512 entries): the bounds are on what it expands to ([`MAX_USER_TOKENS`],
/// [`MAX_NODE_BYTES`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    pub tokens: usize,
    pub bytes: usize,
}

impl std::ops::Add for Cost {
    type Output = Cost;

    fn add(self, other: Cost) -> Cost {
        Cost {
            tokens: self.tokens + other.tokens,
            bytes: self.bytes + other.bytes,
        }
    }
}

impl std::iter::Sum for Cost {
    fn sum<I: Iterator<Item = Cost>>(costs: I) -> Cost {
        costs.fold(Cost::default(), |a, b| a + b)
    }
}

/// The most tokens one user's rules may expand to.
pub const MAX_USER_TOKENS: usize = 4096;
/// The most bytes every user of a cluster together may expand to: what each node is written.
pub const MAX_NODE_BYTES: usize = 1024 * 1024;

/// A token of `text` bytes, with the space that separates it from the next.
fn token(bytes: usize) -> Cost {
    Cost {
        tokens: 1,
        bytes: bytes + 1,
    }
}

/// What one user costs before its roles: its name, `reset on`, its password hashes (a Secret's
/// counts as one), each selector's key patterns and always-denied commands; and per permission
/// the role it names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserCost {
    pub own: Cost,
    pub roles: Vec<String>,
}

impl UserCost {
    pub fn of(user: &AclUser) -> Self {
        let hashes = user.password_hashes.len() + usize::from(user.password_secret_ref.is_some());
        let denied: Cost = ALWAYS_DENIED
            .iter()
            .chain(&LIST_KEY_NAMES)
            .map(|d| token(d.len()))
            .sum();
        let own = token(user.username.len())
            + token("reset".len())
            + token("on".len())
            + (0..hashes).map(|_| token(65)).sum()
            + user
                .permissions
                .iter()
                .map(|p| {
                    // `(`, `)` and the access prefix of each pattern (`%R~` at most).
                    let keys: Cost = p.keys.iter().map(|k| token(k.pattern.len() + 3)).sum();
                    let channels: Cost = p.channels.iter().map(|c| token(c.0.len() + 1)).sum();
                    keys + channels
                        + denied
                        + Cost {
                            tokens: 0,
                            bytes: 2,
                        }
                })
                .sum();
        Self {
            own,
            roles: user
                .permissions
                .iter()
                .map(|p| p.role_ref.clone())
                .collect(),
        }
    }

    /// The whole cost, with each role's as `role` says (a missing role costs nothing: that user
    /// is not written at all).
    pub fn with_roles(&self, role: impl Fn(&str) -> Option<Cost>) -> Cost {
        self.own + self.roles.iter().filter_map(|r| role(r)).sum()
    }
}

/// What a role adds to each permission that names it: one token per category and command.
pub fn role_cost(role: &ValkeyRoleSpec) -> Cost {
    let categories = role
        .categories
        .iter()
        .map(|c| token(c.acl_name().len() + 2));
    let commands = role.commands.iter().map(|c| token(c.acl_name().len() + 1));
    categories.chain(commands).sum()
}

/// Why users' rules are too large, naming the user (by its index in `spec.acl`) and the limit.
pub fn cost_problems(
    users: &[UserCost],
    role: impl Fn(&str) -> Option<Cost>,
) -> Vec<(Option<usize>, String)> {
    let mut problems = Vec::new();
    let mut total = 0;
    for (index, user) in users.iter().enumerate() {
        let cost = user.with_roles(&role);
        if cost.tokens > MAX_USER_TOKENS {
            problems.push((
                Some(index),
                format!(
                    "expands to {} ACL rules (its roles' entries once per permission, and its key patterns); at most {MAX_USER_TOKENS} per user are allowed",
                    cost.tokens
                ),
            ));
        }
        total += cost.bytes;
    }
    if total > MAX_NODE_BYTES {
        problems.push((
            None,
            format!(
                "expands to {total} bytes of ACL rules written on every node; at most {MAX_NODE_BYTES} are allowed"
            ),
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ChannelPattern, KeyPermission, PasswordHash, Permission};

    fn no_secret(secret: &SecretKeyRef) -> Result<String, String> {
        Err(format!("Secret {} was not expected", secret.name))
    }

    fn reader() -> ValkeyRoleSpec {
        ValkeyRoleSpec {
            categories: vec![Permission {
                name: "read".into(),
                subcommand: None,
                access: Access::Allow,
            }],
            commands: vec![Permission {
                name: "KEYS".into(),
                subcommand: None,
                access: Access::Deny,
            }],
        }
    }

    fn user_with_patterns(role_ref: &str, patterns: &[&str]) -> AclUser {
        AclUser {
            username: "app".into(),
            password_hashes: vec![PasswordHash("ab".repeat(32))],
            password_secret_ref: None,
            permissions: vec![AclPermission {
                role_ref: role_ref.into(),
                channels: vec![],
                keys: patterns
                    .iter()
                    .zip([KeyAccess::Read, KeyAccess::Readwrite, KeyAccess::Write])
                    .map(|(pattern, access)| KeyPermission {
                        pattern: (*pattern).into(),
                        access,
                    })
                    .collect(),
            }],
        }
    }

    fn user(role_ref: &str) -> AclUser {
        user_with_patterns(role_ref, &["orders:*", "cache:*"])
    }

    #[test]
    fn a_permission_is_one_selector_over_its_keys() {
        let role = reader();
        let rules = user_rules(
            &user("reader"),
            |name| (name == "reader").then_some(&role),
            no_secret,
        );
        assert_eq!(
            arguments(&rules.unwrap()),
            [
                "reset".to_string(),
                "on".into(),
                format!("#{}", "ab".repeat(32)),
                "(%R~orders:* ~cache:* +@read -keys -@admin -flushall -flushdb -swapdb -keys -scan -randomkey -cluster|getkeysinslot -client|tracking)".into(),
            ]
        );
    }

    #[test]
    fn channels_and_subcommands_are_written_as_momentos_operator_spells_them() {
        let mut role = reader();
        role.commands[0] = Permission {
            name: "config".into(),
            subcommand: Some("get".into()),
            access: Access::Allow,
        };
        let mut user = user_with_patterns("reader", &["orders:*"]);
        user.permissions[0].channels = vec![ChannelPattern("news:*".into())];
        let rules = arguments(&user_rules(&user, |_| Some(&role), no_secret).unwrap());
        assert!(
            rules[3].starts_with("(%R~orders:* &news:* +@read +config|get -@admin"),
            "{rules:?}"
        );
        user.permissions[0].channels = vec![ChannelPattern("a b".into())];
        let error = user_rules(&user, |_| Some(&role), no_secret).unwrap_err();
        assert!(error.to_string().contains("channel"), "{error}");
    }

    #[test]
    fn only_a_selector_that_reads_every_key_may_list_key_names() {
        let role = reader();
        let build = |patterns: &[&str]| {
            let user = user_with_patterns("reader", patterns);
            arguments(&user_rules(&user, |_| Some(&role), no_secret).unwrap())
        };
        let limited = build(&["orders:*"]);
        assert!(
            limited[3].ends_with("-keys -scan -randomkey -cluster|getkeysinslot -client|tracking)"),
            "{limited:?}"
        );
        let everything = build(&["*"]);
        assert!(!everything[3].contains("-scan"), "{everything:?}");
        // Writing every key is not reading them.
        let write_only = {
            let mut user = user_with_patterns("reader", &["*"]);
            user.permissions[0].keys[0].access = KeyAccess::Write;
            arguments(&user_rules(&user, |_| Some(&role), no_secret).unwrap())
        };
        assert!(write_only[3].contains("-scan"), "{write_only:?}");
    }

    #[test]
    fn a_missing_role_is_named() {
        let error = user_rules(&user("ghost"), |_| None, no_secret).unwrap_err();
        assert_eq!(
            error.to_string(),
            "user app: ValkeyRole ghost does not exist"
        );
    }

    #[test]
    fn a_pattern_that_would_be_more_than_one_rule_builds_nothing() {
        let role = reader();
        for pattern in [
            "* +@all", "a\tb", "x\"y", "it's", "a(b", "a)", "\u{0}", "a\nb", "",
        ] {
            let user = user_with_patterns("reader", &[pattern]);
            let error = user_rules(&user, |_| Some(&role), no_secret).unwrap_err();
            assert!(
                matches!(&error, AclError::Invalid { field, .. } if field == "key pattern"),
                "{pattern:?}: {error}"
            );
        }
        for pattern in ["*", "orders:{eu}:*", "a[bc]?\\*", "ключ:*", "%R~x", "a|b"] {
            let user = user_with_patterns("reader", &[pattern]);
            assert!(
                user_rules(&user, |_| Some(&role), no_secret).is_ok(),
                "{pattern:?}"
            );
        }
    }

    #[test]
    fn names_are_plain_names() {
        for good in ["read", "keyspace", "json.get", "georadius_ro", "a-b"] {
            assert_eq!(check_category(good), Ok(()), "{good}");
            assert_eq!(check_command(good), Ok(()), "{good}");
        }
        assert_eq!(check_command("config|get"), Ok(()));
        assert!(check_category("config|get").is_err());
        for bad in [
            "", "@all", "+get", "get all", "1get", "get|", "a|b|c", "~*", "all)",
        ] {
            assert!(check_command(bad).is_err(), "{bad:?}");
            assert!(check_category(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_role_with_a_bad_name_builds_nothing_and_says_which() {
        let mut role = reader();
        role.commands[0].name = "keys +@all".into();
        let error = user_rules(&user("reader"), |_| Some(&role), no_secret).unwrap_err();
        assert!(
            error.to_string().contains("ValkeyRole reader command"),
            "{error}"
        );
    }

    #[test]
    fn a_secret_password_is_one_more_hash_and_an_unreadable_one_builds_nothing() {
        let role = reader();
        let mut user = user("reader");
        user.password_secret_ref = Some(SecretKeyRef {
            name: "app".into(),
            key: "password".into(),
        });
        let found = |_: &SecretKeyRef| Ok("cd".repeat(32));
        let rules = user_rules(&user, |_| Some(&role), found).unwrap();
        assert_eq!(rules[3], Rule::PasswordHash("cd".repeat(32)));
        let error = user_rules(&user, |_| Some(&role), no_secret).unwrap_err();
        assert_eq!(
            error.to_string(),
            "user app: passwordSecretRef: Secret app was not expected"
        );
    }

    #[test]
    fn reserved_names_build_nothing() {
        let role = reader();
        for name in RESERVED_USERS {
            let mut user = user("reader");
            user.username = name.into();
            let error = user_rules(&user, |_| Some(&role), no_secret).unwrap_err();
            assert!(error.to_string().contains("is reserved"), "{error}");
        }
    }

    #[test]
    fn a_users_cost_is_what_its_rules_expand_to() {
        let role = reader();
        let mut user = user("reader");
        user.permissions.push(user.permissions[0].clone());
        let rules = user_rules(&user, |_| Some(&role), no_secret).unwrap();
        let written: Vec<String> = arguments(&rules);
        let bytes = user.username.len() + 1 + written.iter().map(|a| a.len() + 1).sum::<usize>();
        let cost = UserCost::of(&user).with_roles(|_| Some(role_cost(&role)));
        // One token per rule outside selectors, one per entry inside them.
        let inside: usize = written
            .iter()
            .filter(|a| a.starts_with('('))
            .map(|a| a.split(' ').count())
            .sum();
        let outside = written.iter().filter(|a| !a.starts_with('(')).count();
        assert_eq!(cost.tokens, 1 + outside + inside);
        assert!(
            cost.bytes >= bytes && cost.bytes <= bytes + 4 * user.permissions.len(),
            "{cost:?} against {bytes} bytes written"
        );
    }

    #[test]
    fn a_role_granted_many_times_over_is_refused_by_what_it_expands_to() {
        let big = ValkeyRoleSpec {
            categories: Vec::new(),
            commands: (0..256)
                .map(|i| Permission {
                    name: format!("command{i:03}"),
                    subcommand: None,
                    access: Access::Allow,
                })
                .collect(),
        };
        let mut user = user("big");
        user.permissions = vec![user.permissions[0].clone(); 16];
        let costs = vec![UserCost::of(&user)];
        let cost = |_: &str| Some(role_cost(&big));
        assert_eq!(cost_problems(&costs, cost).len(), 1);
        let problem = &cost_problems(&costs, cost)[0];
        assert_eq!(problem.0, Some(0));
        assert!(problem.1.contains("at most 4096 per user"), "{}", problem.1);
        user.permissions.truncate(15);
        assert!(cost_problems(&[UserCost::of(&user)], cost).is_empty());
        let many = vec![UserCost::of(&user); 64];
        let problems = cost_problems(&many, cost);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].0.is_none() && problems[0].1.contains("bytes of ACL rules"));
    }

    #[test]
    fn a_malformed_hash_builds_nothing() {
        let mut user = user("reader");
        user.password_hashes[0].0 = "ab cd".into();
        let role = reader();
        assert!(user_rules(&user, |_| Some(&role), no_secret).is_err());
    }
}
