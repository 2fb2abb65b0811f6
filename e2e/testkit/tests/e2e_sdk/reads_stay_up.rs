//! Reads stay up with the official SDK (`docs/operations.md`, section 5.8): a client
//! connected throughout keeps the last checkpoint, and a new client (a fresh database)
//! gets all of it, while the replica's ingest cannot run — the replica restarted while its
//! primary is down, the ingest waiting for the operator after a source change it cannot
//! follow, the disk under the store full; once each fault is gone the client ends equal
//! to the primary.
use std::time::Instant;

use serde_json::{json, Value};
use testkit::{SdkClient, SmallDisk, WatchClient};

use super::{assert_no_warnings, assert_rows, wait_equal, wait_equal_to, Rig, Rules, SECRET, USER};

/// A new client process with a database of its own; its first sync's tasks and how long
/// it took.
fn new_client(rig: &Rig) -> (Value, f64) {
    let db = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let first = SdkClient::new(
        &format!("http://127.0.0.1:{}", rig.http_port),
        SECRET,
        USER,
        db.path(),
        &rig.primary.uri("postgres"),
    )
    .unwrap()
    .with_env("PSM_SUBSCRIBE", "tasks_by_auth_project")
    .run("initial");
    assert_eq!(first["ok"], true, "{first}");
    assert_no_warnings(&first, "a new client while ingest cannot run");
    (
        first["tables"]["tasks"].clone(),
        started.elapsed().as_secs_f64(),
    )
}

/// The primary stops and the replica restarts while it is down: served from its start.
fn primary_down_and_replica_restarted(rig: &Rig, client: &mut WatchClient) {
    let before = rig.expected_tasks();
    rig.primary.stop_fast();
    rig.replica.stop_fast();
    rig.replica.start();
    let restarted = Instant::now();
    rig.replica
        .wait_worker("the replica serving its store", |s| {
            (s["ready"] == true).then_some(())
        });
    let serving = restarted.elapsed().as_secs_f64();
    let (tasks, took) = new_client(rig);
    assert_rows("a new client, the primary down", &tasks, &before);
    wait_equal_to(client, before, "the connected client, the primary down");
    eprintln!(
        "primary down: served {serving:.2} s after the replica's start; a new client's \
         first sync took {took:.2} s (its process included)"
    );
    let status = rig.status();
    assert_eq!(status["phase"], "validating", "{status}");
    rig.primary.start();
    rig.wait_streaming();
    rig.primary.sql(
        "UPDATE tasks SET title = 'After the primary returned' \
         WHERE id = 'task-sentinel-update-0001'",
    );
    wait_equal(client, rig, "after the primary returned");
}

/// The ingest waits for the operator: served meanwhile; after the fix and a reset the
/// client holds the primary's rows again.
fn ingest_waits_for_the_operator(rig: &Rig, client: &mut WatchClient) {
    let before = rig.expected_tasks();
    rig.primary.sql(
        "ALTER TABLE tasks REPLICA IDENTITY NOTHING;
         INSERT INTO tasks VALUES ('task-e2e-no-key', 'org-001', 'project-org-001-0001', \
         'user-org-001-0001', 'Inserted without a replica identity', 'todo', 3, \
         'user-org-001-0002', 5, '2026-02-01T00:00:00Z', 'no key');",
    );
    let status = rig
        .replica
        .wait_worker("the ingest waiting for the operator", |s| {
            (s["ingest"]["waiting_for_operator"] == true).then(|| s.clone())
        });
    assert_eq!(status["ready"], true, "{status}");
    assert_eq!(status["last_error"]["code"], "PSM_R2002", "{status}");
    let (tasks, took) = new_client(rig);
    assert_rows("a new client, the ingest stopped", &tasks, &before);
    wait_equal_to(client, before, "the connected client, the ingest stopped");
    eprintln!("ingest waiting for the operator: a new client's first sync took {took:.2} s");
    // The fix the error names, then reset(): the client follows the new snapshot.
    rig.primary
        .sql("ALTER TABLE tasks REPLICA IDENTITY DEFAULT");
    client.send(&json!({"cmd": "disconnect"}));
    let reset: Value =
        serde_json::from_str(&rig.replica.sql("SELECT powersync_mdbx.reset()")).unwrap();
    assert_eq!(reset["reset"], true, "{reset}");
    rig.wait_replicated();
    client.send(&json!({"cmd": "reconnect"}));
    wait_equal(client, rig, "after the fix and reset()");
}

#[test]
fn sdk_clients_keep_and_get_the_last_checkpoint_while_ingest_cannot_run() {
    let rig = Rig::start(Rules::Streams);
    let mut client = rig.client().watch();
    wait_equal(&mut client, &rig, "synced before the faults");
    primary_down_and_replica_restarted(&rig, &mut client);
    ingest_waits_for_the_operator(&rig, &mut client);
    client.finish();
}

#[test]
fn sdk_clients_keep_and_get_the_last_checkpoint_while_the_stores_disk_is_full() {
    // The disk is mounted below a directory the clusters' user may pass through, and
    // handed to that user (the store refuses a directory of another owner).
    let root = tempfile::tempdir().unwrap();
    let open = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(root.path(), open).unwrap();
    let disk = SmallDisk::tmpfs(&root.path().join("disk"), "160m");
    if let Some(user) = testkit::PgInstall::pg16().run_as() {
        disk.give_to(user);
    }
    let rig = Rig::start_on_storage(Rules::Streams, &disk.path().join("store"));
    let mut client = rig.client().watch();
    let before = rig.expected_tasks();
    wait_equal_to(&mut client, before.clone(), "synced before the disk filled");

    // The disk fills; then 40 MB of rows arrive, more than the store can write.
    let filler = disk.fill();
    rig.primary.sql(
        "INSERT INTO tasks SELECT 'task-big-' || g, 'org-001', 'project-org-001-0001', \
         'user-org-001-0001', 'big', 'todo', 1, 'user-org-001-0001', 1, \
         '2026-02-01T00:00:00Z', repeat(md5(g::text), 3125) FROM generate_series(1, 400) g",
    );
    let status = rig.replica.wait_worker("the full disk reported", |s| {
        (s["ingest"]["running"] == false && s["last_error"]["code"] != Value::Null)
            .then(|| s.clone())
    });
    assert!(
        status["last_error"]["code"]
            .as_str()
            .is_some_and(|c| c.starts_with("PSM_S100")),
        "{status}"
    );
    assert_eq!(status["ready"], true, "{status}");
    let (tasks, took) = new_client(&rig);
    assert_rows("a new client, the disk full", &tasks, &before);
    wait_equal_to(&mut client, before, "the connected client, the disk full");
    eprintln!("disk full: a new client's first sync took {took:.2} s");

    // The big rows are deleted again while the disk is still full, so the client does not
    // download 40 MB afterwards (an SDK disconnecting in the middle of a large BSON
    // document logs "illegal end of stream", which the driver counts as a failure).
    rig.primary
        .sql("DELETE FROM tasks WHERE id LIKE 'task-big-%'");
    // Space is freed: the ingest resumes by itself and the client catches up.
    std::fs::remove_file(&filler).unwrap();
    rig.wait_replicated();
    wait_equal(&mut client, &rig, "after space was freed");
    client.finish();
}
