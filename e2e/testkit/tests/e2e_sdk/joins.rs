//! The official SDK on streams written with the Sync Streams language's joins: a join chain
//! (tasks → the user's access rows → projects), a global CTE, `queries:`, a wildcard table;
//! the joined tables change (a user joins and leaves a project, a project changes owner, a
//! project is filtered out), a table the wildcard matches is created, and the client ends
//! equal to the primary each time. The same in `bucket_definitions` where they express it
//! (parameter queries for the access rows and the owned projects, no filter on a joined
//! project).
use serde_json::json;

use super::{assert_no_warnings, wait_equal_to, Rig, Rules, USER};

const COLUMNS: &str = "tasks.id, tasks.org_id, tasks.project_id, tasks.title, tasks.status, \
    tasks.priority, tasks.assignee_id, tasks.story_points, tasks.updated_at, tasks.summary";

/// `tasks_by_auth_project` (the stream the test client subscribes) reaches tasks through the
/// user's access rows and the projects they name; `owned` (a default stream) through a
/// global CTE of the projects the user owns, and by a second query the user's urgent tasks;
/// `archived` (a default stream) the user's tasks in every `tasks_archive…` table, shown as
/// `tasks`.
fn rules() -> String {
    format!(
        "config:\n  edition: 3\nwith:\n  owned_projects: SELECT id AS id FROM projects WHERE owner_id = auth.user_id()\n\
         streams:\n  tasks_by_auth_project:\n    query: SELECT {COLUMNS} FROM tasks \
         JOIN user_project_access a ON a.project_id = tasks.project_id \
         JOIN projects p ON p.id = a.project_id WHERE a.user_id = auth.user_id() AND p.priority > 0\n\
         \x20 owned:\n    auto_subscribe: true\n    queries:\n      \
         - SELECT {COLUMNS} FROM tasks, owned_projects WHERE tasks.project_id = owned_projects.id\n      \
         - SELECT {COLUMNS} FROM tasks WHERE tasks.assignee_id = auth.user_id() AND tasks.priority > 4\n\
         \x20 archived:\n    auto_subscribe: true\n    query: SELECT {COLUMNS} FROM \"tasks_archive%\" AS tasks \
         WHERE tasks.assignee_id = auth.user_id()\n"
    )
}

/// The same access in `bucket_definitions` (edition 1): what a join chain filters on the
/// joined projects has no counterpart there.
fn legacy_rules() -> String {
    format!(
        "bucket_definitions:\n  by_project:\n    parameters: SELECT project_id FROM user_project_access \
         WHERE user_id = request.user_id()\n    data:\n      - SELECT {COLUMNS} FROM tasks WHERE tasks.project_id = bucket.project_id\n\
         \x20 owned:\n    parameters: SELECT id AS project_id FROM projects WHERE owner_id = request.user_id()\n    data:\n      \
         - SELECT {COLUMNS} FROM tasks WHERE tasks.project_id = bucket.project_id\n\
         \x20 mine:\n    parameters: SELECT request.user_id() AS user_id\n    data:\n      \
         - SELECT {COLUMNS} FROM tasks WHERE tasks.assignee_id = bucket.user_id AND tasks.priority > 4\n      \
         - SELECT {COLUMNS} FROM \"tasks_archive%\" AS tasks WHERE tasks.assignee_id = bucket.user_id\n"
    )
}

/// What the legacy rules give the user, by the primary's own SQL (see [`expected_filter`]).
fn legacy_filter() -> String {
    format!(
        "NOT archived AND (project_id IN (SELECT project_id FROM user_project_access \
         WHERE user_id = '{USER}') \
         OR project_id IN (SELECT id FROM projects WHERE owner_id = '{USER}') \
         OR (assignee_id = '{USER}' AND priority > 4)) \
         OR archived AND assignee_id = '{USER}'"
    )
}

/// The table the wildcard of `archived` matches, created during the test.
const ARCHIVE: &str = "tasks_archive_2025";

/// The tasks the rules give the user, by the primary's own SQL, over the rows of
/// [`tasks_and_archive`].
fn expected_filter() -> String {
    format!(
        "NOT archived AND (project_id IN (SELECT a.project_id FROM user_project_access a \
         JOIN projects p ON p.id = a.project_id WHERE a.user_id = '{USER}' AND p.priority > 0) \
         OR project_id IN (SELECT id FROM projects WHERE owner_id = '{USER}') \
         OR (assignee_id = '{USER}' AND priority > 4)) \
         OR archived AND assignee_id = '{USER}'"
    )
}

/// The rows of `tasks`, and of [`ARCHIVE`] once it exists, marked by where they are.
fn tasks_and_archive(rig: &Rig) -> String {
    let archive = rig
        .primary
        .sql(&format!("SELECT to_regclass('{ARCHIVE}') IS NOT NULL"));
    if archive == "t" {
        format!(
            "(SELECT *, false AS archived FROM tasks UNION ALL \
             SELECT *, true FROM {ARCHIVE}) AS tasks"
        )
    } else {
        "(SELECT *, false AS archived FROM tasks) AS tasks".to_owned()
    }
}

#[test]
fn sdk_syncs_streams_with_joins_ctes_and_queries_as_their_tables_change() {
    scenario(Rules::Streams, &rules(), &expected_filter(), true);
}

#[test]
fn sdk_syncs_the_same_access_in_bucket_definitions_as_their_tables_change() {
    scenario(Rules::Legacy, &legacy_rules(), &legacy_filter(), false);
}

/// The scenario under `rules` of format `kind`, whose rows for the user `filter` selects;
/// `joined_filter`: the rules filter the joined projects (a step changes one's priority).
fn scenario(kind: Rules, rules: &str, filter: &str, joined_filter: bool) {
    let rig = Rig::start_with_rules(kind, rules);
    // The fixture has no projects: one per task project, owned by another user, all in.
    rig.primary.sql(
        "INSERT INTO projects (id, org_id, code, name, status, priority, owner_id, updated_at, summary) \
         SELECT DISTINCT project_id, org_id, 'c', 'n', 'active', 1, 'user-org-001-0002', now(), 's' FROM tasks",
    );
    rig.wait_replicated();
    let mut client = rig.client().watch();
    // Each step must change what the user sees, or it would prove nothing.
    let previous = std::cell::RefCell::new(serde_json::Value::Null);
    let expect = |client: &mut testkit::WatchClient, what: &str| {
        let want = rig.expected_tasks_in(&tasks_and_archive(&rig), filter, "summary");
        assert!(
            want.as_array().is_some_and(|rows| !rows.is_empty()),
            "{what}: the scenario should give the user rows"
        );
        assert_ne!(
            *previous.borrow(),
            want,
            "{what}: the step changed nothing the user sees"
        );
        previous.replace(want.clone());
        wait_equal_to(client, want, what);
    };
    expect(&mut client, "initial sync through the join chain");

    // A user joins a project, then leaves another.
    let joined = rig.primary.sql(&format!(
        "SELECT min(project_id) FROM tasks WHERE project_id NOT IN \
         (SELECT project_id FROM user_project_access WHERE user_id = '{USER}')"
    ));
    rig.primary.sql(&format!(
        "INSERT INTO user_project_access VALUES ('access-e2e-join', '{USER}', 'org-001', '{joined}', 'member', now())"
    ));
    expect(&mut client, "the user joined a project");
    let left = rig.primary.sql(&format!(
        "SELECT min(project_id) FROM user_project_access WHERE user_id = '{USER}' AND project_id <> '{joined}'"
    ));
    rig.primary.sql(&format!(
        "DELETE FROM user_project_access WHERE user_id = '{USER}' AND project_id = '{left}'"
    ));
    expect(&mut client, "the user left a project");

    // A project the user has no access row for changes owner to the user, then back.
    rig.primary.sql(&format!(
        "UPDATE projects SET owner_id = '{USER}' WHERE id = '{left}'"
    ));
    expect(&mut client, "a project changed owner to the user");
    rig.primary.sql(&format!(
        "UPDATE projects SET owner_id = 'user-org-001-0002' WHERE id = '{left}'"
    ));
    expect(&mut client, "the project changed owner away from the user");

    if joined_filter {
        // The project the user joined is filtered out by the last table of the chain.
        rig.primary.sql(&format!(
            "UPDATE projects SET priority = 0 WHERE id = '{joined}'"
        ));
        expect(&mut client, "a joined project filtered out");
    }

    // A table the wildcard matches is created while the client is connected: its rows
    // (filled before it was published) reach the client, then a row written to it after.
    rig.primary.sql_each(&[
        format!("CREATE TABLE {ARCHIVE} (LIKE tasks INCLUDING ALL)").as_str(),
        format!(
            "INSERT INTO {ARCHIVE} SELECT 'archived-' || id, org_id, project_id, owner_id, title, \
             status, priority, assignee_id, story_points, updated_at, summary FROM tasks \
             WHERE assignee_id = '{USER}' ORDER BY id LIMIT 5"
        )
        .as_str(),
        format!("ALTER PUBLICATION powersync ADD TABLE {ARCHIVE}").as_str(),
    ]);
    expect(&mut client, "a table the wildcard matches created");
    rig.primary.sql(&format!(
        "INSERT INTO {ARCHIVE} SELECT 'archived-late-' || id, org_id, project_id, owner_id, \
         title, status, priority, assignee_id, story_points, updated_at, summary FROM tasks \
         WHERE assignee_id = '{USER}' ORDER BY id DESC LIMIT 1"
    ));
    expect(&mut client, "a row written to the new table");
    let dump = client.send(&json!({"cmd": "dump"}));
    assert_no_warnings(&dump, "joins");
    client.finish();
}
