use std::sync::Arc;

use super::diagnostics::{budget_warning, display_uri, quiet_for};
use super::schema::schema_json;
use super::sync_rules_status::rules_error;
use super::*;
use rules::RulesError;
use source::{DatabaseSchema, SchemaColumn, SchemaTable, SlotBudget};

fn api(tokens: &[&str]) -> AdminApi {
    let source = SourceConnection::from_uri("postgresql://app:secret@127.0.0.1:5432/db").unwrap();
    let tokens = ApiTokens::new(tokens.iter().map(|t| (*t).to_owned()).collect());
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(store::Store::open(&dir.path().join("store")).unwrap());
    let rules = Arc::new(SyncRules::parse("bucket_definitions: {}\n").unwrap());
    let (_published, checkpoints) = watch::channel(store::Checkpoint::default());
    let served = Arc::new(crate::Served {
        generation: 1,
        wakeups: crate::Wakeups::new(&store, checkpoints.clone()),
        store,
        rules,
        checkpoints,
        stream_progress: Arc::default(),
        snapshot_progress: Arc::default(),
    });
    let (_keep, served) = watch::channel(served);
    AdminApi::new(tokens, Arc::new(StatusCell::new(1)), source, served).0
}

#[test]
fn only_a_configured_token_is_let_in() {
    let api = api(&["first", "second"]);
    assert!(api.authorize(Some("Bearer second")).is_ok());
    assert!(api.authorize(Some("Token first")).is_ok());
    let wrong = api.authorize(Some("Bearer third")).unwrap_err();
    assert_eq!((wrong.status, wrong.code), (401, "PSYNC_S2101"));
    assert!(wrong.description.contains("Authentication failed"));
    for header in [None, Some("first"), Some("Bearer "), Some("Basic Zmlyc3Q=")] {
        let missing = api.authorize(header).unwrap_err();
        assert!(
            missing.description.contains("Authentication required"),
            "{header:?}"
        );
    }
}

#[test]
fn without_tokens_the_api_is_off() {
    let error = super::tests::api(&[])
        .authorize(Some("Bearer x"))
        .unwrap_err();
    assert_eq!(error.status, 401);
    assert!(error.description.contains("api.tokens"), "{error}");
}

#[test]
fn the_uri_shown_has_no_password() {
    let source = SourceConnection::from_uri("postgresql://app:secret@db.example:6543/app").unwrap();
    assert_eq!(display_uri(&source), "postgresql://app@db.example:6543/app");
}

#[test]
fn compile_errors_point_into_the_yaml() {
    let text = "bucket_definitions:\n  global:\n    data:\n      - SELECT * FROM lists WHERE\n";
    let error = SyncRules::parse(text).unwrap_err();
    let entry = rules_error(text, &error);
    assert_eq!(entry["level"], "fatal");
    let start = entry["location"]["start_offset"].as_u64().unwrap() as usize;
    let end = entry["location"]["end_offset"].as_u64().unwrap() as usize;
    let query_at = text.find("SELECT").unwrap();
    assert!(
        start >= query_at && end <= text.len() && start <= end,
        "{entry}"
    );

    let yaml = "bucket_definitions:\n  global: [\n";
    let error = SyncRules::parse(yaml).unwrap_err();
    assert!(matches!(error, RulesError::Yaml { .. }));
    let entry = rules_error(yaml, &error);
    assert!(entry["location"]["start_offset"].is_u64(), "{entry}");
}

#[test]
fn the_schema_has_the_official_shape_and_sqlite_types() {
    let column = |name: &str, declared: &str, type_name: &str, oid: u32, element: Option<u32>| {
        SchemaColumn {
            name: name.to_owned(),
            declared: declared.to_owned(),
            type_name: type_name.to_owned(),
            type_oid: oid,
            element_oid: element,
        }
    };
    let schemas = [DatabaseSchema {
        name: "public".to_owned(),
        tables: vec![SchemaTable {
            name: "todos".to_owned(),
            columns: vec![
                column("id", "uuid", "uuid", 2950, None),
                column("done", "boolean", "bool", 16, None),
                column("weight", "double precision", "float8", 701, None),
                column("tags", "text[]", "text[]", 1009, Some(25)),
                column("photo", "bytea", "bytea", 17, None),
            ],
        }],
    }];
    let json = schema_json(&schemas);
    assert_eq!(json["defaultConnectionTag"], "default");
    assert_eq!(json["defaultSchema"], "public");
    let columns = &json["connections"][0]["schemas"][0]["tables"][0]["columns"];
    let flags: Vec<u64> = (0..5)
        .map(|i| columns[i]["sqlite_type"].as_u64().unwrap())
        .collect();
    assert_eq!(flags, [2, 4, 8, 2, 1]);
    assert_eq!(columns[3]["pg_type"], "text[]");
    assert_eq!(columns[2]["internal_type"], "double precision");
}

#[test]
fn a_quiet_source_is_warned_about_then_fatal() {
    let mut status = StatusCell::new(1).snapshot();
    assert!(quiet_for(&status, 10_000).is_none(), "nothing served yet");
    status.served = Some(status::ServedCheckpoint {
        lsn: "0/1".into(),
        op_id: 1,
        since: 10_000,
        age_seconds: 0,
    });
    assert!(quiet_for(&status, 10_000 + 300).is_none());
    let warning = quiet_for(&status, 10_000 + 301).unwrap();
    assert_eq!(warning["level"], "warning");
    assert_eq!(warning["message"], "No replicated commit in more than 301s");
    assert_eq!(quiet_for(&status, 10_000 + 901).unwrap()["level"], "fatal");
    status.replication = Some(status::ReplicationStatus {
        source_heard_at: Some(10_000 + 900),
        ..Default::default()
    });
    assert!(
        quiet_for(&status, 10_000 + 901).is_none(),
        "heard from the primary"
    );
}

#[test]
fn a_low_wal_budget_is_warned_about() {
    let budget = |safe: i64| SlotBudget {
        exists: true,
        wal_status: Some("reserved".to_owned()),
        safe_wal_size: Some(safe),
        max_slot_wal_keep_size: Some(1000),
        lag_bytes: Some(0),
    };
    assert!(budget_warning(&budget(900)).is_none());
    let low = budget_warning(&budget(300)).unwrap();
    assert_eq!(low["level"], "warning");
    assert!(
        low["message"].as_str().unwrap().contains("30% remaining"),
        "{low}"
    );
}
