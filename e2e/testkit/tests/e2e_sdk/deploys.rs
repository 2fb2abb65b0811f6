//! Step 8 of the session under the edition 3 rules: rules deploys with the official
//! client connected throughout.
use serde_json::{json, Value};
use testkit::WatchClient;

use super::{assert_no_warnings, Rig};

const ALL: &str = "id, org_id, project_id, title, status, priority, assignee_id, story_points, updated_at, summary";
const NO_SUMMARY: &str =
    "id, org_id, project_id, title, status, priority, assignee_id, story_points, updated_at";

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
fn expect_rows(rig: &Rig, client: &mut WatchClient, filter: &str, summary: &str, what: &str) {
    let want = rig.expected_tasks_where(filter, summary);
    let answer = client.try_send(&json!({"cmd": "wait_equal", "table": "tasks", "rows": want}));
    assert!(answer["ok"] == true, "{what}: {answer}");
}

/// Step 8: rules deploys with the official client connected throughout: a changed filter, an
/// added stream, a changed column list; invalid rules rejected while the served ones
/// stay; the worker killed during a build. The client must end each with exactly the
/// new rules' rows and log no warning.
pub(super) fn deploys_with_the_client_connected(
    rig: &Rig,
    client: &mut WatchClient,
    step: &dyn Fn(&str),
) {
    rig.primary
        .sql("UPDATE tasks SET status = 'done' WHERE id = 'task-e2e-after-truncate'");
    // Deploys happen inside the served store: its generation and slot stay.
    let generation = rig.status()["generation"].as_u64().unwrap();
    filter_and_streams_change(rig, client, step);
    invalid_rules_keep_the_served_ones(rig, client, step, generation);
    a_column_added_under_select_star(rig, client, step);
    a_column_list_changed_with_a_crash(rig, client, step, generation);
}

/// A changed filter, an added stream, a stream added without auto_subscribe.
fn filter_and_streams_change(rig: &Rig, client: &mut WatchClient, step: &dyn Fn(&str)) {
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
}

/// Invalid rules: rejected while the served ones (of `generation`) stay.
fn invalid_rules_keep_the_served_ones(
    rig: &Rig,
    client: &mut WatchClient,
    step: &dyn Fn(&str),
    generation: u64,
) {
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
}

/// `SELECT *`, then a column added with a constant default.
fn a_column_added_under_select_star(rig: &Rig, client: &mut WatchClient, step: &dyn Fn(&str)) {
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
}

/// A changed column list with the worker killed during the build; the store stays at
/// `generation`.
fn a_column_list_changed_with_a_crash(
    rig: &Rig,
    client: &mut WatchClient,
    step: &dyn Fn(&str),
    generation: u64,
) {
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
