//! Table-driven tests: every supported operator, function and PostgreSQL type conversion,
//! in edition 1 and edition 2 where they differ.
use crate::support;

use rules::{OwnedSourceRow, SyncRules};
use support::{eval, ty};

fn rules(edition: u8, select: &str) -> SyncRules {
    let yaml = format!("config:\n  edition: {edition}\nbucket_definitions:\n  g:\n    data:\n      - \"{select}\"\n");
    SyncRules::parse(&yaml).unwrap_or_else(|e| panic!("{select}: {e}"))
}

/// The row every expression test reads.
fn sample_row() -> OwnedSourceRow {
    OwnedSourceRow::new("public", "t")
        .column("id", ty("text"), Some("r1"))
        .column("i", ty("int8"), Some("5"))
        .column("f", ty("float8"), Some("2.5"))
        .column("s", ty("text"), Some("Hello"))
        .column("n", ty("text"), None)
        .column("z", ty("int4"), Some("0"))
        .column("num", ty("text"), Some("12abc"))
        .column("b", ty("bytea"), Some("\\x0102ff"))
        .column("arr", ty("int4[]"), Some("{1,2,3}"))
        .column(
            "j",
            ty("jsonb"),
            Some(r#"{"a": {"b": [1, 2]}, "c": "x", "d.e": 7}"#),
        )
}

/// The JSON text of `expr AS v` for the sample row ("<dropped>" when omitted as a blob).
fn value_of(edition: u8, expr: &str) -> String {
    let r = rules(edition, &format!("SELECT id, {expr} AS v FROM t"));
    let out = eval(&r, &sample_row());
    assert_eq!(out.buckets.len(), 1, "{expr}");
    let data: &str = &out.buckets[0].data;
    match data.strip_prefix(r#"{"id":"r1","v":"#) {
        Some(rest) => rest.strip_suffix('}').unwrap().to_string(),
        None => {
            assert_eq!(data, r#"{"id":"r1"}"#, "{expr}");
            "<dropped>".to_string()
        }
    }
}

fn check(edition: u8, cases: &[(&str, &str)]) {
    let mut failures = Vec::new();
    for (expr, want) in cases {
        let got = value_of(edition, expr);
        if got != *want {
            failures.push(format!(
                "edition {edition}: `{expr}` gave {got}, want {want}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn operators() {
    let cases = [
        ("i + 2", "7"),
        ("i - 7", "-2"),
        ("i * f", "12.5"),
        ("i / 2", "2"),
        ("i / 0", "null"),
        ("f / 0", "null"),
        ("f * 2", "5.0"),
        ("i || 'x'", r#""5x""#),
        ("s || n", "null"),
        ("i = 5", "1"),
        ("i != 5", "0"),
        ("i <> 4", "1"),
        ("i < 6", "1"),
        ("i <= 5", "1"),
        ("i > 5", "0"),
        ("i >= 6", "0"),
        ("i = n", "null"),
        ("s > i", "1"),
        ("'a' < 'b'", "1"),
        ("n IS NULL", "1"),
        ("i IS NOT NULL", "1"),
        ("NOT z", "1"),
        ("NOT i", "0"),
        ("NOT n", "1"),
        ("NOT 'abc'", "1"),
        ("NOT '0.5'", "1"),
        ("NOT '12abc'", "0"),
        ("NOT '0x1'", "0"),
        ("n OR z", "0"),
        ("iif('12abc', 1, 2)", "1"),
        ("i + '2.5x'", "7.5"),
        // The official 0.38 reads a sign in text (`parseNumeric`, `parseBigInt`).
        ("i + '-2'", "3"),
        ("i AND z", "0"),
        ("i OR z", "1"),
        ("n AND z", "0"),
        ("n OR i", "1"),
        ("n AND i", "0"),
        ("i IN (1, 5)", "1"),
        ("i NOT IN (1, 2)", "1"),
        ("i IN (1, n)", "null"),
        ("2 IN arr", "1"),
        ("7 IN arr", "0"),
        ("-i", "-5"),
        ("-f", "-2.5"),
        ("TRUE", "1"),
        ("FALSE", "0"),
        ("1.0", "1.0"),
        ("NULL", "null"),
        ("'it''s'", r#""it's""#),
        ("(i + 1) * 2", "12"),
    ];
    check(1, &cases);
    check(2, &cases);
}

/// The sample row's `j -> 'a'` as a text value (a JSON string holding the object).
const MEMBER_A_AS_TEXT: &str = r#""{\"b\":[1,2]}""#;

#[test]
fn functions() {
    let cases = [
        ("upper(s)", r#""HELLO""#),
        ("lower(s)", r#""hello""#),
        ("upper(n)", "null"),
        ("length(s)", "5"),
        ("length(b)", "3"),
        ("length(i)", "1"),
        ("length(n)", "null"),
        ("substring(s, 2)", r#""ello""#),
        ("substring(s, 2, 3)", r#""ell""#),
        ("substring(s, -3)", r#""llo""#),
        ("substring(s, 0, 2)", r#""H""#),
        ("substr(s, -3, 2)", r#""ll""#),
        ("substring(s FROM 2 FOR 2)", r#""el""#),
        ("substring(s, -7, 3)", r#""Hel""#),
        ("substring(s, 3, -2)", r#""He""#),
        ("substring(b, 1, 1)", r#""\u0001""#),
        ("length('😀')", "2"),
        ("hex(b)", r#""0102FF""#),
        ("hex(s)", r#""48656C6C6F""#),
        ("hex(n)", r#""""#),
        ("base64(b)", r#""AQL/""#),
        ("base64(s)", r#""SGVsbG8=""#),
        ("ifnull(n, 'd')", r#""d""#),
        ("ifnull(i, 0)", "5"),
        ("iif(i > 1, 'big', 'small')", r#""big""#),
        ("iif(n, 1, 2)", "2"),
        ("typeof(f)", r#""real""#),
        ("typeof(n)", r#""null""#),
        ("json_extract(j, '$.a.b[1]')", "2"),
        ("json_extract(j, '$.c')", r#""x""#),
        ("json_extract(j, '$.a')", MEMBER_A_AS_TEXT),
        ("json_extract(j, '$.missing')", "null"),
        ("j -> 'c'", r#""\"x\"""#),
        ("j ->> 'c'", r#""x""#),
        ("j ->> 'a'", MEMBER_A_AS_TEXT),
        ("j -> 'missing'", "null"),
        ("j ->> '$.a.b'", r#""[1,2]""#),
        ("arr ->> 0", "1"),
        ("arr ->> '2'", "3"),
        ("json_array_length(arr)", "3"),
        ("json_valid(j)", "1"),
        ("json_valid(s)", "0"),
        ("json_valid(n)", "0"),
        ("json_valid(i)", "1"),
        ("instr(s, 'll')", "3"),
        ("instr(s, 'z')", "0"),
        ("instr(n, 'z')", "null"),
        ("json_keys(j)", r#""[\"a\",\"c\",\"d.e\"]""#),
        ("json_keys(arr)", "null"),
        ("CAST(i AS text)", r#""5""#),
        ("CAST(f AS integer)", "2"),
        ("CAST(num AS integer)", "12"),
        ("CAST(i AS real)", "5.0"),
        ("CAST('3.0' AS numeric)", "3.0"),
        ("CAST('7' AS numeric)", "7"),
        ("CAST(-f AS integer)", "-3"),
        ("CAST('-5' AS integer)", "-5"),
        ("CAST(' +7x' AS integer)", "7"),
        ("CAST('-.5' AS numeric)", "-0.5"),
        ("CAST('2.' AS numeric)", "2.0"),
        ("CAST('12.7' AS integer)", "12"),
        ("CAST('x' AS real)", "0.0"),
        ("CAST('2.5' AS numeric)", "2.5"),
        ("CAST(s AS blob)", "<dropped>"),
        ("i::text", r#""5""#),
        ("b", "<dropped>"),
    ];
    check(1, &cases);
    check(2, &cases);
}

#[test]
fn json_key_rules_differ_by_edition() {
    // Edition 1 splits `->>` keys on dots; edition 2 takes them literally.
    check(
        1,
        &[
            ("j ->> 'a.b'", r#""[1,2]""#),
            ("j ->> 'd.e'", "null"),
            ("j ->> 'a.b.1'", "2"),
        ],
    );
    check(
        2,
        &[
            ("j ->> 'a.b'", "null"),
            ("j ->> 'd.e'", "7"),
            ("j ->> 'a.b.1'", "null"),
        ],
    );
}

#[test]
fn in_without_parentheses_binds_looser_than_json_operators() {
    let r = rules(2, "SELECT id FROM t WHERE 'x' IN j -> 'list'");
    let row = |list: &str| {
        OwnedSourceRow::new("public", "t")
            .column("id", ty("text"), Some("r"))
            .column("j", ty("jsonb"), Some(list))
    };
    assert_eq!(eval(&r, &row(r#"{"list": ["x", "y"]}"#)).buckets.len(), 1);
    assert_eq!(eval(&r, &row(r#"{"list": ["y"]}"#)).buckets.len(), 0);
}

/// (type, PostgreSQL text, edition-1 JSON, edition-2 JSON)
const TYPES: &[(&str, Option<&str>, &str, &str)] = &[
    ("bool", Some("t"), "1", "1"),
    ("bool", Some("f"), "0", "0"),
    ("int2", Some("7"), "7", "7"),
    ("int4", Some("-42"), "-42", "-42"),
    (
        "int8",
        Some("9223372036854775807"),
        "9223372036854775807",
        "9223372036854775807",
    ),
    ("oid", Some("12"), "12", "12"),
    ("float8", Some("2.5"), "2.5", "2.5"),
    ("float8", Some("3"), "3.0", "3.0"),
    ("float8", Some("NaN"), "null", "null"),
    ("float8", Some("Infinity"), "null", "null"),
    ("float8", Some("-Infinity"), "null", "null"),
    ("float8", Some("1e+21"), "1e+21", "1e+21"),
    ("float4", Some("0.1"), "0.1", "0.1"),
    ("numeric", Some("12.50"), r#""12.50""#, r#""12.50""#),
    ("numeric", Some("NaN"), r#""NaN""#, r#""NaN""#),
    (
        "text",
        Some("a\"b\\c\n"),
        r#""a\"b\\c\n""#,
        r#""a\"b\\c\n""#,
    ),
    ("varchar", Some("ü/€"), r#""ü/€""#, r#""ü/€""#),
    (
        "uuid",
        Some("0a6b5a3e-6a43-4f3c-9f0e-3a5b0c1d2e3f"),
        r#""0a6b5a3e-6a43-4f3c-9f0e-3a5b0c1d2e3f""#,
        r#""0a6b5a3e-6a43-4f3c-9f0e-3a5b0c1d2e3f""#,
    ),
    (
        "date",
        Some("2024-05-01"),
        r#""2024-05-01""#,
        r#""2024-05-01""#,
    ),
    (
        "date",
        Some("infinity"),
        r#""9999-12-31""#,
        r#""9999-12-31""#,
    ),
    (
        "date",
        Some("-infinity"),
        r#""0000-01-01""#,
        r#""0000-01-01""#,
    ),
    (
        "time",
        Some("10:00:00"),
        r#""10:00:00""#,
        r#""10:00:00.000000""#,
    ),
    (
        "time",
        Some("10:00:00.5"),
        r#""10:00:00.5""#,
        r#""10:00:00.500000""#,
    ),
    (
        "timestamp",
        Some("2024-05-01 10:00:00.123"),
        r#""2024-05-01 10:00:00.123""#,
        r#""2024-05-01T10:00:00.123000""#,
    ),
    (
        "timestamp",
        Some("infinity"),
        r#""9999-12-31 23:59:59""#,
        r#""9999-12-31T23:59:59.000000""#,
    ),
    (
        "timestamptz",
        Some("2024-05-01 01:30:00.25-05:30"),
        r#""2024-05-01 07:00:00.25Z""#,
        r#""2024-05-01T07:00:00.250000Z""#,
    ),
    (
        "timestamptz",
        Some("2024-12-31 23:00:00-02"),
        r#""2025-01-01 01:00:00Z""#,
        r#""2025-01-01T01:00:00.000000Z""#,
    ),
    (
        "timestamptz",
        Some("2026-01-01 00:00:00+00"),
        r#""2026-01-01 00:00:00Z""#,
        r#""2026-01-01T00:00:00.000000Z""#,
    ),
    (
        "json",
        Some(r#"{"a": 1}"#),
        r#""{\"a\": 1}""#,
        r#""{\"a\": 1}""#,
    ),
    (
        "jsonb",
        Some(r#"[1, "x"]"#),
        r#""[1, \"x\"]""#,
        r#""[1, \"x\"]""#,
    ),
    ("bytea", Some("\\x0102"), "<dropped>", "<dropped>"),
    (
        "int4[]",
        Some("{1,2,NULL}"),
        r#""[1,2,null]""#,
        r#""[1,2,null]""#,
    ),
    (
        "text[]",
        Some(r#"{a,"b c","q\"x"}"#),
        r#""[\"a\",\"b c\",\"q\\\"x\"]""#,
        r#""[\"a\",\"b c\",\"q\\\"x\"]""#,
    ),
    ("bool[]", Some("{t,f}"), r#""[1,0]""#, r#""[1,0]""#),
    (
        "float8[]",
        Some("{1,2.5}"),
        r#""[1.0,2.5]""#,
        r#""[1.0,2.5]""#,
    ),
    (
        "numeric[]",
        Some("{1.50}"),
        r#""[\"1.50\"]""#,
        r#""[\"1.50\"]""#,
    ),
    (
        "int4[]",
        Some("{{1,2},{3,4}}"),
        r#""[[1,2],[3,4]]""#,
        r#""[[1,2],[3,4]]""#,
    ),
    ("int4[]", Some("[0:1]={5,6}"), r#""[5,6]""#, r#""[5,6]""#),
    (
        "jsonb[]",
        Some(r#"{"{\"a\": 1}"}"#),
        r#""[{\"a\": 1}]""#,
        r#""[{\"a\": 1}]""#,
    ),
    ("int4[]", Some("{}"), r#""[]""#, r#""[]""#),
    (
        "timestamptz[]",
        Some(r#"{"2024-05-01 10:00:00+00"}"#),
        r#""[\"2024-05-01 10:00:00Z\"]""#,
        r#""[\"2024-05-01T10:00:00.000000Z\"]""#,
    ),
    (
        "timestamptz",
        Some("0044-03-15 12:00:00+00 BC"),
        r#""0044-03-15 12:00:00+00 BC""#,
        r#""0044-03-15 12:00:00+00 BC""#,
    ),
    (
        "timestamp",
        Some("10000-01-01 00:00:00"),
        r#""10000-01-01 00:00:00""#,
        r#""10000-01-01 00:00:00""#,
    ),
    (
        "pg_lsn",
        Some("0/16B3748"),
        r#""00000000/016B3748""#,
        r#""00000000/016B3748""#,
    ),
    (
        "interval",
        Some("1 day 02:00:00"),
        r#""1 day 02:00:00""#,
        r#""1 day 02:00:00""#,
    ),
    ("text", None, "null", "null"),
    ("int8", None, "null", "null"),
];

#[test]
fn type_conversions_both_editions() {
    let mut failures = Vec::new();
    for edition in [1u8, 2] {
        let r = rules(edition, "SELECT * FROM t");
        for (t, text, want1, want2) in TYPES {
            let row = OwnedSourceRow::new("public", "t")
                .column("id", ty("text"), Some("r"))
                .column("c", ty(t), *text);
            let data = eval(&r, &row).buckets[0].data.to_string();
            let want = if edition == 1 { want1 } else { want2 };
            let expected = if *want == "<dropped>" {
                r#"{"id":"r"}"#.to_string()
            } else {
                format!(r#"{{"id":"r","c":{want}}}"#)
            };
            if data != expected {
                failures.push(format!(
                    "edition {edition} {t} {text:?}: got {data}, want {expected}"
                ));
            }
            serde_json::from_str::<serde_json::Value>(&data).expect("data is valid JSON");
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bad_values_are_row_errors_naming_table_and_column() {
    let r = rules(1, "SELECT * FROM t");
    for (t, text) in [
        ("int8", "12x"),
        ("bool", "maybe"),
        ("float8", "abc"),
        ("timestamptz", "yesterday"),
        ("timestamptz", "2024-05-01 10:00:0ü+00"),
        ("int4[]", "{1,2"),
    ] {
        let row = OwnedSourceRow::new("public", "t")
            .column("id", ty("text"), Some("r"))
            .column("c", ty(t), Some(text));
        let cols = row.source_columns();
        let err = r
            .plan_for("public", "t")
            .unwrap()
            .evaluate(&row.view(&cols))
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("public.t") && msg.contains("column c"),
            "{msg}"
        );
        assert_eq!(err.code(), "PSM_RULES_ROW");
    }
}

#[test]
fn star_skips_underscore_columns_and_explicit_columns_win() {
    let r = rules(1, "SELECT *, upper(s) AS s FROM t");
    let row = OwnedSourceRow::new("public", "t")
        .column("id", ty("text"), Some("r"))
        .column("_secret", ty("text"), Some("x"))
        .column("s", ty("text"), Some("low"));
    assert_eq!(&*eval(&r, &row).buckets[0].data, r#"{"id":"r","s":"LOW"}"#);
}

#[test]
fn object_id_and_output_table_rules() {
    let r = rules(
        1,
        "SELECT CAST(n AS integer) AS id, s FROM public.t AS items",
    );
    let row = OwnedSourceRow::new("public", "t")
        .column("n", ty("text"), Some("42"))
        .column("s", ty("text"), Some("x"));
    let b = &eval(&r, &row).buckets[0];
    assert_eq!((&*b.object_type, &*b.object_id), ("items", "42"));
    let null_id = OwnedSourceRow::new("public", "t").column("n", ty("text"), None);
    assert_eq!(&*eval(&r, &null_id).buckets[0].object_id, "");
    let real = rules(1, "SELECT f AS id FROM t");
    let row = OwnedSourceRow::new("public", "t").column("f", ty("float8"), Some("1.5"));
    assert_eq!(&*eval(&real, &row).buckets[0].object_id, "1.5");
}

#[test]
fn quoted_identifiers_keep_case() {
    let r = rules(1, r#"SELECT id, \"Name\" AS n FROM \"Items\""#);
    assert!(r.plan_for("public", "Items").is_some());
    let row = OwnedSourceRow::new("public", "Items")
        .column("id", ty("text"), Some("1"))
        .column("Name", ty("text"), Some("x"));
    assert_eq!(&*eval(&r, &row).buckets[0].data, r#"{"id":"1","n":"x"}"#);
}

#[test]
fn a_plan_reads_the_columns_its_queries_name_and_what_star_takes() {
    let rules = SyncRules::parse(
        "
bucket_definitions:
  by_list:
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT id, title FROM todos WHERE list_id = bucket.list_id AND status != 'gone'
  everything:
    data:
      - SELECT * FROM notes
",
    )
    .unwrap();
    let todos = rules.plan_for("public", "todos").unwrap();
    for read in ["id", "title", "list_id", "status"] {
        assert!(todos.reads_column(read), "todos.{read}");
    }
    for unread in ["note", "due", "_internal"] {
        assert!(!todos.reads_column(unread), "todos.{unread}");
    }
    let lists = rules.plan_for("public", "lists").unwrap();
    assert!(lists.reads_column("id") && lists.reads_column("owner_id"));
    assert!(!lists.reads_column("name"));
    let notes = rules.plan_for("public", "notes").unwrap();
    assert!(notes.reads_column("anything_new") && notes.reads_column("id"));
    assert!(
        !notes.reads_column("_hidden"),
        "* leaves out columns starting with _"
    );
}
