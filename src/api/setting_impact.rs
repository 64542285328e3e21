//! What changing a Valkey setting does to a running node: most settings apply live with
//! `CONFIG SET`; the ones Valkey marks immutable or protected only take effect at start, so
//! changing them replaces nodes (a roll). The list is checked against real valkey-server
//! binaries by `tests/valkey_settings.rs`, for every version the tests fetch.

/// The settings the operator gives every node a fixed value of, whatever the config says (a
/// config may not set them: admission refuses them with the rest of [`OPERATOR_OWNED`]).
/// `cluster-node-timeout`: the failure-detection window the roll's and the heal's waits are
/// built around (Momento's operator forces the same 5 s).
pub const FORCED: [(&str, &str); 1] = [("cluster-node-timeout", "5000")];

/// Settings the operator sets itself on every node; a config may not override them.
const OPERATOR_OWNED: &[&str] = &[
    "port",
    "bind",
    "dir",
    "daemonize",
    "supervised",
    "pidfile",
    "logfile",
    "include",
    "protected-mode",
    "cluster-enabled",
    "cluster-config-file",
    "cluster-port",
    "cluster-node-timeout",
    "cluster-preferred-endpoint-type",
    "replicaof",
    "slaveof",
    "masterauth",
    "masteruser",
    "primaryauth",
    "primaryuser",
    "requirepass",
    "aclfile",
    "unixsocket",
    "unixsocketperm",
];

/// Prefixes of operator-owned settings (the node's announced address, TLS).
const OPERATOR_OWNED_PREFIXES: &[&str] = &["cluster-announce-", "tls-"];

/// Whether the operator owns this setting (admission refuses it in `spec.valkey`).
pub fn is_operator_owned(setting: &str) -> bool {
    let setting = setting.to_ascii_lowercase();
    OPERATOR_OWNED.contains(&setting.as_str())
        || OPERATOR_OWNED_PREFIXES
            .iter()
            .any(|p| setting.starts_with(p))
}

/// Settings that `CONFIG SET` refuses (immutable or protected in Valkey 9.0 and 9.1), excluding
/// the ones the operator owns (those are refused at admission). Underscore spellings are
/// Valkey's own aliases.
pub const RESTART_ONLY: &[&str] = &[
    "always-show-logo",
    "aof-rewrite-cpulist",
    "aof_rewrite_cpulist",
    "appenddirname",
    "appendfilename",
    "bgsave-cpulist",
    "bgsave_cpulist",
    "bio-cpulist",
    "bio_cpulist",
    "cluster-databases",
    "databases",
    "dbfilename",
    "disable-thp",
    "enable-debug-command",
    "enable-module-command",
    "enable-protected-configs",
    "hash-seed",
    "mptcp",
    "rdbchecksum",
    "rdma-bind",
    "rdma-completion-vector",
    "rdma-rx-size",
    "repl-mptcp",
    "server-cpulist",
    "server_cpulist",
    "set-proc-title",
    "socket-mark-id",
    "syslog-enabled",
    "syslog-facility",
    "syslog-ident",
    "tcp-backlog",
    "unixsocketgroup",
];

/// Whether a change of this setting needs the node restarted (replaced), rather than a live
/// `CONFIG SET`.
pub fn needs_restart(setting: &str) -> bool {
    RESTART_ONLY.contains(&setting.to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_settings_are_recognised() {
        for owned in [
            "port",
            "bind",
            "cluster-announce-ip",
            "tls-port",
            "Daemonize",
            "aclfile",
        ] {
            assert!(is_operator_owned(owned), "{owned}");
        }
        for free in ["maxmemory", "maxmemory-policy", "hz", "appendonly"] {
            assert!(!is_operator_owned(free), "{free}");
        }
    }

    #[test]
    fn classification() {
        assert!(needs_restart("databases"));
        assert!(needs_restart("Databases"));
        assert!(!needs_restart("maxmemory"));
        assert!(!needs_restart("maxmemory-policy"));
    }
}
