//! Generated cases: random expressions over random typed rows, in every format and edition,
//! and random parameter links with random claims, client parameters and subscriptions.
//! Deterministic for a seed, so a failure prints a case that reproduces.
//!
//! Not generated yet, because this crate still differs there (each is open work of the
//! Sync Streams issue, listed in `docs/sync-rules.md`, "Known differences"):
//! - unary minus on anything but a number literal, exponent literals (`1e3`), `NOT IN`
//!   and `IN (…)` lists holding column references, `->`/`->>` with a number operand, and
//!   `x IN <column>` at edition 3 (where it means a table): the official parser refuses them;
//! - JSON operators and functions over text that is not JSON: the official evaluator fails
//!   the row, this crate gives NULL;
//! - `x IN <JSON scalar>` (the official treats a scalar as a one-element array);
//! - a stream's `priority` at edition 2 (the official alpha compiler ignores it);
//! - integer literals beyond 2^53 (the official parser reads a double);
//! - reals that overflow (`CAST('1e999' AS real)`: the official writes `Infinity` into the
//!   row's JSON, which is not JSON; this crate writes `null`);
//! - `->>` with a number key as text (`'"str"' ->> '1'`: the official indexes the
//!   characters of a JSON string) and `json_array_length` of a non-array (it fails the row);
//! - the truthiness of text at edition 3 (its evaluator takes `'a.b'` as true);
//! - `substring` cutting a character beyond the BMP in two (rows of such cases hold none):
//!   a deliberate difference, `deliberate/substring-cuts-a-character` in `cases.rs`;
//! - `json_extract` and `->>` paths with `[n]` (deliberate: `docs/sync-rules.md`), and
//!   `x IN <request JSON scalar>`;
//! - an array or object inside an array a request expands (the official skips it);
//! - at edition 2, a subscription to a default stream while defaults are off (the official
//!   alpha compiler gives its buckets both reasons);
//! - `IN (…)` lists before edition 3 (at edition 3 the generated `IN ARRAY[…]`/`ROW(…)`
//!   forms stand for them; `x NOT IN ARRAY[…]` is refused here, not there);
//! - integers inside a JSON array or object of the claims or client parameters, when the
//!   array becomes text (the official holds them as JavaScript doubles and prints `1.0`).

use serde_json::{json, Value};

use super::{Case, Request};
use crate::support::Rng;

/// The generated table `t`: its columns, their types and the texts a value takes.
const COLUMNS: &[(&str, &str, &[&str])] = &[
    ("id", "text", &["r1", "r2", "r3", "42", "x y"]),
    (
        "s",
        "text",
        &["abc", "12abc", "-2", "0.5", "", "Äö€😀", "3", "a.b", "null"],
    ),
    (
        "n",
        "int8",
        &[
            "0",
            "1",
            "-5",
            "42",
            "9007199254740993",
            "-9223372036854775808",
        ],
    ),
    ("i", "int4", &["0", "7", "-1", "2147483647"]),
    ("f", "float8", &["0", "1.5", "-2", "3", "0.1", "-0.25"]),
    ("b", "bool", &["t", "f"]),
    (
        "j",
        "jsonb",
        &[
            r#"{"a": 1, "b": [1, 2], "c": {"d": "x"}, "a.b": 5}"#,
            r#"[1, "x", null, 2.5]"#,
            r#""str""#,
            "3",
            "null",
            "{}",
            r#"{"a": "1"}"#,
        ],
    ),
    ("v", "varchar", &["u1", "u2", "p1", "1"]),
    (
        "arr",
        "jsonb",
        &[r#"["u1", "p1"]"#, "[1, 2.5]", "[]", r#"["1", 1, null]"#],
    ),
];

fn random_row(rng: &mut Rng, id: &str) -> Vec<(String, String, Option<String>)> {
    COLUMNS
        .iter()
        .map(|(name, ty, values)| {
            let v = if *name == "id" {
                Some(id.to_string())
            } else if rng.chance(12) {
                None
            } else {
                Some(rng.pick(values).to_string())
            };
            (name.to_string(), ty.to_string(), v)
        })
        .collect()
}

const LITERALS: &[&str] = &[
    "'abc'",
    "'12abc'",
    "'-2'",
    "''",
    "'0.5'",
    "3",
    "-7",
    "0",
    "2.5",
    "NULL",
    "TRUE",
    "FALSE",
    r#"'{"a":1,"b":[1,2]}'"#,
    r#"'[1,2,"x"]'"#,
    "'a.b'",
];

const BINARY: &[&str] = &[
    "+", "-", "*", "/", "||", "=", "!=", "<>", "<", "<=", ">", ">=", "AND", "OR",
];

/// A random expression over `t`'s columns, at most `depth` levels deep.
fn expr(rng: &mut Rng, depth: usize) -> String {
    if depth == 0 || rng.chance(25) {
        return if rng.chance(55) {
            rng.pick(COLUMNS).0.to_string()
        } else {
            rng.pick(LITERALS).to_string()
        };
    }
    let d = depth - 1;
    match rng.below(22) {
        0..=5 => format!("({} {} {})", expr(rng, d), rng.pick(BINARY), expr(rng, d)),
        6 => format!("(NOT {})", expr(rng, d)),
        7 => format!("({} IS NULL)", expr(rng, d)),
        8 => format!("({} IS NOT NULL)", expr(rng, d)),
        9 => format!("(-{})", rng.pick(&["1", "2.5", "0"])),
        10 => format!("({} || {})", expr(rng, d), rng.pick(LITERALS)),
        11 => format!(
            "(j {} '{}')",
            rng.pick(&["->", "->>"]),
            rng.pick(&["a", "b", "c", "a.b", "$.c.d", "zz"])
        ),
        12 => format!("(j ->> '{}')", rng.pick(&["a", "c", "zz"])),
        13 => {
            let f = rng.pick(&[
                "upper",
                "lower",
                "length",
                "hex",
                "typeof",
                "base64",
                "unixepoch",
                "datetime",
            ]);
            format!("{f}({})", expr(rng, d))
        }
        14 => format!(
            "substring({}, {}, {})",
            expr(rng, d),
            rng.pick(&["1", "2", "0", "-1", "-3"]),
            rng.pick(&["1", "2", "10"])
        ),
        15 => format!("instr({}, {})", expr(rng, d), expr(rng, d)),
        16 => format!("ifnull({}, {})", expr(rng, d), expr(rng, d)),
        17 => format!("iif({}, {}, {})", expr(rng, d), expr(rng, d), expr(rng, d)),
        18 => format!(
            "CAST({} AS {})",
            expr(rng, d),
            rng.pick(&["text", "integer", "real", "numeric"])
        ),
        19 => format!(
            "json_extract(j, '{}')",
            rng.pick(&["$.a", "$.b", "$.c.d", "$"])
        ),
        20 => format!("json_array_length(arr, '{}')", rng.pick(&["$", "$.b"])),
        _ => format!(
            "({} {} {})",
            expr(rng, d),
            rng.pick(&["AND", "OR", "="]),
            expr(rng, d)
        ),
    }
}

/// [`expr`] (at edition 3 also `BETWEEN` and `CASE`), without what edition 3 evaluates
/// differently (text literals: see the module's list).
fn expr_for(rng: &mut Rng, depth: usize, edition: u8) -> String {
    loop {
        let e = if edition >= 3 && rng.chance(30) {
            edition3_form(rng, depth)
        } else {
            expr(rng, depth)
        };
        if edition < 3 || !e.contains('\'') {
            return e;
        }
    }
}

/// `BETWEEN`, `CASE` (both forms) or `IN ARRAY[…]`/`ROW(…)` over random expressions:
/// edition 3 only.
fn edition3_form(rng: &mut Rng, depth: usize) -> String {
    let d = depth.saturating_sub(1);
    match rng.below(4) {
        3 => {
            let (open, close) = rng.pick(&[("ARRAY[", "]"), ("ROW(", ")")]);
            let member = format!(
                "({} IN {open}{}, {}{close})",
                expr(rng, d),
                expr(rng, d),
                expr(rng, d)
            );
            if rng.chance(30) {
                format!("(NOT {member})")
            } else {
                member
            }
        }
        0 => format!(
            "({} {}BETWEEN {} AND {})",
            expr(rng, d),
            if rng.chance(30) { "NOT " } else { "" },
            expr(rng, d),
            expr(rng, d)
        ),
        1 => format!(
            "(CASE WHEN {} THEN {} WHEN {} THEN {} ELSE {} END)",
            expr(rng, d),
            expr(rng, d),
            expr(rng, d),
            expr(rng, d),
            expr(rng, d)
        ),
        _ => format!(
            "(CASE {} WHEN {} THEN {} WHEN {} THEN {} END)",
            expr(rng, d),
            expr(rng, d),
            expr(rng, d),
            expr(rng, d),
            expr(rng, d)
        ),
    }
}

/// A config holding one data query in the given format.
fn config(edition: u8, legacy: bool, select: &str) -> String {
    let select = select.replace('\'', "''");
    if legacy {
        format!("config:\n  edition: {edition}\nbucket_definitions:\n  b:\n    data:\n      - '{select}'\n")
    } else {
        format!("config:\n  edition: {edition}\nstreams:\n  s:\n    auto_subscribe: true\n    query: '{select}'\n")
    }
}

const FORMATS: &[(u8, bool, &str)] = &[
    (1, true, "legacy-e1"),
    (2, true, "legacy-e2"),
    (2, false, "streams-e2"),
    (3, false, "streams-e3"),
];

/// Data queries: random output expressions and filters.
fn expression_cases(rng: &mut Rng, n: usize) -> Vec<Case> {
    (0..n)
        .map(|k| {
            let (edition, legacy, label) = rng.pick(FORMATS);
            let select = if rng.chance(70) {
                format!(
                    "SELECT id, {} AS a, {} AS b FROM t",
                    expr_for(rng, 3, edition),
                    expr_for(rng, 2, edition)
                )
            } else {
                format!("SELECT * FROM t WHERE {}", expr_for(rng, 3, edition))
            };
            let mut case = Case::new(
                format!("expressions/{label}/{k}"),
                config(edition, legacy, &select),
            );
            for r in 0..3 {
                let mut columns = random_row(rng, &format!("r{r}"));
                if select.contains("substring(") {
                    // A cut inside a character beyond the BMP: a deliberate difference (module docs).
                    for (_, _, value) in &mut columns {
                        if let Some(v) = value {
                            *v = v.replace('😀', "x");
                        }
                    }
                }
                case.rows.push(super::Row {
                    table: "t".into(),
                    columns,
                });
            }
            case.request(Request::claims(json!({"sub": "u1"})))
        })
        .collect()
}

const REQUEST_VALUES: &[&str] = &[
    "auth.user_id()",
    "auth.parameter('team')",
    "subscription.parameter('p')",
    "connection.parameter('c')",
];

fn random_value(rng: &mut Rng) -> Value {
    match rng.below(7) {
        0 => json!("u1"),
        1 => json!("p1"),
        2 => json!(1),
        3 => json!(1.5),
        4 => Value::Null,
        5 => json!(["u1", "p1", 1.5]),
        _ => json!("1"),
    }
}

fn random_request(rng: &mut Rng, edition: u8) -> Request {
    let ids = || json!(["u1", "p1", 1.5, "r1"]);
    let mut claims = json!({"sub": rng.pick(&["u1", "u2", "1"]), "ids": ids()});
    if rng.chance(70) {
        claims["team"] = random_value(rng);
    }
    let mut q = Request::claims(claims).params(json!({"c": random_value(rng), "ids": ids()}));
    if edition == 3 && rng.chance(20) {
        q = q.no_defaults();
    }
    for _ in 0..rng.below(3) {
        let stream = rng.pick(&["s", "s", "other"]);
        let params = if rng.chance(15) {
            Value::Null
        } else {
            json!({"p": random_value(rng), "ids": [rng.pick(&["p1", "r2"]), "u1"]})
        };
        q = if rng.chance(20) {
            q.subscribe_at(stream, params, rng.below(4) as u8)
        } else {
            q.subscribe(stream, params)
        };
    }
    q
}

/// Streams whose buckets are parameterized by request values: random links, random requests.
fn link_cases(rng: &mut Rng, n: usize) -> Vec<Case> {
    (0..n)
        .map(|k| {
            let edition = rng.pick(&[2u8, 3]);
            let column = rng.pick(&["v", "n", "s", "id", "i"]);
            let request = rng.pick(REQUEST_VALUES);
            let link = match rng.below(4) {
                0 => format!("{column} = {request}"),
                1 => format!("{column} IN {}", rng.pick(&["subscription.parameter('ids')", "connection.parameter('ids')", "auth.parameter('ids')"])),
                2 => format!("{request} IN arr"),
                _ => format!("{column} = {request} AND {}", expr_for(rng, 2, edition)),
            };
            let select = format!("SELECT id, v, n FROM t WHERE {link}");
            let default = rng.chance(40);
            let yaml = format!(
                "config:\n  edition: {edition}\nstreams:\n  s:\n    auto_subscribe: {default}\n{}    query: '{}'\n",
                if edition == 3 { format!("    priority: {}\n", rng.below(4)) } else { String::new() },
                select.replace('\'', "''")
            );
            let mut case = Case::new(format!("links/e{edition}/{k}"), yaml);
            for r in 0..3 {
                let columns = random_row(rng, &format!("r{r}"));
                case.rows.push(super::Row { table: "t".into(), columns });
            }
            for _ in 0..3 {
                case = case.request(random_request(rng, edition));
            }
            case
        })
        .collect()
}

/// A row of `m` (memberships: a user and a key) or `g` (users: an id and an org).
fn side_rows(rng: &mut Rng, case: &mut Case) {
    for r in 0..4 {
        let id = format!("m{r}");
        let key = rng.pick(&["u1", "p1", "1", "abc", "r1"]);
        let uid = rng.pick(&["u1", "u2", "1"]);
        let flag = rng.pick(&["t", "f"]);
        let columns = vec![
            ("id", "text", Some(id.as_str())),
            ("key", "text", Some(key)),
            ("uid", "text", Some(uid)),
            ("flag", "bool", Some(flag)),
        ];
        *case = std::mem::replace(case, Case::new("", "")).row("m", &columns);
    }
    for (id, org) in [("u1", "u1"), ("u2", "p1"), ("1", "u1")] {
        let org = if rng.chance(20) { None } else { Some(org) };
        *case = std::mem::replace(case, Case::new("", ""))
            .row("g", &[("id", "text", Some(id)), ("org", "text", org)]);
    }
}

/// Joins and streams with several parameters at edition 3: random shapes over `t`, `m`
/// and `g`, random rows that meet, random requests.
fn join_cases(rng: &mut Rng, n: usize) -> Vec<Case> {
    (0..n)
        .map(|k| {
            let column = rng.pick(&["v", "s", "id", "n"]);
            let request = rng.pick(REQUEST_VALUES);
            let filter = match rng.below(4) {
                0 => " AND m.flag".to_string(),
                1 => " AND t.i > 0".to_string(),
                2 => " AND NOT m.flag AND t.b".to_string(),
                _ => String::new(),
            };
            let select = match rng.below(5) {
                0 => format!("SELECT t.id, t.v FROM t JOIN m ON m.key = t.{column} WHERE m.uid = {request}{filter}"),
                1 => format!("SELECT t.* FROM t JOIN m ON t.{column} = m.key JOIN g ON g.id = m.uid WHERE g.org = {request}{filter}"),
                2 => format!("SELECT t.id FROM t, m WHERE m.key = t.v AND m.uid = t.{column} AND m.uid = {request}{filter}"),
                3 => format!("SELECT t.id, t.n FROM t JOIN m ON m.key = t.{column}{}", filter.replacen(" AND", " WHERE", 1)),
                _ => format!(
                    "SELECT t.id FROM t WHERE t.{column} = {request} AND t.{} = {}",
                    rng.pick(&["v", "s", "i", "b"]),
                    rng.pick(REQUEST_VALUES)
                ),
            };
            let yaml = format!(
                "config:\n  edition: 3\nstreams:\n  s:\n    auto_subscribe: {}\n    query: '{}'\n",
                rng.chance(50),
                select.replace('\'', "''")
            );
            let mut case = Case::new(format!("joins/generated/{k}"), yaml);
            for r in 0..3 {
                let columns = random_row(rng, &format!("r{r}"));
                case.rows.push(super::Row { table: "t".into(), columns });
            }
            side_rows(rng, &mut case);
            for _ in 0..3 {
                case = case.request(random_request(rng, 3));
            }
            case
        })
        .collect()
}

/// Query shapes for [`sharing_cases`]: several give the same buckets, some differ only in
/// how a request instantiates them, some in what they put in a bucket. None selects other
/// columns of a table another selects: two such queries of one stream reached alike put
/// one row into one bucket with two different objects (see `deliberate` in `cases.rs`).
const SHAPES: &[&str] = &[
    "SELECT * FROM t",
    "SELECT * FROM m",
    "SELECT * FROM t WHERE v = auth.user_id()",
    "SELECT * FROM t WHERE v = subscription.parameter(''p'')",
    "SELECT * FROM t WHERE v IN subscription.parameter(''ids'')",
    "SELECT * FROM m WHERE uid = auth.user_id()",
    "SELECT * FROM m WHERE key = auth.user_id()",
    "SELECT t.* FROM t JOIN m ON m.key = t.v WHERE m.uid = auth.user_id()",
    "SELECT * FROM t WHERE v IN (SELECT key FROM m WHERE uid = auth.user_id())",
    "SELECT * FROM t WHERE v = auth.user_id() AND auth.parameter(''team'') IS NOT NULL",
];

/// Configs of two or three streams of one to three queries each, drawn from [`SHAPES`]:
/// which buckets they share and how requests reach them (edition 3).
fn sharing_cases(rng: &mut Rng, n: usize) -> Vec<Case> {
    (0..n)
        .map(|k| {
            let mut yaml = String::from("config:\n  edition: 3\nstreams:\n");
            let streams = 2 + rng.below(2);
            for i in 0..streams {
                yaml.push_str(&format!(
                    "  s{i}:\n    auto_subscribe: {}\n    queries:\n",
                    rng.chance(50)
                ));
                for _ in 0..1 + rng.below(3) {
                    yaml.push_str(&format!("      - '{}'\n", rng.pick(SHAPES)));
                }
            }
            let mut case = Case::new(format!("sharing/generated/{k}"), yaml);
            for r in 0..3 {
                let columns = random_row(rng, &format!("r{r}"));
                case.rows.push(super::Row {
                    table: "t".into(),
                    columns,
                });
            }
            side_rows(rng, &mut case);
            for _ in 0..3 {
                let mut q = random_request(rng, 3);
                q.subscriptions = (0..rng.below(3))
                    .map(|_| {
                        (
                            format!("s{}", rng.below(streams)),
                            json!({"p": random_value(rng), "ids": ["u1", "p1"]}),
                            None,
                        )
                    })
                    .collect();
                case = case.request(q);
            }
            case
        })
        .collect()
}

/// The generated part of the corpus.
pub fn all(seed: u64) -> Vec<Case> {
    let mut rng = Rng(seed | 1);
    let mut out = expression_cases(&mut rng, 400);
    out.extend(link_cases(&mut rng, 150));
    out.extend(join_cases(&mut rng, 150));
    out.extend(sharing_cases(&mut rng, 100));
    out
}
