//! The YAML and SQL front ends and the value converters never panic on arbitrary input.
//!
//! A deterministic generator (fixed seeds, so failures reproduce) feeds random bytes,
//! mutated fixture files, SQL token soup and random PostgreSQL text values.
use crate::support;

use rules::{InMemoryLookups, OwnedSourceRow, RequestContext, SyncRules};
use support::{fixture, ty, Rng};

/// Parse, and when it compiles, also evaluate a row and a request (exercising the plans).
fn exercise(yaml: &str) {
    if let Ok(rules) = SyncRules::parse(yaml) {
        for (t, _) in rules.tables() {
            let row = OwnedSourceRow::new(&t.schema, &t.name)
                .column("id", ty("text"), Some("x"))
                .column("a", ty("int8"), Some("1"))
                .column("b", ty("jsonb"), Some(r#"{"k": [1, "2"]}"#))
                .column("c", ty("text"), None);
            let cols = row.source_columns();
            if let Some(plan) = rules.plan_for(&t.schema, &t.name) {
                if let Ok(out) = plan.evaluate(&row.view(&cols)) {
                    for b in out.buckets {
                        // Names are `<generation>#<source>[<JSON array>]`; data is a JSON object.
                        let source = rules
                            .sources()
                            .iter()
                            .map(|s| format!("1#{}", s.name))
                            .filter(|p| b.bucket.starts_with(p.as_str()))
                            .max_by_key(|p| p.len())
                            .unwrap_or_else(|| panic!("{} has no source prefix", b.bucket));
                        let rest = &b.bucket[source.len()..];
                        let open = rest.find('[').unwrap_or_else(|| panic!("{}", b.bucket));
                        let params: serde_json::Value = serde_json::from_str(&rest[open..])
                            .unwrap_or_else(|e| panic!("{}: {e}", b.bucket));
                        assert!(params.is_array(), "{}", b.bucket);
                        let data: serde_json::Value =
                            serde_json::from_str(&b.data).expect("data JSON");
                        assert!(data.is_object(), "{}", b.data);
                    }
                }
            }
        }
        let req =
            RequestContext::from_claims(serde_json::json!({"sub": "u", "parameters": {"a": [1]}}));
        let _ = rules.resolve_request(&req, &InMemoryLookups::new());
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..3000 {
        let len = rng.below(200);
        let bytes: Vec<u8> = (0..len).map(|_| (rng.next() & 0xff) as u8).collect();
        exercise(&String::from_utf8_lossy(&bytes));
    }
}

#[test]
fn mutated_fixtures_never_panic() {
    let seeds = [
        fixture("sync-config.yaml"),
        fixture("sync-rules-legacy.yaml"),
        "bucket_definitions:\n  d:\n    parameters: SELECT id AS p FROM m WHERE u = request.user_id() OR id IN request.parameters() ->> 'ids'\n    data: [SELECT *, upper(b ->> 'k') AS u FROM t WHERE a = bucket.p AND (c IS NULL OR NOT a > 2)]\n".to_string(),
    ];
    let alphabet =
        b" \n:-[]{}'\"(),.*=<>!|#%$&0123456789abcdefghijklmnopqrstuvwxyzSELECTFROMWHEREIN\t";
    let mut rng = Rng(42);
    for i in 0..3000 {
        let mut s: Vec<u8> = seeds[i % seeds.len()].clone().into_bytes();
        for _ in 0..1 + rng.below(6) {
            if s.is_empty() {
                break;
            }
            let at = rng.below(s.len());
            match rng.below(3) {
                0 => {
                    s.remove(at);
                }
                1 => s.insert(at, alphabet[rng.below(alphabet.len())]),
                _ => s[at] = alphabet[rng.below(alphabet.len())],
            }
        }
        exercise(&String::from_utf8_lossy(&s));
    }
}

#[test]
fn sql_token_soup_never_panics() {
    let tokens = [
        "SELECT",
        "FROM",
        "WHERE",
        "AND",
        "OR",
        "NOT",
        "IN",
        "IS",
        "NULL",
        "AS",
        "id",
        "t",
        "u",
        "bucket.p",
        "t.a",
        "request.user_id()",
        "request.jwt()",
        "request.parameters()",
        "token_parameters.x",
        "auth.user_id()",
        "auth.parameter('k')",
        "subscription.parameter('p')",
        "->",
        "->>",
        "'k'",
        "'$.a'",
        "=",
        "!=",
        "<",
        ">=",
        "+",
        "-",
        "*",
        "/",
        "||",
        "(",
        ")",
        ",",
        "1",
        "2.5",
        "TRUE",
        "upper(",
        "substring(",
        "json_extract(",
        "CAST(",
        "integer",
        "text",
        "::",
        "iif(",
        "ifnull(",
        "hex(",
        "base64(",
        "length(",
        "LIMIT",
        "ORDER BY",
        "JOIN",
        "ON",
        ";",
        "_priority",
        "(SELECT",
        "cte",
        "\"Q\"",
        "%",
        "<@",
        "@>",
        "CASE",
        "WHEN",
        "END",
        "BETWEEN",
        "LIKE",
        "--",
    ];
    let mut rng = Rng(7);
    for i in 0..4000 {
        let mut sql = String::from("SELECT ");
        for _ in 0..rng.below(18) {
            sql.push_str(rng.pick(&tokens));
            sql.push(' ');
        }
        let quoted = sql.replace('\\', "\\\\").replace('"', "\\\"");
        let yaml = match i % 4 {
            0 => format!("bucket_definitions:\n  d:\n    data: [\"{quoted}\"]\n"),
            1 => format!("bucket_definitions:\n  d:\n    parameters: \"{quoted}\"\n    data: [SELECT id FROM t]\n"),
            2 => format!("config:\n  edition: 3\nstreams:\n  s:\n    query: \"{quoted}\"\n"),
            _ => format!(
                "config:\n  edition: 3\nstreams:\n  s:\n    with:\n      cte: \"{quoted}\"\n    query: SELECT * FROM t, cte AS b WHERE t.a = b.x\n"
            ),
        };
        exercise(&yaml);
    }
}

#[test]
fn deep_nesting_is_rejected_not_overflowed() {
    let deep = format!(
        "SELECT id FROM t WHERE {}1{}",
        "(".repeat(5000),
        ")".repeat(5000)
    );
    let yaml = format!("bucket_definitions:\n  d:\n    data: [\"{deep}\"]\n");
    assert!(SyncRules::parse(&yaml).is_err());
    let long_chain = format!("SELECT id FROM t WHERE a = 1{}", " AND a = 1".repeat(20000));
    let yaml = format!("bucket_definitions:\n  d:\n    data: [\"{long_chain}\"]\n");
    assert!(SyncRules::parse(&yaml).is_err());
    let near_limit = format!("SELECT id FROM t WHERE a = 1{}", " AND a = 1".repeat(120));
    let yaml = format!("bucket_definitions:\n  d:\n    data: [\"{near_limit}\"]\n");
    assert!(SyncRules::parse(&yaml).is_err());
    assert!(SyncRules::parse(&"[".repeat(100_000)).is_err());
    assert!(SyncRules::parse(&"a:\n ".repeat(10_000)).is_err());
    for shape in [
        "SELECT id FROM (SELECT id FROM t WHERE {chain}) AS x",
        "SELECT id FROM t WHERE a IN (SELECT b FROM u WHERE {chain})",
        "SELECT id, CASE WHEN {chain} THEN 1 END AS c FROM t",
        "SELECT id, EXTRACT(YEAR FROM {chain}) AS c FROM t",
        "SELECT id, ({chain}, 1) AS c FROM t",
        "SELECT id, x IN {chain} -> 'a' AS c FROM t",
        "SELECT id FROM t WHERE a = 1 ORDER BY {chain}",
        "SELECT id FROM t; SELECT id FROM u WHERE {chain}",
        "DELETE FROM t WHERE {chain}",
        "SELECT id FROM t WHERE a BETWEEN 1 AND {chain}",
        "SELECT id FROM t JOIN u ON {chain}",
    ] {
        // Close to the 500-token limit, so the tree is as deep as the parser accepts.
        let sql = shape.replace("{chain}", &format!("a{}", " + a".repeat(225)));
        for yaml in [
            format!("bucket_definitions:\n  d:\n    data: [\"{sql}\"]\n"),
            format!("config:\n  edition: 3\nstreams:\n  s:\n    query: \"{sql}\"\n"),
        ] {
            assert!(SyncRules::parse(&yaml).is_err(), "{shape}");
        }
    }
    let deep_not = format!("SELECT id FROM t WHERE {}a", "NOT ".repeat(5000));
    let yaml = format!("bucket_definitions:\n  d:\n    data: [\"{deep_not}\"]\n");
    assert!(SyncRules::parse(&yaml).is_err());
}

#[test]
fn random_column_text_never_panics() {
    let types = [
        "bool",
        "int2",
        "int4",
        "int8",
        "float4",
        "float8",
        "numeric",
        "text",
        "uuid",
        "date",
        "time",
        "timestamp",
        "timestamptz",
        "json",
        "jsonb",
        "bytea",
        "int4[]",
        "text[]",
        "jsonb[]",
        "timestamptz[]",
        "pg_lsn",
        "interval",
    ];
    let pieces = [
        "{",
        "}",
        ",",
        "\"",
        "\\",
        "NULL",
        "1",
        "-",
        "+",
        ":",
        ".",
        " ",
        "2024-05-01",
        "10:00:00",
        "+05:30",
        "x",
        "t",
        "f",
        "[",
        "]",
        "=",
        "e",
        "NaN",
        "Infinity",
        "/",
        "ü",
    ];
    let mut rng = Rng(99);
    for edition in [1, 2] {
        let rules = SyncRules::parse(&format!(
            "config:\n  edition: {edition}\nbucket_definitions:\n  d:\n    data:\n      - \"SELECT *, c ->> 'a' AS j, CAST(c AS integer) AS n, substring(c, -2, 3) AS s FROM t\"\n"
        ))
        .unwrap();
        let plan = rules.plan_for("public", "t").unwrap();
        for _ in 0..4000 {
            let mut text = String::new();
            for _ in 0..rng.below(10) {
                text.push_str(rng.pick(&pieces));
            }
            let row = OwnedSourceRow::new("public", "t")
                .column("id", ty("text"), Some("r"))
                .column("c", ty(rng.pick(&types)), Some(&text));
            let cols = row.source_columns();
            if let Ok(out) = plan.evaluate(&row.view(&cols)) {
                for b in out.buckets {
                    serde_json::from_str::<serde_json::Value>(&b.data).unwrap_or_else(|e| {
                        panic!("invalid data JSON {} for {text:?}: {e}", b.data)
                    });
                }
            }
        }
    }
}

/// Edition 3's `BETWEEN` and `CASE operand` nested in their operand: each part is compiled
/// once (a form that repeated its operand per comparison or arm would grow exponentially
/// with the nesting and never finish).
#[test]
fn nested_between_and_case_compile_each_part_once() {
    let between = (0..40).fold("a".to_string(), |x, _| format!("({x} BETWEEN 1 AND 2)"));
    let case = (0..40).fold("a".to_string(), |x, _| {
        format!("(CASE {x} WHEN 1 THEN 1 WHEN 2 THEN 2 WHEN 3 THEN 3 END)")
    });
    for e in [between, case] {
        let yaml = format!(
            "config:\n  edition: 3\nstreams:\n  s:\n    query: \"SELECT id, {e} AS x FROM t\"\n"
        );
        // Refused (too many tokens or too deep) or compiled: either way it ends.
        let _ = SyncRules::parse(&yaml);
    }
}
