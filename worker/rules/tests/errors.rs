//! Every unsupported construct is an error naming the rule, the query and the position,
//! and saying what is supported instead. Nothing is silently ignored.
use rules::{RulesError, SyncRules};

fn data_def(sql: &str) -> String {
    format!(
        "bucket_definitions:\n  by_user:\n    parameters: SELECT request.user_id() AS p\n    data:\n      - SELECT id FROM ok WHERE owner = bucket.p\n      - \"{sql}\"\n"
    )
}

fn param_def(sql: &str) -> String {
    format!("bucket_definitions:\n  by_user:\n    parameters: \"{sql}\"\n    data:\n      - SELECT id FROM ok WHERE owner = bucket.p\n")
}

fn stream(sql: &str) -> String {
    format!("config:\n  edition: 3\nstreams:\n  s1:\n    query: \"{sql}\"\n")
}

/// (yaml, rule, query label, line, column, message fragment)
type Case = (String, &'static str, &'static str, u64, u64, &'static str);

/// Every case, in order.
fn cases() -> Vec<Case> {
    [
        query_shape_cases(),
        expression_cases(),
        bucket_parameter_cases(),
        operator_and_name_cases(),
        parameter_query_cases(),
        stream_cases(),
    ]
    .concat()
}

/// Statement and FROM forms a data query cannot have: LIMIT, ORDER BY, GROUP BY,
/// DISTINCT, several statements, non-SELECT, JOIN, subqueries.
fn query_shape_cases() -> Vec<Case> {
    vec![
        (
            data_def("SELECT id FROM t WHERE owner = bucket.p LIMIT 3"),
            "by_user",
            "data[1]",
            1,
            47,
            "LIMIT",
        ),
        (
            data_def("SELECT id FROM t WHERE owner = bucket.p ORDER BY id"),
            "by_user",
            "data[1]",
            1,
            50,
            "ORDER BY",
        ),
        (
            data_def("SELECT owner AS id FROM t WHERE owner = bucket.p GROUP BY owner"),
            "by_user",
            "data[1]",
            1,
            59,
            "GROUP BY",
        ),
        (
            data_def("SELECT DISTINCT id FROM t WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            1,
            "DISTINCT",
        ),
        (
            data_def("SELECT id FROM a WHERE owner = bucket.p; SELECT id FROM b"),
            "by_user",
            "data[1]",
            1,
            42,
            "more than one SQL statement",
        ),
        (
            data_def("DELETE FROM t"),
            "by_user",
            "data[1]",
            1,
            1,
            "only SELECT",
        ),
        (
            data_def("SELECT t.id FROM t JOIN u ON t.a = u.b WHERE t.owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            25,
            "JOIN",
        ),
        (
            data_def("SELECT id FROM (SELECT id FROM t) AS x"),
            "by_user",
            "data[1]",
            1,
            17,
            "only plain table names",
        ),
    ]
}

/// Expressions and output columns a data query cannot have: LIKE, unknown functions,
/// wrong arity, unsupported casts, unnamed outputs, no `id`.
fn expression_cases() -> Vec<Case> {
    vec![
        (
            data_def("SELECT id FROM t WHERE owner = bucket.p AND name LIKE 'a%'"),
            "by_user",
            "data[1]",
            1,
            45,
            "LIKE",
        ),
        (
            data_def("SELECT id, foo(name) AS f FROM t WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            12,
            "function `foo` is not supported",
        ),
        (
            data_def("SELECT id, upper(a, b) AS u FROM t WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            12,
            "takes 1 argument",
        ),
        (
            data_def("SELECT id, CAST(a AS date) AS d FROM t WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            17,
            "CAST to `DATE`",
        ),
        (
            data_def("SELECT id, upper(name) FROM t WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            12,
            "needs a name",
        ),
        (
            data_def("SELECT name FROM t WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            1,
            r#""id" column"#,
        ),
    ]
}

/// How a data query may use bucket parameters: not request values, not on both sides,
/// only compared directly, all of them covered, only existing ones, one IN at most.
fn bucket_parameter_cases() -> Vec<Case> {
    vec![
        (
            data_def("SELECT id FROM t WHERE owner = request.user_id()"),
            "by_user",
            "data[1]",
            1,
            32,
            "not available in a data query",
        ),
        (
            data_def("SELECT id FROM t WHERE bucket.p = bucket.p"),
            "by_user",
            "data[1]",
            1,
            24,
            "both sides",
        ),
        (
            data_def("SELECT id FROM t WHERE owner = upper(bucket.p)"),
            "by_user",
            "data[1]",
            1,
            38,
            "can only be compared directly",
        ),
        (
            data_def("SELECT id FROM t"),
            "by_user",
            "data[1]",
            1,
            1,
            "cover all bucket parameters",
        ),
        (
            data_def("SELECT id FROM t WHERE owner = bucket.q"),
            "by_user",
            "data[1]",
            1,
            32,
            "not a parameter",
        ),
        (
            data_def("SELECT id FROM t WHERE bucket.p IN a AND bucket.p IN b"),
            "by_user",
            "data[1]",
            1,
            42,
            "multiple IN",
        ),
    ]
}

/// Operators and names a data query cannot have: BETWEEN, CASE, `<@`,
/// `%`, database-qualified tables, schemas in column references.
fn operator_and_name_cases() -> Vec<Case> {
    vec![
        (
            data_def("SELECT id FROM t WHERE owner = bucket.p AND n BETWEEN 1 AND 2"),
            "by_user",
            "data[1]",
            1,
            45,
            "BETWEEN",
        ),
        (
            data_def("SELECT id, CASE WHEN a THEN 1 END AS c FROM t WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            12,
            "CASE",
        ),
        (
            data_def("SELECT id FROM t WHERE owner = bucket.p AND a <@ b"),
            "by_user",
            "data[1]",
            1,
            47,
            "<@",
        ),
        (
            data_def("SELECT id FROM t WHERE owner = bucket.p AND a % 2 = 0"),
            "by_user",
            "data[1]",
            1,
            45,
            "operator `%`",
        ),
        (
            data_def("SELECT id FROM s.t.u WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            16,
            "database-qualified",
        ),
        (
            data_def("SELECT id, x.y.z AS v FROM t WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            12,
            "schema in a column",
        ),
    ]
}

/// Parameter queries: aliases, `*`, request filters, json_each forms, `_priority`,
/// stream-only functions, unnamed outputs (and json_each in a data query).
fn parameter_query_cases() -> Vec<Case> {
    vec![
        (
            param_def("SELECT m.project AS p FROM members m WHERE m.user_id = request.user_id()"),
            "by_user",
            "parameters[0]",
            1,
            28,
            "table aliases",
        ),
        (
            param_def("SELECT * FROM members WHERE user_id = request.user_id()"),
            "by_user",
            "parameters[0]",
            1,
            8,
            "`*` is not allowed",
        ),
        (
            param_def("SELECT project AS p FROM members WHERE user_id = 'nobody'"),
            "by_user",
            "parameters[0]",
            1,
            40,
            "must compare a row column",
        ),
        (
            data_def("SELECT id FROM json_each(x) WHERE owner = bucket.p"),
            "by_user",
            "data[1]",
            1,
            16,
            "table-valued",
        ),
        (
            param_def("SELECT other AS p FROM json_each(request.jwt() ->> 'ids')"),
            "by_user",
            "parameters[0]",
            1,
            24,
            "no column `other`",
        ),
        (
            param_def("SELECT value AS p FROM json_each(request.jwt(), 1)"),
            "by_user",
            "parameters[0]",
            1,
            24,
            "exactly one argument",
        ),
        (
            param_def("SELECT request.user_id() AS p, 7 AS _priority"),
            "by_user",
            "parameters[0]",
            1,
            32,
            "_priority",
        ),
        (
            param_def("SELECT auth.user_id() AS p"),
            "by_user",
            "parameters[0]",
            1,
            8,
            "only available in streams",
        ),
        (
            param_def("SELECT upper(request.user_id())"),
            "by_user",
            "parameters[0]",
            1,
            8,
            "needs a name",
        ),
    ]
}

/// Stream queries: OR between parameters, legacy request functions, joined tables,
/// NOT IN forms, parameter names, syntax errors.
fn stream_cases() -> Vec<Case> {
    vec![
        (
            stream("SELECT id, json_valid(a) AS v FROM t WHERE a = auth.user_id()"),
            "s1",
            "query",
            1,
            12,
            "function `json_valid` is not supported at edition 3",
        ),
        (
            // Edition 2 (the alpha compiler); edition 3 makes a bucket of each branch.
            stream("SELECT * FROM t WHERE a = auth.user_id() OR b = auth.user_id()")
                .replace("edition: 3", "edition: 2"),
            "s1",
            "query",
            1,
            23,
            "OR between parameter conditions",
        ),
        (
            stream("SELECT * FROM t WHERE a = request.user_id()"),
            "s1",
            "query",
            1,
            27,
            "bucket_definitions form",
        ),
        (
            stream("SELECT * FROM t, other WHERE t.a = other.b"),
            "s1",
            "query",
            1,
            8,
            "`*` is ambiguous when the query joins tables",
        ),
        (
            stream("SELECT t.* FROM t, other WHERE other.b = auth.user_id()"),
            "s1",
            "query",
            1,
            20,
            "`other` is not compared with `t`",
        ),
        (
            stream("SELECT t.* FROM t JOIN u ON u.a = t.a JOIN v ON v.b = u.b AND v.c = u.c WHERE v.d = auth.user_id()"),
            "s1",
            "query",
            1,
            63,
            "tables joined beyond the first are compared by one column",
        ),
        (
            stream("SELECT * FROM t WHERE a NOT IN (SELECT b FROM u WHERE c = auth.user_id())"),
            "s1",
            "query",
            1,
            23,
            "NOT IN (SELECT",
        ),
        (
            stream("SELECT * FROM t WHERE a NOT IN subscription.parameter('x')"),
            "s1",
            "query",
            1,
            29,
            "NOT IN <json array>",
        ),
        (
            stream("SELECT * FROM t WHERE a = subscription.parameter(1)"),
            "s1",
            "query",
            1,
            27,
            "string literal",
        ),
        (
            stream("SELECT * FRM t"),
            "s1",
            "query",
            1,
            14,
            "syntax error",
        ),
    ]
}

#[test]
fn unsupported_constructs_name_rule_query_and_position() {
    let mut failures = Vec::new();
    for (yaml, rule, label, line, column, fragment) in cases() {
        match SyncRules::parse(&yaml) {
            Ok(_) => failures.push(format!("accepted: {yaml}")),
            Err(RulesError::Sql {
                location,
                message,
                hint,
            }) => {
                let text = RulesError::Sql {
                    location: location.clone(),
                    message: message.clone(),
                    hint: hint.clone(),
                }
                .to_string();
                let ok = location.rule == rule
                    && location.query_label == label
                    && (location.line, location.column) == (line, column)
                    && text.contains(fragment)
                    && text.contains(&location.sql)
                    && text.contains(&format!("line {line}, column {column}"))
                    && !hint.is_empty();
                if !ok {
                    failures.push(format!(
                        "{rule}/{label} want {line}:{column} `{fragment}`\n  got {}:{}/{}: {text}",
                        location.line, location.column, location.query_label
                    ));
                }
            }
            Err(other) => failures.push(format!("wrong kind for {yaml}: {other}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn yaml_and_config_errors_name_the_rule() {
    let cases = [
        ("bucket_definitions: [1, 2]", "must be a mapping"),
        ("foo: 1\nbucket_definitions: {}", "unknown top-level key `foo`"),
        ("config:\n  edition: 1\n", "neither `bucket_definitions` nor `streams`"),
        ("config:\n  edition: 4\nstreams: {}", "edition must be 1, 2 or 3"),
        ("config:\n  edition: 3\nbucket_definitions:\n  a:\n    data: [SELECT id FROM t]", "not allowed with edition 3"),
        ("bucket_definitions:\n  a:\n    data: [SELECT id FROM t]\n    priority: 5", "a: priority must be an integer 0..3"),
        ("bucket_definitions:\n  a:\n    parameters: SELECT 1 AS x", "a: bucket definition has no `data`"),
        ("bucket_definitions:\n  a:\n    data: [SELECT id FROM t]\n    extra: 1", "a: unknown key `extra`"),
        ("config:\n  edition: 3\nstreams:\n  s:\n    query: SELECT * FROM t\n    queries: [SELECT * FROM t]", "s: both `query` and `queries`"),
        ("config:\n  edition: 3\nstreams:\n  s:\n    auto_subscribe: true", "s: neither `query` nor `queries`"),
        ("config:\n  edition: 2\nstreams:\n  s:\n    queries: [SELECT * FROM t]", "s: `queries:` needs edition 3"),
        ("config:\n  edition: 2\nstreams:\n  s:\n    query: SELECT * FROM t\n    with:\n      c: SELECT 1 AS x", "s: `with:` needs edition 3"),
        ("streams:\n  s:\n    query: SELECT * FROM t", "streams need edition 2 or 3"),
        ("bucket_definitions:\n  a:\n    data: [SELECT id FROM t]\n  a:\n    data: [SELECT id FROM u]", "duplicate"),
        ("bucket_definitions:\n  a:\n    data: [SELECT id FROM t]\nevent_definitions:\n  e:\n    payloads: SELECT x FROM t", "e: event payloads must be a list"),
        ("bucket_definitions:\n  a:\n    data: [SELECT id FROM t]\nevent_definitions:\n  e:\n    query: SELECT x FROM t", "e: unknown key `query`"),
        ("config:\n  edition: 2\n  timestamp_max_precision: seconds\nstreams: {}", "timestamp_max_precision"),
        (
            "bucket_definitions:\n  a:\n    parameters: [SELECT request.user_id() AS x, SELECT request.user_id() AS y]\n    data: [SELECT id FROM t WHERE o = bucket.x]",
            "bucket parameters must match",
        ),
        ("bucket_definitions:\n  a:\n    data: [SELECT id FROM t]\n\tbad", "YAML"),
    ];
    for (yaml, fragment) in cases {
        let err = SyncRules::parse(yaml).expect_err(yaml).to_string();
        assert!(err.contains(fragment), "{yaml}\n=> {err}");
        assert!(
            err.contains("Fix:") || err.contains("Supported instead:"),
            "{err}"
        );
    }
}
