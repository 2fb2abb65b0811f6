//! The `powersync-mdbx rules` commands, through the library entry point and the binary.

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../e2e/fixture");

fn run(args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = cli::run(&args, &mut out, &mut err);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn check_prints_a_summary() {
    let (code, out, _) = run(&["rules", "check", &format!("{FIXTURES}/sync-config.yaml")]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("ok: edition 3, 0 bucket definition(s), 3 stream(s), sha256 "),
        "{out}"
    );
    assert!(out.contains("table public.tasks: data\n"));
    assert!(out.contains("table public.user_project_access: parameters\n"));
}

/// Wildcard tables as written, and event definitions with the tables their payloads read.
#[test]
fn check_lists_wildcard_tables_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.yaml");
    std::fs::write(
        &file,
        "bucket_definitions:\n  b:\n    data:\n      - SELECT id, _table_suffix AS y FROM \"todos_%\"\n\
         event_definitions:\n  write_checkpoints:\n    payloads:\n      - SELECT user_id, client_id, checkpoint FROM checkpoints\n",
    )
    .unwrap();
    let (code, out, err) = run(&["rules", "check", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("table public.todos_%: data\n"), "{out}");
    assert!(
        out.contains(
            "event write_checkpoints: public.checkpoints (checked; events have no effect here)\n"
        ),
        "{out}"
    );
}

#[test]
fn check_reports_errors_with_non_zero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "bucket_definitions:\n  x:\n    data: [SELECT id FROM t ORDER BY id]\n",
    )
    .unwrap();
    let (code, out, err) = run(&["rules", "check", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(err.contains("bucket definition `x`, data[0]"), "{err}");
    assert!(err.contains("line 1, column 27"), "{err}");
    let (code, _, err) = run(&["rules", "check"]);
    assert_eq!(code, 2);
    assert!(err.contains("usage:"));
    let (code, _, err) = run(&["rules", "check", "/nonexistent.yaml"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot read"));
}

#[test]
fn check_prints_warnings_on_stderr_and_still_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("warned.yaml");
    std::fs::write(
        &file,
        "config:\n  edition: 3\nstreams:\n  s:\n    query: SELECT id, upper(title) FROM todos WHERE list = subscription.parameter('list')\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let (code, out, err) = run(&["rules", "check", path]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("ok: edition 3, 0 bucket definition(s), 1 stream(s)"),
        "{out}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with(&format!(
            "warning: {path}: [PSM_RULES_WARN_UNNAMED_COLUMN] stream `s`, query `SELECT id, upper(title) FROM todos WHERE list = subscription.parameter('list')` at line 1, column 12 (`upper(title)`): "
        )),
        "{err}"
    );
    assert!(lines[0].ends_with("Fix: `upper(title) AS <name>`"), "{err}");
    assert!(
        lines[1].contains("[PSM_RULES_WARN_UNAUTHENTICATED] stream `s`, query `")
            && lines[1].contains("at line 1, column 49 (`subscription.parameter('list')`)"),
        "{err}"
    );
    assert!(
        lines[1].contains("accept_potentially_dangerous_queries: true"),
        "{err}"
    );

    // Without anything to warn about, stderr stays empty.
    let (code, _, err) = run(&["rules", "check", &format!("{FIXTURES}/sync-config.yaml")]);
    assert_eq!((code, err.as_str()), (0, ""));
}

#[test]
fn eval_prints_ops_lookups_and_request_buckets() {
    let rules = format!("{FIXTURES}/sync-config.yaml");
    let row = r#"{"id":{"type":"text","value":"task-org-001-0001-0001"},"org_id":{"type":"text","value":"org-001"},
        "project_id":{"type":"text","value":"project-org-001-0001"},"owner_id":{"type":"text","value":"user-org-001-0001"},
        "title":{"type":"text","value":"Task 1.1"},"status":{"type":"text","value":"todo"},"priority":{"type":"int4","value":"1"},
        "assignee_id":{"type":"text","value":"user-org-001-0001"},"story_points":{"oid":23,"value":"1"},
        "updated_at":{"type":"timestamptz","value":"2026-01-01 00:00:00+00"},
        "summary":{"type":"text","value":"57325864169bad4e7c06a9218bc8a62657325864169bad4e7c06a9218bc8a62657325864169bad4e7c06a9218bc8a626"}}"#;
    let (code, out, err) = run(&[
        "rules",
        "eval",
        &rules,
        "--table",
        "public.tasks",
        "--row",
        row,
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // `tasks|0[]` (which `tasks_dashboard` shares) and the project bucket.
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[1]["bucket"],
        r#"1#tasks_by_auth_project|0["project-org-001-0001"]"#
    );
    assert_eq!(lines[1]["checksum"], 2268963827u32);
    assert_eq!(lines[1]["op"], "PUT");

    let access = r#"{"id":{"type":"text","value":"a1"},"user_id":{"type":"text","value":"u1"},"project_id":{"type":"text","value":"p1"}}"#;
    let (code, out, err) = run(&[
        "rules",
        "eval",
        &rules,
        "--table",
        "user_project_access",
        "--row",
        access,
        "--claims",
        r#"{"sub":"u1"}"#,
        "--no-defaults",
        "--subscribe",
        "tasks_by_auth_project",
        "--subscribe",
        "missing={}",
        "--generation",
        "4",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            r#"{"lookup":["tasks_by_auth_project","with.accessible_projects","u1"],"outputs":["p1"]}"#,
            r#"{"request_bucket":{"bucket":"4#tasks_by_auth_project|0[\"p1\"]","priority":3,"subscriptions":[{"sub":0}]}}"#,
            r#"{"subscription_error":{"sub":1,"message":"unknown stream `missing`"}}"#,
        ]
    );
}

#[test]
fn eval_rejects_bad_rows_clearly() {
    let rules = format!("{FIXTURES}/sync-rules-legacy.yaml");
    let cases = [
        (
            r#"{"id":{"type":"nope","value":"x"}}"#,
            "unknown type `nope`",
        ),
        (r#"{"id":{"value":"x"}}"#, "needs \"type\""),
        (r#"{"id":{"type":"int8","value":5}}"#, "text representation"),
        (r#"[1]"#, "JSON object of columns"),
        (r#"{"id":{"type":"int8","value":"x5"}}"#, "column id"),
    ];
    for (row, want) in cases {
        let (code, _, err) = run(&["rules", "eval", &rules, "--table", "tasks", "--row", row]);
        assert_eq!(code, 1, "{row}");
        assert!(err.contains(want), "{row}: {err}");
    }
    let (code, _, err) = run(&["rules", "eval", &rules, "--table", "nope", "--row", "{}"]);
    assert_eq!(code, 1);
    assert!(err.contains("do not read table public.nope"));
    let (code, _, _) = run(&["rules", "eval", &rules, "--bogus", "1"]);
    assert_eq!(code, 2);
}

#[test]
fn binary_runs() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_powersync-mdbx"))
        .args([
            "rules",
            "check",
            &format!("{FIXTURES}/sync-rules-legacy.yaml"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("ok: edition 1, 2 bucket definition(s)")
    );
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_powersync-mdbx"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
