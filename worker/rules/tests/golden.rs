//! Golden tests: bucket names, `data` strings and checksums equal to the official service's
//! (`docs/spec/protocol.md` §3.5 worked examples, `docs/spec/protocol.md` §2.4, and the captured
//! vectors of the benchmark fixture).
use crate::support;

use rules::{
    add_checksums, put_checksum, BucketReason, BucketVersion, InMemoryLookups, OwnedSourceRow,
    RequestContext, Subscription, SyncRules,
};
use serde_json::json;
use store::remove_checksum;
use support::*;

#[test]
fn spec_checksum_vectors() {
    let cases = [
        (
            "test",
            "t1",
            r#"{"id":"t1","description":"Test 1"}"#,
            920318466u32,
        ),
        (
            "test",
            "t2",
            r#"{"id":"t2","description":"Test 2"}"#,
            3280762209,
        ),
        (
            "test",
            "test1",
            r#"{"id":"test1","description":"test1"}"#,
            2871785649,
        ),
        (
            "test",
            "a",
            r#"{"id":"a","description":"Test 1"}"#,
            2582164875,
        ),
        (
            "lists",
            "list1",
            r#"{"id":"list1","user_id":"user1","name":"User 1"}"#,
            1418351250,
        ),
        ("todos", "1", r#"{"id":"1"}"#, 3145345093),
    ];
    for (t, id, data, want) in cases {
        assert_eq!(put_checksum(t, id, data), want, "{t}/{id}");
    }
    assert_eq!(add_checksums(920318466, 3280762209), 4201080675);
    assert_eq!(add_checksums(920318466, 3280762209) as i32, -93886621);
    assert_eq!(
        remove_checksum("todos/0a6b5a3e-6a43-4f3c-9f0e-3a5b0c1d2e3f"),
        123688221
    );
}

#[test]
fn spec_global_bucket_put() {
    let rules = SyncRules::parse(
        "bucket_definitions:\n  global:\n    data:\n      - SELECT id, description FROM test\n",
    )
    .unwrap();
    let row = OwnedSourceRow::new("public", "test")
        .column("id", ty("text"), Some("t1"))
        .column("description", ty("text"), Some("Test 1"));
    let out = eval(&rules, &row);
    assert_eq!(out.buckets.len(), 1);
    let b = &out.buckets[0];
    assert_eq!(b.bucket, "1#global[]");
    assert_eq!(&*b.object_type, "test");
    assert_eq!(&*b.object_id, "t1");
    assert_eq!(&*b.data, r#"{"id":"t1","description":"Test 1"}"#);
    assert_eq!(b.checksum, 920318466);
}

const BY_LIST: &str = r#"
bucket_definitions:
  by_list:
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT * FROM todos WHERE list_id = bucket.list_id
"#;

fn todo_row(completed: &str) -> OwnedSourceRow {
    OwnedSourceRow::new("public", "todos")
        .column(
            "id",
            ty("uuid"),
            Some("0a6b5a3e-6a43-4f3c-9f0e-3a5b0c1d2e3f"),
        )
        .column(
            "list_id",
            ty("uuid"),
            Some("c1d2e3f4-0000-4000-8000-000000000001"),
        )
        .column("description", ty("text"), Some("Buy milk"))
        .column("completed", ty("bool"), Some(completed))
        .column(
            "created_at",
            ty("timestamptz"),
            Some("2024-05-01 12:00:00+02"),
        )
        .column("_internal", ty("text"), Some("dropped by *"))
}

#[test]
fn spec_worked_example_b() {
    let rules = SyncRules::parse_with_version(BY_LIST, BucketVersion::Unversioned).unwrap();
    let out = eval(&rules, &todo_row("f"));
    assert_eq!(out.buckets.len(), 1);
    let b = &out.buckets[0];
    assert_eq!(
        b.bucket,
        r#"by_list["c1d2e3f4-0000-4000-8000-000000000001"]"#
    );
    assert_eq!(
        &*b.data,
        r#"{"id":"0a6b5a3e-6a43-4f3c-9f0e-3a5b0c1d2e3f","list_id":"c1d2e3f4-0000-4000-8000-000000000001","description":"Buy milk","completed":0,"created_at":"2024-05-01 10:00:00Z"}"#
    );
    assert_eq!(b.checksum, 3046294055);
    let updated = eval(&rules, &todo_row("t"));
    assert_eq!(updated.buckets[0].checksum, 2719420475);
    let total = [3046294055u32, 2719420475, 123688221]
        .into_iter()
        .fold(0u32, add_checksums);
    assert_eq!(total, 1594435455);

    // Parameter side: the lists row produces the lookup the request resolves through.
    let list = OwnedSourceRow::new("public", "lists")
        .column(
            "id",
            ty("uuid"),
            Some("c1d2e3f4-0000-4000-8000-000000000001"),
        )
        .column("owner_id", ty("text"), Some("user-1"));
    let lookups = eval(&rules, &list).lookups;
    assert_eq!(lookups.len(), 1);
    assert_eq!(lookups[0].key.encode(), r#"["by_list","0","user-1"]"#);
    let mut store = InMemoryLookups::new();
    store.insert(lookups);
    let req = RequestContext::from_claims(json!({"sub": "user-1"}));
    let res = rules.resolve_request(&req, &store).unwrap();
    let names: Vec<_> = res.buckets.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        names,
        [r#"by_list["c1d2e3f4-0000-4000-8000-000000000001"]"#]
    );
    let other = RequestContext::from_claims(json!({"sub": "user-2"}));
    assert!(rules
        .resolve_request(&other, &store)
        .unwrap()
        .buckets
        .is_empty());
}

const U: u32 = 1024;
const P: u32 = 1000;
const PROJECT1: &str = r#"1#tasks_by_auth_project|0["project-org-001-0001"]"#;
const PROJECT2: &str = r#"1#tasks_by_auth_project|0["project-org-001-0002"]"#;

fn streams() -> SyncRules {
    SyncRules::parse(&fixture("sync-config.yaml")).unwrap()
}

fn runtime_insert() -> OwnedSourceRow {
    task_row(
        "task-runtime-insert-0001",
        "org-001",
        "project-org-001-0001",
        "user-org-001-0001",
        "Runtime insert sentinel benchmark row",
        "todo",
        3,
        "user-org-001-0002",
        3,
        "2026-01-02 00:00:00+00",
        "runtime:insert:1",
    )
}

fn updated_sentinel() -> OwnedSourceRow {
    task_row(
        "task-sentinel-update-0001",
        "org-001",
        "project-org-001-0001",
        "user-org-001-0001",
        "Update sentinel changed benchmark row",
        "todo",
        2,
        "user-org-001-0001",
        2,
        "2026-01-03 00:00:00+00",
        "sentinel:update:1",
    )
}

/// Every PUT op in the captured vectors is reproduced from a rebuilt source row.
#[test]
fn streams_reproduce_captured_puts() {
    let rules = streams();
    let mut rows = vec![
        sentinel("update"),
        sentinel("delete"),
        batch_sentinel(1, P, U),
        batch_sentinel(2, P, U),
        runtime_insert(),
    ];
    for t in 1..=5 {
        rows.push(generated_task(1, t, U));
    }
    for t in 1..=3 {
        rows.push(generated_task(2, t, U));
    }
    let mut checked = 0;
    let mut update_puts = 0;
    for line in fixture("vectors/tasks-streams-routed-1m.ndjson").lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let Some(data) = v.get("data") else { continue };
        let bucket = data["bucket"].as_str().unwrap();
        for op in data["data"].as_array().unwrap() {
            let id = op["object_id"].as_str().unwrap();
            let want = op["checksum"].as_u64().unwrap() as u32;
            if op["op"] == "REMOVE" {
                let subkey = op["subkey"].as_str().unwrap();
                assert_eq!(remove_checksum(subkey), want);
                continue;
            }
            let want_data = op["data"].as_str().unwrap();
            let row = if id == "task-sentinel-update-0001" && want_data.contains("changed") {
                updated_sentinel()
            } else if let Some(r) = rows.iter().find(|r| r.columns[0].2.as_deref() == Some(id)) {
                r.clone()
            } else {
                continue;
            };
            if id == "task-sentinel-update-0001" {
                update_puts += 1;
            }
            let out = eval(&rules, &row);
            let m = out
                .buckets
                .iter()
                .find(|b| b.bucket == bucket)
                .unwrap_or_else(|| panic!("{id} not in {bucket}: {:?}", out.buckets));
            assert_eq!(&*m.object_type, op["object_type"].as_str().unwrap());
            assert_eq!(&*m.object_id, id);
            assert_eq!(&*m.data, want_data, "{id}");
            assert_eq!(m.checksum, want, "{id}");
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} ops checked");
    assert_eq!(update_puts, 2);
}

/// `tasks` and `tasks_dashboard` select the same columns of every task: as in the official
/// compiler, they share the first one's bucket.
#[test]
fn streams_row_lands_in_two_buckets() {
    let out = eval(&streams(), &generated_task(1, 1, U));
    let names: Vec<_> = out.buckets.iter().map(|b| b.bucket.as_str()).collect();
    assert_eq!(names, ["1#tasks|0[]", PROJECT1]);
    assert!(out.lookups.is_empty());
}

fn bucket_sum(
    rules: &SyncRules,
    rows: impl Iterator<Item = OwnedSourceRow>,
    bucket: &str,
) -> (u32, usize) {
    let mut sum = 0u32;
    let mut count = 0;
    for r in rows {
        for b in eval(rules, &r).buckets {
            if b.bucket == bucket {
                sum = add_checksums(sum, b.checksum);
                count += 1;
            }
        }
    }
    (sum, count)
}

/// The whole project-1 and project-2 buckets of the 1m profile match the official
/// checkpoint checksums and counts, through the update and delete that follow.
#[test]
fn streams_full_bucket_checksums_match_official() {
    let rules = streams();
    let project1 = (1..=1000)
        .map(|t| generated_task(1, t, U))
        .chain([sentinel("update"), sentinel("delete")])
        .chain((1..=400).map(|i| batch_sentinel(i, P, U)));
    let (sum, count) = bucket_sum(&rules, project1, PROJECT1);
    assert_eq!((sum as i32, count), (1391997441, 1003));

    let (ins, _) = bucket_sum(&rules, [runtime_insert()].into_iter(), PROJECT1);
    let sum = add_checksums(sum, ins);
    assert_eq!(sum as i32, 1430934145);
    let (upd, _) = bucket_sum(&rules, [updated_sentinel()].into_iter(), PROJECT1);
    let sum = add_checksums(sum, upd);
    assert_eq!(sum as i32, -260539975);
    let sum = add_checksums(
        sum,
        remove_checksum(
            "9a2a5224-abe9-4020-aae8-3a7233d52385/7ead02ae-5ab5-5c49-a290-72114b97dddb",
        ),
    );
    assert_eq!(sum as i32, -2034374473);

    let project2 = (1..=1000)
        .map(|t| generated_task(2, t, U))
        .chain((1..=400).map(|i| batch_sentinel(i, P, U)));
    let (sum2, count2) = bucket_sum(&rules, project2, PROJECT2);
    assert_eq!((sum2 as i32, count2), (-1848505700, 1001));
}

#[test]
fn streams_readiness_probe_request() {
    let rules = streams();
    let mut store = InMemoryLookups::new();
    for r in [
        access_row(
            "access-user-benchmark-readiness-probe-project-org-001-0001",
            "user-benchmark-readiness-probe",
            "project-org-001-0001",
        ),
        access_row("a2", "user-org-001-0001", "project-org-001-0001"),
        access_row("a3", "user-org-001-0001", "project-org-001-0002"),
    ] {
        store.insert(eval(&rules, &r).lookups);
    }
    let mut req = RequestContext::from_claims(json!({"sub": "user-benchmark-readiness-probe"}));
    req.include_defaults = false;
    req.subscriptions.push(Subscription {
        stream: "tasks_by_auth_project".into(),
        parameters: json!({}),
        override_priority: None,
    });
    let res = rules.resolve_request(&req, &store).unwrap();
    assert_eq!(res.buckets.len(), 1);
    assert_eq!(res.buckets[0].name, PROJECT1);
    assert_eq!(res.buckets[0].priority, 3);
    assert_eq!(res.buckets[0].reasons, [BucketReason::Subscription(0)]);

    // The target user with defaults: the global bucket plus two project buckets.
    let mut target = RequestContext::from_claims(json!({"sub": "user-org-001-0001"}));
    target.subscriptions = req.subscriptions.clone();
    let res = rules.resolve_request(&target, &store).unwrap();
    let names: Vec<_> = res.buckets.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["1#tasks|0[]", PROJECT1, PROJECT2]);
    // Both default streams include the shared bucket.
    assert_eq!(
        res.buckets[0].reasons,
        [BucketReason::Default(0), BucketReason::Default(2)]
    );

    // Authorization probe: another user sees no project bucket.
    let mut other = RequestContext::from_claims(json!({"sub": "someone-else"}));
    other.include_defaults = false;
    other.subscriptions = req.subscriptions;
    assert!(rules
        .resolve_request(&other, &store)
        .unwrap()
        .buckets
        .is_empty());
}

#[test]
fn legacy_fixture_edition1() {
    let rules = SyncRules::parse(&fixture("sync-rules-legacy.yaml")).unwrap();
    let out = eval(&rules, &generated_task(1, 1, U));
    let names: Vec<_> = out.buckets.iter().map(|b| b.bucket.as_str()).collect();
    assert_eq!(
        names,
        ["1#all_tasks[]", r#"1#by_project["project-org-001-0001"]"#]
    );
    let want = concat!(
        r#"{"id":"task-org-001-0001-0001","org_id":"org-001","project_id":"project-org-001-0001","#,
        r#""title":"Task 1.1","status":"todo","priority":1,"assignee_id":"user-org-001-0001","story_points":1,"#,
        r#""updated_at":"2026-01-01 00:00:00Z","summary":"57325864169bad4e7c06a9218bc8a62657325864169bad4e7c06a9218bc8a62657325864169bad4e7c06a9218bc8a626"}"#
    );
    assert_eq!(&*out.buckets[0].data, want);
    assert_eq!(
        out.buckets[0].checksum,
        put_checksum("tasks", "task-org-001-0001-0001", want)
    );

    let access = eval(
        &rules,
        &access_row("a1", "user-org-001-0001", "project-org-001-0007"),
    );
    assert_eq!(access.lookups.len(), 1);
    assert_eq!(
        access.lookups[0].key.encode(),
        r#"["by_project","0","user-org-001-0001"]"#
    );
    let mut store = InMemoryLookups::new();
    store.insert(access.lookups);
    let res = rules
        .resolve_request(
            &RequestContext::from_claims(json!({"sub": "user-org-001-0001"})),
            &store,
        )
        .unwrap();
    let names: Vec<_> = res.buckets.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        names,
        ["1#all_tasks[]", r#"1#by_project["project-org-001-0007"]"#]
    );
    assert_eq!(res.lookups_read.len(), 1);
    let tables: Vec<_> = rules
        .tables()
        .into_iter()
        .map(|(t, u)| (t.to_string(), u.data, u.parameters))
        .collect();
    assert_eq!(
        tables,
        [
            ("public.tasks".to_string(), true, false),
            ("public.user_project_access".to_string(), false, true)
        ]
    );
}

#[test]
fn content_hash_is_sha256_of_yaml() {
    let yaml = fixture("sync-config.yaml");
    let rules = SyncRules::parse(&yaml).unwrap();
    assert_eq!(rules.content_hash_hex().len(), 64);
    let other = SyncRules::parse(&format!("{yaml}\n# changed\n")).unwrap();
    assert_ne!(rules.content_hash(), other.content_hash());
}

#[test]
fn generation_changes_bucket_names() {
    let rules =
        SyncRules::parse_with_version(&fixture("sync-config.yaml"), BucketVersion::Versioned(7))
            .unwrap();
    let out = eval(&rules, &generated_task(1, 1, U));
    assert_eq!(
        out.buckets[1].bucket,
        r#"7#tasks_by_auth_project|0["project-org-001-0001"]"#
    );
}

/// The examples of `docs/spec/protocol.md` §7.3, §7.4 and §7.6 in one file: static parameter
/// queries over token values, an output-table alias, and every bucket-name shape.
const SPEC_SECTION_7: &str = r#"
bucket_definitions:
  global:
    data:
      - SELECT * FROM lists
  by_user:
    parameters: SELECT request.user_id() AS user_id
    data:
      - SELECT * FROM tasks AS todos WHERE owner_id = bucket.user_id
  by_token_user:
    parameters: SELECT token_parameters.user_id
    data:
      - SELECT id FROM tasks WHERE owner_id = bucket.user_id
  admin_org:
    parameters: SELECT token_parameters.org_id AS org_id WHERE token_parameters.is_admin
    data:
      - SELECT id FROM lists WHERE org_id = bucket.org_id
  by_org:
    parameters: SELECT id AS org FROM orgs WHERE owner = request.user_id()
    data:
      - SELECT id FROM lists WHERE org_num = bucket.org
  pair:
    parameters: SELECT request.jwt() ->> 'k' AS a, request.jwt() ->> 'n' AS b
    data:
      - SELECT id FROM lists WHERE kind = bucket.a AND num = bucket.b
  x:
    parameters: SELECT request.jwt() ->> 'missing' AS v
    data:
      - SELECT id FROM lists WHERE maybe = bucket.v
"#;

#[test]
fn spec_section_7_examples() {
    let rules = SyncRules::parse_with_version(SPEC_SECTION_7, BucketVersion::Unversioned).unwrap();
    let task = OwnedSourceRow::new("public", "tasks")
        .column("id", ty("text"), Some("t1"))
        .column("owner_id", ty("text"), Some("u1"));
    let out = eval(&rules, &task);
    let got: Vec<_> = out
        .buckets
        .iter()
        .map(|b| (b.bucket.as_str(), &*b.object_type))
        .collect();
    assert_eq!(
        got,
        [
            (r#"by_user["u1"]"#, "todos"),
            (r#"by_token_user["u1"]"#, "tasks")
        ]
    );

    let list = OwnedSourceRow::new("public", "lists")
        .column("id", ty("text"), Some("l1"))
        .column("org_id", ty("text"), Some("o1"))
        .column("org_num", ty("int8"), Some("42"))
        .column("kind", ty("text"), Some("a"))
        .column("num", ty("float8"), Some("1"))
        .column("maybe", ty("text"), None);
    let names: Vec<_> = eval(&rules, &list)
        .buckets
        .into_iter()
        .map(|b| b.bucket)
        .collect();
    // `maybe` is NULL: NULL never matches, so no `x[null]` membership from the row side.
    assert_eq!(
        names,
        [
            "global[]",
            r#"admin_org["o1"]"#,
            "by_org[42]",
            r#"pair["a",1]"#
        ]
    );

    let mut store = InMemoryLookups::new();
    let org = OwnedSourceRow::new("public", "orgs")
        .column("id", ty("int4"), Some("42"))
        .column("owner", ty("text"), Some("u1"));
    store.insert(eval(&rules, &org).lookups);
    let req = RequestContext::from_claims(json!({
        "sub": "u1", "k": "a", "n": 1.0, "parameters": {"org_id": "o1", "is_admin": true}
    }));
    let res = rules.resolve_request(&req, &store).unwrap();
    let names: Vec<_> = res.buckets.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "global[]",
            r#"by_user["u1"]"#,
            r#"by_token_user["u1"]"#,
            r#"admin_org["o1"]"#,
            "by_org[42]",
            r#"pair["a",1]"#,
            "x[null]",
        ]
    );
    // Not an admin: the static query's WHERE is false, so no admin_org bucket.
    let plain = RequestContext::from_claims(json!({"sub": "u1", "parameters": {"org_id": "o1"}}));
    let res = rules.resolve_request(&plain, &store).unwrap();
    assert!(!res.buckets.iter().any(|b| b.name.starts_with("admin_org")));
}

#[test]
fn compiled_rules_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SyncRules>();
    assert_send_sync::<rules::TablePlan>();
    assert_send_sync::<InMemoryLookups>();
}

/// The rows rebuilt in `rules_support` have exactly the columns (order and types) of the
/// fixture's schema.sql, so the golden data strings are built from the real table shapes.
#[test]
fn fixture_rows_match_schema_sql() {
    use sqlparser::ast::Statement;
    use sqlparser::dialect::PostgreSqlDialect;
    // Only the CREATE TABLE statements (sqlparser does not know CREATE PUBLICATION).
    let schema = fixture("schema.sql");
    let statements: Vec<Statement> = schema
        .split(';')
        .map(str::trim)
        .filter(|s| s.starts_with("CREATE TABLE"))
        .flat_map(|sql| sqlparser::parser::Parser::parse_sql(&PostgreSqlDialect {}, sql).unwrap())
        .collect();
    let table = |name: &str| -> Vec<(String, String)> {
        statements
            .iter()
            .find_map(|s| match s {
                Statement::CreateTable(t) if t.name.to_string() == name => Some(
                    t.columns
                        .iter()
                        .map(|c| (c.name.value.clone(), c.data_type.to_string().to_lowercase()))
                        .collect(),
                ),
                _ => None,
            })
            .unwrap()
    };
    let pg_name = |oid: u32| match oid {
        25 => "text",
        23 => "integer",
        1184 => "timestamptz",
        other => panic!("unexpected oid {other}"),
    };
    for (name, row) in [
        ("tasks", generated_task(1, 1, U)),
        ("user_project_access", access_row("a", "u", "p")),
    ] {
        let ours: Vec<(String, String)> = row
            .columns
            .iter()
            .map(|(n, t, _)| (n.clone(), pg_name(t.oid).to_string()))
            .collect();
        assert_eq!(ours, table(name), "{name}");
    }
}
