//! `checkpointMode: 'requests'`: checkpoints the SDK asks for.
use serde_json::json;

use super::{assert_no_warnings, assert_rows, Rig, Rules};

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
