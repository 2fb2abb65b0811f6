//! A sync config as the official `SyncRulesStatus` shows it: the tables it reads as the
//! primary has them now, and its errors and warnings with their place in the YAML text.

use serde_json::{json, Value};
use tokio_postgres::Client;

use super::{connect, problem, ConfigInUse, ADMIN_DEADLINE, CONNECTION_ID, CONNECTION_TAG};
use config::SourceConnection;
use rules::{RulesError, SqlLocation, SyncRules, TableRef};
use source::{SourceError, SourceTable};

/// `POST /api/admin/v1/validate`: `text` compiled, its tables checked on the primary.
pub(super) async fn validate(source: &SourceConnection, text: &str) -> Value {
    let rules = match SyncRules::parse(text) {
        Ok(rules) => rules,
        Err(e) => return json!({ "connections": [], "errors": [rules_error(text, &e)] }),
    };
    let tables = live_tables(source, &rules).await;
    let mut errors = table_errors(&tables);
    errors.extend(warnings(&rules));
    json!({
        "connections": [{
            "id": CONNECTION_ID,
            "tag": CONNECTION_TAG,
            "slot_name": "",
            "initial_replication_done": false,
            "tables": tables,
        }],
        "errors": errors,
    })
}

/// `POST /api/sync-rules/v1/validate`: what `text` defines and reads, or its errors.
pub(super) async fn debug_text(source: &SourceConnection, text: &str) -> Value {
    match SyncRules::parse(text) {
        Ok(rules) => debug_rules(source, &rules).await,
        Err(e) => json!({ "valid": false, "errors": [rules_error(text, &e)] }),
    }
}

/// `GET /api/sync-rules/v1/current`'s entry for one config.
pub(super) async fn debug_config(source: &SourceConnection, config: &ConfigInUse) -> Value {
    let mut out = json!({ "slot_name": config.slot, "content": config.rules.text() });
    if let (Value::Object(out), Value::Object(debug)) =
        (&mut out, debug_rules(source, &config.rules).await)
    {
        out.extend(debug);
    }
    out
}

async fn debug_rules(source: &SourceConnection, rules: &SyncRules) -> Value {
    let names: Vec<&str> = rules.sources().iter().map(|s| s.name.as_str()).collect();
    json!({
        "valid": true,
        "bucket_definitions": names,
        "source_tables": live_tables(source, rules).await,
    })
}

/// Every table `rules` read, as `TableInfo`s read from the primary within the deadline; a
/// wildcard table stands for each published table it matches. When the primary cannot be
/// read, each table carries that error, as the official service's "connection failed".
pub(super) async fn live_tables(source: &SourceConnection, rules: &SyncRules) -> Vec<Value> {
    let read = async {
        let client = connect(source).await?;
        Ok::<_, String>(tables_of(&client, rules).await)
    };
    let failed = match tokio::time::timeout(ADMIN_DEADLINE, read).await {
        Ok(Ok(tables)) => return tables,
        Ok(Err(message)) => message,
        Err(_) => format!(
            "the primary did not answer within {}s",
            ADMIN_DEADLINE.as_secs()
        ),
    };
    rules
        .tables()
        .into_iter()
        .map(|(table, usage)| {
            let mut info = table_info(&table, usage, Vec::new());
            info["errors"] = json!([problem("fatal", format!("connection failed: {failed}"))]);
            info
        })
        .collect()
}

async fn tables_of(client: &Client, rules: &SyncRules) -> Vec<Value> {
    let mut out = Vec::new();
    for (table, usage) in rules.tables() {
        if table.is_pattern() {
            let prefix = table.name.trim_end_matches('%');
            match source::published_with_prefix(client, &table.schema, prefix).await {
                Ok(matched) => {
                    for found in matched {
                        let mut info = checked(client, &found, usage).await;
                        info["pattern"] = json!(table.name);
                        out.push(info);
                    }
                }
                Err(e) => {
                    let mut info = table_info(&table, usage, Vec::new());
                    info["pattern"] = json!(table.name);
                    info["errors"] = json!([problem("fatal", e.to_string())]);
                    out.push(info);
                }
            }
            continue;
        }
        let named = SourceTable {
            schema: table.schema.clone(),
            name: table.name.clone(),
        };
        out.push(checked(client, &named, usage).await);
    }
    out
}

/// One table checked as replication checks it.
async fn checked(client: &Client, table: &SourceTable, usage: rules::TableUsage) -> Value {
    let reference = TableRef {
        schema: table.schema.clone(),
        name: table.name.clone(),
    };
    match source::table_status(client, table).await {
        Ok(found) => table_info(&reference, usage, found.identity_columns),
        Err(e) => {
            let mut info = table_info(&reference, usage, Vec::new());
            let message = match &e {
                SourceError::Setup { code, message } => format!("{code} {message}"),
                other => other.to_string(),
            };
            info["errors"] = json!([problem("fatal", message)]);
            info
        }
    }
}

fn table_info(table: &TableRef, usage: rules::TableUsage, identity: Vec<String>) -> Value {
    json!({
        "schema": table.schema,
        "name": table.name,
        "replication_id": identity,
        "data_queries": usage.data,
        "parameter_queries": usage.parameters,
        "errors": [],
    })
}

/// The tables' errors, which the official shape repeats in the config's `errors`.
pub(super) fn table_errors(tables: &[Value]) -> Vec<Value> {
    tables
        .iter()
        .filter_map(|t| t["errors"].as_array())
        .flatten()
        .cloned()
        .collect()
}

/// What the official compiler warns about, as warnings with their place.
pub(super) fn warnings(rules: &SyncRules) -> Vec<Value> {
    rules
        .warnings()
        .iter()
        .map(|w| {
            let mut entry = problem("warning", w.to_string());
            if let Some((start, end)) = excerpt_span(rules.text(), &w.location, &w.excerpt) {
                entry["location"] = json!({ "start_offset": start, "end_offset": end });
            }
            entry
        })
        .collect()
}

/// A compile error as a fatal `ReplicationError`, placed in `text` where it can be.
pub(super) fn rules_error(text: &str, e: &RulesError) -> Value {
    let mut entry = problem("fatal", e.to_string());
    let span = match e {
        RulesError::Yaml { line, column, .. } => {
            offset_of(text, *line, *column).map(|start| (start, line_end(text, start)))
        }
        RulesError::Sql { location, .. } => sql_span(text, location),
        _ => None,
    };
    if let Some((start, end)) = span {
        entry["location"] = json!({ "start_offset": start, "end_offset": end });
    }
    entry
}

/// The place of a SQL error: its query found in the text, then its line and column.
fn sql_span(text: &str, location: &SqlLocation) -> Option<(usize, usize)> {
    let query = query_start(text, location)?;
    if location.line == 0 {
        return Some((query, query + location.sql.len()));
    }
    let inside = offset_of(&location.sql, location.line, location.column)?;
    Some((query + inside, query + location.sql.len()))
}

/// The place of a warning's excerpt within its query.
fn excerpt_span(text: &str, location: &SqlLocation, excerpt: &str) -> Option<(usize, usize)> {
    let query = query_start(text, location)?;
    let inside = location.sql.find(excerpt).unwrap_or(0);
    let length = if excerpt.is_empty() {
        location.sql.len()
    } else {
        excerpt.len()
    };
    Some((query + inside, query + inside + length))
}

fn query_start(text: &str, location: &SqlLocation) -> Option<usize> {
    (!location.sql.is_empty())
        .then(|| text.find(&location.sql))
        .flatten()
        .map(|bytes| char_offset(text, bytes))
}

/// The character offset of 1-based `line` and `column` in `text`.
fn offset_of(text: &str, line: u64, column: u64) -> Option<usize> {
    if line == 0 {
        return None;
    }
    let mut offset = 0;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i as u64 + 1 == line {
            let column = usize::try_from(column.saturating_sub(1)).ok()?;
            return Some(offset + column.min(l.chars().count()));
        }
        offset += l.chars().count();
    }
    // The line after a final newline: the end of the text.
    (text.ends_with('\n') && line as usize == text.split_inclusive('\n').count() + 1)
        .then_some(offset)
}

/// The character offset of the end of the line holding character `start`.
fn line_end(text: &str, start: usize) -> usize {
    text.chars()
        .skip(start)
        .position(|c| c == '\n')
        .map_or(text.chars().count(), |n| start + n)
}

/// Byte offset `bytes` of `text` as a character offset (the official offsets count
/// characters).
fn char_offset(text: &str, bytes: usize) -> usize {
    text[..bytes].chars().count()
}
