//! `powersync_mdbx.validate_rules()`: compiles a sync-rules text and reports, as JSON, what
//! it defines or where it is wrong (from the [`RulesError`] fields, not its text).

use serde_json::{json, Value};

use super::error::{RulesError, SqlLocation};
use super::sync_rules::{SourceKind, SyncRules};

/// `{"valid": true, "buckets": [...], "streams": [...], "tables": [...], "events": [...],
/// "warnings": [{code, message, hint, ...location}]}` for rules that compile (warnings: what
/// the official compiler warns about); `{"valid": false, "errors": [{code, message, hint,
/// ...location}]}` otherwise.
pub fn validation_report(yaml: &str) -> Value {
    match SyncRules::parse(yaml) {
        Ok(rules) => {
            let names = |kind: SourceKind| -> Vec<&str> {
                rules
                    .sources()
                    .iter()
                    .filter(|s| s.kind == kind)
                    .map(|s| s.name.as_str())
                    .collect()
            };
            let tables: Vec<Value> = rules
                .tables()
                .into_iter()
                .map(|(t, u)| json!({"table": t.to_string(), "data": u.data, "parameters": u.parameters}))
                .collect();
            let events: Vec<Value> = rules
                .event_definitions()
                .iter()
                .map(|e| {
                    let tables: Vec<String> = e.tables.iter().map(ToString::to_string).collect();
                    json!({"name": e.name, "tables": tables})
                })
                .collect();
            let warnings: Vec<Value> = rules
                .warnings()
                .iter()
                .map(|w| {
                    let mut out = json!({
                        "code": w.kind.code(),
                        "message": w.to_string(),
                        "hint": w.hint,
                        "excerpt": w.excerpt,
                    });
                    extend(&mut out, location_json(&w.location));
                    out
                })
                .collect();
            json!({
                "valid": true,
                "edition": rules.compatibility().edition,
                "buckets": names(SourceKind::Definition),
                "streams": names(SourceKind::Stream),
                "tables": tables,
                "events": events,
                "warnings": warnings,
            })
        }
        Err(e) => json!({ "valid": false, "errors": [error_json(&e)] }),
    }
}

/// One error with its code, full message, fix and location fields.
pub fn error_json(e: &RulesError) -> Value {
    let mut out = json!({ "code": e.code(), "message": e.to_string() });
    let fields = match e {
        RulesError::Yaml {
            hint, line, column, ..
        } => json!({ "hint": hint, "line": line, "column": column }),
        RulesError::Config { rule, hint, .. } => json!({ "rule": rule, "hint": hint }),
        RulesError::Sql { location, hint, .. } => {
            let mut fields = location_json(location);
            extend(&mut fields, json!({ "hint": hint }));
            fields
        }
        RulesError::Row { table, column, .. } => json!({ "table": table, "column": column }),
        RulesError::Request { .. } => json!({}),
    };
    extend(&mut out, fields);
    out
}

/// Where in the rules an error or a warning is: rule, query, its SQL and the position.
fn location_json(l: &SqlLocation) -> Value {
    json!({
        "kind": l.kind,
        "rule": l.rule,
        "query": l.query_label,
        "sql": l.sql,
        "line": l.line,
        "column": l.column,
    })
}

/// Adds `fields`' members to the object `out`.
fn extend(out: &mut Value, fields: Value) {
    if let (Value::Object(out), Value::Object(fields)) = (out, fields) {
        out.extend(fields);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_rules_list_their_definitions_and_tables() {
        let r = validation_report(
            "bucket_definitions:\n  global:\n    data:\n      - SELECT * FROM lists\n",
        );
        assert_eq!(r["valid"], true, "{r}");
        assert_eq!(r["buckets"], json!(["global"]));
        assert_eq!(r["streams"], json!([]));
        assert_eq!(r["tables"][0]["data"], true, "{r}");
    }

    #[test]
    fn warnings_and_events_are_listed() {
        let r = validation_report(
            "config:\n  edition: 2\nstreams:\n  s:\n    query: SELECT * FROM lists\n\
             event_definitions:\n  e:\n    payloads:\n      - SELECT user_id FROM checkpoints\n",
        );
        assert_eq!(r["valid"], true, "{r}");
        assert_eq!(
            r["warnings"][0]["code"], "PSM_RULES_WARN_ALPHA_STREAMS",
            "{r}"
        );
        assert!(r["warnings"][0]["hint"].is_string(), "{r}");
        assert_eq!(
            r["events"],
            json!([{"name": "e", "tables": ["public.checkpoints"]}])
        );
    }

    #[test]
    fn sql_errors_carry_rule_query_and_position() {
        let r = validation_report(
            "bucket_definitions:\n  global:\n    data:\n      - SELECT * FROM lists WHERE\n",
        );
        assert_eq!(r["valid"], false, "{r}");
        let e = &r["errors"][0];
        assert_eq!(e["code"], "PSM_RULES_SQL", "{r}");
        assert_eq!(e["rule"], "global");
        assert_eq!(e["query"], "data[0]");
        assert!(e["line"].as_u64() >= Some(1), "{r}");
    }

    #[test]
    fn yaml_errors_carry_the_yaml_position() {
        let r = validation_report("bucket_definitions:\n  global: [\n");
        let e = &r["errors"][0];
        assert_eq!(e["code"], "PSM_RULES_YAML", "{r}");
        assert!(e["line"].as_u64() >= Some(2), "{r}");
        assert!(e["hint"].is_string());
    }
}
