//! Live tests: the bootstrap against a real primary — the fixture and a table of every
//! supported column type — checked against an independent computation from the primary's
//! rows (plain SELECT, not COPY) with the rules library; restart, ownership and refusal.
use std::collections::BTreeMap;
use std::sync::Arc;

use config::SourceConnection;
use replication::{
    bootstrap, BootstrapIntent, BootstrapOutcome, BootstrapState, Progress, ReplicationError,
    SourcePlan,
};
use rules::SyncRules;
use store::Store;
use testkit::{buckets, fixture_dir, Cluster, ClusterKind, PgInstall, TestDir, Waiting};

const SLOT: &str = "psm_bootstrap_test";

struct Rig {
    _dir: TestDir,
    primary: Cluster,
    store_dir: tempfile::TempDir,
}

impl Rig {
    fn fixture() -> Self {
        let install = PgInstall::primary();
        let dir = TestDir::new(&install);
        let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
        primary.sql_file(&fixture_dir().join("schema.sql"), &[]);
        primary.sql_file(
            &fixture_dir().join("data.sql"),
            &[("U", "8"), ("P", "12"), ("T", "25"), ("D", "6"), ("S", "4")],
        );
        Self {
            _dir: dir,
            primary,
            store_dir: tempfile::tempdir().unwrap(),
        }
    }

    fn plan(&self) -> SourcePlan {
        SourcePlan {
            connection: SourceConnection::from_uri(&self.primary.uri("postgres")).unwrap(),
            slot: SLOT.into(),
        }
    }

    fn store(&self) -> Arc<Store> {
        Arc::new(Store::open(&self.store_dir.path().join("store")).unwrap())
    }
}

fn fixture_rules() -> Arc<SyncRules> {
    Arc::new(
        SyncRules::parse(&std::fs::read_to_string(fixture_dir().join("sync-config.yaml")).unwrap())
            .unwrap(),
    )
}

async fn run(
    rig: &Rig,
    rules: &Arc<SyncRules>,
    store: &Arc<Store>,
) -> Result<BootstrapOutcome, ReplicationError> {
    bootstrap(
        &rig.plan(),
        rules.clone(),
        store.clone(),
        Arc::new(Progress::default()),
    )
    .await
}

/// Bucket → (count, checksum) computed from `SELECT *` rows with the rules library.
async fn expected_buckets(
    rig: &Rig,
    rules: &SyncRules,
    tables: &[&str],
) -> BTreeMap<String, (u64, u32)> {
    let mut buckets: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    for b in buckets::evaluate_primary_rows(&rig.plan().connection, rules, tables).await {
        let entry = buckets.entry(b.bucket.clone()).or_default();
        entry.0 += 1;
        entry.1 = entry.1.wrapping_add(b.checksum);
    }
    buckets
}

fn stored_buckets(
    store: &Store,
    names: impl Iterator<Item = String>,
) -> BTreeMap<String, (u64, u32)> {
    store
        .read(|view| {
            let mut out = BTreeMap::new();
            for name in names {
                if let Some(state) = view.bucket(&name)? {
                    out.insert(name, (state.count, state.checksum));
                }
            }
            Ok(out)
        })
        .unwrap()
}

#[tokio::test]
async fn fixture_bootstraps_to_the_independently_computed_buckets() {
    let rig = Rig::fixture();
    let rules = fixture_rules();
    let store = rig.store();
    let outcome = run(&rig, &rules, &store).await.unwrap();
    let tasks: u64 = rig
        .primary
        .sql("SELECT count(*) FROM tasks")
        .parse()
        .unwrap();
    let access: u64 = rig
        .primary
        .sql("SELECT count(*) FROM user_project_access")
        .parse()
        .unwrap();
    let BootstrapOutcome::Copied {
        consistent_point,
        rows,
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!(rows, tasks + access);
    assert!(consistent_point > 0);
    let slot_lsn = rig.primary.sql(&format!(
        "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
    ));
    assert_eq!(slot_lsn.parse::<u64>().unwrap(), consistent_point);
    assert_eq!(
        store.read(|v| v.checkpoint()).unwrap().lsn,
        consistent_point
    );

    let expected = expected_buckets(&rig, &rules, &["tasks", "user_project_access"]).await;
    // Every task in `tasks` (which `tasks_dashboard` shares: the same rows the same way)
    // and one project bucket.
    assert_eq!(expected.len(), 1 + 12);
    let probe = "1#tasks_by_auth_project|0[\"project-org-001-0001\"]";
    assert_eq!(
        expected[probe].0,
        25 + 2 + 1,
        "T rows, two sentinels, one batch sentinel"
    );
    assert_eq!(stored_buckets(&store, expected.keys().cloned()), expected);

    // A restart after completion does not copy again.
    drop(store);
    let store = rig.store();
    let complete = BootstrapOutcome::AlreadyComplete {
        consistent_point,
        rows,
    };
    assert_eq!(run(&rig, &rules, &store).await.unwrap(), complete);
    assert_eq!(stored_buckets(&store, expected.keys().cloned()), expected);

    // Changed rules are refused rather than served from data built with the old ones.
    let changed = Arc::new(
        SyncRules::parse("bucket_definitions:\n  all:\n    data:\n      - SELECT * FROM tasks\n")
            .unwrap(),
    );
    let err = run(&rig, &changed, &store).await.unwrap_err();
    assert!(err.to_string().starts_with("PSM_B1003"), "{err}");

    // A lost slot is the stream's to rebuild (`slot_invalidation.rs`): the complete store
    // is not copied again here.
    rig.primary.drop_slot(SLOT);
    assert_eq!(run(&rig, &rules, &store).await.unwrap(), complete);
}

#[tokio::test]
async fn an_interrupted_bootstrap_starts_over_and_foreign_slots_are_refused() {
    let rig = Rig::fixture();
    let rules = fixture_rules();

    // A slot this storage did not create: refused, and left alone.
    rig.primary.sql(&format!(
        "SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')"
    ));
    let store = rig.store();
    let err = run(&rig, &rules, &store).await.unwrap_err();
    assert!(err.to_string().starts_with("PSM_R1013"), "{err}");
    assert_eq!(
        rig.primary.sql(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
        )),
        "1"
    );
    rig.primary.drop_slot(SLOT);

    // Interrupt a bootstrap after its slot exists: cancel it while it copies.
    rig.primary.sql("INSERT INTO tasks SELECT 'bulk-' || i, 'org-001', 'project-org-001-0002', 'u', 't', 'todo', 1, 'u', 1, now(), repeat('x', 200) FROM generate_series(1, 60000) i");
    let plan = rig.plan();
    let progress = Arc::new(Progress::default());
    let task = tokio::spawn({
        let (rules, store, progress) = (rules.clone(), store.clone(), progress.clone());
        async move { bootstrap(&plan, rules, store, progress).await }
    });
    // Stop it once rows are being copied (its slot exists by then).
    let mut waiting = Waiting::new("the bootstrap copying rows");
    while progress.rows() == 0 {
        assert!(!task.is_finished(), "the bootstrap ended before it copied");
        waiting.progress(progress.copying());
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    task.abort();
    let _ = task.await;
    let state = store
        .read(|v| Ok(BootstrapIntent::load(v)))
        .unwrap()
        .unwrap()
        .unwrap()
        .state;
    assert_eq!(
        state,
        BootstrapState::Snapshotting,
        "the copy was interrupted"
    );
    drop(store);

    // The restart finds its own idle slot, drops it, and copies everything again.
    let store = rig.store();
    let outcome = run(&rig, &rules, &store).await.unwrap();
    let total: u64 = rig
        .primary
        .sql("SELECT (SELECT count(*) FROM tasks) + (SELECT count(*) FROM user_project_access)")
        .parse()
        .unwrap();
    assert!(
        matches!(outcome, BootstrapOutcome::Copied { rows, .. } if rows == total),
        "{outcome:?}"
    );
    let expected = expected_buckets(&rig, &rules, &["tasks", "user_project_access"]).await;
    assert_eq!(stored_buckets(&store, expected.keys().cloned()), expected);
}

#[tokio::test]
async fn every_supported_column_type_bootstraps() {
    let install = PgInstall::primary();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(
        "CREATE TYPE mood AS ENUM ('sad', 'ok');
         CREATE TABLE everything (
           id uuid PRIMARY KEY, b boolean, i2 smallint, i4 integer, i8 bigint, f4 real, f8 double precision,
           n numeric, t text, vc varchar(20), c char(3), ts timestamp, tz timestamptz, d date, tm time,
           j json, jb jsonb, ai int[], at text[], by bytea, m mood, iv interval, ip inet);
         INSERT INTO everything VALUES
           ('7c9e6679-7425-40de-944b-e07fc1f90ae7', true, 1, 2, 9007199254740993, 1.5, 'NaN', 12.340, 'tab\there',
            'v', 'ab', '2026-01-02 03:04:05.123456', '2026-01-02 03:04:05+02', '2026-01-02', '03:04:05',
            '{\"a\": [1, 2]}', '{\"b\": null}', '{1,2,NULL}', '{\"x y\",z}', '\\x0102', 'ok', '1 day', '10.0.0.1'),
           ('00000000-0000-0000-0000-000000000000', NULL, NULL, NULL, NULL, NULL, 'Infinity', NULL, 'line\nbreak\\\\',
            NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
         CREATE PUBLICATION powersync FOR ALL TABLES;",
    );
    let rules = Arc::new(
        SyncRules::parse("bucket_definitions:\n  all:\n    data:\n      - SELECT *, hex(by) AS by_hex FROM everything\n").unwrap(),
    );
    let rig = Rig {
        _dir: dir,
        primary,
        store_dir: tempfile::tempdir().unwrap(),
    };
    let store = rig.store();
    let outcome = run(&rig, &rules, &store).await.unwrap();
    assert!(
        matches!(outcome, BootstrapOutcome::Copied { rows: 2, .. }),
        "{outcome:?}"
    );
    let expected = expected_buckets(&rig, &rules, &["everything"]).await;
    assert_eq!(expected.len(), 1);
    assert_eq!(stored_buckets(&store, expected.keys().cloned()), expected);
}
