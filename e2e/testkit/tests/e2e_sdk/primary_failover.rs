//! A primary failover that keeps the slot, with the official SDK connected throughout: a
//! PostgreSQL 17+ primary whose physical standby synchronizes the replica's failover slot
//! (`slot_failover: true`); rows written before, during and after the promotion; the
//! connection moves to the promoted standby (a proxy that moves, as a DNS name would). The
//! replica resumes the same slot: no rebuild (so no row copied again), the client downloads
//! only the rows that changed and ends equal to the new primary.
use serde_json::Value;
use testkit::{
    fixture_dir, free_port, require_sdk_client, Cluster, ClusterKind, PgInstall, TcpProxy, TestDir,
};

use super::{client_auth, lsn, metric, wait_equal, Rig, Rules};

/// The fixture's primary with a standby that synchronizes slots, the proxy the replica
/// reaches the primary through, and a sync replica following with `slot_failover`.
fn start() -> (Rig, TcpProxy, Cluster) {
    require_sdk_client();
    let replica_install = PgInstall::pg16();
    let dir = TestDir::new(&replica_install);
    let install = PgInstall::primary_with_failover_slots();
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql_file(&fixture_dir().join("schema.sql"), &[]);
    primary.sql_file(
        &fixture_dir().join("data.sql"),
        &[("U", "8"), ("P", "12"), ("T", "25"), ("D", "6"), ("S", "4")],
    );
    // The primary sends the replica nothing its standby has not received.
    primary.sql("SELECT pg_create_physical_replication_slot('standby_phys')");
    primary.sql("ALTER SYSTEM SET synchronized_standby_slots = 'standby_phys'");
    primary.sql("SELECT pg_reload_conf()");
    let standby = Cluster::start_standby_with(
        &install,
        &dir,
        "standby",
        &primary,
        &[
            "primary_slot_name = 'standby_phys'".into(),
            "hot_standby_feedback = on".into(),
            "sync_replication_slots = on".into(),
        ],
    );
    let proxy = TcpProxy::start(primary.port());
    let http_port = free_port();
    let rules_text = std::fs::read_to_string(fixture_dir().join(Rules::Streams.file())).unwrap();
    let rules_path = dir.write("rules.yaml", &rules_text);
    let config = format!(
        "replication:\n  connections:\n    - type: postgresql\n      uri: {}\n      sslmode: disable\n\
         \x20     slot_failover: true\nsync_config:\n  path: {}\n{}port: {http_port}\n",
        proxy.uri(),
        rules_path.display(),
        client_auth(),
    );
    let replica = Cluster::start_sync_replica(&replica_install, &dir, &config, &[]);
    let rig = Rig {
        replica,
        primary,
        http_port,
        rules: Rules::Streams,
        rules_path,
        config,
        db_dir: tempfile::tempdir().unwrap(),
        _dir: dir,
    };
    rig.wait_streaming();
    (rig, proxy, standby)
}

/// The standby's copy of the slot: `(synced, confirmed_flush_lsn)`, once it has one.
fn standby_slot(standby: &Cluster, slot: &str) -> Option<(bool, u64)> {
    let row = standby.sql(&format!(
        "SELECT synced::text || ' ' || confirmed_flush_lsn FROM pg_replication_slots \
         WHERE slot_name = '{slot}'"
    ));
    let (synced, flushed) = row.trim().split_once(' ')?;
    Some((synced == "true", lsn(flushed)))
}

fn ops_sent(rig: &Rig) -> f64 {
    let text = testkit::http_get(rig.http_port, "/metrics").unwrap().body;
    metric(&text, "powersync_mdbx_sync_ops_sent_total").expect("the ops metric")
}

#[test]
fn the_sdk_stays_connected_through_a_failover_that_keeps_the_slot() {
    let (mut rig, proxy, standby) = start();
    let before: Value = rig.status();
    let slot = before["replication"]["slot"].as_str().unwrap().to_owned();
    let mut client = rig.client().watch();
    wait_equal(&mut client, &rig, "the initial sync");

    rig.primary.sql(
        "UPDATE tasks SET title = 'before the failover' WHERE id = 'task-sentinel-update-0001'",
    );
    wait_equal(&mut client, &rig, "a change before the failover");
    // The standby holds a synchronized copy of the slot (at or behind the store's position:
    // the replica resumes from its store and skips what it applied).
    let (_, synced_at) = testkit::wait_until("the standby's synchronized copy of the slot", || {
        standby_slot(&standby, &slot).filter(|(synced, _)| *synced)
    });
    let ops_before = ops_sent(&rig);

    // Written while the promotion happens; the standby has it before it is promoted.
    rig.primary.sql(
        "UPDATE tasks SET title = 'during the failover' WHERE id = 'task-sentinel-delete-0001'",
    );
    let head = lsn(&rig.primary.sql("SELECT pg_current_wal_lsn()"));
    testkit::wait_until("the standby replaying the primary's head", || {
        (lsn(&standby.sql("SELECT pg_last_wal_replay_lsn()")) >= head).then_some(())
    });
    standby.promote();
    // It copied the old primary's setting and has no standby of its own yet.
    standby.sql("ALTER SYSTEM RESET synchronized_standby_slots");
    standby.sql("SELECT pg_reload_conf()");
    proxy.retarget(standby.port());
    // The old primary goes down, as in a failover (its connections close); expected rows
    // come from the new one.
    drop(std::mem::replace(&mut rig.primary, standby));

    rig.primary.sql(
        "INSERT INTO tasks VALUES ('task-e2e-after-failover', 'org-001', 'project-org-001-0001', \
         'user-org-001-0001', 'After the failover', 'todo', 1, 'user-org-001-0001', 1, \
         '2026-05-03T00:00:00Z', 'after the failover'); \
         UPDATE tasks SET title = 'after the failover' WHERE id = 'task-sentinel-update-0001';",
    );
    wait_equal(&mut client, &rig, "the promoted primary's rows");
    rig.wait_replicated();
    let after = rig.status();
    let replication = &after["replication"];
    assert_eq!(replication["slot"], slot.as_str(), "the same slot: {after}");
    assert!(
        replication["last_rebuild"].is_null() && replication["rebuild"].is_null(),
        "no rebuild: {after}"
    );
    assert_eq!(
        after["store"]["identity"], before["store"]["identity"],
        "the same store"
    );
    assert_eq!(replication["rebuilding"], false, "{after}");
    // Three rows changed (one during, two after); each is in at most two of the client's
    // buckets (the global one and its project's): nothing else was downloaded again.
    let downloaded = ops_sent(&rig) - ops_before;
    println!(
        "primary failover: {downloaded} ops downloaded for 3 changed rows; slot {slot} \
         resumed (synchronized on the standby at {synced_at:X})"
    );
    assert!(
        (3.0..=6.0).contains(&downloaded),
        "{downloaded} ops after the failover"
    );
    client.finish();
}
