//! Which keys of the official service's configuration file (`@powersync/service-types`,
//! `PowerSyncConfig`, with the Postgres connection's keys) this engine uses: every key of
//! a file, nested ones too, is used, listed as not used (`config_ignored`), or refused
//! because ignoring it would change what is secured. `docs/migrating.md` says why, key by
//! key.

use serde_norway::{Mapping, Value};

/// What the engine does with a key.
enum Key {
    /// Read and honoured (what lies below it too).
    Used,
    /// Honoured, with its keys described key by key.
    Section(&'static [(&'static str, Key)]),
    /// A list of mappings whose keys are described key by key (`replication.connections`).
    Items(&'static [(&'static str, Key)]),
    /// Accepted without effect, with what lies below it: listed in `config_ignored`.
    Unused,
    /// Refused when set: ignoring it would change security behaviour. The message says
    /// what to do instead.
    Refused(&'static str),
}

use Key::{Items, Refused, Section, Unused, Used};

const CONNECTION: &[(&str, Key)] = &[
    ("type", Used),
    ("uri", Used),
    ("hostname", Used),
    ("host", Used),
    ("port", Used),
    ("database", Used),
    ("username", Used),
    ("user", Used),
    ("password", Used),
    ("sslmode", Used),
    ("cacert", Used),
    ("slot_failover", Used),
    ("id", Unused),
    ("tag", Unused),
    ("debug_api", Unused),
    ("slot_name_prefix", Unused),
    ("max_pool_size", Unused),
    ("connect_timeout", Unused),
    ("snapshot_socket_timeout", Unused),
    ("heartbeat_interval_seconds", Unused),
    (
        "client_certificate",
        Refused(
            "client certificates for the source connection are not supported; let the \
             replication user authenticate with a password (over verify-full TLS) instead",
        ),
    ),
    (
        "client_private_key",
        Refused(
            "client certificates for the source connection are not supported; let the \
             replication user authenticate with a password (over verify-full TLS) instead",
        ),
    ),
    (
        "tls_servername",
        Refused(
            "a TLS server name other than the host is not supported; connect to a host name \
             the primary's certificate carries",
        ),
    ),
    (
        "reject_ip_ranges",
        Refused(
            "is not supported; restrict where the source connection may go with a firewall, \
             and give the primary's own address",
        ),
    ),
];

const RULES: &[(&str, Key)] = &[("path", Used), ("content", Used), ("exit_on_error", Unused)];

const SCHEMA: &[(&str, Key)] = &[
    (
        "replication",
        Section(&[("connections", Items(CONNECTION))]),
    ),
    ("sync_config", Section(RULES)),
    ("sync_rules", Section(RULES)),
    (
        "client_auth",
        Section(&[
            ("jwks_uri", Used),
            ("jwks", Section(&[("keys", Used)])),
            ("audience", Used),
            ("issuer", Used),
            ("jwks_allow_http", Used),
            ("supabase", Used),
            ("supabase_jwt_secret", Used),
            ("block_local_jwks", Used),
            ("jwks_reject_ip_ranges", Used),
        ]),
    ),
    (
        "api",
        Section(&[
            ("tokens", Used),
            (
                "parameters",
                Section(&[
                    ("max_concurrent_connections", Used),
                    ("max_buckets_per_connection", Used),
                    ("max_parameter_query_results", Used),
                    // This engine's own; not in the official schema.
                    ("max_concurrent_connections_per_user", Used),
                    ("max_data_fetch_concurrency", Unused),
                    ("checkpoint_request_retention_minutes", Unused),
                    ("bucket_count_cache_ttl_minutes", Unused),
                ]),
            ),
        ]),
    ),
    ("port", Used),
    // The official CLI's marker in a project's service.yaml (`_type: self-hosted`).
    ("_type", Unused),
    ("storage", Unused),
    ("metadata", Unused),
    ("migrations", Unused),
    (
        "telemetry",
        Section(&[
            ("prometheus_port", Used),
            ("disable_telemetry_sharing", Unused),
            ("internal_service_endpoint", Unused),
        ]),
    ),
    ("healthcheck", Unused),
    (
        "system",
        Section(&[("logging", Section(&[("level", Unused), ("format", Unused)]))]),
    ),
    ("parameters", Unused),
];

/// The keys of `file` (a mapping) this engine does not use, as dotted paths
/// (`replication.connections[0].slot_name_prefix`; keys the official schema does not have
/// either end in ` (unknown)`), sorted; or the first refused key that is set, with why.
pub(crate) fn not_used(file: &Mapping) -> Result<Vec<String>, (String, &'static str)> {
    let mut out = Vec::new();
    walk(file, SCHEMA, "", &mut out)?;
    out.sort();
    Ok(out)
}

fn walk(
    map: &Mapping,
    schema: &[(&str, Key)],
    prefix: &str,
    out: &mut Vec<String>,
) -> Result<(), (String, &'static str)> {
    for (key, value) in map {
        let name = key_text(key);
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match schema
            .iter()
            .find(|(known, _)| *known == name)
            .map(|(_, k)| k)
        {
            None => out.push(format!("{path} (unknown)")),
            Some(Used) => {}
            Some(Unused) => out.push(path),
            Some(Refused(why)) => {
                if is_set(value) {
                    return Err((path, why));
                }
            }
            Some(Section(keys)) => {
                if let Value::Mapping(inner) = value {
                    walk(inner, keys, &path, out)?;
                }
            }
            Some(Items(keys)) => {
                if let Value::Sequence(items) = value {
                    for (index, item) in items.iter().enumerate() {
                        if let Value::Mapping(inner) = item {
                            walk(inner, keys, &format!("{path}[{index}]"), out)?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// False for a key written without effect: null, `false`, an empty string or list.
fn is_set(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::String(s) => !s.is_empty(),
        Value::Sequence(items) => !items.is_empty(),
        _ => true,
    }
}

/// A mapping key as text (YAML allows keys of any type).
pub(crate) fn key_text(key: &Value) -> String {
    match key {
        Value::String(s) => s.clone(),
        other => serde_norway::to_string(other)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
    }
}

/// Every key of the official schema as a dotted path (`replication.connections[].uri`)
/// with what this engine does with it: `used`, `not used` or `refused`
/// (`docs/configuration.md` lists each the same way).
#[cfg(test)]
fn reference() -> Vec<(String, &'static str)> {
    fn list(schema: &[(&str, Key)], prefix: &str, out: &mut Vec<(String, &'static str)>) {
        for (name, key) in schema {
            let path = if prefix.is_empty() {
                (*name).to_owned()
            } else {
                format!("{prefix}.{name}")
            };
            match key {
                Used => out.push((path, "used")),
                Unused => out.push((path, "not used")),
                Refused(_) => out.push((path, "refused")),
                Section(inner) => list(inner, &path, out),
                Items(inner) => list(inner, &format!("{path}[]"), out),
            }
        }
    }
    let mut out = Vec::new();
    list(SCHEMA, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::reference;

    /// `docs/configuration.md` names every key in a row that says how it is treated: a
    /// key added, or treated otherwise, fails here until the reference says so.
    #[test]
    fn the_configuration_reference_lists_every_key_as_it_is_treated() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/configuration.md"
        ))
        .expect("docs/configuration.md");
        let rows: Vec<Vec<&str>> = doc
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| l.split(" | ").collect())
            .collect();
        let mut missing = Vec::new();
        for (path, treated) in reference() {
            let named = format!("`{path}`");
            match rows.iter().find(|r| r[0].contains(&named)) {
                Some(row) if row.get(1) == Some(&treated) => {}
                Some(row) => missing.push(format!("{path}: {treated}, the reference says {row:?}")),
                None => missing.push(format!("{path}: {treated}, not in the reference")),
            }
        }
        assert!(missing.is_empty(), "docs/configuration.md: {missing:#?}");
    }
}
