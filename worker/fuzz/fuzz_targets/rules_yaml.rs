//! Sync rules text: `rules::SyncRules::parse` on arbitrary text (YAML and the SQL inside
//! it); rules that compile are exercised with a row per table and a request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rules::SyncRules;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(rules) = SyncRules::parse(&text) {
        powersync_mdbx_fuzz::exercise_rules(
            &rules,
            serde_json::json!({"sub": "u", "parameters": {"a": [1], "p": "x"}}),
        );
    }
});
