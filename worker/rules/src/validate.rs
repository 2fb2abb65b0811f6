//! `powersync_mdbx.validate_rules()`: compiles a sync-rules text and reports, as JSON, what
//! it defines or where it is wrong (from the [`RulesError`] fields, not its text).

use serde_json::{json, Value};

use super::error::RulesError;
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
                    json!({
                        "code": w.kind.code(),
                        "message": w.to_string(),
                        "hint": w.hint,
                        "kind": w.location.kind,
                        "rule": w.location.rule,
                        "query": w.location.query_label,
                        "sql": w.location.sql,
                        "line": w.location.line,
                        "column": w.location.column,
                        "excerpt": w.excerpt,
                    })
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
        RulesError::Sql { location, hint, .. } => json!({
            "kind": location.kind,
            "rule": location.rule,
            "query": location.query_label,
            "sql": location.sql,
            "line": location.line,
            "column": location.column,
            "hint": hint,
        }),
        RulesError::Row { table, column, .. } => json!({ "table": table, "column": column }),
        RulesError::Request { .. } => json!({}),
    };
    if let (Value::Object(out), Value::Object(fields)) = (&mut out, fields) {
        out.extend(fields);
    }
    out
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
