//! Step 2 of the session: the source changes under a connected client (rows, column
//! migrations, the table replaced and renamed, the slot dropped and invalidated, a row
//! moving between buckets); after each the client holds exactly the primary's rows.
use std::collections::BTreeSet;

use serde_json::json;
use testkit::WatchClient;

use super::{wait_equal, wait_equal_to, Rig};

/// An insert, an update and a delete.
pub(super) fn rows_change(rig: &Rig, client: &mut WatchClient) {
    rig.primary.sql(
        "INSERT INTO tasks VALUES ('task-e2e-new-1', 'org-001', 'project-org-001-0001', \
         'user-org-001-0001', 'Inserted on the primary', 'todo', 3, 'user-org-001-0002', 5, \
         '2026-02-01T00:00:00Z', 'e2e insert');
         UPDATE tasks SET title = 'Updated on the primary', updated_at = '2026-02-02T00:00:00Z' \
         WHERE id = 'task-sentinel-update-0001';
         DELETE FROM tasks WHERE id = 'task-sentinel-delete-0001';",
    );
    wait_equal(client, rig, "insert, update, delete");
}

/// Column migrations: one no rule reads, then selected ones retyped, renamed, dropped and
/// added again; the replica identity changed.
pub(super) fn columns_migrate(rig: &Rig, client: &mut WatchClient) {
    // A migration adds a column no rule reads: the stream goes on, and the next write of
    // the table, which comes with the new column, reaches the client.
    rig.primary.sql(
        "ALTER TABLE tasks ADD COLUMN note text DEFAULT 'none';
         UPDATE tasks SET title = 'After a migration', note = 'x' \
         WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(client, rig, "a column no rule reads added");
    assert_eq!(rig.status()["phase"], "streaming", "{}", rig.status());

    // Migrations of columns the rules read: the table is copied again beside the stream.
    // A retype that leaves every value's text as it was; then a selected column renamed
    // away (the rules now read a column that is not there: every row's summary is null),
    // and back.
    rig.primary.sql(
        "ALTER TABLE tasks ALTER COLUMN title TYPE varchar(300);
         UPDATE tasks SET title = 'After a retype' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(client, rig, "a selected column retyped");
    rig.primary.sql(
        "ALTER TABLE tasks RENAME COLUMN summary TO summary_before;
         UPDATE tasks SET title = 'After a rename' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal_to(
        client,
        rig.expected_tasks_where("true", "NULL::text"),
        "a selected column renamed away",
    );
    rig.primary.sql(
        "ALTER TABLE tasks RENAME COLUMN summary_before TO summary;
         UPDATE tasks SET title = 'After a rename back' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(client, rig, "a selected column renamed back");
    rig.replica.wait_worker("the re-copies to end", |s| {
        (s["phase"] == "streaming" && s["replication"]["recopying"] == 0).then_some(())
    });

    // The replica identity changes: rows move to their new keys inside the store.
    rig.primary.sql(
        "ALTER TABLE tasks REPLICA IDENTITY FULL;
         UPDATE tasks SET title = 'Under a full identity' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(client, rig, "the replica identity changed");
    // A selected column dropped, then added again empty (every row's summary is null but
    // the one written after).
    rig.primary.sql(
        "ALTER TABLE tasks DROP COLUMN summary;
         ALTER TABLE tasks ADD COLUMN summary text;
         UPDATE tasks SET summary = 'written again' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(client, rig, "a selected column dropped and added again");
}

/// The table replaced by a copy, then renamed away and back.
pub(super) fn table_replaced_and_renamed(rig: &Rig, client: &mut WatchClient) {
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
        client,
        rig,
        "the table dropped, created again and published",
    );
    // Renamed away: after the grace its rows leave the client (a replica started now
    // would not find the table); renamed back: copied again.
    rig.primary.sql("ALTER TABLE tasks RENAME TO tasks_away");
    wait_equal_to(client, json!([]), "the covered table renamed away");
    rig.replica.wait_worker("the table counted gone", |s| {
        (s["replication"]["tables_gone"] == 1).then_some(())
    });
    rig.primary.sql("ALTER TABLE tasks_away RENAME TO tasks");
    wait_equal(client, rig, "the covered table renamed back");
    rig.replica.wait_worker("the re-copies to end", |s| {
        (s["phase"] == "streaming"
            && s["replication"]["recopying"] == 0
            && s["replication"]["tables_gone"] == 0)
            .then_some(())
    });
}

/// The slot dropped on the primary; returns its name.
pub(super) fn slot_dropped(rig: &Rig, client: &mut WatchClient) -> String {
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
    wait_equal(client, rig, "the rebuild after the slot was dropped");
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
    slot
}

/// The slot `slot` invalidated while the replica is down.
pub(super) fn slot_invalidated(rig: &Rig, client: &mut WatchClient, slot: &str) {
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
    wait_equal(client, rig, "the rebuild after the slot was invalidated");
}

/// A row moving between projects, with a parameter row adding a bucket.
pub(super) fn row_moves_between_buckets(
    rig: &Rig,
    client: &mut WatchClient,
    access: &BTreeSet<String>,
) {
    // A row moving from an accessible project to another, in one transaction with a
    // parameter row giving the user one more project (a new bucket).
    rig.primary.sql(
        "BEGIN;
         UPDATE tasks SET project_id = 'project-org-001-0002' WHERE id = 'task-org-001-0001-0003';
         INSERT INTO user_project_access VALUES ('access-e2e-0002', 'user-org-001-0001', \
         'org-001', 'project-org-001-0002', 'member', '2026-02-03T00:00:00Z');
         COMMIT;",
    );
    wait_equal(client, rig, "a row moving between projects");
    let answer = client.try_send(&json!({
        "cmd": "wait_buckets",
        "count": access.len() + 1 + rig.rules.global_buckets(),
        "contains": ["project-org-001-0002"],
    }));
    assert!(
        answer["ok"] == true,
        "a new access row adds its bucket: {answer}"
    );
}
