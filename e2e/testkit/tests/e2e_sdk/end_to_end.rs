//! The official SDK through a whole session: the initial sync, the source's changes (from
//! `source_changes`), local writes, long bucket parameters, a reconnect, churn past the
//! compaction threshold, TRUNCATE and `reset()`; under the edition 3 rules, rules deploys
//! too (`deploys`).
use std::collections::BTreeSet;

use serde_json::{json, Value};
use testkit::{SdkClient, WatchClient};

use super::deploys::deploys_with_the_client_connected;
use super::source_changes;
use super::{
    assert_no_warnings, assert_rows, bucket_projects, wait_equal, Rig, Rules, SECRET, USER,
};

/// The initial sync in a fresh client, then the rest of the scenarios in a `watch` client
/// on the same database (a new process resuming from the stored positions).
fn sync_end_to_end(rules: Rules) {
    let rig = Rig::start(rules);
    let access = rig.access_projects();
    assert_eq!(access.len(), 4, "fixture profile S=4");
    let started = std::time::Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());

    initial_sync(&rig, &access);
    step("initial sync checked");
    // 2. A new process on the same database resumes, then follows source changes.
    let mut client = rig.client().watch();
    source_changes::rows_change(&rig, &mut client);
    source_changes::columns_migrate(&rig, &mut client);
    source_changes::table_replaced_and_renamed(&rig, &mut client);
    let slot = source_changes::slot_dropped(&rig, &mut client);
    source_changes::slot_invalidated(&rig, &mut client, &slot);
    step("watch client synced; insert/update/delete arrived");
    source_changes::row_moves_between_buckets(&rig, &mut client, &access);
    step("move + new bucket arrived");
    local_writes(&rig, &mut client, &step);
    step("primary change after upload arrived");
    long_bucket_parameters(&rig, &mut client);
    step("buckets named by 3,000-character and 100 KB parameters arrived");
    reconnect_resumes(&rig, &mut client, &step);
    step("reconnect caught up");
    churn_past_compaction(&rig, &mut client, &step);
    truncate(&rig, &mut client);
    step("TRUNCATE arrived");
    reset_rebuilds(&rig, &mut client, &step);
    if rules == Rules::Streams {
        deploys_with_the_client_connected(&rig, &mut client, &step);
    }
    client.finish();
}

/// Step 1 of [`sync_end_to_end`], in a fresh client.
fn initial_sync(rig: &Rig, access: &BTreeSet<String>) {
    // 1. Initial sync: every row the user should see, and one bucket per access row.
    let first = rig.client().run("initial");
    assert_rows(
        "initial sync",
        &first["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    assert_eq!(
        bucket_projects(&first["buckets"]),
        *access,
        "{}",
        first["buckets"]
    );
    assert_eq!(
        first["buckets"].as_array().unwrap().len(),
        access.len() + rig.rules.global_buckets(),
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
    if rig.rules == Rules::Streams {
        let streams = first["status"]["streams"].as_array().unwrap();
        let routed = streams
            .iter()
            .find(|s| s["name"] == "tasks_by_auth_project")
            .unwrap_or_else(|| panic!("no tasks_by_auth_project stream status: {streams:?}"));
        assert_eq!(routed["hasSynced"], true, "{routed}");
    }
}

/// Step 3 of [`sync_end_to_end`], and a change on the primary after the upload.
fn local_writes(rig: &Rig, client: &mut WatchClient, step: &dyn Fn(&str)) {
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
    wait_equal(client, rig, "a primary change after the upload");
}

/// Bucket parameters 3,000 characters and 100 KB long (between steps 3 and 4).
fn long_bucket_parameters(rig: &Rig, client: &mut WatchClient) {
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
    wait_equal(client, rig, "tasks of projects with long ids");
    let answer = client.try_send(&json!({
        "cmd": "wait_buckets",
        "contains": long_projects.iter().map(|p| format!("{p}\"")).collect::<Vec<_>>(),
    }));
    assert!(
        answer["ok"] == true,
        "the buckets of the long project ids: {:.600}",
        answer.to_string()
    );
}

/// Step 4 of [`sync_end_to_end`].
fn reconnect_resumes(rig: &Rig, client: &mut WatchClient, step: &dyn Fn(&str)) {
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
    wait_equal(client, rig, "after a reconnect");
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
}

/// Step 5 of [`sync_end_to_end`].
fn churn_past_compaction(rig: &Rig, client: &mut WatchClient, step: &dyn Fn(&str)) {
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
    wait_equal(client, rig, "churn while connected");
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
    wait_equal(client, rig, "churn while disconnected");
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
}

/// Step 6 of [`sync_end_to_end`].
fn truncate(rig: &Rig, client: &mut WatchClient) {
    // 6. TRUNCATE empties the buckets; rows inserted after it arrive.
    rig.primary.sql(
        "TRUNCATE tasks;
         INSERT INTO tasks VALUES ('task-e2e-after-truncate', 'org-001', 'project-org-001-0001', \
         'user-org-001-0001', 'After truncate', 'todo', 1, 'user-org-001-0001', 1, \
         '2026-05-01T00:00:00Z', 'after truncate');",
    );
    wait_equal(client, rig, "TRUNCATE");
    let last = client.send(&json!({"cmd": "dump"}));
    assert_eq!(last["tables"]["tasks"].as_array().unwrap().len(), 1);
    assert_no_warnings(&last, "the whole session");
}

/// Step 7 of [`sync_end_to_end`].
fn reset_rebuilds(rig: &Rig, client: &mut WatchClient, step: &dyn Fn(&str)) {
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
    wait_equal(client, rig, "after reset()");
    let after = client.send(&json!({"cmd": "dump"}));
    assert_eq!(after["tables"]["tasks"].as_array().unwrap().len(), 2);
    assert_no_warnings(&after, "after reset()");
    step("the client resynced after reset()");
}

#[test]
fn sdk_syncs_edition_3_streams() {
    sync_end_to_end(Rules::Streams);
}

#[test]
fn sdk_syncs_legacy_bucket_definitions() {
    sync_end_to_end(Rules::Legacy);
}
