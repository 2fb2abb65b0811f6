//! A client moving between replicas whose histories forked (each copied a table again at
//! a moment of its own) downloads again without a checksum mismatch.
use testkit::{free_port, PgInstall, TestDir};

use super::{checksum_warnings, metric, FixtureSource};

#[test]
fn a_client_moving_between_replicas_whose_histories_forked_downloads_again_without_a_mismatch() {
    testkit::require_sdk_client();
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let source = FixtureSource::start(&install, &dir);
    let (port_a, port_b) = (free_port(), free_port());
    let a = source.replica(&install, &dir, "fork_a", port_a, None);
    let b = source.replica(&install, &dir, "fork_b", port_b, Some(port_a));
    let db_dir = tempfile::tempdir().unwrap();
    let mut client = source.client(port_a, db_dir.path());
    source.wait_equal(&mut client, "the first sync from A");

    // A rewrite that changes every title: each replica copies the table again when it
    // sees it, so each writes the new titles at a moment of its own and forks its history.
    source
        .primary
        .sql("ALTER TABLE tasks ALTER COLUMN title TYPE varchar(300) USING title || ' (v2)'");
    source.wait_equal(&mut client, "the rewrite, on A");
    // Each replica sees the rewrite in the primary's catalog within seconds (it
    // carries no row change), copies the table again and forks when it merges.
    for (replica, port) in [(&a, port_a), (&b, port_b)] {
        let forks = replica.wait_worker("the re-copy's fork, in status()", |s| {
            s["store"]["history_forks"].as_u64().filter(|&n| n >= 1)
        });
        replica.wait_worker("the re-copy to end", |s| {
            (s["phase"] == "streaming" && s["replication"]["recopying"] == 0).then_some(())
        });
        replica.wait_applied(&source.primary);
        let log = replica.log_text();
        assert!(
            log.contains("op ids leave the history shared with peers"),
            "the re-copy forked the history:\n{log}"
        );
        assert_eq!(metric(port, "powersync_mdbx_history_forks"), forks);
    }
    let dump = client.send(&serde_json::json!({"cmd": "dump"}));
    assert_eq!(checksum_warnings(&dump), Vec::<serde_json::Value>::new());
    client.finish();

    // The client moves to B with A's positions: B never gave those op ids out, so it
    // sends the client's buckets again behind a CLEAR; no checksum fails.
    let mut client = source.client(port_b, db_dir.path());
    source.wait_equal(&mut client, "the same rows from B");
    source
        .primary
        .sql("UPDATE tasks SET status = 'done' WHERE id LIKE 'task-org-001-0003-%'");
    source.wait_equal(&mut client, "a change followed on B");
    let dump = client.send(&serde_json::json!({"cmd": "dump"}));
    assert_eq!(
        checksum_warnings(&dump),
        Vec::<serde_json::Value>::new(),
        "the SDK logged a checksum mismatch"
    );
    client.finish();
}
