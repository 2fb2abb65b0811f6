//! Parameter queries and request resolution: static queries over every request value,
//! table lookups (=, both IN forms, OR branches), `_priority`, and the streams forms
//! (auth.*, subscription.*, CTEs, IN subqueries, request filters).
use crate::support;

use rules::{
    BucketReason, InMemoryLookups, OwnedSourceRow, RequestContext, Subscription, SyncRules,
};
use serde_json::json;
use support::{eval, ty};

fn names(rules: &SyncRules, req: &RequestContext, store: &InMemoryLookups) -> Vec<String> {
    rules
        .resolve_request(req, store)
        .unwrap()
        .buckets
        .into_iter()
        .map(|b| b.name)
        .collect()
}

fn legacy(param: &str) -> SyncRules {
    let yaml = format!(
        "bucket_definitions:\n  d:\n    parameters: \"{param}\"\n    data: [\"SELECT id FROM items WHERE owner = bucket.p\"]\n"
    );
    SyncRules::parse(&yaml).unwrap_or_else(|e| panic!("{param}: {e}"))
}

fn request() -> RequestContext {
    let mut r = RequestContext::from_claims(json!({
        "sub": "u1",
        "org": "acme",
        "parameters": {"team": "t9", "n": 3},
        "admin": true
    }));
    r.parameters = json!({"project": "p7", "ids": ["a", "b"]});
    r
}

#[test]
fn static_parameter_queries_read_every_request_value() {
    let store = InMemoryLookups::new();
    let cases = [
        ("SELECT request.user_id() AS p", vec![r#"1#d["u1"]"#]),
        ("SELECT token_parameters.user_id AS p", vec![r#"1#d["u1"]"#]),
        ("SELECT token_parameters.team AS p", vec![r#"1#d["t9"]"#]),
        ("SELECT token_parameters.n AS p", vec![r#"1#d[3]"#]),
        (
            "SELECT request.jwt() ->> 'org' AS p",
            vec![r#"1#d["acme"]"#],
        ),
        (
            "SELECT request.parameters() ->> 'project' AS p",
            vec![r#"1#d["p7"]"#],
        ),
        ("SELECT user_parameters.project AS p", vec![r#"1#d["p7"]"#]),
        (
            "SELECT 'x' AS p WHERE request.jwt() ->> 'admin'",
            vec![r#"1#d["x"]"#],
        ),
        (
            "SELECT 'x' AS p WHERE NOT (request.jwt() ->> 'admin')",
            vec![],
        ),
        ("SELECT upper(request.user_id()) AS p", vec![r#"1#d["U1"]"#]),
        ("SELECT request.jwt() ->> 'missing' AS p", vec!["1#d[null]"]),
        (
            "SELECT value AS p FROM json_each(request.parameters() ->> 'ids')",
            vec![r#"1#d["a"]"#, r#"1#d["b"]"#],
        ),
        (
            "SELECT upper(json_each.value) AS p FROM json_each(request.parameters() ->> 'ids') WHERE value != 'a'",
            vec![r#"1#d["B"]"#],
        ),
        ("SELECT value AS p FROM json_each(request.jwt() ->> 'org')", vec![]),
    ];
    for (q, want) in cases {
        assert_eq!(names(&legacy(q), &request(), &store), want, "{q}");
    }
}

#[test]
fn global_definition_and_priorities() {
    let rules = SyncRules::parse(
        "bucket_definitions:\n  g:\n    priority: 1\n    data: [SELECT id FROM items]\n  h:\n    parameters: SELECT request.user_id() AS u, 0 AS _priority\n    data: [SELECT id FROM items WHERE owner = bucket.u]\n",
    )
    .unwrap();
    let res = rules
        .resolve_request(&request(), &InMemoryLookups::new())
        .unwrap();
    let got: Vec<_> = res
        .buckets
        .iter()
        .map(|b| (b.name.as_str(), b.priority, b.reasons.clone()))
        .collect();
    assert_eq!(
        got,
        [
            ("1#g[]", 1, vec![BucketReason::Default(0)]),
            (r#"1#h["u1"]"#, 0, vec![BucketReason::Default(1)]),
        ]
    );
}

fn members(v: &str) -> OwnedSourceRow {
    OwnedSourceRow::new("public", "members")
        .column("id", ty("text"), Some("m1"))
        .column("user_id", ty("text"), Some("u1"))
        .column("team", ty("text"), Some("t9"))
        .column("project", ty("text"), Some(v))
        .column("tags", ty("jsonb"), Some(r#"["a", "b"]"#))
        .column("active", ty("bool"), Some("t"))
}

fn lookups(rules: &SyncRules, rows: &[OwnedSourceRow]) -> InMemoryLookups {
    let mut store = InMemoryLookups::new();
    for r in rows {
        store.insert(eval(rules, r).lookups);
    }
    store
}

#[test]
fn table_parameter_queries() {
    let cases = [
        ("SELECT project AS p FROM members WHERE user_id = request.user_id()", vec![r#"1#d["p1"]"#]),
        ("SELECT project AS p FROM members WHERE members.user_id = request.user_id() AND active", vec![r#"1#d["p1"]"#]),
        ("SELECT project AS p FROM members WHERE user_id = request.user_id() AND NOT active", vec![]),
        ("SELECT project AS p FROM members WHERE team = token_parameters.team AND user_id = request.user_id()", vec![r#"1#d["p1"]"#]),
        // row value IN request array: one lookup per element.
        ("SELECT project AS p FROM members WHERE id IN request.parameters() ->> 'ids' OR user_id = request.user_id()", vec![r#"1#d["p1"]"#]),
        // request value IN row array.
        ("SELECT project AS p FROM members WHERE 'a' IN tags AND user_id = request.user_id()", vec![r#"1#d["p1"]"#]),
        ("SELECT project AS p FROM members WHERE request.jwt() ->> 'org' IN tags", vec![]),
    ];
    for (q, want) in cases {
        let rules = legacy(q);
        let store = lookups(&rules, &[members("p1")]);
        assert_eq!(names(&rules, &request(), &store), want, "{q}");
    }
}

#[test]
fn lookup_entries_are_typed_and_versionable() {
    let rules =
        legacy("SELECT project AS p FROM members WHERE id IN request.parameters() ->> 'ids'");
    let row = OwnedSourceRow::new("public", "members")
        .column("id", ty("int8"), Some("3"))
        .column("project", ty("text"), Some("p1"));
    let out = eval(&rules, &row);
    assert_eq!(out.lookups.len(), 1);
    assert_eq!(out.lookups[0].key.encode(), r#"["d","0",3]"#);
    let mut store = InMemoryLookups::new();
    store.insert(out.lookups);
    // A request array of the integer 3 (and of 3.0) matches; the string "3" does not.
    for (ids, want) in [(json!([3]), 1), (json!([3.0]), 1), (json!(["3"]), 0)] {
        let mut req = request();
        req.parameters = json!({ "ids": ids });
        assert_eq!(names(&rules, &req, &store).len(), want, "{ids}");
    }
}

#[test]
fn data_query_in_and_or_forms() {
    let rules = SyncRules::parse(
        r#"
bucket_definitions:
  d:
    parameters: SELECT request.user_id() AS p
    data:
      - SELECT id FROM items WHERE bucket.p IN tags
      - SELECT id FROM other WHERE owner = bucket.p OR editor = bucket.p
      - SELECT id FROM third WHERE owner = bucket.p AND (score > 3 OR pinned)
"#,
    )
    .unwrap();
    let items = OwnedSourceRow::new("public", "items")
        .column("id", ty("text"), Some("i"))
        .column("tags", ty("text[]"), Some("{u1,u2,NULL}"));
    let got: Vec<_> = eval(&rules, &items)
        .buckets
        .into_iter()
        .map(|b| b.bucket)
        .collect();
    assert_eq!(got, [r#"1#d["u1"]"#, r#"1#d["u2"]"#]);
    let other = OwnedSourceRow::new("public", "other")
        .column("id", ty("text"), Some("o"))
        .column("owner", ty("text"), Some("u1"))
        .column("editor", ty("text"), Some("u1"));
    assert_eq!(eval(&rules, &other).buckets.len(), 1);
    let third = |score: &str, pinned: &str| {
        OwnedSourceRow::new("public", "third")
            .column("id", ty("text"), Some("t"))
            .column("owner", ty("text"), Some("u1"))
            .column("score", ty("int4"), Some(score))
            .column("pinned", ty("bool"), Some(pinned))
    };
    assert_eq!(eval(&rules, &third("5", "f")).buckets.len(), 1);
    assert_eq!(eval(&rules, &third("1", "t")).buckets.len(), 1);
    assert_eq!(eval(&rules, &third("1", "f")).buckets.len(), 0);
    // NULL never matches a bucket parameter.
    let null_owner = OwnedSourceRow::new("public", "third")
        .column("id", ty("text"), Some("t"))
        .column("owner", ty("text"), None)
        .column("score", ty("int4"), Some("9"));
    assert_eq!(eval(&rules, &null_owner).buckets.len(), 0);
}

const STREAMS: &str = r#"
config:
  edition: 3
with:
  my_teams: SELECT team AS team FROM members WHERE user_id = auth.user_id()
streams:
  by_param:
    query: SELECT * FROM items WHERE project = subscription.parameter('project')
  by_claim:
    auto_subscribe: true
    priority: 1
    query: SELECT id, name FROM items WHERE org = auth.parameter('org') AND visible
  by_subquery:
    query: SELECT * FROM items WHERE team IN (SELECT team FROM members WHERE user_id = auth.user_id())
  by_global_cte:
    query: SELECT items.* FROM items, my_teams AS t WHERE items.team = t.team
  admin_only:
    query: SELECT * FROM items WHERE auth.parameter('admin')
  by_list:
    query: SELECT * FROM items WHERE project IN subscription.parameter('projects')
"#;

fn item(project: &str, org: &str, team: &str) -> OwnedSourceRow {
    OwnedSourceRow::new("public", "items")
        .column("id", ty("text"), Some("i1"))
        .column("name", ty("text"), Some("n"))
        .column("project", ty("text"), Some(project))
        .column("org", ty("text"), Some(org))
        .column("team", ty("text"), Some(team))
        .column("visible", ty("bool"), Some("t"))
}

fn sub(stream: &str, params: serde_json::Value) -> Subscription {
    Subscription {
        stream: stream.into(),
        parameters: params,
        override_priority: None,
    }
}

#[test]
fn streams_data_side_buckets() {
    let rules = SyncRules::parse(STREAMS).unwrap();
    let got: Vec<_> = eval(&rules, &item("p1", "acme", "t9"))
        .buckets
        .into_iter()
        .map(|b| b.bucket)
        .collect();
    // Streams that put the same rows into buckets the same way share the first one's
    // bucket, as the official compiler does: by_global_cte writes by_subquery's (both
    // partition `items` by `team`), by_list by_param's (both by `project`).
    assert_eq!(
        got,
        [
            r#"1#by_param|0["p1"]"#,
            r#"1#by_claim|0["acme"]"#,
            r#"1#by_subquery|0["t9"]"#,
            "1#admin_only|0[]",
        ]
    );
    // Both the global CTE and the subquery read `members`; each has its own lookup.
    let lk = eval(&rules, &members("p1")).lookups;
    let keys: Vec<_> = lk.iter().map(|l| l.key.encode()).collect();
    assert_eq!(
        keys,
        [
            r#"["by_subquery","0.sub0","u1"]"#,
            r#"["$with","with.my_teams","u1"]"#
        ]
    );
}

#[test]
fn streams_request_side() {
    let rules = SyncRules::parse(STREAMS).unwrap();
    let store = lookups(&rules, &[members("p1")]);
    let mut req = request();
    req.subscriptions = vec![
        sub("by_param", json!({"project": "p7"})),
        sub("by_subquery", json!({})),
        sub("by_global_cte", json!(null)),
        sub("admin_only", json!({})),
        sub("by_list", json!({"projects": ["x", "y"]})),
        sub("nope", json!({})),
        Subscription {
            stream: "by_claim".into(),
            parameters: json!({}),
            override_priority: Some(0),
        },
    ];
    let res = rules.resolve_request(&req, &store).unwrap();
    let got: Vec<_> = res
        .buckets
        .iter()
        .map(|b| (b.name.as_str(), b.priority, b.reasons.clone()))
        .collect();
    assert_eq!(
        got,
        [
            (
                r#"1#by_claim|0["acme"]"#,
                0,
                vec![BucketReason::Default(1), BucketReason::Subscription(6)]
            ),
            (
                r#"1#by_param|0["p7"]"#,
                3,
                vec![BucketReason::Subscription(0)]
            ),
            // by_global_cte's bucket is by_subquery's, so it has both subscriptions.
            (
                r#"1#by_subquery|0["t9"]"#,
                3,
                vec![BucketReason::Subscription(1), BucketReason::Subscription(2)]
            ),
            ("1#admin_only|0[]", 3, vec![BucketReason::Subscription(3)]),
            (
                r#"1#by_param|0["x"]"#,
                3,
                vec![BucketReason::Subscription(4)]
            ),
            (
                r#"1#by_param|0["y"]"#,
                3,
                vec![BucketReason::Subscription(4)]
            ),
        ]
    );
    assert_eq!(res.errors.len(), 1);
    assert_eq!(res.errors[0].subscription, 5);
    assert!(res.errors[0].message.contains("nope"));

    // Request filter false: no bucket; include_defaults false drops by_claim.
    let mut plain = RequestContext::from_claims(json!({"sub": "u2"}));
    plain.include_defaults = false;
    plain.subscriptions = vec![sub("admin_only", json!({})), sub("by_subquery", json!({}))];
    assert!(rules
        .resolve_request(&plain, &store)
        .unwrap()
        .buckets
        .is_empty());
}

#[test]
fn streams_json_each_cte() {
    let rules = SyncRules::parse(
        r#"
config:
  edition: 3
streams:
  by_each:
    auto_subscribe: true
    with:
      mine: SELECT value AS project FROM json_each(auth.parameter('projects'))
    query: SELECT * FROM items, mine WHERE items.project = mine.project
"#,
    )
    .unwrap();
    let got: Vec<_> = eval(&rules, &item("p1", "acme", "t9"))
        .buckets
        .into_iter()
        .map(|b| b.bucket)
        .collect();
    assert_eq!(got, [r#"1#by_each|0["p1"]"#]);
    let req = RequestContext::from_claims(json!({"sub": "u", "projects": ["p1", "p2", "p1"]}));
    assert_eq!(
        names(&rules, &req, &InMemoryLookups::new()),
        [r#"1#by_each|0["p1"]"#, r#"1#by_each|0["p2"]"#]
    );
}

#[test]
fn bucket_count_is_limited() {
    let rules = SyncRules::parse(STREAMS).unwrap();
    let ids: Vec<String> = (0..1500).map(|i| format!("p{i}")).collect();
    let mut req = RequestContext::from_claims(json!({"sub": "u1"}));
    req.subscriptions = vec![sub("by_list", json!({ "projects": ids }))];
    let store = InMemoryLookups::new();
    let err = rules.resolve_request(&req, &store).unwrap_err();
    assert_eq!(err.code(), "PSM_RULES_REQUEST");
    assert!(err.to_string().contains("more than 1000 buckets"), "{err}");
    let res = rules
        .resolve_request_with_limit(&req, &store, 5000)
        .unwrap();
    // 1500 subscribed; the default by_claim stream makes none: the token has no `org`,
    // and at edition 3 a NULL request value makes no bucket.
    assert_eq!(res.buckets.len(), 1500);
}
