//! End-to-end: the official PowerSync JavaScript SDK (`@powersync/node`, run by
//! `e2e/client.mjs`) syncs from a PostgreSQL 16 sync replica running the extension, and
//! what the client holds is compared with what the primary says the user should see:
//! the initial sync, incremental changes (insert, update, delete, a column no rule reads
//! added by a migration, a row moving between buckets, a parameter row adding a bucket,
//! TRUNCATE, reset()), local writes uploaded through the connector and acknowledged by a
//! write checkpoint, reconnects and a new process resuming from the stored positions, and
//! token refreshes.
//!
//! Without the e2e packages (`e2e/install.sh`, which `scripts/setup.sh` and so
//! `scripts/test.sh` run) every test here fails and says so.
use std::collections::BTreeSet;

use serde_json::{json, Value};
use testkit::{
    fixture_dir, free_port, require_sdk_client, Cluster, ClusterKind, PgInstall, SdkClient, TestDir,
};

/// base64url of the HS256 key `psm-e2e-test-secret-0123456789abcdef`.
const SECRET: &str = "cHNtLWUyZS10ZXN0LXNlY3JldC0wMTIzNDU2Nzg5YWJjZGVm";
const AUDIENCE: &str = "powersync-mdbx-test";
const USER: &str = "user-org-001-0001";

/// Which rules the replica runs; they differ in how a timestamptz is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rules {
    /// `e2e/fixture/sync-config.yaml`: edition 3 streams, ISO 8601 with microseconds.
    Streams,
    /// `e2e/fixture/sync-rules-legacy.yaml`: bucket_definitions, `YYYY-MM-DD HH:MM:SSZ`.
    Legacy,
}

impl Rules {
    fn file(self) -> &'static str {
        match self {
            Self::Streams => "sync-config.yaml",
            Self::Legacy => "sync-rules-legacy.yaml",
        }
    }

    /// SQL rendering `updated_at` as the rules' output does (whole seconds only in the
    /// legacy form: the tests never write fractions).
    fn updated_at_sql(self) -> &'static str {
        match self {
            Self::Streams => {
                "to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
            }
            Self::Legacy => "to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS\"Z\"')",
        }
    }

    /// Buckets that do not depend on the user's project access.
    fn global_buckets(self) -> usize {
        match self {
            Self::Streams => 2, // tasks, tasks_dashboard
            Self::Legacy => 1,  // all_tasks
        }
    }
}

/// Fields drop in order: the clusters stop (their drop reads the pid from the data
/// directory) before the directory is removed.
struct Rig {
    replica: Cluster,
    primary: Cluster,
    http_port: u16,
    rules: Rules,
    rules_path: std::path::PathBuf,
    db_dir: tempfile::TempDir,
    _dir: TestDir,
}

impl Rig {
    /// The primary with the fixture at a small profile and a sync replica streaming
    /// from it; fails when the SDK client is not installed.
    fn start(rules: Rules) -> Self {
        let client_auth = format!(
            "client_auth:\n  audience: [{AUDIENCE}]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, kid: psm-e2e, k: {SECRET}}}\n"
        );
        Self::start_with(rules, &client_auth, PgInstall::pg16())
    }

    /// [`Self::start`] with a `client_auth` section (YAML) of the test's own, and servers
    /// started from `install` (which may carry environment variables).
    fn start_with(rules: Rules, client_auth: &str, install: PgInstall) -> Self {
        require_sdk_client();
        let dir = TestDir::new(&install);
        let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
        primary.sql_file(&fixture_dir().join("schema.sql"), &[]);
        primary.sql_file(
            &fixture_dir().join("data.sql"),
            &[("U", "8"), ("P", "12"), ("T", "25"), ("D", "6"), ("S", "4")],
        );
        let http_port = free_port();
        let rules_text = std::fs::read_to_string(fixture_dir().join(rules.file())).unwrap();
        let rules_path = dir.write("rules.yaml", &rules_text);
        let config = format!(
            "replication:\n  connections:\n    - type: postgresql\n      uri: {}\n      sslmode: disable\n\
             sync_config:\n  path: {}\n{client_auth}port: {http_port}\n",
            primary.uri("postgres"),
            rules_path.display(),
        );
        let replica = Cluster::start_sync_replica(&install, &dir, &config, &[]);
        let rig = Self {
            replica,
            primary,
            http_port,
            rules,
            rules_path,
            db_dir: tempfile::tempdir().unwrap(),
            _dir: dir,
        };
        rig.wait_streaming();
        rig
    }

    fn wait_streaming(&self) {
        self.replica.wait_worker_phase("streaming");
    }

    fn client(&self) -> SdkClient {
        let mut client = SdkClient::new(
            &format!("http://127.0.0.1:{}", self.http_port),
            SECRET,
            USER,
            self.db_dir.path(),
            &self.primary.uri("postgres"),
        )
        .unwrap();
        if self.rules == Rules::Streams {
            client = client.with_env("PSM_SUBSCRIBE", "tasks_by_auth_project");
        }
        client
    }

    /// Every task, as the client's `tasks` table should hold it: both rule sets give the
    /// user every row (the global `tasks` stream / `all_tasks` bucket).
    fn expected_tasks(&self) -> Value {
        self.expected_tasks_where("true", "summary")
    }

    /// The tasks `filter` selects, with `summary` as the expression for that column.
    fn expected_tasks_where(&self, filter: &str, summary: &str) -> Value {
        let sql = format!(
            "SELECT coalesce(json_agg(json_build_object('id', id, 'org_id', org_id, \
             'project_id', project_id, 'title', title, 'status', status, 'priority', priority, \
             'assignee_id', assignee_id, 'story_points', story_points, 'updated_at', {}, \
             'summary', {summary}) ORDER BY id), '[]') FROM tasks WHERE {filter}",
            self.rules.updated_at_sql()
        );
        serde_json::from_str(&self.primary.sql(&sql)).unwrap()
    }

    /// The worker's status.
    fn status(&self) -> Value {
        serde_json::from_str(&self.replica.sql("SELECT powersync_mdbx.status()")).unwrap()
    }

    /// Writes `rules` to the rules file and has the worker reload it.
    fn deploy(&self, rules: &str) -> Value {
        std::fs::write(&self.rules_path, rules).unwrap();
        serde_json::from_str(&self.replica.sql("SELECT powersync_mdbx.reload()")).unwrap()
    }

    /// Waits until the worker serves `rules` with no deploy in progress.
    fn wait_rules(&self, rules: &str) {
        let hash = rules::SyncRules::parse(rules).unwrap().content_hash_hex();
        self.replica.wait_worker("the deployed rules served", |s| {
            (s["rules_hash"] == hash.as_str() && s["deploy"].is_null() && s["phase"] == "streaming")
                .then_some(())
        })
    }

    /// The projects the user's access rows name: one parameter bucket each.
    fn access_projects(&self) -> BTreeSet<String> {
        self.primary
            .sql(&format!(
                "SELECT project_id FROM user_project_access WHERE user_id = '{USER}'"
            ))
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Every change committed on the primary so far is in the store: the worker's
    /// `applied_lsn` passed the primary's WAL position (a logical message makes an idle
    /// source advance). The slot's `confirmed_flush_lsn` is not used: it was seen to stay
    /// at the consistent point for about 28 s while the store had applied later commits.
    fn wait_replicated(&self) {
        let head = lsn(&self.primary.sql("SELECT pg_current_wal_lsn()"));
        self.primary
            .sql("SELECT pg_logical_emit_message(false, 'powersync', 'e2e sync point')");
        self.replica
            .wait_worker("the worker's applied_lsn to pass the primary's head", |s| {
                let applied = s["replication"]["applied_lsn"].as_str().map(lsn)?;
                (applied >= head).then_some(())
            });
    }
}

/// `X/Y` → a 64-bit LSN.
fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.trim().split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Project ids named by bucket names.
fn bucket_projects(buckets: &Value) -> BTreeSet<String> {
    buckets
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| {
            let name = b.as_str().unwrap();
            let at = name.find("project-org-001-")?;
            name.get(at..at + "project-org-001-0000".len())
                .map(str::to_owned)
        })
        .collect()
}

fn assert_rows(label: &str, got: &Value, want: &Value) {
    if got == want {
        return;
    }
    let ids = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (g, w) = (ids(got), ids(want));
    let first_diff = got
        .as_array()
        .unwrap()
        .iter()
        .zip(want.as_array().unwrap())
        .find(|(a, b)| a != b);
    panic!(
        "{label}: client rows differ from the primary: {} rows vs {}; missing {:?}; extra {:?}; \
         first differing pair {first_diff:?}",
        g.len(),
        w.len(),
        w.difference(&g).take(5).collect::<Vec<_>>(),
        g.difference(&w).take(5).collect::<Vec<_>>()
    );
}

fn wait_equal(client: &mut testkit::WatchClient, rig: &Rig, what: &str) {
    wait_equal_to(client, rig.expected_tasks(), what);
}

/// Waits until the client holds exactly `expected` as its tasks.
fn wait_equal_to(client: &mut testkit::WatchClient, expected: Value, what: &str) {
    let answer = client.try_send(&json!({"cmd": "wait_equal", "table": "tasks", "rows": expected}));
    assert!(
        answer["ok"] == true,
        "{what}: the client did not reach the primary's rows: {answer}"
    );
}

fn assert_no_warnings(dump: &Value, what: &str) {
    assert_eq!(
        dump["warnings"],
        json!([]),
        "{what}: the SDK logged warnings or errors"
    );
}

/// The initial sync in a fresh client, then the rest of the scenarios in a `watch` client
/// on the same database (a new process resuming from the stored positions).
fn sync_end_to_end(rules: Rules) {
    let rig = Rig::start(rules);
    let access = rig.access_projects();
    assert_eq!(access.len(), 4, "fixture profile S=4");
    let started = std::time::Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());

    // 1. Initial sync: every row the user should see, and one bucket per access row.
    let first = rig.client().run("initial");
    assert_rows(
        "initial sync",
        &first["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    assert_eq!(
        bucket_projects(&first["buckets"]),
        access,
        "{}",
        first["buckets"]
    );
    assert_eq!(
        first["buckets"].as_array().unwrap().len(),
        access.len() + rules.global_buckets(),
        "{}",
        first["buckets"]
    );
    eprintln!(
        "initial sync: {} rows, buckets {}, {} ms",
        first["tables"]["tasks"].as_array().unwrap().len(),
        first["buckets"],
        first["elapsed_ms"]
    );
    assert_eq!(first["status"]["hasSynced"], true);
    assert_no_warnings(&first, "initial sync");
    if rules == Rules::Streams {
        let streams = first["status"]["streams"].as_array().unwrap();
        let routed = streams
            .iter()
            .find(|s| s["name"] == "tasks_by_auth_project")
            .unwrap_or_else(|| panic!("no tasks_by_auth_project stream status: {streams:?}"));
        assert_eq!(routed["hasSynced"], true, "{routed}");
    }

    step("initial sync checked");
    // 2. A new process on the same database resumes, then follows source changes.
    let mut client = rig.client().watch();
    rig.primary.sql(
        "INSERT INTO tasks VALUES ('task-e2e-new-1', 'org-001', 'project-org-001-0001', \
         'user-org-001-0001', 'Inserted on the primary', 'todo', 3, 'user-org-001-0002', 5, \
         '2026-02-01T00:00:00Z', 'e2e insert');
         UPDATE tasks SET title = 'Updated on the primary', updated_at = '2026-02-02T00:00:00Z' \
         WHERE id = 'task-sentinel-update-0001';
         DELETE FROM tasks WHERE id = 'task-sentinel-delete-0001';",
    );
    wait_equal(&mut client, &rig, "insert, update, delete");

    // A migration adds a column no rule reads: the stream goes on, and the next write of
    // the table, which comes with the new column, reaches the client.
    rig.primary.sql(
        "ALTER TABLE tasks ADD COLUMN note text DEFAULT 'none';
         UPDATE tasks SET title = 'After a migration', note = 'x' \
         WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(&mut client, &rig, "a column no rule reads added");
    assert_eq!(rig.status()["phase"], "streaming", "{}", rig.status());

    // Migrations of columns the rules read: the table is copied again beside the stream.
    // A retype that leaves every value's text as it was; then a selected column renamed
    // away (the rules now read a column that is not there: every row's summary is null),
    // and back.
    rig.primary.sql(
        "ALTER TABLE tasks ALTER COLUMN title TYPE varchar(300);
         UPDATE tasks SET title = 'After a retype' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(&mut client, &rig, "a selected column retyped");
    rig.primary.sql(
        "ALTER TABLE tasks RENAME COLUMN summary TO summary_before;
         UPDATE tasks SET title = 'After a rename' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal_to(
        &mut client,
        rig.expected_tasks_where("true", "NULL::text"),
        "a selected column renamed away",
    );
    rig.primary.sql(
        "ALTER TABLE tasks RENAME COLUMN summary_before TO summary;
         UPDATE tasks SET title = 'After a rename back' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(&mut client, &rig, "a selected column renamed back");
    rig.replica.wait_worker("the re-copies to end", |s| {
        (s["phase"] == "streaming" && s["replication"]["recopying"] == 0).then_some(())
    });

    // The replica identity changes: rows move to their new keys inside the store.
    rig.primary.sql(
        "ALTER TABLE tasks REPLICA IDENTITY FULL;
         UPDATE tasks SET title = 'Under a full identity' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(&mut client, &rig, "the replica identity changed");
    // A selected column dropped, then added again empty (every row's summary is null but
    // the one written after).
    rig.primary.sql(
        "ALTER TABLE tasks DROP COLUMN summary;
         ALTER TABLE tasks ADD COLUMN summary text;
         UPDATE tasks SET summary = 'written again' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(
        &mut client,
        &rig,
        "a selected column dropped and added again",
    );
    // The table swapped for a copy in several transactions (a new table filled, the old
    // one dropped, the new one renamed and published): no row goes missing meanwhile.
    rig.primary.sql_each(&[
        "CREATE TABLE tasks_new (LIKE tasks INCLUDING ALL)",
        "INSERT INTO tasks_new SELECT * FROM tasks",
        "UPDATE tasks_new SET title = 'In the new table' WHERE id = 'task-sentinel-update-0001'",
        "DROP TABLE tasks",
        "ALTER TABLE tasks_new RENAME TO tasks",
        "ALTER PUBLICATION powersync ADD TABLE tasks",
    ]);
    wait_equal(
        &mut client,
        &rig,
        "the table dropped, created again and published",
    );
    // Renamed away: after the grace its rows leave the client (a replica started now
    // would not find the table); renamed back: copied again.
    rig.primary.sql("ALTER TABLE tasks RENAME TO tasks_away");
    wait_equal_to(&mut client, json!([]), "the covered table renamed away");
    rig.replica.wait_worker("the table counted gone", |s| {
        (s["replication"]["tables_gone"] == 1).then_some(())
    });
    rig.primary.sql("ALTER TABLE tasks_away RENAME TO tasks");
    wait_equal(&mut client, &rig, "the covered table renamed back");
    rig.replica.wait_worker("the re-copies to end", |s| {
        (s["phase"] == "streaming"
            && s["replication"]["recopying"] == 0
            && s["replication"]["tables_gone"] == 0)
            .then_some(())
    });

    // The slot is dropped on the primary (its walsender ended first): the worker rebuilds
    // from a new slot while the client keeps what it has, and changes flow again.
    let slot = rig.status()["replication"]["slot"]
        .as_str()
        .unwrap()
        .to_owned();
    rig.primary.sql(&format!(
        "DO $$ BEGIN
           FOR i IN 1..200 LOOP
             BEGIN
               PERFORM pg_terminate_backend(active_pid) FROM pg_replication_slots
                 WHERE slot_name = '{slot}' AND active_pid IS NOT NULL;
               PERFORM pg_sleep(0.05);
               PERFORM pg_drop_replication_slot('{slot}');
               RETURN;
             EXCEPTION WHEN object_in_use THEN NULL;
             END;
           END LOOP;
           RAISE 'the slot stayed in use';
         END $$;
         UPDATE tasks SET title = 'After the slot was dropped' \
         WHERE id = 'task-sentinel-update-0001';"
    ));
    wait_equal(&mut client, &rig, "the rebuild after the slot was dropped");
    rig.replica.wait_worker("the rebuild to end", |s| {
        (s["phase"] == "streaming" && s["replication"]["rebuilding"] == false).then_some(())
    });
    assert_eq!(
        rig.primary.sql(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
        )),
        "1",
        "a new slot"
    );

    // The slot invalidated by max_slot_wal_keep_size while the replica is down (changes
    // made meanwhile are lost with it): on start the worker rebuilds from a new slot. The
    // client is disconnected meanwhile (a stopped server is a fetch error to the SDK).
    client.send(&json!({"cmd": "disconnect"}));
    rig.primary.sql_each(&[
        "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'",
        "SELECT pg_reload_conf()",
        "CREATE TABLE wal_filler (body text)",
    ]);
    rig.replica.stop_fast();
    rig.primary.sql(
        "UPDATE tasks SET title = 'While the replica was down' \
         WHERE id = 'task-sentinel-update-0001'",
    );
    let wal_status = || {
        rig.primary.sql(&format!(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
    };
    let mut rounds = 0;
    while wal_status() != "lost" {
        rounds += 1;
        assert!(rounds <= 20, "slot not invalidated: {}", wal_status());
        rig.primary.sql_each(&[
            "INSERT INTO wal_filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)",
            "SELECT pg_switch_wal()",
            "CHECKPOINT",
        ]);
    }
    rig.primary.sql_each(&[
        "ALTER SYSTEM RESET max_slot_wal_keep_size",
        "SELECT pg_reload_conf()",
        "DROP TABLE wal_filler",
    ]);
    rig.replica.start();
    // Done once a new slot serves it (the old one is lost until the rebuild replaces it).
    rig.replica
        .wait_worker("the rebuild from a new slot to end", |s| {
            (s["phase"] == "streaming"
                && s["replication"]["rebuilding"] == false
                && wal_status() == "reserved")
                .then_some(())
        });
    client.send(&json!({"cmd": "reconnect"}));
    wait_equal(
        &mut client,
        &rig,
        "the rebuild after the slot was invalidated",
    );

    step("watch client synced; insert/update/delete arrived");
    // A row moving from an accessible project to another, in one transaction with a
    // parameter row giving the user one more project (a new bucket).
    rig.primary.sql(
        "BEGIN;
         UPDATE tasks SET project_id = 'project-org-001-0002' WHERE id = 'task-org-001-0001-0003';
         INSERT INTO user_project_access VALUES ('access-e2e-0002', 'user-org-001-0001', \
         'org-001', 'project-org-001-0002', 'member', '2026-02-03T00:00:00Z');
         COMMIT;",
    );
    wait_equal(&mut client, &rig, "a row moving between projects");
    let answer = client.try_send(&json!({
        "cmd": "wait_buckets",
        "count": access.len() + 1 + rules.global_buckets(),
        "contains": ["project-org-001-0002"],
    }));
    assert!(
        answer["ok"] == true,
        "a new access row adds its bucket: {answer}"
    );

    step("move + new bucket arrived");
    // 3. Local writes: uploaded by the connector to the primary, acknowledged by a write
    // checkpoint, then replaced by the server's version of the rows.
    client.send(&json!({"cmd": "insert", "table": "tasks", "row": {
        "id": "task-e2e-local-1", "org_id": "org-001", "project_id": "project-org-001-0001",
        "title": "Written on the client", "status": "todo", "priority": 1,
        "assignee_id": "user-org-001-0001", "story_points": 3,
        "updated_at": "2026-03-01T10:00:00Z", "summary": "local insert"}}));
    client.send(
        &json!({"cmd": "update", "table": "tasks", "id": "task-org-001-0002-0005",
        "set": {"status": "done", "title": "Closed on the client"}}),
    );
    client.send(&json!({"cmd": "delete", "table": "tasks", "id": "task-org-001-0003-0007"}));
    let synced = client.send(&json!({"cmd": "wait_synced_after_upload"}));
    eprintln!(
        "after the upload: write checkpoint state {}, uploads {}",
        synced["write_checkpoint"], synced["uploaded_transactions"]
    );
    assert_eq!(synced["upload_queue"], 0, "{synced}");
    assert!(
        synced["uploaded_transactions"].as_u64().unwrap() >= 1,
        "{synced}"
    );
    assert_eq!(
        rig.primary.sql(
            "SELECT (SELECT title FROM tasks WHERE id = 'task-e2e-local-1') || '|' || \
             (SELECT status || ' ' || title FROM tasks WHERE id = 'task-org-001-0002-0005') || '|' || \
             (SELECT count(*) FROM tasks WHERE id = 'task-org-001-0003-0007')"
        ),
        "Written on the client|done Closed on the client|0",
        "the connector applied the client's writes to the primary"
    );
    assert_rows(
        "after the write checkpoint",
        &synced["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    step("write checkpoint acknowledged");
    // A change on the primary after the upload still arrives (downloads are not held back
    // by an unacknowledged write checkpoint).
    rig.primary.sql(
        "UPDATE tasks SET status = 'blocked', updated_at = '2026-03-02T00:00:00Z' \
         WHERE id = 'task-e2e-local-1'",
    );
    wait_equal(&mut client, &rig, "a primary change after the upload");

    step("primary change after upload arrived");
    // Bucket parameters of any length: projects whose ids are 3,000 characters and 100 KB
    // long (an app user can type such a value) give the user buckets named by them; their
    // rows arrive, with checksums the SDK accepts (no warning in the whole session, below).
    // The snapshot path takes them too, at the reset() of step 7.
    let long = [("x", 3_000), ("y", 100_000)];
    let long_projects = long.map(|(c, n)| format!("project-long-{}", c.repeat(n)));
    for (i, (c, n)) in long.iter().enumerate() {
        // Built by the server: a 100 KB literal is longer than one psql argument may be.
        let project = format!("'project-long-' || repeat('{c}', {n})");
        rig.primary.sql(&format!(
            "INSERT INTO user_project_access VALUES ('access-e2e-long-{i}', '{USER}', \
             'org-001', {project}, 'member', '2026-02-04T00:00:00Z');
             INSERT INTO tasks VALUES ('task-e2e-long-{i}', 'org-001', {project}, '{USER}', \
             'In a project with a long id', 'todo', 1, '{USER}', 1, '2026-02-04T00:00:00Z', \
             'long');"
        ));
    }
    wait_equal(&mut client, &rig, "tasks of projects with long ids");
    let answer = client.try_send(&json!({
        "cmd": "wait_buckets",
        "contains": long_projects.iter().map(|p| format!("{p}\"")).collect::<Vec<_>>(),
    }));
    assert!(
        answer["ok"] == true,
        "the buckets of the long project ids: {:.600}",
        answer.to_string()
    );
    step("buckets named by 3,000-character and 100 KB parameters arrived");
    // 4. Disconnect, changes while offline, reconnect: the client catches up from its
    // positions.
    client.send(&json!({"cmd": "disconnect"}));
    rig.primary.sql(
        "INSERT INTO tasks VALUES ('task-e2e-offline-1', 'org-001', 'project-org-001-0004', \
         'user-org-001-0001', 'Inserted while offline', 'todo', 2, 'user-org-001-0003', 1, \
         '2026-04-01T00:00:00Z', 'offline');
         DELETE FROM tasks WHERE id = 'task-org-001-0004-0001';",
    );
    step("disconnected, offline changes made");
    rig.wait_replicated();
    step("offline changes replicated");
    let resumed = client.send(&json!({"cmd": "reconnect"}));
    step("reconnected");
    wait_equal(&mut client, &rig, "after a reconnect");
    let total_rows = rig.expected_tasks().as_array().unwrap().len() as u64;
    eprintln!(
        "reconnect: download progress total {} ops",
        resumed["max_progress_total"]
    );
    // The SDK's download progress on the new connection counts only what changed.
    let ops = resumed["max_progress_total"]
        .as_u64()
        .unwrap_or_else(|| panic!("no download progress seen on the reconnect: {resumed}"));
    assert!(
        ops < total_rows,
        "a reconnect resumes instead of downloading everything again ({ops} ops for {total_rows} rows)"
    );

    step("reconnect caught up");
    // 5. Churn past the compaction threshold (1,024 compactable ops in a bucket): every
    // row updated four times and a project's rows deleted, while connected; then more of
    // it while disconnected, so the reconnect resumes from positions inside the compacted
    // history; then a fresh client downloads the compacted buckets.
    for round in 1..=4 {
        rig.primary.sql(&format!(
            "UPDATE tasks SET story_points = story_points + 1, \
             updated_at = '2026-06-0{round}T00:00:00Z'"
        ));
    }
    rig.primary
        .sql("DELETE FROM tasks WHERE project_id = 'project-org-001-0012'");
    wait_equal(&mut client, &rig, "churn while connected");
    step("churn while connected arrived");
    client.send(&json!({"cmd": "disconnect"}));
    for round in 5..=8 {
        rig.primary.sql(&format!(
            "UPDATE tasks SET priority = priority % 5 + 1, \
             updated_at = '2026-06-0{round}T00:00:00Z'"
        ));
    }
    rig.primary
        .sql("DELETE FROM tasks WHERE project_id = 'project-org-001-0011'");
    rig.wait_replicated();
    client.send(&json!({"cmd": "reconnect"}));
    wait_equal(&mut client, &rig, "churn while disconnected");
    step("churn while disconnected arrived");
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh = SdkClient::new(
        &format!("http://127.0.0.1:{}", rig.http_port),
        SECRET,
        USER,
        fresh_dir.path(),
        &rig.primary.uri("postgres"),
    )
    .unwrap()
    .run("initial");
    assert_rows(
        "a fresh client after compaction",
        &fresh["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    assert_no_warnings(&fresh, "a fresh client after compaction");
    step(&format!(
        "fresh client after churn synced: {} rows, {} ops downloaded",
        fresh["tables"]["tasks"].as_array().unwrap().len(),
        fresh["max_progress_total"]
    ));

    // 6. TRUNCATE empties the buckets; rows inserted after it arrive.
    rig.primary.sql(
        "TRUNCATE tasks;
         INSERT INTO tasks VALUES ('task-e2e-after-truncate', 'org-001', 'project-org-001-0001', \
         'user-org-001-0001', 'After truncate', 'todo', 1, 'user-org-001-0001', 1, \
         '2026-05-01T00:00:00Z', 'after truncate');",
    );
    wait_equal(&mut client, &rig, "TRUNCATE");
    let last = client.send(&json!({"cmd": "dump"}));
    assert_eq!(last["tables"]["tasks"].as_array().unwrap().len(), 1);
    assert_no_warnings(&last, "the whole session");
    step("TRUNCATE arrived");
    // 7. reset(): the sync replica drops its slot and store and builds them again under
    // the next bucket generation; the client, reconnecting with positions of the old
    // data, drops the old buckets (they leave its checkpoint) and downloads the new ones
    // without a checksum mismatch.
    client.send(&json!({"cmd": "disconnect"}));
    let reset: Value =
        serde_json::from_str(&rig.replica.sql("SELECT powersync_mdbx.reset()")).unwrap();
    assert_eq!(reset["reset"], true, "{reset}");
    assert_eq!(reset["bucket_generation"], 2, "{reset}");
    rig.primary.sql(
        "INSERT INTO tasks VALUES ('task-e2e-after-reset', 'org-001', 'project-org-001-0001', \
         'user-org-001-0001', 'After reset', 'todo', 1, 'user-org-001-0001', 1, \
         '2026-05-02T00:00:00Z', 'after reset');",
    );
    rig.wait_replicated();
    step("reset done, replica streaming again");
    client.send(&json!({"cmd": "reconnect"}));
    wait_equal(&mut client, &rig, "after reset()");
    let after = client.send(&json!({"cmd": "dump"}));
    assert_eq!(after["tables"]["tasks"].as_array().unwrap().len(), 2);
    assert_no_warnings(&after, "after reset()");
    step("the client resynced after reset()");
    if rules == Rules::Streams {
        deploys_with_the_client_connected(&rig, &mut client, &step);
    }
    client.finish();
}

/// The edition 3 rules with `filter` on every stream, `columns` selected, and the
/// `done_tasks` stream when `extra_stream`.
fn streams_rules(filter: &str, columns: &str, extra_stream: bool) -> String {
    let prefixed: Vec<String> = columns.split(", ").map(|c| format!("tasks.{c}")).collect();
    let prefixed = prefixed.join(", ");
    let project_filter = if filter == "true" {
        String::new()
    } else {
        format!(" AND tasks.{filter}")
    };
    let mut rules = format!(
        "config:\n  edition: 3\nstreams:\n  tasks:\n    auto_subscribe: true\n    \
         query: SELECT {columns} FROM tasks WHERE {filter}\n  tasks_by_auth_project:\n    with:\n      \
         accessible_projects: SELECT project_id AS project_id FROM user_project_access WHERE user_id = auth.user_id()\n    \
         queries:\n      - SELECT {prefixed} FROM tasks, accessible_projects AS bucket WHERE tasks.project_id = bucket.project_id{project_filter}\n"
    );
    if extra_stream {
        rules.push_str(&format!(
            "  done_tasks:\n    auto_subscribe: true\n    query: SELECT {columns} FROM tasks WHERE status = 'done'\n"
        ));
    }
    rules
}

/// Waits until the client holds exactly the tasks `filter` selects (`summary`: the
/// expression for that column).
fn expect_rows(
    rig: &Rig,
    client: &mut testkit::WatchClient,
    filter: &str,
    summary: &str,
    what: &str,
) {
    let want = rig.expected_tasks_where(filter, summary);
    let answer = client.try_send(&json!({"cmd": "wait_equal", "table": "tasks", "rows": want}));
    assert!(answer["ok"] == true, "{what}: {answer}");
}

/// Step 8: rules deploys with the official client connected throughout: a changed filter, an
/// added stream, a changed column list; invalid rules rejected while the served ones
/// stay; the worker killed during a build. The client must end each with exactly the
/// new rules' rows and log no warning.
fn deploys_with_the_client_connected(
    rig: &Rig,
    client: &mut testkit::WatchClient,
    step: &dyn Fn(&str),
) {
    const ALL: &str = "id, org_id, project_id, title, status, priority, assignee_id, story_points, updated_at, summary";
    const NO_SUMMARY: &str =
        "id, org_id, project_id, title, status, priority, assignee_id, story_points, updated_at";
    rig.primary
        .sql("UPDATE tasks SET status = 'done' WHERE id = 'task-e2e-after-truncate'");
    // Deploys happen inside the served store: its generation and slot stay.
    let generation = rig.status()["generation"].as_u64().unwrap();

    // A changed filter (and a stream removed: tasks_dashboard).
    let rules = streams_rules("status != 'done'", ALL, false);
    let result = rig.deploy(&rules);
    assert_eq!(result["outcome"], "deploying_rules", "{result}");
    rig.wait_rules(&rules);
    expect_rows(
        rig,
        client,
        "status != 'done'",
        "summary",
        "a changed filter",
    );
    step("deploy: a changed filter");

    // An added stream.
    let rules = streams_rules("status != 'done'", ALL, true);
    rig.deploy(&rules);
    rig.wait_rules(&rules);
    expect_rows(rig, client, "true", "summary", "an added stream");
    step("deploy: an added stream");

    // A stream added without auto_subscribe: `tasks` is copied again for it, and the
    // client, which does not subscribe to it, downloads nothing: every bucket it holds
    // keeps its last op and checksums.
    let before = client.send(&json!({"cmd": "bucket_ops"}));
    assert!(
        before["buckets"].as_array().is_some_and(|b| !b.is_empty()),
        "{before}"
    );
    let rules = streams_rules("status != 'done'", ALL, true)
        + "  task_by_id:\n    query: SELECT * FROM tasks WHERE id = subscription.parameter('id')\n";
    rig.deploy(&rules);
    rig.wait_rules(&rules);
    expect_rows(
        rig,
        client,
        "true",
        "summary",
        "a stream added without auto_subscribe",
    );
    let after = client.send(&json!({"cmd": "bucket_ops"}));
    assert_eq!(
        after["buckets"], before["buckets"],
        "no data reached the client's buckets"
    );
    step("deploy: a stream added without auto_subscribe, no data sent");

    // Invalid rules: rejected, the served generation stays and follows the primary.
    let result = rig.deploy("config:\n  edition: 3\nstreams:\n  broken:\n    query: SELECT FROM\n");
    assert_eq!(result["outcome"], "invalid_rules_or_keys", "{result}");
    rig.primary.sql(
        "INSERT INTO tasks VALUES ('task-e2e-after-invalid', 'org-001', 'project-org-001-0001', \
         'user-org-001-0001', 'After invalid rules', 'todo', 1, 'user-org-001-0001', 1, \
         '2026-05-03T00:00:00Z', 'after invalid');",
    );
    expect_rows(
        rig,
        client,
        "true",
        "summary",
        "invalid rules keep the served ones",
    );
    assert_eq!(rig.status()["generation"], generation);
    let dump = client.send(&json!({"cmd": "dump"}));
    assert_no_warnings(&dump, "the rules deploys");
    step("deploy: invalid rules rejected");

    // Under `SELECT *` a column added with a constant default changes every row's output
    // without one row change on the stream: the table is copied again and every row the
    // client holds gets the new column. (The stream the client subscribed to stays.)
    let explicit = streams_rules("true", ALL, false);
    let rules = explicit.replacen(
        &format!("SELECT {ALL} FROM tasks"),
        "SELECT * FROM tasks",
        1,
    );
    assert_ne!(rules, explicit, "the tasks stream selects *");
    rig.deploy(&rules);
    rig.wait_rules(&rules);
    expect_rows(rig, client, "true", "summary", "every column of every task");
    rig.primary.sql(
        "ALTER TABLE tasks ADD COLUMN label text DEFAULT 'migrated';
         UPDATE tasks SET title = 'After a column added under *' \
         WHERE id = 'task-sentinel-update-0001';",
    );
    let want = rig.expected_tasks_where("true", "summary");
    let count = want.as_array().map_or(0, Vec::len);
    testkit::wait_for(
        "every task the client holds to have the added column",
        || {
            let raw = client.send(&json!({"cmd": "raw_rows", "table": "tasks"}));
            let rows = raw["rows"].as_array().cloned().unwrap_or_default();
            let labelled = rows
                .iter()
                .filter(|r| {
                    serde_json::from_str::<Value>(r["data"].as_str().unwrap_or("{}"))
                        .is_ok_and(|data| data["label"] == "migrated")
                })
                .count();
            if rows.len() == count && labelled == count {
                Ok(())
            } else {
                Err(format!(
                    "{labelled} of {} rows labelled, {count} expected",
                    rows.len()
                ))
            }
        },
    );
    expect_rows(rig, client, "true", "summary", "a column added under *");
    rig.replica.wait_worker("the re-copy to end", |s| {
        (s["phase"] == "streaming" && s["replication"]["recopying"] == 0).then_some(())
    });
    let dump = client.send(&json!({"cmd": "dump"}));
    assert_no_warnings(&dump, "a column added under *");
    step("deploy: SELECT *, then a column added with a constant default");

    // A changed column list, with the worker killed during the deploy: the restarted
    // worker resumes the deploy its store records (or, killed before it was recorded,
    // starts it again).
    let rules = streams_rules("true", NO_SUMMARY, false);
    rig.deploy(&rules);
    rig.replica.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'powersync_mdbx'",
    );
    rig.wait_rules(&rules);
    assert_eq!(rig.status()["generation"], generation);
    expect_rows(
        rig,
        client,
        "true",
        "NULL::text",
        "a changed column list after a crash during the build",
    );
    let status = rig.status();
    assert!(status["deploy"].is_null(), "{status}");
    // The killed worker's temporary re-copy slot goes with its connection.
    testkit::wait_for("only the served slot to remain", || {
        let slots = rig
            .primary
            .sql("SELECT string_agg(slot_name, ',') FROM pg_replication_slots");
        if slots.trim() == "powersync_mdbx" {
            Ok(())
        } else {
            Err(slots)
        }
    });
    // While the killed worker restarts the client cannot connect, then is told to retry
    // until the restarted engine has checked its store and slot (503 PSYNC_S2302);
    // nothing else may show.
    let dump = client.send(&json!({"cmd": "dump"}));
    let other: Vec<&Value> = dump["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| {
            let text = w["text"].as_str().unwrap_or_default();
            !text.contains("fetch failed") && !text.contains("PSYNC_S2302")
        })
        .collect();
    assert!(other.is_empty(), "the SDK logged {other:?}");
    step("deploy: a changed column list, worker killed during the build");
}

#[test]
fn sdk_syncs_edition_3_streams() {
    sync_end_to_end(Rules::Streams);
}

#[test]
fn sdk_syncs_legacy_bucket_definitions() {
    sync_end_to_end(Rules::Legacy);
}

/// Short-lived tokens: the client refreshes its credentials before they expire (the
/// server's `token_expires_in` lines) and keeps syncing on the new connection.
#[test]
fn sdk_refreshes_expiring_tokens() {
    let rig = Rig::start(Rules::Legacy);
    let mut client = rig.client().with_env("PSM_TOKEN_TTL_S", "35").watch();
    let answer =
        client.try_send(&json!({"cmd": "wait_credentials", "count": 2, "timeout_ms": 30000}));
    assert!(
        answer["ok"] == true,
        "the client fetched new credentials before the token expired: {answer}"
    );
    rig.primary.sql(
        "UPDATE tasks SET title = 'After a token refresh' WHERE id = 'task-sentinel-update-0001'",
    );
    wait_equal(&mut client, &rig, "after a token refresh");
    let last = client.send(&json!({"cmd": "dump"}));
    assert_no_warnings(&last, "token refresh");
    client.finish();
}

/// The client itself, against the in-memory mock service of `e2e/selftest/`: a dump, a
/// checksum mismatch and a missing endpoint failing the run, local writes gated by the
/// write checkpoint, reconnects resuming. Needs no server, so a broken harness shows up
/// apart from server bugs.
#[test]
fn sdk_client_selftest_against_a_mock_service() {
    let (node, script) = require_sdk_client();
    let selftest = script.with_file_name("selftest").join("run.mjs");
    let out = std::process::Command::new(node)
        .arg(selftest)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "e2e client self-test failed:\n{text}");
    assert!(text.contains(" passed, 0 failed"), "{text}");
}

/// A JWKS document served on 127.0.0.1 to every request, standing in for a Supabase
/// project's `/auth/v1/.well-known/jwks.json`; returns its URL.
fn serve_jwks(document: String) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!(
        "http://{}/auth/v1/.well-known/jwks.json",
        listener.local_addr().unwrap()
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{document}",
                document.len()
            );
        }
    });
    uri
}

/// A token as Supabase Auth issues them: `aud: authenticated`, living three days (more than
/// the one day other keys may), signed with `key`.
fn supabase_token(
    key: &jsonwebtoken::EncodingKey,
    alg: jsonwebtoken::Algorithm,
    kid: &str,
) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some(kid.to_owned());
    let claims = json!({"sub": USER, "aud": "authenticated", "role": "authenticated",
                        "iss": "https://abcdefghijklmnop.supabase.co/auth/v1",
                        "iat": now, "exp": now + 3 * 86_400});
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

/// `client_auth.supabase: true`, the most common PowerSync setup: the SDK syncs with a token
/// signed with the project's legacy JWT secret (`supabase_jwt_secret`) and with one signed
/// by the project's signing key, fetched from its JWKS (a local server stands in for
/// Supabase through `PSM_TEST_SUPABASE_JWKS_URI`, the override for tests). Both carry
/// `aud: authenticated`, which the configured `audience` does not list, and live three days.
#[test]
fn sdk_syncs_with_supabase_auth_tokens() {
    let ec_private = include_str!("../../../worker/auth/tests/auth_keys/ec_p256.pem");
    let mut jwk: Value = serde_json::from_str(include_str!(
        "../../../worker/auth/tests/auth_keys/ec_p256.jwk.json"
    ))
    .unwrap();
    jwk["kid"] = json!("supabase-signing-key");
    jwk["alg"] = json!("ES256");
    let jwks_uri = serve_jwks(json!({"keys": [jwk]}).to_string());
    let legacy_secret = "psm-supabase-legacy-jwt-secret-0123456789";
    let client_auth = format!(
        "client_auth:\n  supabase: true\n  supabase_jwt_secret: {legacy_secret}\n  audience: [{AUDIENCE}]\n"
    );
    let install = PgInstall::pg16().with_env(config::SUPABASE_JWKS_OVERRIDE_ENV, &jwks_uri);
    let rig = Rig::start_with(Rules::Legacy, &client_auth, install);
    let tokens = [
        (
            "the legacy JWT secret",
            supabase_token(
                &jsonwebtoken::EncodingKey::from_secret(legacy_secret.as_bytes()),
                jsonwebtoken::Algorithm::HS256,
                "some-supabase-kid",
            ),
        ),
        (
            "a signing key from the project's JWKS",
            supabase_token(
                &jsonwebtoken::EncodingKey::from_ec_pem(ec_private.as_bytes()).unwrap(),
                jsonwebtoken::Algorithm::ES256,
                "supabase-signing-key",
            ),
        ),
    ];
    for (what, token) in tokens {
        let synced = rig.client().with_env("PSM_TOKEN", &token).run("initial");
        assert_rows(what, &synced["tables"]["tasks"], &rig.expected_tasks());
        assert_no_warnings(&synced, what);
    }
    let status = rig.status();
    assert_eq!(status["config_ignored"], json!([]), "{status}");
}

/// The value of the sample `name` (no labels) in a Prometheus exposition.
fn metric(exposition: &str, name: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Dashboards built on the official service's metric names find them after a sync: the
/// connection, the ops and bytes sent, the rows replicated, the storage sizes; and the
/// worker process's own figures. `telemetry.prometheus_port` serves them alone on a port
/// of their own.
#[test]
fn official_metric_names_count_a_sync() {
    let prometheus_port = free_port();
    let client_auth = format!(
        "client_auth:\n  audience: [{AUDIENCE}]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, kid: psm-e2e, k: {SECRET}}}\n\
         telemetry:\n  prometheus_port: {prometheus_port}\n"
    );
    let rig = Rig::start_with(Rules::Legacy, &client_auth, PgInstall::pg16());
    let synced = rig.client().run("initial");
    assert_rows(
        "initial sync",
        &synced["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    rig.primary.sql(
        "UPDATE tasks SET title = 'Counted by the metrics' WHERE id = 'task-sentinel-update-0001'",
    );
    rig.wait_replicated();
    let reply = testkit::http_get(rig.http_port, "/metrics").expect("GET /metrics answers");
    let text = reply.body;
    let value = |name: &str| {
        metric(&text, name).unwrap_or_else(|| panic!("/metrics has no {name}:\n{text}"))
    };
    let rows = rig.expected_tasks().as_array().unwrap().len() as f64;
    assert!(value("powersync_operations_synced_total") >= rows, "{text}");
    assert!(
        value("powersync_data_synced_bytes_total") >= value("powersync_data_sent_bytes_total")
            && value("powersync_data_sent_bytes_total") > 0.0,
        "{text}"
    );
    assert!(value("powersync_concurrent_connections") >= 0.0);
    assert!(value("powersync_rows_replicated_total") >= 1.0, "{text}");
    assert!(
        value("powersync_transactions_replicated_total") >= 1.0,
        "{text}"
    );
    assert!(value("powersync_replication_lag_seconds") >= 0.0);
    for size in [
        "powersync_replication_storage_size_bytes",
        "powersync_operation_storage_size_bytes",
        "powersync_parameter_storage_size_bytes",
    ] {
        assert!(value(size) > 0.0, "{size}: {text}");
    }
    assert!(value("process_cpu_seconds_total") > 0.0, "{text}");
    assert!(value("process_resident_memory_bytes") > 0.0, "{text}");
    assert!(
        text.contains("powersync_mdbx_build_info{version=\""),
        "{text}"
    );
    let scraped = testkit::http_get(prometheus_port, "/metrics").expect("the metrics port answers");
    assert_eq!(scraped.status, 200);
    assert!(metric(&scraped.body, "powersync_operations_synced_total").is_some());
    for other in ["/probes/readiness", "/sync/stream", "/"] {
        let reply = testkit::http_get(prometheus_port, other).unwrap();
        assert_eq!(
            reply.status, 404,
            "{other} on the metrics port: {}",
            reply.body
        );
    }
    assert_eq!(rig.status()["config_ignored"], json!([]));
}

/// `checkpointMode: 'requests'`: the SDK seeds its checkpoint requests at every connect
/// (`POST /sync/checkpoint-request`), a checkpoint it asks for resolves once it holds a
/// row committed before, local writes uploaded are acknowledged by a request, and a
/// reconnect (seeding again) goes on where it was.
#[test]
fn sdk_checkpoint_requests_resolve_once_the_client_holds_the_data() {
    let rig = Rig::start(Rules::Legacy);
    let mut client = rig
        .client()
        .with_env("PSM_CHECKPOINT_MODE", "requests")
        .watch();
    rig.primary.sql(
        "UPDATE tasks SET title = 'Before the checkpoint request' \
         WHERE id = 'task-sentinel-update-0001'",
    );
    let requested = client.send(&json!({"cmd": "request_checkpoint"}));
    assert_rows(
        "a resolved checkpoint request",
        &requested["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    assert_no_warnings(&requested, "checkpoint request");
    client.send(
        &json!({"cmd": "update", "table": "tasks", "id": "task-org-001-0002-0005",
        "set": {"status": "done", "title": "Closed in requests mode"}}),
    );
    let synced = client.send(&json!({"cmd": "wait_synced_after_upload"}));
    assert_eq!(synced["upload_queue"], 0, "{synced}");
    assert_rows(
        "after the uploaded write",
        &synced["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    client.send(&json!({"cmd": "disconnect"}));
    rig.primary.sql(
        "UPDATE tasks SET title = 'While disconnected' WHERE id = 'task-sentinel-update-0001'",
    );
    client.send(&json!({"cmd": "reconnect"}));
    let again = client.send(&json!({"cmd": "request_checkpoint"}));
    assert_rows(
        "a request after a reconnect",
        &again["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    let last = client.send(&json!({"cmd": "dump"}));
    assert_no_warnings(&last, "requests mode");
    client.finish();
}

/// `connectionMethod: WEB_SOCKET` (React Native apps without streaming `fetch`): the SDK
/// opens RSocket over a WebSocket on `/sync/stream`, gets every line as BSON within its
/// request-N credit, follows changes, and uploads and waits for its write checkpoint.
#[test]
fn sdk_syncs_over_a_websocket() {
    let rig = Rig::start(Rules::Streams);
    let client = rig.client().with_env("PSM_CONNECTION_METHOD", "web-socket");
    let first = client.run("initial");
    assert_rows(
        "initial sync over a WebSocket",
        &first["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    assert_no_warnings(&first, "WebSocket initial sync");
    let mut client = client.watch();
    rig.primary
        .sql("UPDATE tasks SET title = 'Over the socket' WHERE id = 'task-sentinel-update-0001'");
    wait_equal(&mut client, &rig, "a change over a WebSocket");
    client.send(
        &json!({"cmd": "update", "table": "tasks", "id": "task-org-001-0002-0005",
        "set": {"status": "done", "title": "Closed over the socket"}}),
    );
    let synced = client.send(&json!({"cmd": "wait_synced_after_upload"}));
    assert_rows(
        "after an upload over a WebSocket",
        &synced["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    let last = client.send(&json!({"cmd": "dump"}));
    assert_no_warnings(&last, "WebSocket");
    client.finish();
    // Every stream was a WebSocket (101), none a streamed POST (200).
    let metrics = testkit::http_get(rig.http_port, "/metrics").unwrap().body;
    let upgraded = metric(
        &metrics,
        "powersync_mdbx_sync_responses_total{status=\"101\"}",
    );
    assert!(upgraded >= Some(2.0), "{metrics}");
    assert_eq!(
        metric(
            &metrics,
            "powersync_mdbx_sync_responses_total{status=\"200\"}"
        ),
        None,
        "{metrics}"
    );
}

/// The web SDK in a real browser: `@powersync/web` (SQLite in a web worker, the sync in a
/// shared worker, across origins) syncs the fixture in headless Chromium over streamed
/// `fetch` and then over a WebSocket, holds exactly the primary's rows (the same digest as
/// the Node SDK's), and follows a change made on the primary while the page is open. The
/// page's screenshots are kept in `target/e2e/web-sdk-<transport>.png`.
#[test]
fn web_sdk_syncs_in_a_headless_browser() {
    let rig = Rig::start(Rules::Streams);
    let node = rig.client().run("initial");
    assert_rows(
        "the Node SDK",
        &node["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    for (n, method) in ["http", "web-socket"].into_iter().enumerate() {
        let screenshot = browser_screenshot_path(method);
        let title = format!("Changed in the browser test ({method})");
        let page = rig
            .client()
            .with_env("PSM_CONNECTION_METHOD", method)
            .with_env(
                "PSM_BROWSER_CHANGE_SQL",
                &format!(
                    "UPDATE tasks SET title = '{title}' WHERE id = 'task-sentinel-update-0001'"
                ),
            )
            .run_in_browser(&screenshot);
        let what = format!("the web SDK over {method}");
        assert_no_warnings(&page, &what);
        assert_eq!(page["digest_checked"], true, "{what}: {page}");
        if n == 0 {
            // Nothing changed yet: the same rows as the Node SDK's, the same buckets.
            assert_rows(&what, &page["tables"]["tasks"], &node["tables"]["tasks"]);
            assert_eq!(
                page["buckets"], node["buckets"],
                "{what}: the Node SDK's buckets"
            );
        }
        assert_rows(
            &format!("{what}, after a change on the primary"),
            &page["after_change"],
            &rig.expected_tasks(),
        );
        let png = std::fs::read(&screenshot).unwrap();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 1000,
            "{what}: the page's screenshot at {} is not a PNG",
            screenshot.display()
        );
        println!(
            "{what} ({}) synced {} tasks in {} ms, digest {}; screenshot {}",
            page["browser"],
            page["tables"]["tasks"].as_array().unwrap().len(),
            page["elapsed_ms"],
            page["digest"],
            screenshot.display()
        );
    }
    // The second page's stream was a WebSocket (101), the first pages' streamed POSTs (200).
    let metrics = testkit::http_get(rig.http_port, "/metrics").unwrap().body;
    for status in ["101", "200"] {
        let name = format!("powersync_mdbx_sync_responses_total{{status=\"{status}\"}}");
        assert!(metric(&metrics, &name) >= Some(1.0), "{name}: {metrics}");
    }
}

/// `target/e2e/web-sdk-<transport>.png` in the build's target directory.
fn browser_screenshot_path(transport: &str) -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        std::path::PathBuf::from,
    );
    let dir = target.join("e2e");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("web-sdk-{transport}.png"))
}
