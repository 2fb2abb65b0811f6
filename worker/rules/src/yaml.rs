//! The YAML front end: sync-rules text → a checked outline of definitions and streams.
//!
//! Walks the parsed YAML by hand (instead of derive) so every message can name the rule and
//! key, and so unknown keys are reported rather than ignored. Mapping order is kept: it
//! decides bucket-parameter order and `checkpoint.streams` indexes.

use serde_norway::Value as Y;

use super::error::RulesError;
use super::options::Compatibility;

/// A `bucket_definitions` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct RawDefinition {
    /// Definition name.
    pub name: String,
    /// Parameter queries (empty: one global bucket).
    pub parameters: Vec<String>,
    /// Data queries.
    pub data: Vec<String>,
    /// `priority`, if set.
    pub priority: Option<u8>,
    /// `accept_potentially_dangerous_queries: true` (silences a warning).
    pub accept_dangerous: bool,
}

/// A `streams` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct RawStream {
    /// Stream name.
    pub name: String,
    /// `query` (one) or `queries`.
    pub queries: Vec<String>,
    /// True when written as `queries:` (labels in errors).
    pub uses_queries_key: bool,
    /// `auto_subscribe`.
    pub auto_subscribe: bool,
    /// `priority`, if set.
    pub priority: Option<u8>,
    /// Stream-level `with:` CTEs, in order.
    pub with: Vec<(String, String)>,
    /// `accept_potentially_dangerous_queries: true` (silences a warning).
    pub accept_dangerous: bool,
}

/// An `event_definitions` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct RawEvent {
    /// Event name.
    pub name: String,
    /// Its payload queries.
    pub payloads: Vec<String>,
}

/// The checked outline of a sync-rules file.
#[derive(Debug, Clone, PartialEq)]
pub struct RawRules {
    /// Edition options.
    pub compat: Compatibility,
    /// `bucket_definitions`, in file order.
    pub definitions: Vec<RawDefinition>,
    /// `streams`, in file order.
    pub streams: Vec<RawStream>,
    /// Global `with:` CTEs.
    pub with: Vec<(String, String)>,
    /// `event_definitions`, in file order.
    pub events: Vec<RawEvent>,
    /// `config.storage_version`, if set (it has no effect here; the official service
    /// warns about unstable versions).
    pub storage_version: Option<u8>,
}

fn yaml_err(message: impl Into<String>, hint: impl Into<String>) -> RulesError {
    RulesError::Yaml {
        message: message.into(),
        hint: hint.into(),
        line: 0,
        column: 0,
    }
}

fn mapping<'a>(v: &'a Y, what: &str) -> Result<Vec<(String, &'a Y)>, RulesError> {
    match v {
        Y::Mapping(m) => {
            let mut out = Vec::with_capacity(m.len());
            for (k, v) in m {
                match k {
                    Y::String(s) => out.push((s.clone(), v)),
                    other => {
                        return Err(yaml_err(
                            format!("{what} has a non-string key `{}`", short(other)),
                            "use plain names as keys",
                        ))
                    }
                }
            }
            Ok(out)
        }
        other => Err(yaml_err(
            format!("{what} must be a mapping, found {}", short(other)),
            "see docs/sync-rules.md for the file structure",
        )),
    }
}

fn short(v: &Y) -> String {
    let s = serde_norway::to_string(v).unwrap_or_default();
    let s = s.trim();
    if s.len() > 60 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(60).map(|(i, _)| i).unwrap_or(s.len())]
        )
    } else {
        s.to_string()
    }
}

fn sql_string(v: &Y, rule: &str, key: &str) -> Result<String, RulesError> {
    match v {
        Y::String(s) => Ok(s.clone()),
        other => Err(RulesError::config(
            rule,
            format!("`{key}` must be an SQL string, found {}", short(other)),
            "write the query as a YAML string",
        )),
    }
}

fn sql_list(v: &Y, rule: &str, key: &str) -> Result<Vec<String>, RulesError> {
    match v {
        Y::Sequence(items) => items.iter().map(|i| sql_string(i, rule, key)).collect(),
        other => Ok(vec![sql_string(other, rule, key)?]),
    }
}

fn priority(v: &Y, rule: &str) -> Result<u8, RulesError> {
    match v.as_u64() {
        Some(p) if p <= 3 => Ok(p as u8),
        _ => Err(RulesError::config(
            rule,
            format!("priority must be an integer 0..3, found {}", short(v)),
            "priority: 0, 1, 2 or 3 (0 syncs first; the default is 3)",
        )),
    }
}

fn boolean(v: &Y, rule: &str, key: &str) -> Result<bool, RulesError> {
    v.as_bool().ok_or_else(|| {
        RulesError::config(
            rule,
            format!("`{key}` must be true or false, found {}", short(v)),
            format!("{key}: true"),
        )
    })
}

fn ctes(v: &Y, rule: &str) -> Result<Vec<(String, String)>, RulesError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (name, q) in mapping(v, &format!("`with` of {rule}"))? {
        if out.iter().any(|(n, _)| *n == name) {
            return Err(RulesError::config(
                rule,
                format!("CTE `{name}` is defined twice"),
                "give each CTE a unique name",
            ));
        }
        out.push((name.clone(), sql_string(q, rule, &format!("with.{name}"))?));
    }
    Ok(out)
}

/// Parse and check the YAML outline.
pub fn parse(yaml: &str) -> Result<RawRules, RulesError> {
    let root: Y = serde_norway::from_str(yaml).map_err(|e| {
        let message = e.to_string();
        let hint = if message.contains("duplicate entry") {
            "give each bucket definition, stream and CTE a unique name"
        } else {
            "valid YAML with `bucket_definitions:` or `streams:` at the top level"
        };
        let (line, column) = e
            .location()
            .map_or((0, 0), |l| (l.line() as u64, l.column() as u64));
        RulesError::Yaml {
            message,
            hint: hint.into(),
            line,
            column,
        }
    })?;
    let mut compat = Compatibility::default();
    let mut storage_version = None;
    let mut defs_v = None;
    let mut streams_v = None;
    let mut with_v = None;
    let mut events_v = None;
    for (k, v) in mapping(&root, "the document")? {
        match k.as_str() {
            "config" => (compat, storage_version) = config(v)?,
            "bucket_definitions" => defs_v = Some(v),
            "streams" => streams_v = Some(v),
            "with" => with_v = Some(v),
            "event_definitions" => events_v = Some(v),
            other => {
                return Err(yaml_err(
                    format!("unknown top-level key `{other}`"),
                    "config, bucket_definitions, streams, with, event_definitions",
                ))
            }
        }
    }
    if defs_v.is_none() && streams_v.is_none() {
        return Err(yaml_err(
            "neither `bucket_definitions` nor `streams` is present",
            "add `bucket_definitions:` (edition 1/2) or `streams:` (edition 2/3)",
        ));
    }
    let mut rules = RawRules {
        compat,
        definitions: Vec::new(),
        streams: Vec::new(),
        with: Vec::new(),
        events: Vec::new(),
        storage_version,
    };
    if let Some(v) = events_v {
        for (name, e) in mapping(v, "event_definitions")? {
            rules.events.push(event(&name, e)?);
        }
    }
    if let Some(v) = with_v {
        if compat.edition < 3 {
            return Err(RulesError::config(
                "with",
                "global `with:` needs edition 3",
                "config: { edition: 3 }",
            ));
        }
        rules.with = ctes(v, "with")?;
    }
    if let Some(v) = defs_v {
        if compat.edition >= 3 {
            return Err(RulesError::config(
                "bucket_definitions",
                "bucket_definitions are not allowed with edition 3",
                "convert them to `streams:` or use edition 1 or 2",
            ));
        }
        for (name, d) in mapping(v, "bucket_definitions")? {
            rules.definitions.push(definition(&name, d)?);
        }
    }
    if let Some(v) = streams_v {
        if compat.edition < 2 {
            return Err(RulesError::config(
                "streams",
                "streams need edition 2 or 3",
                "config: { edition: 3 }",
            ));
        }
        for (name, s) in mapping(v, "streams")? {
            if rules.definitions.iter().any(|d| d.name == name) {
                return Err(RulesError::config(
                    &name,
                    "a stream has the same name as a bucket definition",
                    "rename one of them",
                ));
            }
            rules.streams.push(stream(&name, s, compat.edition)?);
        }
    }
    Ok(rules)
}

/// The edition options and the storage version of `config`.
fn config(v: &Y) -> Result<(Compatibility, Option<u8>), RulesError> {
    let entries = mapping(v, "config")?;
    let edition = match entries.iter().find(|(k, _)| k == "edition") {
        None => 1,
        Some((_, e)) => match e.as_u64() {
            Some(n @ 1..=3) => n as u8,
            _ => {
                return Err(RulesError::config(
                    "config",
                    format!("edition must be 1, 2 or 3, found {}", short(e)),
                    "config: { edition: 3 }",
                ))
            }
        },
    };
    let mut c = Compatibility::for_edition(edition);
    let mut storage_version = None;
    for (k, val) in &entries {
        match k.as_str() {
            "edition" => {}
            "timestamps_iso8601" => c.timestamps_iso8601 = boolean(val, "config", k)?,
            "versioned_bucket_ids" => c.versioned_bucket_ids = boolean(val, "config", k)?,
            "fixed_json_extract" => c.fixed_json_extract = boolean(val, "config", k)?,
            "custom_postgres_types" => c.custom_postgres_types = boolean(val, "config", k)?,
            "storage_version" => match val.as_u64() {
                Some(n @ 1..=3) => storage_version = Some(n as u8),
                _ => return Err(RulesError::config("config", "storage_version must be 1, 2 or 3", "remove storage_version")),
            },
            "unstable_sqlite_expression_engine" | "timestamp_max_precision" => {
                return Err(RulesError::config(
                    "config",
                    format!("`{k}` is not supported by powersync_mdbx"),
                    format!("remove `{k}`"),
                ))
            }
            other => {
                return Err(RulesError::config(
                    "config",
                    format!("unknown config key `{other}`"),
                    "edition, timestamps_iso8601, versioned_bucket_ids, fixed_json_extract, custom_postgres_types, storage_version",
                ))
            }
        }
    }
    Ok((c, storage_version))
}

/// An `event_definitions` entry: `payloads`, a list of SQL strings.
fn event(name: &str, v: &Y) -> Result<RawEvent, RulesError> {
    let mut payloads = None;
    for (k, val) in mapping(v, &format!("event definition `{name}`"))? {
        match (k.as_str(), val) {
            ("payloads", Y::Sequence(items)) => {
                payloads = Some(
                    items
                        .iter()
                        .map(|i| sql_string(i, name, "payloads"))
                        .collect::<Result<Vec<_>, _>>()?,
                )
            }
            ("payloads", other) => {
                return Err(RulesError::config(
                    name,
                    format!("event payloads must be a list, found {}", short(other)),
                    "payloads: [SELECT <columns> FROM <table>]",
                ))
            }
            (other, _) => {
                return Err(RulesError::config(
                    name,
                    format!("unknown key `{other}` in an event definition"),
                    "payloads",
                ))
            }
        }
    }
    let payloads = payloads.ok_or_else(|| {
        RulesError::config(
            name,
            "event definition has no `payloads`",
            "payloads: [SELECT <columns> FROM <table>]",
        )
    })?;
    Ok(RawEvent {
        name: name.to_owned(),
        payloads,
    })
}

fn definition(name: &str, v: &Y) -> Result<RawDefinition, RulesError> {
    let mut d = RawDefinition {
        name: name.to_string(),
        parameters: Vec::new(),
        data: Vec::new(),
        priority: None,
        accept_dangerous: false,
    };
    let mut has_data = false;
    for (k, val) in mapping(v, &format!("bucket definition `{name}`"))? {
        match k.as_str() {
            "parameters" => d.parameters = sql_list(val, name, "parameters")?,
            "data" => {
                has_data = true;
                d.data = sql_list(val, name, "data")?;
            }
            "priority" => d.priority = Some(priority(val, name)?),
            "accept_potentially_dangerous_queries" => {
                d.accept_dangerous = boolean(val, name, &k)?;
            }
            other => {
                return Err(RulesError::config(
                    name,
                    format!("unknown key `{other}` in a bucket definition"),
                    "parameters, data, priority, accept_potentially_dangerous_queries",
                ))
            }
        }
    }
    if !has_data {
        return Err(RulesError::config(
            name,
            "bucket definition has no `data` queries",
            "add `data: [SELECT ... FROM ...]`",
        ));
    }
    Ok(d)
}

fn stream(name: &str, v: &Y, edition: u8) -> Result<RawStream, RulesError> {
    let mut s = RawStream {
        name: name.to_string(),
        queries: Vec::new(),
        uses_queries_key: false,
        auto_subscribe: false,
        priority: None,
        with: Vec::new(),
        accept_dangerous: false,
    };
    let (mut query, mut queries) = (None, None);
    for (k, val) in mapping(v, &format!("stream `{name}`"))? {
        match k.as_str() {
            "query" => query = Some(sql_string(val, name, "query")?),
            "queries" => queries = Some(sql_list(val, name, "queries")?),
            "auto_subscribe" => s.auto_subscribe = boolean(val, name, &k)?,
            "priority" => s.priority = Some(priority(val, name)?),
            "with" => {
                if edition < 3 {
                    return Err(RulesError::config(name, "`with:` needs edition 3", "config: { edition: 3 }"));
                }
                s.with = ctes(val, name)?;
            }
            "accept_potentially_dangerous_queries" => {
                s.accept_dangerous = boolean(val, name, &k)?;
            }
            other => {
                return Err(RulesError::config(
                    name,
                    format!("unknown key `{other}` in a stream"),
                    "query or queries, auto_subscribe, priority, with, accept_potentially_dangerous_queries",
                ))
            }
        }
    }
    match (query, queries) {
        (Some(q), None) => s.queries = vec![q],
        (None, Some(qs)) => {
            if edition < 3 {
                return Err(RulesError::config(
                    name,
                    "`queries:` needs edition 3",
                    "use `query:` or config: { edition: 3 }",
                ));
            }
            if qs.is_empty() {
                return Err(RulesError::config(
                    name,
                    "`queries:` is empty",
                    "list at least one query",
                ));
            }
            s.uses_queries_key = true;
            s.queries = qs;
        }
        (Some(_), Some(_)) => {
            return Err(RulesError::config(
                name,
                "both `query` and `queries` are set",
                "use exactly one of them",
            ))
        }
        (None, None) => {
            return Err(RulesError::config(
                name,
                "neither `query` nor `queries` is set",
                "add `query: SELECT ...`",
            ))
        }
    }
    Ok(s)
}
