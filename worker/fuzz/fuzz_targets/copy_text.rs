//! COPY text rows: `source::CopyFields::decode`, then the decoded fields converted to
//! values by the rules' row evaluation (the snapshot's next step) for a table of typed
//! columns. The first byte picks the column count; the rest is the line.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use powersync_mdbx_fuzz::ty;
use rules::{SourceColumn, SourceRow, SyncRules};
use source::CopyFields;

/// Columns of every type family the converters handle.
const COLUMNS: &[(&str, &str)] = &[
    ("id", "text"),
    ("n", "int8"),
    ("b", "bool"),
    ("f", "float8"),
    ("j", "jsonb"),
    ("ts", "timestamptz"),
    ("num", "numeric"),
    ("raw", "bytea"),
    ("arr", "int4[]"),
    ("tags", "text[]"),
    ("u", "uuid"),
    ("d", "date"),
];

static RULES: LazyLock<SyncRules> = LazyLock::new(|| {
    let columns: Vec<&str> = COLUMNS.iter().map(|(name, _)| *name).collect();
    let yaml = format!(
        "bucket_definitions:\n  all:\n    data:\n      - SELECT * FROM t\n  by_n:\n    \
         parameters: SELECT n AS n FROM t WHERE id = request.user_id()\n    data:\n      \
         - SELECT {}, j ->> 'k' AS k FROM t WHERE n = bucket.n\n",
        columns.join(", ")
    );
    SyncRules::parse(&yaml).expect("the target's rules compile")
});

fuzz_target!(|data: &[u8]| {
    let Some((&count, line)) = data.split_first() else {
        return;
    };
    let columns = usize::from(count % 16);
    let mut decoder = CopyFields::new(columns);
    let Ok(fields) = decoder.decode(line) else {
        return;
    };
    assert_eq!(fields.len(), columns);
    for i in 0..columns {
        let (bytes, text) = (fields.get(i), fields.get_str(i));
        // `get_str` skips the UTF-8 check: the decoder must have made it.
        if let Some(bytes) = bytes {
            assert_eq!(std::str::from_utf8(bytes).ok(), text);
        }
    }
    if columns > COLUMNS.len() {
        return;
    }
    let row: Vec<SourceColumn<'_>> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, (name, t))| SourceColumn {
            name,
            pg_type: ty(t),
            value: fields.get_str(i % columns.max(1)).filter(|_| columns > 0),
        })
        .collect();
    let row = SourceRow {
        schema: "public",
        table: "t",
        columns: &row,
    };
    if let Some(plan) = RULES.plan_for("public", "t") {
        if let Ok(out) = plan.evaluate(&row) {
            for bucket in out.buckets {
                let data: serde_json::Value =
                    serde_json::from_str(&bucket.data).expect("row data is JSON");
                assert!(data.is_object());
            }
        }
    }
});
