//! The official `powersync` CLI (npm `powersync`, pinned) manages a sync replica as a
//! self-hosted instance through the admin API: it links, reads the diagnostics, generates
//! a client schema and validates sync configs; a re-copy (`reprocess`) is switched to as a
//! deploy is and the official SDK syncs the same rows after it; the commands that cannot
//! apply say so.
use serde_json::Value;
use testkit::{http_post, OfficialCli};

use super::{assert_rows, client_auth, Rig, Rules};

const ADMIN_TOKEN: &str = "psm-admin-token-0123456789";

#[test]
fn the_official_cli_manages_a_sync_replica() {
    let auth = format!("{}api:\n  tokens: [{ADMIN_TOKEN}]\n", client_auth());
    let rig = Rig::start_with(Rules::Streams, &auth, testkit::PgInstall::pg16());
    let dir = tempfile::tempdir().unwrap();
    let cli = OfficialCli::new(dir.path(), ADMIN_TOKEN);
    let served = link_project(&cli, &rig);
    diagnostics(&cli, &rig);
    schema_and_validation(&cli, &served);
    admin_routes(&rig);
    reprocess(&rig);
}

fn bearer() -> String {
    format!("Authorization: Bearer {ADMIN_TOKEN}")
}

/// `POST path` with an empty JSON object and `headers`.
fn post(rig: &Rig, path: &str, headers: &[&str]) -> testkit::HttpReply {
    http_post(rig.http_port, path, headers, "{}").unwrap()
}

/// Runs `powersync <args>`, which must succeed; prints the session as a user sees it
/// (`--nocapture`; docs/operations.md shows one).
fn ok(cli: &OfficialCli, args: &[&str]) -> testkit::CliRun {
    let run = cli.run(args);
    assert!(run.success, "powersync {args:?} failed:\n{}", run.text());
    println!("$ powersync {}\n{}", args.join(" "), run.text().trim());
    run
}

/// A self-hosted project linked to the replica; answers the served sync config.
fn link_project(cli: &OfficialCli, rig: &Rig) -> String {
    let url = format!("http://127.0.0.1:{}", rig.http_port);
    ok(cli, &["init", "self-hosted"]);
    ok(cli, &["link", "self-hosted", "--api-url", &url]);
    // The project's service.yaml is the replica's own file, with the CLI's marker and the
    // official bucket storage section its schema requires (the replica ignores both).
    let service = format!(
        "_type: self-hosted\nstorage:\n  type: postgresql\n  uri: {}\n{}",
        rig.primary.uri("postgres"),
        rig.config
    );
    std::fs::write(cli.project().join("powersync/service.yaml"), service).unwrap();
    let served = std::fs::read_to_string(&rig.rules_path).unwrap();
    std::fs::write(cli.project().join("powersync/sync-config.yaml"), &served).unwrap();
    served
}

/// Diagnostics: the connection, the served config, its slot and its tables.
fn diagnostics(cli: &OfficialCli, rig: &Rig) {
    let status: Value = serde_json::from_str(&ok(cli, &["status", "--output", "json"]).stdout)
        .expect("status --output json prints JSON");
    assert_eq!(status["connections"][0]["connected"], true, "{status}");
    let active = &status["active_sync_rules"]["connections"][0];
    assert_eq!(active["initial_replication_done"], true, "{status}");
    assert_eq!(
        active["slot_name"],
        rig.status()["replication"]["slot"],
        "{status}"
    );
    let tasks = active["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "tasks")
        .unwrap_or_else(|| panic!("no tasks table in {status}"));
    assert_eq!(tasks["replication_id"], serde_json::json!(["id"]));
    assert_eq!(tasks["data_queries"], true);
    assert!(
        active["last_lsn"].is_string() && active["wal_status"].is_string(),
        "{status}"
    );
    let fatal = |errors: &Value| {
        errors
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["level"] == "fatal")
    };
    assert!(!fatal(&status["active_sync_rules"]["errors"]), "{status}");
    let human = ok(cli, &["status"]).stdout;
    assert!(
        human.contains("Status: connected") && human.contains("Initial replication done: true"),
        "{human}"
    );
}

/// A client schema, and validation of good and broken configs; what the cloud alone does.
fn schema_and_validation(cli: &OfficialCli, served: &str) {
    ok(
        cli,
        &[
            "generate",
            "schema",
            "--output",
            "ts",
            "--output-path",
            "schema.ts",
        ],
    );
    let schema = std::fs::read_to_string(cli.project().join("schema.ts")).unwrap();
    for expected in ["tasks", "title: column.text", "priority: column.integer"] {
        assert!(
            schema.contains(expected),
            "schema.ts has no `{expected}`:\n{schema}"
        );
    }

    // Validation passes for the served config and fails, with the place, for a broken one.
    ok(cli, &["validate"]);
    let broken = served.replace("FROM tasks\n", "FROM tasks WHERE\n");
    std::fs::write(cli.project().join("powersync/sync-config.yaml"), &broken).unwrap();
    let refused = cli.run(&["validate", "--output", "json"]);
    assert!(
        !refused.success,
        "a broken config validated:\n{}",
        refused.text()
    );
    assert!(
        refused.text().contains("PSM_RULES_SQL"),
        "{}",
        refused.text()
    );

    // What only the cloud does says so.
    let deploy = cli.run(&["deploy"]);
    assert!(!deploy.success, "{}", deploy.text());
    assert!(
        deploy.text().to_lowercase().contains("cloud"),
        "{}",
        deploy.text()
    );
}

/// The admin token is required; a deploy through the API is refused with the fix.
fn admin_routes(rig: &Rig) {
    let bearer = bearer();
    let post = |path: &str, headers: &[&str]| post(rig, path, headers);
    assert_eq!(post("/api/admin/v1/diagnostics", &[]).status, 401);
    let wrong = post("/api/admin/v1/diagnostics", &["Authorization: Bearer nope"]);
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    let deploy = post("/api/sync-rules/v1/deploy", &[&bearer]);
    assert_eq!(deploy.status, 422, "{}", deploy.body);
    assert!(deploy.body.contains("PSYNC_S4105"), "{}", deploy.body);
}

/// A re-copy: a new slot, switched to as a deploy is; a client that synced before it
/// holds the same rows after it.
fn reprocess(rig: &Rig) {
    let bearer = bearer();
    let post = |path: &str, headers: &[&str]| post(rig, path, headers);
    let synced = rig.client().run("initial");
    assert_rows(
        "before reprocess",
        &synced["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    let before = rig.status()["replication"]["slot"].clone();
    let reply = post("/api/admin/v1/reprocess", &[&bearer]);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer: Value = serde_json::from_str(&reply.body).unwrap();
    let slot = answer["data"]["connections"][0]["slot_name"].clone();
    assert!(slot.is_string() && slot != before, "{answer}");
    let busy = post("/api/admin/v1/reprocess", &[&bearer]);
    assert_eq!(
        busy.status, 409,
        "a second reprocess during the first: {}",
        busy.body
    );
    assert!(busy.body.contains("PSYNC_S4106"), "{}", busy.body);
    rig.replica.wait_worker("the re-copy switched to", |s| {
        (s["replication"]["slot"] == slot && s["deploy"].is_null()).then_some(())
    });
    rig.primary
        .sql("UPDATE tasks SET title = 'after the re-copy' WHERE id = 'task-sentinel-update-0001'");
    let synced = rig.client().run("initial");
    assert_rows(
        "after reprocess",
        &synced["tables"]["tasks"],
        &rig.expected_tasks(),
    );
}
