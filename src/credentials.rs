//! The operator's own users on a cluster's nodes, and the Secrets that keep their passwords.
//! Pure: the Secrets' data in, the users, the `auth.conf` the nodes start with and the next step
//! of a rotation out (the reads and writes are `crate::controller::pass::credentials`).
//!
//! Per cluster, two random passwords:
//! - `operator-password`, of the user the operator connects as ([`OPERATOR_USER`]), allowed
//!   only the administrative commands it sends ([`OPERATOR_COMMANDS`]), no keys;
//! - `replication-password`, of the user replicas (and atomic slot migration) authenticate to
//!   a primary as ([`REPLICATION_USER`], `masteruser`/`masterauth`). Replication needs only
//!   `PSYNC`/`REPLCONF`, but the target of an atomic slot migration runs the moved data (from
//!   `SELECT` on) as the commands of this user's connection, so it is granted every data
//!   command on every key, and no administrative one but replication's ([`replication_rules`]).
//!
//! They live in two Secrets, so that no credential a tenant can read is an administrative one:
//! - **private**, [`private_secret_name`] (`<namespace>.<cluster>`) in the operator's own
//!   namespace, which the clusters' teams cannot read: the passwords ([`SystemCredentials::to_data`]);
//! - **mounted**, [`secret_name`] (`<cluster>-credentials`) in the cluster's namespace, owned by
//!   the cluster: only `auth.conf` ([`SystemCredentials::public_data`]), those two users by hash,
//!   `default` closed, and the replication login. Every node starts with `--include` of it, so
//!   it is closed from its first command and no password appears in its Pod's spec. Whoever
//!   reads it (the team, with its namespace's Secrets) learns the replication password: every
//!   key of its own cluster, which it has anyway, and no `ACL`, `CONFIG` or `CLUSTER` command
//!   that changes a node.
//!
//! Passwords an older operator kept in the mounted Secret were readable by the team: they are
//! moved to the private Secret and rotated at once ([`SystemCredentials::exposed`]).
//!
//! `default` is off on every version: a client without credentials gets `NOAUTH` for every
//! command. (Valkey 9.0's atomic slot migration would need `default` to keep `CLUSTER
//! SYNCSLOTS`, which lets anyone move any shard's slots; 9.0 clusters move slots key by key
//! instead, see [`crate::valkey::migration`].)
//!
//! A rotation (asked for with [`ROTATE_CREDENTIALS`](crate::api::annotations::ROTATE_CREDENTIALS)
//! on the mounted Secret) never locks anything out:
//! 1. **Adding**: new passwords are kept beside the current ones (`next-…` keys); every node
//!    is given both hashes;
//! 2. **Dropping**: once every node has both, the new passwords become current (the operator
//!    and `masterauth` switch to them) and the old ones are kept as `previous-…`;
//! 3. once every node has taken that, the old hashes go.
//!
//! The operator logs in with the current password and falls back to the other one, so a node
//! that missed a step is still reached.

use std::collections::BTreeMap;
use std::fmt;

use crate::acl::{DEFAULT_USER, OPERATOR_USER, REPLICATION_USER, Rule, password_hash};
use crate::api::secret_keys::{AUTH_CONF, NEXT, OPERATOR_PASSWORD, PREVIOUS, REPLICATION_PASSWORD};

/// A Valkey user and its password, sent with `AUTH` (`HELLO`) when connecting. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// What the operator sends: cluster membership, roles, failover and slot migration, `INFO`,
/// `CONFIG SET` of live settings, `ACL` for the tenants' users, and the connection handshake.
pub const OPERATOR_COMMANDS: [&str; 7] = [
    "cluster", "info", "config", "acl", "ping", "client", "hello",
];

/// The name of a cluster's credentials Secret.
pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}{CREDENTIALS_SUFFIX}")
}

/// The name of the Secret in the operator's namespace that keeps a cluster's passwords: its
/// namespace and name, which no two clusters share (a namespace name holds no dot).
pub fn private_secret_name(namespace: &str, cluster: &str) -> String {
    format!("{namespace}.{cluster}")
}

/// The name of the Secret in the operator's namespace with the passwords issued to the config
/// users of one cluster (see `crate::controller::pass::issued`).
pub fn issued_secret_name(namespace: &str, cluster: &str) -> String {
    format!("{namespace}.{cluster}{ISSUED_SUFFIX}")
}

/// What [`issued_secret_name`] adds to [`private_secret_name`].
pub const ISSUED_SUFFIX: &str = ".issued";

/// What [`secret_name`] adds to the cluster's name.
pub const CREDENTIALS_SUFFIX: &str = "-credentials";

/// The two passwords. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Passwords {
    pub operator: String,
    pub replication: String,
}

impl fmt::Debug for Passwords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Passwords(<redacted>)")
    }
}

impl Passwords {
    /// Two new random passwords (256 bits each, as hex: nothing for a config file to quote).
    pub fn generate() -> Result<Self, getrandom::Error> {
        Ok(Self {
            operator: random_password()?,
            replication: random_password()?,
        })
    }

    fn hashes(&self) -> (String, String) {
        (
            password_hash(self.operator.as_bytes()),
            password_hash(self.replication.as_bytes()),
        )
    }
}

/// 256 random bits as 64 hex digits: nothing for a config file to quote.
pub(crate) fn random_password() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where a rotation stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rotation {
    Steady,
    /// New passwords, not yet on every node.
    Adding(Passwords),
    /// The passwords current before the switch, still accepted until every node has the new.
    Dropping(Passwords),
}

/// What a cluster's credentials Secret says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemCredentials {
    pub current: Passwords,
    pub rotation: Rotation,
}

impl SystemCredentials {
    /// New credentials for a new Secret.
    pub fn fresh() -> Result<Self, getrandom::Error> {
        Ok(Self {
            current: Passwords::generate()?,
            rotation: Rotation::Steady,
        })
    }

    /// Reads the Secret's data; a missing or malformed password is an error naming the key.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Self, String> {
        let current = passwords(data, "")?.ok_or_else(|| {
            format!("it has no {OPERATOR_PASSWORD:?} and {REPLICATION_PASSWORD:?}")
        })?;
        let rotation = match (passwords(data, NEXT)?, passwords(data, PREVIOUS)?) {
            (None, None) => Rotation::Steady,
            (Some(next), None) => Rotation::Adding(next),
            (None, Some(previous)) => Rotation::Dropping(previous),
            (Some(_), Some(_)) => {
                return Err("it holds both next- and previous- passwords".into());
            }
        };
        Ok(Self { current, rotation })
    }

    /// Credentials read from where the cluster's team could read them: a rotation to new
    /// passwords starts at once (one already going on is finished instead, and the next one
    /// asked for replaces what it leaves).
    pub fn exposed(self) -> Result<Self, getrandom::Error> {
        match self.rotation {
            Rotation::Steady => Ok(Self {
                rotation: Rotation::Adding(Passwords::generate()?),
                ..self
            }),
            _ => Ok(self),
        }
    }

    /// The data of the mounted Secret: the `auth.conf` nodes start with, and nothing else.
    pub fn public_data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(AUTH_CONF.to_owned(), self.auth_conf())])
    }

    /// The private Secret's data: the passwords (and those of a rotation).
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let mut data = BTreeMap::new();
        let mut put = |prefix: &str, passwords: &Passwords| {
            data.insert(
                format!("{prefix}{OPERATOR_PASSWORD}"),
                passwords.operator.clone(),
            );
            data.insert(
                format!("{prefix}{REPLICATION_PASSWORD}"),
                passwords.replication.clone(),
            );
        };
        put("", &self.current);
        match &self.rotation {
            Rotation::Steady => {}
            Rotation::Adding(next) => put(NEXT, next),
            Rotation::Dropping(previous) => put(PREVIOUS, previous),
        }
        data
    }

    /// Every password pair a node may hold now, current first.
    fn all(&self) -> Vec<&Passwords> {
        match &self.rotation {
            Rotation::Steady => vec![&self.current],
            Rotation::Adding(other) | Rotation::Dropping(other) => vec![&self.current, other],
        }
    }

    /// How the operator logs in: the current password, then the other one of a rotation.
    pub fn logins(&self) -> Vec<Credentials> {
        self.all()
            .into_iter()
            .map(|passwords| Credentials {
                username: OPERATOR_USER.into(),
                password: passwords.operator.clone(),
            })
            .collect()
    }

    /// The operator's users as every node must have them now, and `default` closed.
    pub fn system_users(&self) -> SystemUsers {
        let (operator, replication): (Vec<_>, Vec<_>) =
            self.all().into_iter().map(Passwords::hashes).unzip();
        SystemUsers {
            users: vec![
                (
                    OPERATOR_USER.into(),
                    user_rules(&operator, &OPERATOR_COMMANDS),
                ),
                (REPLICATION_USER.into(), replication_rules(&replication)),
            ],
            replication: Credentials {
                username: REPLICATION_USER.into(),
                password: self.current.replication.clone(),
            },
            default: vec![Rule::Reset, Rule::Off],
        }
    }

    /// The file every node `--include`s: the users by hash, then the replication login.
    pub fn auth_conf(&self) -> String {
        let users = self.system_users();
        let mut lines = vec![user_line(DEFAULT_USER, &users.default)];
        for (name, rules) in &users.users {
            lines.push(user_line(name, rules));
        }
        lines.push(format!("masteruser {REPLICATION_USER}"));
        lines.push(format!("masterauth {}", users.replication.password));
        lines.join("\n") + "\n"
    }

    /// The next state once every node took this one (`everywhere`), or a rotation was asked
    /// for while none is going on; `None` when nothing changes. `fresh` makes the new passwords.
    pub fn advanced(
        &self,
        rotate_asked: bool,
        everywhere: bool,
        fresh: impl FnOnce() -> Result<Passwords, getrandom::Error>,
    ) -> Result<Option<Self>, getrandom::Error> {
        let next = match &self.rotation {
            Rotation::Steady if rotate_asked => Self {
                current: self.current.clone(),
                rotation: Rotation::Adding(fresh()?),
            },
            Rotation::Adding(next) if everywhere => Self {
                current: next.clone(),
                rotation: Rotation::Dropping(self.current.clone()),
            },
            Rotation::Dropping(_) if everywhere => Self {
                current: self.current.clone(),
                rotation: Rotation::Steady,
            },
            _ => return Ok(None),
        };
        Ok(Some(next))
    }
}

/// One pair of passwords from the Secret, under `prefix`: both keys or neither.
fn passwords(data: &BTreeMap<String, Vec<u8>>, prefix: &str) -> Result<Option<Passwords>, String> {
    let read = |key: &str| -> Result<Option<String>, String> {
        let key = format!("{prefix}{key}");
        let Some(bytes) = data.get(&key) else {
            return Ok(None);
        };
        check_password(bytes)
            .map(Some)
            .map_err(|m| format!("{key:?} {m}"))
    };
    match (read(OPERATOR_PASSWORD)?, read(REPLICATION_PASSWORD)?) {
        (Some(operator), Some(replication)) => Ok(Some(Passwords {
            operator,
            replication,
        })),
        (None, None) => Ok(None),
        _ => Err(format!(
            "it has only one of {prefix}{OPERATOR_PASSWORD:?} and {prefix}{REPLICATION_PASSWORD:?}"
        )),
    }
}

/// A password the Secret may hold: 16 to 256 visible ASCII characters, no quotes (it is
/// written into `auth.conf` as `masterauth`, where Valkey's config parser would read quotes).
fn check_password(bytes: &[u8]) -> Result<String, String> {
    let fits = (16..=256).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_graphic() && *b != b'"' && *b != b'\'' && *b != b'\\');
    if fits {
        Ok(String::from_utf8_lossy(bytes).into_owned())
    } else {
        Err("is not 16 to 256 visible ASCII characters without quotes or backslashes".into())
    }
}

fn user_rules(hashes: &[String], commands: &[&'static str]) -> Vec<Rule> {
    let mut rules = vec![Rule::Reset, Rule::On];
    rules.extend(hashes.iter().cloned().map(Rule::PasswordHash));
    rules.extend(commands.iter().copied().map(Rule::Allow));
    rules
}

/// What the replication user may do beyond data: replication's own administrative commands
/// (`CLUSTER SYNCSLOTS` is 9.1's atomic slot migration, whose source logs in to the target as
/// this user).
pub const REPLICATION_ADMIN_COMMANDS: [&str; 3] = ["psync", "replconf", "cluster|syncslots"];

/// The replication user: every data command on every key, because a slot migration's target
/// runs what it receives as this user (atomic migration's `SELECT` and the keys' data, refused
/// with `NOPERM … 'select'` otherwise; key-by-key migration's `RESTORE-ASKING` from `MIGRATE
/// … AUTH2`); of the administrative commands only replication's, so its password, which every
/// Pod mounts, opens no `ACL` or `CONFIG`.
fn replication_rules(hashes: &[String]) -> Vec<Rule> {
    let mut rules = vec![Rule::Reset, Rule::On];
    rules.extend(hashes.iter().cloned().map(Rule::PasswordHash));
    rules.extend([
        Rule::AllKeys,
        Rule::AllChannels,
        Rule::Allow("@all"),
        Rule::Deny("@admin"),
    ]);
    rules.extend(REPLICATION_ADMIN_COMMANDS.map(Rule::Allow));
    rules
}

fn user_line(name: &str, rules: &[Rule]) -> String {
    let rules: Vec<String> = rules.iter().map(ToString::to_string).collect();
    format!("user {name} {}", rules.join(" "))
}

/// The operator's users, `default`, and the login replicas use, as written on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemUsers {
    pub users: Vec<(String, Vec<Rule>)>,
    pub replication: Credentials,
    pub default: Vec<Rule>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(tag: &str) -> Passwords {
        Passwords {
            operator: format!("operator-{tag}-0123456789"),
            replication: format!("replication-{tag}-0123456789"),
        }
    }

    fn steady() -> SystemCredentials {
        SystemCredentials {
            current: pair("a"),
            rotation: Rotation::Steady,
        }
    }

    fn bytes(data: BTreeMap<String, String>) -> BTreeMap<String, Vec<u8>> {
        data.into_iter().map(|(k, v)| (k, v.into_bytes())).collect()
    }

    #[test]
    fn the_secret_reads_back_what_it_was_written_as_in_every_state() {
        for rotation in [
            Rotation::Steady,
            Rotation::Adding(pair("b")),
            Rotation::Dropping(pair("z")),
        ] {
            let credentials = SystemCredentials {
                current: pair("a"),
                rotation,
            };
            let data = bytes(credentials.to_data());
            assert_eq!(SystemCredentials::from_data(&data), Ok(credentials));
        }
    }

    #[test]
    fn a_damaged_secret_is_an_error_naming_the_key() {
        let mut data = bytes(steady().to_data());
        data.remove(REPLICATION_PASSWORD);
        let error = SystemCredentials::from_data(&data).unwrap_err();
        assert!(error.contains("only one of"), "{error}");
        data.insert(REPLICATION_PASSWORD.into(), b"short".to_vec());
        let error = SystemCredentials::from_data(&data).unwrap_err();
        assert!(error.contains("\"replication-password\" is not"), "{error}");
        data.insert(
            REPLICATION_PASSWORD.into(),
            b"with \"quotes\" inside it".to_vec(),
        );
        assert!(SystemCredentials::from_data(&data).is_err());
        assert!(SystemCredentials::from_data(&BTreeMap::new()).is_err());
    }

    #[test]
    fn auth_conf_closes_default_and_holds_only_hashes_of_user_passwords() {
        let credentials = steady();
        let conf = credentials.auth_conf();
        let lines: Vec<&str> = conf.lines().collect();
        assert_eq!(lines[0], "user default reset off");
        assert!(
            lines[1].starts_with("user valkey-operator reset on #"),
            "{conf}"
        );
        assert!(lines[1].ends_with("+cluster +info +config +acl +ping +client +hello"));
        assert!(
            lines[2].ends_with(" ~* &* +@all -@admin +psync +replconf +cluster|syncslots"),
            "{conf}"
        );
        assert_eq!(lines[3], "masteruser valkey-replication");
        assert_eq!(
            lines[4],
            format!("masterauth {}", credentials.current.replication)
        );
        // The operator's password is only ever there as its hash.
        assert!(!conf.contains(&credentials.current.operator));
    }

    #[test]
    fn a_rotation_adds_then_switches_then_drops_each_only_once_every_node_took_the_last() {
        let fresh = || Ok(pair("b"));
        let start = steady();
        assert_eq!(start.advanced(false, true, fresh), Ok(None));
        let adding = start.advanced(true, false, fresh).unwrap().unwrap();
        assert_eq!(adding.rotation, Rotation::Adding(pair("b")));
        assert_eq!(
            adding.current,
            pair("a"),
            "nothing switches before every node has both"
        );
        assert_eq!(adding.advanced(true, false, fresh), Ok(None));
        let dropping = adding.advanced(false, true, fresh).unwrap().unwrap();
        assert_eq!(dropping.current, pair("b"));
        assert_eq!(dropping.rotation, Rotation::Dropping(pair("a")));
        assert_eq!(dropping.advanced(false, false, fresh), Ok(None));
        let done = dropping.advanced(false, true, fresh).unwrap().unwrap();
        assert_eq!(
            done,
            SystemCredentials {
                current: pair("b"),
                rotation: Rotation::Steady
            }
        );
    }

    #[test]
    fn during_a_rotation_nodes_accept_both_and_the_operator_tries_current_first() {
        let adding = SystemCredentials {
            current: pair("a"),
            rotation: Rotation::Adding(pair("b")),
        };
        let logins: Vec<String> = adding.logins().into_iter().map(|c| c.password).collect();
        assert_eq!(logins, [pair("a").operator, pair("b").operator]);
        let users = adding.system_users();
        let hashes = |rules: &[Rule]| {
            rules
                .iter()
                .filter(|r| matches!(r, Rule::PasswordHash(_)))
                .count()
        };
        assert_eq!(hashes(&users.users[0].1), 2);
        assert_eq!(hashes(&users.users[1].1), 2);
        assert_eq!(
            users.replication.password,
            pair("a").replication,
            "masterauth switches with current"
        );
    }

    #[test]
    fn the_mounted_secret_holds_no_password_but_replications_and_the_private_one_no_auth_conf() {
        let credentials = SystemCredentials {
            current: pair("a"),
            rotation: Rotation::Adding(pair("b")),
        };
        let public = credentials.public_data();
        assert_eq!(public.keys().collect::<Vec<_>>(), [AUTH_CONF]);
        let conf = &public[AUTH_CONF];
        for password in [
            &pair("a").operator,
            &pair("b").operator,
            &pair("b").replication,
        ] {
            assert!(!conf.contains(password.as_str()), "{conf}");
        }
        assert!(!credentials.to_data().contains_key(AUTH_CONF));
        assert_eq!(credentials.to_data().len(), 4, "two pairs");
    }

    #[test]
    fn exposed_credentials_start_a_rotation_unless_one_is_going_on() {
        let rotated = steady().exposed().unwrap();
        assert_eq!(rotated.current, pair("a"));
        assert!(matches!(rotated.rotation, Rotation::Adding(ref next) if *next != pair("a")));
        let dropping = SystemCredentials {
            current: pair("b"),
            rotation: Rotation::Dropping(pair("a")),
        };
        assert_eq!(dropping.clone().exposed().unwrap(), dropping);
    }

    #[test]
    fn private_names_differ_per_namespace() {
        assert_eq!(private_secret_name("shop", "orders"), "shop.orders");
        assert_ne!(
            private_secret_name("shop", "orders"),
            private_secret_name("shop-orders", "x")
        );
    }

    #[test]
    fn generated_passwords_differ_and_are_valid() {
        let (a, b) = (
            Passwords::generate().unwrap(),
            Passwords::generate().unwrap(),
        );
        assert_ne!(a, b);
        assert!(check_password(a.operator.as_bytes()).is_ok());
        assert_eq!(format!("{a:?}"), "Passwords(<redacted>)");
    }
}
