//! Wildcard tables (`"todos_%"`): one query over every table whose name starts with the
//! prefix, in both formats, with rows of matching tables, a table the prefix does not
//! match, and a table matched both by name and through a wildcard.

use serde_json::json;

use super::{Case, Request};

/// Rows of `todos`, `todos_a`, `todos_b`, `todosx` and `other`, each with an owner and a
/// list; and access rows for the parameter queries.
fn with_rows(mut case: Case) -> Case {
    for (table, id, owner, list) in [
        ("todos", "t0", "u1", "l1"),
        ("todos_a", "a1", "u1", "l1"),
        ("todos_a", "a2", "u2", "l2"),
        ("todos_b", "b1", "u1", "l2"),
        ("todos_b", "b2", "u2", "l1"),
        ("todosx", "x1", "u1", "l1"),
        ("other", "o1", "u1", "l1"),
    ] {
        case = case.row(
            table,
            &[
                ("id", "text", Some(id)),
                ("owner_id", "text", Some(owner)),
                ("list_id", "text", Some(list)),
                ("_hidden", "text", Some("h")),
            ],
        );
    }
    for (table, id, user, list) in [
        ("lists_shared", "s1", "u1", "l2"),
        ("lists_owned", "s2", "u2", "l1"),
    ] {
        case = case.row(
            table,
            &[
                ("id", "text", Some(id)),
                ("user_id", "text", Some(user)),
                ("list_id", "text", Some(list)),
            ],
        );
    }
    case.request(Request::claims(json!({"sub": "u1"})).subscribe("s", json!({"list": "l1"})))
        .request(Request::claims(json!({"sub": "u2"})).subscribe("s", json!({"list": "l2"})))
}

/// One edition-3 stream `s`, auto-subscribed, over the rows of [`with_rows`].
pub(super) fn stream(name: &str, query: &str) -> Case {
    stream_at(name, 3, query)
}

fn stream_at(name: &str, edition: u8, query: &str) -> Case {
    with_rows(Case::new(
        name,
        format!("config:\n  edition: {edition}\nstreams:\n  s:\n    auto_subscribe: true\n    query: '{query}'\n"),
    ))
}

fn definition(name: &str, edition: u8, lines: &str) -> Case {
    with_rows(Case::new(
        name,
        format!("config:\n  edition: {edition}\nbucket_definitions:\n  b:\n{lines}"),
    ))
}

/// Every wildcard case.
pub fn all() -> Vec<Case> {
    vec![
        stream("columns/star-e3-stream", "SELECT * FROM todos_a"),
        stream_at("columns/star-e2-stream", 2, "SELECT * FROM todos_a"),
        definition("columns/star-e3-definition", 3, "    data:\n      - SELECT * FROM todos_a\n"),
        stream("columns/absent-e3-stream", "SELECT id, nope, upper(nope) AS up FROM todos_a"),
        stream_at("columns/absent-e2-stream", 2, "SELECT id, nope FROM todos_a"),
        definition("columns/absent-e3-definition", 3, "    data:\n      - SELECT id, nope FROM todos_a\n"),
        stream("wildcard/stream", r#"SELECT * FROM "todos%" WHERE owner_id = auth.user_id()"#),
        stream("wildcard/stream-underscore-prefix", r#"SELECT * FROM "todos_%""#),
        stream("wildcard/stream-aliased", r#"SELECT t.id, t.list_id FROM "todos_%" AS t WHERE t.list_id = subscription.parameter(''list'')"#),
        stream("wildcard/stream-table-suffix-is-a-column", r#"SELECT id, _table_suffix AS suffix FROM "todos_%""#),
        stream(
            "wildcard/stream-subquery-source",
            r#"SELECT * FROM "todos_%" WHERE list_id IN (SELECT list_id FROM "lists_%" WHERE user_id = auth.user_id())"#,
        ),
        with_rows(Case::new(
            "wildcard/stream-beside-a-named-table",
            "config:\n  edition: 3\nstreams:\n  s:\n    auto_subscribe: true\n    query: 'SELECT * FROM todos_a'\n  t:\n    auto_subscribe: true\n    query: 'SELECT id FROM \"todos_%\" WHERE owner_id = auth.user_id()'\n",
        )),
        definition(
            "wildcard/definition-table-suffix",
            2,
            "    data:\n      - SELECT id, _table_suffix AS suffix, list_id FROM \"todos_%\"\n",
        ),
        definition(
            "wildcard/definition-by-suffix",
            1,
            "    parameters: SELECT 'a' AS suffix\n    data:\n      - SELECT * FROM \"todos_%\" WHERE _table_suffix = bucket.suffix\n",
        ),
        definition(
            "wildcard/definition-aliased",
            2,
            "    parameters: SELECT request.user_id() AS owner\n    data:\n      - SELECT id, _table_suffix AS kind FROM \"todos%\" AS todo WHERE owner_id = bucket.owner\n",
        ),
        definition(
            "wildcard/definition-parameter-query",
            2,
            "    parameters: SELECT list_id FROM \"lists_%\" WHERE user_id = request.user_id()\n    data:\n      - SELECT * FROM \"todos_%\" WHERE list_id = bucket.list_id\n",
        ),
        definition(
            "wildcard/definition-beside-a-named-table",
            2,
            "    data:\n      - SELECT * FROM todos_b\n  c:\n    data:\n      - SELECT id, _table_suffix AS s FROM \"todos_%\"\n",
        ),
    ]
}
