//! Access is never wider than the rules say: a filter inside a subquery, a join condition
//! or a CTE narrows what a request gets (the official service once ignored such filters,
//! CVE-2026-30870), and a membership that changes takes the buckets it led to with it.
//! Each case names the buckets a request must get, and so the ones it must not.
use crate::support::{eval, ty};

use rules::{
    BucketReason, InMemoryLookups, OwnedSourceRow, RequestContext, Subscription, SyncRules,
};
use serde_json::json;

/// The same access written four ways: a join chain, nested subqueries, a CTE with a nested
/// subquery, and a join through a CTE-free comma list. Users see tasks of the projects they
/// are *active* members of, in teams of *their org*.
const RULES: &str = r#"
config:
  edition: 3
streams:
  by_join:
    query: SELECT tasks.* FROM tasks JOIN members m ON m.project = tasks.project JOIN users u ON u.id = m.user_id WHERE m.active AND u.org = auth.parameter('org') AND u.id = auth.user_id()
  by_subquery:
    query: SELECT * FROM tasks WHERE project IN (SELECT project FROM members WHERE active AND user_id IN (SELECT id FROM users WHERE org = auth.parameter('org') AND id = auth.user_id()))
  by_cte:
    with:
      mine: SELECT project AS project FROM members WHERE active AND user_id IN (SELECT id FROM users WHERE org = auth.parameter('org') AND id = auth.user_id())
    query: SELECT tasks.* FROM tasks, mine WHERE tasks.project = mine.project
  by_comma:
    query: SELECT t.* FROM tasks t, members m, users u WHERE t.project = m.project AND m.user_id = u.id AND m.active AND u.org = auth.parameter('org') AND u.id = auth.user_id()
"#;

const STREAMS: [&str; 4] = ["by_join", "by_subquery", "by_cte", "by_comma"];

fn member(id: &str, user: &str, project: &str, active: bool) -> OwnedSourceRow {
    OwnedSourceRow::new("public", "members")
        .column("id", ty("text"), Some(id))
        .column("user_id", ty("text"), Some(user))
        .column("project", ty("text"), Some(project))
        .column("active", ty("bool"), Some(if active { "t" } else { "f" }))
}

fn user(id: &str, org: &str) -> OwnedSourceRow {
    OwnedSourceRow::new("public", "users")
        .column("id", ty("text"), Some(id))
        .column("org", ty("text"), Some(org))
}

/// The lookups of the given parameter rows, as a store holds them.
fn stored(rules: &SyncRules, rows: &[OwnedSourceRow]) -> InMemoryLookups {
    let mut lookups = InMemoryLookups::new();
    for r in rows {
        lookups.insert(eval(rules, r).lookups);
    }
    lookups
}

/// The projects (bucket values) each stream gives `user` of `org`.
fn projects(
    rules: &SyncRules,
    lookups: &InMemoryLookups,
    user: &str,
    org: &str,
) -> Vec<Vec<String>> {
    let mut req = RequestContext::from_claims(json!({"sub": user, "org": org}));
    req.subscriptions = STREAMS
        .iter()
        .map(|s| Subscription {
            stream: s.to_string(),
            parameters: json!({}),
            override_priority: None,
        })
        .collect();
    let res = rules.resolve_request(&req, lookups).unwrap();
    // By subscription, not by bucket name: the four streams partition `tasks` alike, so
    // they share one bucket per project, as the official compiler names it.
    (0..STREAMS.len())
        .map(|j| {
            let mut got: Vec<String> = res
                .buckets
                .iter()
                .filter(|b| b.reasons.contains(&BucketReason::Subscription(j)))
                .map(|b| {
                    b.name
                        .rsplit('[')
                        .next()
                        .unwrap_or_default()
                        .trim_end_matches(']')
                        .to_string()
                })
                .collect();
            got.sort();
            got
        })
        .collect()
}

fn all_four(values: &[&str]) -> Vec<Vec<String>> {
    let one: Vec<String> = values.iter().map(|v| format!("\"{v}\"")).collect();
    vec![one; 4]
}

#[test]
fn filters_in_joins_subqueries_and_ctes_narrow_what_a_request_gets() {
    let rules = SyncRules::parse(RULES).unwrap();
    let rows = [
        user("u1", "acme"),
        user("u2", "other"),
        member("m1", "u1", "p1", true),
        // Inactive: the join's and the subquery's `active` filter deny p2.
        member("m2", "u1", "p2", false),
        // u2 is in p3, but in another org.
        member("m3", "u2", "p3", true),
    ];
    let lookups = stored(&rules, &rows);
    assert_eq!(projects(&rules, &lookups, "u1", "acme"), all_four(&["p1"]));
    // The org filter on the last table of the chain denies everything to a token of
    // another org, and a user is not another user.
    assert_eq!(projects(&rules, &lookups, "u1", "other"), all_four(&[]));
    assert_eq!(projects(&rules, &lookups, "u2", "acme"), all_four(&[]));
    assert_eq!(projects(&rules, &lookups, "u2", "other"), all_four(&["p3"]));
    assert_eq!(projects(&rules, &lookups, "u3", "acme"), all_four(&[]));
}

#[test]
fn a_membership_that_changes_takes_its_buckets_with_it() {
    let rules = SyncRules::parse(RULES).unwrap();
    let before = [user("u1", "acme"), member("m1", "u1", "p1", true)];
    let lookups = stored(&rules, &before);
    assert_eq!(projects(&rules, &lookups, "u1", "acme"), all_four(&["p1"]));
    // The membership turns inactive, then moves to p2; the user moves to another org.
    let inactive = stored(
        &rules,
        &[user("u1", "acme"), member("m1", "u1", "p1", false)],
    );
    assert_eq!(projects(&rules, &inactive, "u1", "acme"), all_four(&[]));
    let moved = stored(
        &rules,
        &[user("u1", "acme"), member("m1", "u1", "p2", true)],
    );
    assert_eq!(projects(&rules, &moved, "u1", "acme"), all_four(&["p2"]));
    let left = stored(
        &rules,
        &[user("u1", "other"), member("m1", "u1", "p2", true)],
    );
    assert_eq!(projects(&rules, &left, "u1", "acme"), all_four(&[]));
}

#[test]
fn rows_of_one_lookup_stay_together() {
    // A composite join key: the task's project and owner must come from one membership
    // row. u1 is a member of p1 (as owner o1) and of p2 (as owner o2): no bucket may mix
    // p1 with o2.
    let rules = SyncRules::parse(
        r#"
config:
  edition: 3
streams:
  s:
    auto_subscribe: true
    query: SELECT tasks.* FROM tasks JOIN members m ON m.project = tasks.project AND m.owner = tasks.owner WHERE m.user_id = auth.user_id()
"#,
    )
    .unwrap();
    let row = |id: &str, project: &str, owner: &str| {
        OwnedSourceRow::new("public", "members")
            .column("id", ty("text"), Some(id))
            .column("user_id", ty("text"), Some("u1"))
            .column("project", ty("text"), Some(project))
            .column("owner", ty("text"), Some(owner))
    };
    let lookups = stored(&rules, &[row("m1", "p1", "o1"), row("m2", "p2", "o2")]);
    let res = rules
        .resolve_request(&RequestContext::from_claims(json!({"sub": "u1"})), &lookups)
        .unwrap();
    let mut names: Vec<&str> = res.buckets.iter().map(|b| b.name.as_str()).collect();
    names.sort();
    // Parameters in the official order (by the hash of `?` and the column name: project
    // 91957731, owner 528517550, computed by the official package).
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names[0].ends_with(r#"s|0["p1","o1"]"#), "{names:?}");
    assert!(names[1].ends_with(r#"s|0["p2","o2"]"#), "{names:?}");
}

/// A CTE joined and never compared only gates the stream: its bucket comes when the CTE
/// has a row for the request, once however many rows it has (they are not combined into
/// as many copies of the same bucket, which would pass the request's bucket limit).
#[test]
fn a_cte_never_compared_gates_once_however_many_rows_it_has() {
    let rules = SyncRules::parse(
        "config:\n  edition: 3\nwith:\n  mine: SELECT project FROM members WHERE user_id = auth.user_id()\nstreams:\n  s:\n    query: SELECT tasks.* FROM tasks, mine\n",
    )
    .unwrap();
    let rows: Vec<OwnedSourceRow> = (0..1500)
        .map(|i| member(&format!("m{i}"), "u1", &format!("p{i}"), true))
        .collect();
    let lookups = stored(&rules, &rows);
    let resolve = |user: &str| {
        let mut req = RequestContext::from_claims(json!({"sub": user}));
        req.subscriptions = vec![Subscription {
            stream: "s".into(),
            parameters: json!({}),
            override_priority: None,
        }];
        rules.resolve_request(&req, &lookups).unwrap().buckets.len()
    };
    assert_eq!(resolve("u1"), 1, "a member gets the stream's one bucket");
    assert_eq!(resolve("u2"), 0, "a user the CTE has no row for gets none");
}
