//! Derived bucket names: a definition keeps its names while it and the store's history
//! stay, whatever else a deploy changes; `reads_table_as` names the tables whose rows
//! must be evaluated again.
use crate::support::{eval, ty};
use rules::{BucketVersion, InMemoryLookups, OwnedSourceRow, RequestContext, SyncRules, TableRef};
use serde_json::json;

const BASE: &str = r#"
config:
  edition: 2
streams:
  lists:
    query: SELECT * FROM lists WHERE owner_id = auth.user_id()
    auto_subscribe: true
  todos:
    query: SELECT * FROM todos WHERE list_id IN (SELECT id FROM lists WHERE owner_id = auth.user_id())
    auto_subscribe: true
"#;

fn compiled(text: &str, history: u64) -> SyncRules {
    SyncRules::parse_with_version(text, BucketVersion::Derived(history)).unwrap()
}

/// The default buckets of user `u1` with `l1` among their lists, by stream name.
fn buckets(rules: &SyncRules) -> Vec<(String, String)> {
    let mut lookups = InMemoryLookups::new();
    let list = OwnedSourceRow::new("public", "lists")
        .column("id", ty("text"), Some("l1"))
        .column("owner_id", ty("text"), Some("u1"));
    lookups.insert(eval(rules, &list).lookups);
    let request = RequestContext::from_claims(json!({"sub": "u1"}));
    let mut out: Vec<(String, String)> = rules
        .resolve_request(&request, &lookups)
        .unwrap()
        .buckets
        .into_iter()
        .map(|b| (b.source.clone(), b.name))
        .collect();
    out.sort();
    out
}

fn table(name: &str) -> TableRef {
    TableRef {
        schema: "public".into(),
        name: name.into(),
    }
}

#[test]
fn names_carry_a_tag_of_the_history_and_the_definition() {
    let rules = compiled(BASE, 1);
    let names = buckets(&rules);
    assert_eq!(names.len(), 2, "{names:?}");
    for (stream, name) in &names {
        let (tag, rest) = name.split_once('#').unwrap();
        assert_eq!(tag.len(), 12, "{name}");
        assert!(rest.starts_with(&format!("{stream}|0[")), "{name}");
    }
    assert_eq!(names, buckets(&compiled(BASE, 1)), "deterministic");
    let other_history = buckets(&compiled(BASE, 2));
    assert!(names.iter().zip(&other_history).all(|(a, b)| a.1 != b.1));
}

#[test]
fn a_deploy_keeps_the_names_of_definitions_it_does_not_change() {
    let before = compiled(BASE, 9);
    // A stream added (not subscribed by default), a priority changed: `lists` and `todos`
    // keep their names, and no table they read needs evaluating again.
    let added = compiled(
        &format!(
            "{BASE}  comments:\n    query: SELECT * FROM comments WHERE todo_id = subscription.parameter('todo')\n"
        )
        .replace("auto_subscribe: true\n  todos", "auto_subscribe: true\n    priority: 1\n  todos"),
        9,
    );
    assert_eq!(buckets(&before), buckets(&added));
    assert!(added.reads_table_as(&before, &table("lists")));
    assert!(added.reads_table_as(&before, &table("todos")));
    assert!(!added.reads_table_as(&before, &table("comments")));

    // `todos` changed: its names change, `lists` keeps its own; both tables are read by
    // `todos` (`lists` through its lookup), so both are evaluated again.
    let changed = compiled(
        &BASE.replace("SELECT * FROM todos", "SELECT id, list_id FROM todos"),
        9,
    );
    let (b, c) = (buckets(&before), buckets(&changed));
    assert_eq!(b[0], c[0], "lists");
    assert_ne!(b[1].1, c[1].1, "todos");
    assert!(!changed.reads_table_as(&before, &table("todos")));
    assert!(!changed.reads_table_as(&before, &table("lists")));

    // The edition changes conversions: every name changes.
    let edition = compiled(&BASE.replace("edition: 2", "edition: 3"), 9);
    assert!(buckets(&edition).iter().zip(&b).all(|(x, y)| x.1 != y.1));
}

#[test]
fn the_union_of_two_versions_evaluates_rows_into_both() {
    let before = compiled(BASE, 3);
    let after = compiled(
        &BASE.replace("SELECT * FROM todos", "SELECT id, list_id FROM todos"),
        3,
    );
    let union = before.with_rows_of(&after).unwrap();
    let todo = OwnedSourceRow::new("public", "todos")
        .column("id", ty("text"), Some("t1"))
        .column("list_id", ty("text"), Some("l1"))
        .column("title", ty("text"), Some("x"));
    let names = |rules: &SyncRules| -> Vec<String> {
        let mut b: Vec<String> = eval(rules, &todo)
            .buckets
            .iter()
            .map(|b| b.bucket.clone())
            .collect();
        b.sort();
        b
    };
    let mut both = names(&before);
    both.extend(names(&after));
    both.sort();
    assert_eq!(names(&union), both);
    assert_eq!(both.len(), 2, "{both:?}");
    // `lists` feeds the lookups of both versions of `todos`, under different names.
    let list = OwnedSourceRow::new("public", "lists")
        .column("id", ty("text"), Some("l1"))
        .column("owner_id", ty("text"), Some("u1"));
    let keys = |rules: &SyncRules| -> Vec<String> {
        let mut k: Vec<String> = eval(rules, &list)
            .lookups
            .iter()
            .map(|l| l.key.encode())
            .collect();
        k.sort();
        k.dedup();
        k
    };
    let mut all = keys(&before);
    all.extend(keys(&after));
    all.sort();
    all.dedup();
    assert_eq!(keys(&union), all);
    assert!(
        keys(&before) != keys(&after),
        "a changed stream's lookups are its own"
    );
    // Versions that differ in edition, or names carrying a generation: no union.
    assert!(before
        .with_rows_of(&compiled(&BASE.replace("edition: 2", "edition: 3"), 3))
        .is_none());
    assert!(SyncRules::parse(BASE)
        .unwrap()
        .with_rows_of(&SyncRules::parse(BASE).unwrap())
        .is_none());
}
