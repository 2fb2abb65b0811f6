//! Sync rules SQL: arbitrary text as one query inside a fixed, valid YAML envelope, so the
//! fuzzer spends its time in the SQL parser and compiler rather than in YAML. The first
//! byte picks the place: a bucket data query, a parameter query, a stream query, or a
//! stream's `with` query.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rules::SyncRules;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Some((&place, sql)) = data.split_first() else {
        return;
    };
    let sql = String::from_utf8_lossy(sql);
    let sql = sql.as_ref();
    // JSON is YAML: serde_json quotes the text so any SQL fits the envelope.
    let envelope = match place % 4 {
        0 => json!({"bucket_definitions": {"b": {"data": [sql]}}}),
        1 => json!({"bucket_definitions": {"b": {
            "parameters": sql,
            "data": ["SELECT * FROM t WHERE id = bucket.id"],
        }}}),
        2 => json!({"config": {"edition": 3}, "streams": {"s": {
            "auto_subscribe": true,
            "query": sql,
        }}}),
        _ => json!({"config": {"edition": 3}, "streams": {"s": {
            "with": {"p": sql},
            "queries": ["SELECT t.* FROM t, p AS bucket WHERE t.id = bucket.id"],
        }}}),
    };
    if let Ok(rules) = SyncRules::parse(&envelope.to_string()) {
        powersync_mdbx_fuzz::exercise_rules(
            &rules,
            json!({"sub": "u", "parameters": {"a": [1], "p": "x"}}),
        );
    }
});
