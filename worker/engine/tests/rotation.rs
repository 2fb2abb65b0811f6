//! The operator takes a replica out of rotation and puts it back without a restart
//! (`powersync_mdbx.in_rotation`, applied by a reload): meanwhile the readiness probe
//! fails, open streams end, new sync connections get a retryable 503, and the ingest goes
//! on; back in rotation, clients get what was written meanwhile. The engine is not started
//! again for either.
use std::io::Read;
use std::time::Instant;

use engine::host::HostSettings;
use testkit::{buckets, free_port, http_get, Cluster, ClusterKind, PgInstall, TestDir};

use crate::disk_full::{host_settings, streaming_host, tick_until, write_config, SCHEMA};
use crate::engine_rig::token;
use crate::sync_client::{first_checkpoint, post, rows_of};

#[test]
fn an_operator_takes_a_replica_out_of_rotation_and_back_without_a_restart() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(SCHEMA);
    let root = tempfile::tempdir().unwrap();
    let config_file = root.path().join("config.yaml");
    let port = free_port();
    write_config(&config_file, &primary, port);
    let settings = host_settings(config_file, root.path().join("store"), "psm_rotation");
    let mut host = streaming_host(settings.clone());
    let (_, _, mut open) = first_checkpoint(port, "u1");
    let starts = host.status().snapshot().engine_starts;

    // Out of rotation.
    let out = host.reload(HostSettings {
        in_rotation: false,
        ..settings.clone()
    });
    let left = Instant::now();
    assert_eq!(out["outcome"], "unchanged", "{out}");
    let probe = http_get(port, "/probes/readiness").expect("the probe answers");
    assert_eq!(probe.status, 400, "{}", probe.body);
    assert!(
        probe.body.contains("\"in_rotation\":false"),
        "{}",
        probe.body
    );
    assert!(probe.body.contains("\"ready\":false"), "{}", probe.body);
    // It ends at its next wake, at once: before its next keepalive (20 s), whose line
    // would come first otherwise.
    while open.fill() {}
    println!(
        "out of rotation: the open stream ended after {:?}",
        left.elapsed()
    );
    let rest = String::from_utf8_lossy(&open.pending).into_owned();
    assert!(
        !rest.contains("token_expires_in"),
        "the open stream waited for its keepalive before it ended: {rest}"
    );
    let body = r#"{"buckets":[],"raw_data":true}"#;
    let (code, mut refused) = post(port, Some(&token("u2", 600)), "application/x-ndjson", body);
    let mut text = String::new();
    let _ = refused.reader.read_to_string(&mut text);
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("PSM_H1506"), "{text}");
    let metrics = http_get(port, "/metrics").expect("the metrics answer");
    assert!(
        metrics.body.contains("\npowersync_mdbx_in_rotation 0\n"),
        "{}",
        metrics.body
    );

    // The ingest goes on meanwhile.
    primary.sql("INSERT INTO notes VALUES ('n51', 'written while out of rotation')");
    let head = primary.sql("SELECT pg_current_wal_lsn()");
    tick_until(&mut host, "the ingest past the insert", |h| {
        let snap = serde_json::to_value(h.status().snapshot()).unwrap();
        let applied = snap["replication"]["applied_lsn"].as_str()?;
        (buckets::lsn(applied) >= buckets::lsn(&head)).then_some(())
    });

    // Back in rotation: served again, with what was written meanwhile.
    let back = host.reload(settings);
    assert_eq!(back["outcome"], "unchanged", "{back}");
    let probe = http_get(port, "/probes/readiness").expect("the probe answers");
    assert_eq!(probe.status, 200, "{}", probe.body);
    let (_, client, _) = first_checkpoint(port, "u2");
    let rows = rows_of(&client, "everything[]");
    assert_eq!(rows.len(), 51);
    assert!(rows.contains_key("n51"));
    let snap = host.status().snapshot();
    assert!(snap.in_rotation);
    assert_eq!(
        snap.engine_starts, starts,
        "the engine was not started again"
    );
    assert!(host.shutdown());
}
