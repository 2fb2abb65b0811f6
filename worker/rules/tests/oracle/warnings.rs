//! Hand-written cases for the official compiler's warnings: each warning it reports without
//! a source schema, in each format it has it in, and the near misses that do not warn. The
//! comparison (`compare`) checks the kinds and the text each warning points at.

use serde_json::json;

use super::{Case, Request};

/// A bucket definition `b` with these parameter and data queries, at `edition`.
fn definition(name: &str, edition: u8, parameters: &[&str], data: &[&str]) -> Case {
    let list = |qs: &[&str]| -> String { qs.iter().map(|q| format!("      - {q}\n")).collect() };
    let parameters = if parameters.is_empty() {
        String::new()
    } else {
        format!("    parameters:\n{}", list(parameters))
    };
    let yaml = format!(
        "config:\n  edition: {edition}\nbucket_definitions:\n  b:\n{parameters}    data:\n{}",
        list(data)
    );
    Case::new(name, yaml)
        .row(
            "projects",
            &[
                ("id", "text", Some("p1")),
                ("owner", "text", Some("u1")),
                ("a", "text", Some("x")),
                ("b", "text", Some("y")),
            ],
        )
        .row(
            "todos",
            &[("id", "text", Some("t1")), ("list", "text", Some("p1"))],
        )
        .request(Request::claims(json!({"sub": "u1"})).params(json!({"p": "p1", "ids": ["p1"]})))
}

/// A definition whose one parameter query outputs `p`, its data `todos` by `list`.
fn parameter_query(name: &str, query: &str) -> Case {
    definition(
        name,
        1,
        &[query],
        &["SELECT * FROM todos WHERE list = bucket.p"],
    )
}

fn legacy() -> Vec<Case> {
    let dangerous = [
        ("table", "SELECT id AS p FROM projects WHERE id = request.parameters() ->> 'p'"),
        ("static", "SELECT request.parameters() ->> 'p' AS p"),
        ("static-gated-by-token", "SELECT request.parameters() ->> 'p' AS p WHERE request.jwt() ->> 'sub' = 'u1'"),
        ("json-each", "SELECT value AS p FROM json_each(request.parameters() ->> 'ids')"),
        ("user-parameters", "SELECT id AS p FROM projects WHERE id = user_parameters.p"),
        ("in-client-array", "SELECT id AS p FROM projects WHERE id IN request.parameters() ->> 'ids'"),
        ("or-of-token-links-first", "SELECT id AS p FROM projects WHERE (a = request.user_id() OR b = request.user_id()) AND id = request.parameters() ->> 'p'"),
        ("token-then-or-of-client-links", "SELECT id AS p FROM projects WHERE owner = request.user_id() AND (a = request.parameters() ->> 'p' OR b = request.parameters() ->> 'p')"),
    ];
    let safe = [
        ("table-with-token-link", "SELECT id AS p FROM projects WHERE id = request.parameters() ->> 'p' AND owner = request.user_id()"),
        ("table-with-token-condition", "SELECT id AS p FROM projects WHERE id = request.parameters() ->> 'p' AND request.jwt() ->> 'sub' = 'u1'"),
        ("token-output", "SELECT request.parameters() ->> 'p' || request.user_id() AS p"),
        ("json-each-of-token", "SELECT value AS p FROM json_each(request.jwt() ->> 'ids') WHERE request.parameters() ->> 'all'"),
        ("token-parameters", "SELECT id AS p FROM projects WHERE id = user_parameters.p AND owner = token_parameters.user_id"),
        ("or-of-client-links-then-token", "SELECT id AS p FROM projects WHERE (a = request.parameters() ->> 'p' OR b = request.parameters() ->> 'p') AND owner = request.user_id()"),
        ("no-request-value", "SELECT id AS p FROM projects WHERE owner = request.user_id() AND (a = 'x' OR b = 'x')"),
    ];
    let mut out: Vec<Case> =
        dangerous
            .iter()
            .map(|(name, q)| parameter_query(&format!("warnings/client-parameters/{name}"), q))
            .chain(safe.iter().map(|(name, q)| {
                parameter_query(&format!("warnings/client-parameters-not/{name}"), q)
            }))
            .collect();
    out.push(Case::new(
        "warnings/client-parameters/accepted",
        "bucket_definitions:\n  b:\n    accept_potentially_dangerous_queries: true\n    parameters: SELECT request.parameters() ->> 'p' AS p\n    data:\n      - SELECT * FROM todos WHERE list = bucket.p\n",
    ));
    out.push(definition(
        "warnings/identifier-case/definition",
        2,
        &[
            "SELECT id AS P FROM Projects WHERE Owner = request.user_id() AND projects.A = token_parameters.Org",
            "SELECT value AS p FROM json_each(request.jwt() ->> 'Ids')",
        ],
        &[
            "SELECT Id, todos.List AS l, upper(Title) AS T FROM Todos WHERE List = bucket.P",
            "SELECT * FROM todos AS T WHERE T.list = bucket.p",
            "SELECT * FROM public.Projects WHERE id = bucket.p AND \"Done\" IS NULL",
        ],
    ));
    out.push(Case::new(
        "warnings/storage-version/definition",
        "config:\n  edition: 2\n  storage_version: 3\nbucket_definitions:\n  b:\n    data:\n      - SELECT * FROM todos\n",
    ));
    out
}

/// An edition-2 stream (the alpha compiler).
fn alpha(name: &str, extra: &str, query: &str) -> Case {
    Case::new(
        name,
        format!("config:\n  edition: 2\nstreams:\n  s:\n{extra}    query: {query}\n"),
    )
    .row(
        "todos",
        &[("id", "text", Some("t1")), ("list", "text", Some("p1"))],
    )
    .request(Request::claims(json!({"sub": "u1"})).subscribe("s", json!({"list": "p1"})))
}

fn alpha_streams() -> Vec<Case> {
    vec![
        alpha("warnings/alpha-streams/plain", "", "SELECT * FROM todos WHERE list = auth.user_id()"),
        alpha(
            "warnings/default-subscription/link",
            "    auto_subscribe: true\n",
            "SELECT * FROM todos WHERE list = subscription.parameter('list')",
        ),
        alpha(
            "warnings/default-subscription/in",
            "    auto_subscribe: true\n",
            "SELECT * FROM todos WHERE list IN subscription.parameter('lists')",
        ),
        alpha(
            "warnings/default-subscription/subquery",
            "    auto_subscribe: true\n",
            "SELECT * FROM todos WHERE list IN (SELECT id FROM projects WHERE owner = subscription.parameter('owner'))",
        ),
        alpha(
            "warnings/default-subscription-not/not-default",
            "",
            "SELECT * FROM todos WHERE list = subscription.parameter('list')",
        ),
        alpha(
            "warnings/identifier-case/alpha-stream",
            "",
            "SELECT Id, Todos.List AS l FROM Todos WHERE List = auth.user_id() AND list IN (SELECT Id FROM Projects WHERE Owner = auth.user_id())",
        ),
        Case::new(
            "warnings/storage-version/alpha-stream",
            "config:\n  edition: 2\n  storage_version: 3\nstreams:\n  s:\n    query: SELECT * FROM todos\n",
        ),
    ]
}

/// An edition-3 stream `s` with this query, and `extra` lines in its entry.
fn stream(name: &str, extra: &str, query: &str) -> Case {
    Case::new(
        name,
        format!("config:\n  edition: 3\nstreams:\n  s:\n{extra}    query: {query}\n"),
    )
    .row(
        "todos",
        &[
            ("id", "text", Some("t1")),
            ("list", "text", Some("p1")),
            ("tags", "jsonb", Some(r#"["a"]"#)),
        ],
    )
    .row(
        "projects",
        &[
            ("id", "text", Some("p1")),
            ("owner", "text", Some("u1")),
            ("org", "text", Some("o1")),
        ],
    )
    .request(
        Request::claims(json!({"sub": "u1", "org": "o1"}))
            .params(json!({"list": "p1"}))
            .subscribe(
                "s",
                json!({"list": "p1", "lists": ["p1"], "owner": "u1", "tags": ["a"]}),
            ),
    )
}

fn streams() -> Vec<Case> {
    let unauthenticated = [
        ("subscription-parameter", "SELECT * FROM todos WHERE list = subscription.parameter('list')"),
        ("connection-parameter", "SELECT * FROM todos WHERE list = connection.parameter('list')"),
        ("subscription-parameters", "SELECT * FROM todos WHERE list = subscription.parameters() ->> 'list'"),
        ("in-client-array", "SELECT * FROM todos WHERE list IN subscription.parameter('lists')"),
        ("overlap", "SELECT * FROM todos WHERE tags && subscription.parameter('tags')"),
        ("token-condition-does-not-count", "SELECT * FROM todos WHERE list = subscription.parameter('list') AND auth.parameter('org') = 'o1'"),
        ("request-condition", "SELECT * FROM todos WHERE subscription.parameter('list') = 'p1'"),
        ("subquery", "SELECT * FROM todos WHERE list IN (SELECT id FROM projects WHERE owner = subscription.parameter('owner'))"),
        ("subquery-condition", "SELECT * FROM todos WHERE list IN (SELECT id FROM projects WHERE subscription.parameter('all'))"),
        ("join", "SELECT todos.* FROM todos JOIN projects p ON p.id = todos.list WHERE p.owner = subscription.parameter('owner')"),
        ("json-each", "SELECT * FROM todos WHERE list IN (SELECT value FROM json_each(subscription.parameter('lists')))"),
        ("or-variant", "SELECT * FROM todos WHERE list = subscription.parameter('list') OR list = auth.user_id()"),
        ("two-client-links", "SELECT * FROM todos WHERE list = connection.parameter('list') AND id = subscription.parameter('id')"),
    ];
    let authenticated = [
        ("with-token-link", "SELECT * FROM todos WHERE list = subscription.parameter('list') AND id = auth.user_id()"),
        ("token-and-client-in-one-condition", "SELECT * FROM todos WHERE subscription.parameter('all') AND auth.parameter('org') = 'o1'"),
        ("token-in-the-value", "SELECT * FROM todos WHERE list = subscription.parameter('list') || auth.user_id()"),
        ("subquery-with-token-link", "SELECT * FROM todos WHERE list IN (SELECT id FROM projects WHERE owner = subscription.parameter('owner') AND org = auth.parameter('org'))"),
        ("exists", "SELECT * FROM todos WHERE subscription.parameter('owner') IN (SELECT owner FROM projects)"),
        ("no-request-value", "SELECT * FROM todos WHERE list IN (SELECT id FROM projects)"),
        ("same-column-twice", "SELECT * FROM todos WHERE list = subscription.parameter('list') AND list = auth.user_id()"),
    ];
    let mut out: Vec<Case> = unauthenticated
        .iter()
        .map(|(name, q)| stream(&format!("warnings/unauthenticated/{name}"), "", q))
        .chain(
            authenticated
                .iter()
                .map(|(name, q)| stream(&format!("warnings/unauthenticated-not/{name}"), "", q)),
        )
        .collect();
    out.push(stream(
        "warnings/unauthenticated/accepted",
        "    accept_potentially_dangerous_queries: true\n",
        "SELECT * FROM todos WHERE list = subscription.parameter('list')",
    ));
    out.push(stream(
        "warnings/unauthenticated/default-stream",
        "    auto_subscribe: true\n",
        "SELECT * FROM todos WHERE list = subscription.parameter('list')",
    ));
    out.extend([
        stream(
            "warnings/unnamed-column/expressions",
            "",
            "SELECT id, upper(list), (list || 'x'), todos.list FROM todos",
        ),
        stream(
            "warnings/star-after-alias/star",
            "",
            "SELECT id AS x, * FROM todos",
        ),
        stream(
            "warnings/star-after-alias/qualified",
            "",
            "SELECT todos.list AS l, todos.* FROM todos",
        ),
        stream(
            "warnings/star-after-alias-not/star-first",
            "",
            "SELECT *, list AS l FROM todos",
        ),
        stream(
            "warnings/identifier-case-not/edition-3",
            "",
            "SELECT Id, List FROM Todos WHERE List = auth.user_id()",
        ),
    ]);
    out.extend(ctes());
    out
}

/// CTEs: unused ones (the file's and a stream's, one hidden by a stream's of the same name),
/// client values found in CTEs (a stream's, the file's, a static one), an unnamed CTE column.
/// The official compiler points at a static CTE's client value with the CTE's offsets in
/// the text of the query that reads it (`todos.* FROM todos, chosen WHE`); here the warning
/// points at the value in the CTE.
fn ctes() -> Vec<Case> {
    let yaml = "config:\n  edition: 3\nwith:\n  mine: SELECT id FROM projects WHERE owner = auth.user_id()\n  hidden: SELECT id FROM projects WHERE owner = auth.user_id()\n  spare: SELECT upper(id) FROM projects WHERE org = auth.parameter('org')\n  by_org: SELECT id FROM projects WHERE org = connection.parameter('org')\nstreams:\n  a:\n    query: SELECT todos.* FROM todos, mine WHERE todos.list = mine.id\n  b:\n    with:\n      hidden: SELECT id FROM projects WHERE owner = subscription.parameter('owner')\n      unused_here: SELECT id FROM projects\n    query: SELECT todos.* FROM todos, hidden WHERE todos.list = hidden.id\n  c:\n    with:\n      lists: SELECT id FROM projects WHERE org = connection.parameter('org')\n    query: SELECT todos.* FROM todos, lists WHERE todos.list = lists.id\n  d:\n    query: SELECT todos.* FROM todos, by_org WHERE todos.list = by_org.id\n";
    vec![Case::new("warnings/unused-cte/file-and-stream", yaml)
        .row("todos", &[("id", "text", Some("t1")), ("list", "text", Some("p1"))])
        .row("projects", &[("id", "text", Some("p1")), ("owner", "text", Some("u1")), ("org", "text", Some("o1"))])
        .request(
            Request::claims(json!({"sub": "u1", "org": "o1"}))
                .params(json!({"org": "o1"}))
                .subscribe("a", json!({}))
                .subscribe("b", json!({"owner": "u1"}))
                .subscribe("c", json!({}))
                .subscribe("d", json!({})),
        ),
    stream(
        "warnings/unauthenticated/static-cte",
        "    with:\n      chosen: SELECT subscription.parameter('list') AS l\n",
        "SELECT todos.* FROM todos, chosen WHERE todos.list = chosen.l",
    )
    .differs("warnings", "the official warning about a static CTE's client value points at the CTE's offsets in the query's text; here at the value in the CTE"),
    Case::new(
        "warnings/storage-version/stream",
        "config:\n  edition: 3\n  storage_version: 3\nstreams:\n  s:\n    query: SELECT * FROM todos\n",
    )]
}

/// Every warning case.
pub fn all() -> Vec<Case> {
    let mut out = legacy();
    out.extend(alpha_streams());
    out.extend(streams());
    out
}
