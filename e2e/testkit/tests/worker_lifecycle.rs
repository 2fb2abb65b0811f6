//! Live tests: the background worker inside a real PostgreSQL 16 sync replica.
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::{free_port, http_get, wait_until, Cluster, ClusterKind, PgInstall, TestDir};

/// A primary and the service config that points at it, listening on a free port.
struct Rig {
    dir: TestDir,
    install: PgInstall,
    primary: Cluster,
    http_port: u16,
}

impl Rig {
    fn new() -> Self {
        let install = PgInstall::pg16();
        let dir = TestDir::new(&install);
        let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
        primary.sql(
            "CREATE TABLE lists (id text PRIMARY KEY, name text);
             INSERT INTO lists VALUES ('l1', 'groceries'), ('l2', 'chores');
             CREATE PUBLICATION powersync FOR ALL TABLES;",
        );
        let http_port = free_port();
        Self {
            dir,
            install,
            primary,
            http_port,
        }
    }

    fn config_yaml(&self) -> String {
        format!(
            "# A PowerSync service config, as operators already have it.\n\
             replication:\n  connections:\n    - type: postgresql\n      uri: {}\n\
             sync_config:\n  content: |\n    bucket_definitions:\n      global:\n        data:\n          - SELECT * FROM lists\n\
             client_auth:\n  audience: [powersync-test]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, k: c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA}}\n\
             port: {}\nstorage:\n  type: postgresql\n",
            self.primary.uri("postgres"),
            self.http_port
        )
    }

    fn replica(&self, config: &str, extra: &[String]) -> Cluster {
        Cluster::start_sync_replica(&self.install, &self.dir, config, extra)
    }
}

fn wait_phase(cluster: &Cluster, phase: &str) -> Value {
    cluster.wait_worker_phase(phase)
}

fn worker_pid(cluster: &Cluster) -> Option<i64> {
    cluster
        .sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'powersync_mdbx'")
        .parse()
        .ok()
}

fn store_dir(replica: &Cluster) -> std::path::PathBuf {
    let mut dir = replica.data_dir().as_os_str().to_owned();
    dir.push(".powersync_mdbx");
    dir.into()
}

#[test]
fn worker_serves_probes_and_reports_status() {
    let rig = Rig::new();
    assert_eq!(rig.primary.sql("SHOW wal_level"), "logical");
    let replica = rig.replica(&rig.config_yaml(), &[]);
    let s = wait_phase(&replica, "streaming");
    assert_eq!(s["ready"], true);
    let replication = &s["replication"];
    assert_eq!(replication["slot"], "powersync_mdbx", "{s}");
    // While streaming: the applied LSN and the WAL the primary retains for the slot.
    let streaming = replica.wait_worker("streaming figures in status()", |s| {
        let r = &s["replication"];
        (r["applied_lsn"].is_string() && r["retained_wal_bytes"].as_u64() > Some(0))
            .then(|| s.clone())
    });
    assert!(
        streaming["replication"]["last_op_id"].as_u64() > Some(0),
        "{streaming}"
    );
    assert_eq!(
        (
            replication["rows"].as_u64(),
            replication["tables_total"].as_u64()
        ),
        (Some(2), Some(1)),
        "{s}"
    );
    assert!(
        replication["consistent_point"]
            .as_str()
            .unwrap()
            .contains('/'),
        "{s}"
    );
    let slot = rig
        .primary
        .sql("SELECT slot_name || ' ' || plugin FROM pg_replication_slots");
    assert_eq!(slot, "powersync_mdbx pgoutput");
    assert_eq!(
        Some(s["worker_pid"].as_i64().unwrap()),
        worker_pid(&replica)
    );
    assert_eq!(
        s["listen"],
        serde_json::json!([format!("127.0.0.1:{}", rig.http_port)])
    );
    assert_eq!(s["config_ignored"], serde_json::json!(["storage"]));
    assert_eq!(s["storage_dir"], store_dir(&replica).display().to_string());
    assert!(s["last_error"].is_null());

    let live = http_get(rig.http_port, "/probes/liveness").expect("HTTP answers");
    assert_eq!(live.status, 200, "{}", live.body);
    let body: Value = serde_json::from_str(&live.body).unwrap();
    assert_eq!(body["ready"], true);
    assert_eq!(
        http_get(rig.http_port, "/probes/readiness").unwrap().status,
        200
    );
    let missing = http_get(rig.http_port, "/no/such/path").unwrap();
    assert_eq!(missing.status, 404);
    let body: Value = serde_json::from_str(&missing.body).unwrap();
    assert_eq!(body["error"]["code"], "PSM_H1404");

    let meta = std::fs::metadata(store_dir(&replica)).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    let replica_owner = std::fs::metadata(replica.data_dir()).unwrap().uid();
    assert_eq!(meta.uid(), replica_owner);

    // Only superusers (not PUBLIC) may reset.
    replica.sql("CREATE ROLE app LOGIN");
    let err = replica
        .try_sql("SET ROLE app; SELECT powersync_mdbx.reset()")
        .unwrap_err();
    assert!(err.contains("permission denied"), "{err}");
}

/// One sample of a `/metrics` exposition (`name` or `name{labels}`).
fn metric(text: &str, key: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn worker_metrics_follow_a_commit_on_the_primary() {
    let rig = Rig::new();
    let replica = rig.replica(&rig.config_yaml(), &[]);
    wait_phase(&replica, "streaming");
    let scrape = || {
        let reply = http_get(rig.http_port, "/metrics").expect("HTTP answers");
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.body
    };
    let first = wait_until("a primary head reading", || {
        let text = scrape();
        metric(&text, "powersync_mdbx_replication_lag_bytes").map(|_| text)
    });
    assert_eq!(
        metric(&first, "powersync_mdbx_phase{phase=\"streaming\"}"),
        Some(1.0)
    );
    assert_eq!(metric(&first, "powersync_mdbx_snapshot_rows"), Some(2.0));
    let applied = metric(&first, "powersync_mdbx_applied_lsn").unwrap();
    let head = metric(&first, "powersync_mdbx_primary_wal_lsn").unwrap();

    rig.primary
        .sql("INSERT INTO lists VALUES ('l3', 'errands'); UPDATE lists SET name = 'food' WHERE id = 'l1';");
    let after_commit: f64 = rig
        .primary
        .sql("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
        .parse()
        .unwrap();
    // The commit is applied and published; the head reading (every 10 s) passes it.
    let later = wait_until("the commit in /metrics", || {
        let text = scrape();
        (metric(&text, "powersync_mdbx_source_transactions_applied_total") >= Some(1.0)
            && metric(&text, "powersync_mdbx_primary_wal_lsn") >= Some(after_commit))
        .then_some(text)
    });
    let applied_now = metric(&later, "powersync_mdbx_applied_lsn").unwrap();
    let head_now = metric(&later, "powersync_mdbx_primary_wal_lsn").unwrap();
    assert!(applied_now > applied, "{later}");
    assert!(head_now > head, "{later}");
    assert_eq!(
        metric(&later, "powersync_mdbx_replication_lag_bytes"),
        Some((head_now - applied_now).max(0.0)),
        "{later}"
    );
    assert_eq!(
        metric(&later, "powersync_mdbx_rows_applied_total"),
        Some(2.0)
    );
    assert!(metric(&later, "powersync_mdbx_ops_written_total") >= Some(2.0));
    assert!(metric(&later, "powersync_mdbx_checkpoint_publish_seconds_count") >= Some(1.0));
    assert_eq!(
        metric(&later, "powersync_mdbx_replication_lag_seconds"),
        Some(0.0)
    );
    assert!(metric(&later, "powersync_mdbx_storage_used_bytes") > Some(0.0));
}

#[test]
fn bad_config_is_reported_and_a_reload_recovers() {
    let rig = Rig::new();
    let replica = rig.replica("replication:\n  connections: [ {uri: \n", &[]);
    let s = wait_phase(&replica, "config_error");
    let error = &s["last_error"];
    assert_eq!(error["code"], "PSM_C1003", "{s}");
    assert!(
        error["message"].as_str().unwrap().contains("config.yaml"),
        "{s}"
    );
    assert_eq!(error["needs_operator"], true);
    assert_eq!(s["ready"], false);
    assert!(
        http_get(rig.http_port, "/probes/liveness").is_none(),
        "no server without config"
    );

    // No crash loop: the same worker keeps waiting and logs the error once.
    let pid = worker_pid(&replica).expect("worker runs");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(worker_pid(&replica), Some(pid));
    let log = replica.log_text();
    assert_eq!(log.matches("PSM_C1003").count(), 1, "{log}");
    assert!(!log.contains("exited with exit code"), "{log}");

    rig.dir.write("config.yaml", &rig.config_yaml());
    replica.sql("SELECT pg_reload_conf()");
    let s = wait_phase(&replica, "streaming");
    assert!(s["last_error"].is_null());
    assert_eq!(
        worker_pid(&replica),
        Some(pid),
        "a reload does not restart the worker"
    );
    assert_eq!(
        http_get(rig.http_port, "/probes/readiness").unwrap().status,
        200
    );

    // The operator takes the replica out of rotation and back with the setting.
    let starts = s["engine_starts"].clone();
    replica.sql("ALTER SYSTEM SET powersync_mdbx.in_rotation = off");
    replica.sql("SELECT pg_reload_conf()");
    let probe = wait_until("readiness to fail out of rotation", || {
        http_get(rig.http_port, "/probes/readiness").filter(|p| p.status == 400)
    });
    assert!(
        probe.body.contains("\"in_rotation\":false"),
        "{}",
        probe.body
    );
    assert_eq!(replica.worker_status().unwrap()["in_rotation"], false);
    replica.sql("ALTER SYSTEM RESET powersync_mdbx.in_rotation");
    replica.sql("SELECT pg_reload_conf()");
    wait_until("readiness back in rotation", || {
        http_get(rig.http_port, "/probes/readiness").filter(|p| p.status == 200)
    });
    let s = replica.worker_status().unwrap();
    assert_eq!(s["in_rotation"], true);
    assert_eq!(
        s["engine_starts"], starts,
        "the engine was not started again"
    );
    assert_eq!(worker_pid(&replica), Some(pid));
}

#[test]
fn sigterm_and_terminate_restart_the_worker_with_the_same_store() {
    let rig = Rig::new();
    let replica = rig.replica(&rig.config_yaml(), &[]);
    let s = wait_phase(&replica, "streaming");
    let store_id = s["store"]["store_id"].as_str().unwrap().to_owned();
    let pid = worker_pid(&replica).unwrap();

    // SAFETY: signalling the worker process of our own test cluster.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let second = wait_until("a restarted worker", || {
        worker_pid(&replica).filter(|p| *p != pid)
    });
    let s = wait_phase(&replica, "streaming");
    assert_eq!(s["worker_pid"].as_i64(), Some(second));
    assert_eq!(
        s["store"]["store_id"],
        store_id.as_str(),
        "storage reused across restarts"
    );

    assert_eq!(
        replica.sql(&format!("SELECT pg_terminate_backend({second})")),
        "t"
    );
    let third = wait_until("a restarted worker", || {
        worker_pid(&replica).filter(|p| *p != second)
    });
    let s = wait_phase(&replica, "streaming");
    assert_eq!(s["worker_pid"].as_i64(), Some(third));
    assert_eq!(s["store"]["store_id"], store_id.as_str());
    assert_eq!(
        http_get(rig.http_port, "/probes/liveness").unwrap().status,
        200
    );
    let log = replica.log_text();
    assert_eq!(
        log.matches("worker stopped, engine threads joined").count(),
        2,
        "{log}"
    );
}

#[test]
fn fast_stop_is_prompt_and_clean_and_storage_survives() {
    let rig = Rig::new();
    let replica = rig.replica(&rig.config_yaml(), &[]);
    let s = wait_phase(&replica, "streaming");
    let store_id = s["store"]["store_id"].as_str().unwrap().to_owned();
    let pid = worker_pid(&replica).unwrap();

    let took = replica.stop_fast();
    assert!(
        took < Duration::from_secs(2),
        "pg_ctl stop -m fast took {took:?}"
    );
    // SAFETY: kill(pid, 0) only checks for existence.
    let alive = unsafe { libc::kill(pid as i32, 0) } == 0;
    assert!(!alive, "worker process gone");
    let log = replica.log_text();
    assert!(
        log.contains("worker stopped, engine threads joined"),
        "{log}"
    );
    // A fast stop ends client sessions with a FATAL; a psql session of this test that is
    // still closing when it arrives logs one. Only the worker's own lines count.
    let log: String = log
        .lines()
        .filter(|l| !l.contains("terminating connection due to administrator command"))
        .collect::<Vec<_>>()
        .join("\n");
    for bad in [
        "ERROR",
        "PANIC",
        "FATAL",
        "WARNING",
        "terminated by signal",
        "rthc_",
    ] {
        assert!(!log.contains(bad), "log contains {bad}:\n{log}");
    }
    assert!(http_get(rig.http_port, "/probes/liveness").is_none());

    replica.start();
    let s = wait_phase(&replica, "streaming");
    assert_eq!(s["store"]["store_id"], store_id.as_str());
    let mode = std::fs::metadata(store_dir(&replica))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn foreign_storage_is_refused_and_reset_rebuilds_our_own() {
    let rig = Rig::new();
    let foreign = rig.dir.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("PG_VERSION"), "16\n").unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o700)).unwrap();
    if let Some(user) = rig.install.run_as() {
        std::process::Command::new("chown")
            .args(["-R", user])
            .arg(&foreign)
            .status()
            .unwrap();
    }
    let replica = rig.replica(
        &rig.config_yaml(),
        &[format!(
            "powersync_mdbx.storage_dir = '{}'",
            foreign.display()
        )],
    );
    let s = wait_phase(&replica, "failed");
    assert_eq!(s["last_error"]["code"], "PSM_S1002", "{s}");
    assert!(s["last_error"]["message"]
        .as_str()
        .unwrap()
        .contains("PG_VERSION"));
    assert!(http_get(rig.http_port, "/probes/readiness").is_none());
    let reply: Value = serde_json::from_str(&replica.sql("SELECT powersync_mdbx.reset()")).unwrap();
    assert_eq!(
        reply["removed_files"],
        serde_json::json!([]),
        "foreign files are never removed"
    );
    assert!(foreign.join("PG_VERSION").exists());
    assert_eq!(
        wait_phase(&replica, "failed")["last_error"]["code"],
        "PSM_S1002"
    );

    std::fs::remove_file(foreign.join("PG_VERSION")).unwrap();
    replica.sql("SELECT pg_reload_conf()");
    let s = wait_phase(&replica, "streaming");
    let first = s["store"]["store_id"].as_str().unwrap().to_owned();
    let reply: Value = serde_json::from_str(&replica.sql("SELECT powersync_mdbx.reset()")).unwrap();
    assert_eq!(reply["reset"], true, "{reply}");
    assert_eq!(
        reply["removed_files"],
        serde_json::json!(["mdbx.dat", "mdbx.lck"])
    );
    let s = wait_phase(&replica, "streaming");
    assert_ne!(
        s["store"]["store_id"],
        first.as_str(),
        "reset starts a new store"
    );
}

#[test]
fn reset_without_its_primary_refuses_unless_forced() {
    let rig = Rig::new();
    let replica = rig.replica(&rig.config_yaml(), &[]);
    wait_phase(&replica, "streaming");
    let store_id = replica.worker_status().unwrap()["store"]["store_id"].clone();
    rig.primary.stop_fast();

    let reply: Value = serde_json::from_str(&replica.sql("SELECT powersync_mdbx.reset()")).unwrap();
    assert_eq!(reply["reset"], false, "{reply}");
    assert_eq!(reply["force"], false, "{reply}");
    let error = reply["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("PSM_E1004"), "{reply}");
    assert!(
        error.contains("SELECT pg_drop_replication_slot('powersync_mdbx')"),
        "{reply}"
    );
    assert_eq!(reply["removed_files"], serde_json::json!([]), "{reply}");
    assert!(store_dir(&replica).join("mdbx.dat").exists());

    let reply: Value =
        serde_json::from_str(&replica.sql("SELECT powersync_mdbx.reset(force => true)")).unwrap();
    assert_eq!(reply["reset"], true, "{reply}");
    assert_eq!(reply["force"], true, "{reply}");
    assert_eq!(reply["slots_left"][0]["slot"], "powersync_mdbx", "{reply}");
    assert!(
        reply["warning"]
            .as_str()
            .is_some_and(|w| w.starts_with("PSM_E1004")),
        "{reply}"
    );
    assert_eq!(
        reply["removed_files"],
        serde_json::json!(["mdbx.dat", "mdbx.lck"]),
        "{reply}"
    );

    // The slot left behind is the operator's to drop; then the replica builds anew.
    rig.primary.start();
    rig.primary
        .sql(reply["slots_left"][0]["drop_by_hand"].as_str().unwrap());
    replica.sql("SELECT powersync_mdbx.reload()");
    let s = wait_phase(&replica, "streaming");
    assert_ne!(s["store"]["store_id"], store_id, "a new store");
}

#[test]
fn functions_without_preload_explain_the_fix() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let plain = Cluster::start_new(&install, &dir, "plain", ClusterKind::Plain, &[]);
    plain.sql("CREATE EXTENSION powersync_mdbx");
    assert_eq!(
        plain.sql("SELECT nspname FROM pg_namespace WHERE nspname = 'powersync_mdbx'"),
        "powersync_mdbx"
    );
    for function in ["status", "reset"] {
        let err = plain
            .try_sql(&format!("SELECT powersync_mdbx.{function}()"))
            .unwrap_err();
        assert!(
            err.contains("not loaded through shared_preload_libraries"),
            "{err}"
        );
        assert!(
            err.contains("HINT:") && err.contains("restart PostgreSQL"),
            "{err}"
        );
    }
    let started = Instant::now();
    drop(plain);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_crashed_worker_comes_back_and_reopens_its_store() {
    let rig = Rig::new();
    let replica = rig.replica(&rig.config_yaml(), &[]);
    let s = wait_phase(&replica, "streaming");
    let store_id = s["store"]["store_id"].as_str().unwrap().to_owned();
    let pid = worker_pid(&replica).unwrap();

    // SIGKILL: the postmaster treats it as a crash, reinitialises shared memory and
    // restarts every process, the worker included; MDBX recovers its stale reader lock.
    // SAFETY: signalling the worker process of our own test cluster.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let s = replica.wait_worker("the worker serving again after a crash", |s| {
        (s["phase"] == "streaming" && s["worker_pid"].as_i64() != Some(pid)).then(|| s.clone())
    });
    assert_eq!(s["store"]["store_id"], store_id.as_str());
    assert_eq!(
        http_get(rig.http_port, "/probes/readiness").unwrap().status,
        200
    );
}

/// While the snapshot copies, `status()` shows its progress against the planner's
/// estimate: rows, the estimate, a percent and an ETA; `/metrics` the estimate too.
#[test]
fn the_snapshot_reports_its_progress_against_the_planners_estimate() {
    let rig = Rig::new();
    rig.primary.sql(
        "INSERT INTO lists SELECT 'bulk-' || g, repeat('x', 40) FROM generate_series(1, 300000) g;
         ANALYZE lists;",
    );
    let replica = rig.replica(&rig.config_yaml(), &[]);
    let mut samples = Vec::new();
    // Bounded by the worker's progress, not by a clock.
    let mut waiting = testkit::Waiting::new("the snapshot to complete");
    loop {
        let status = replica.worker_status();
        if let Some(status) = &status {
            match status["phase"].as_str() {
                Some("snapshotting") if status["replication"]["rows"].as_u64() > Some(0) => {
                    samples.push(status["replication"].clone());
                }
                Some("streaming") => break,
                _ => {}
            }
        }
        waiting.progress(status.as_ref().map(testkit::worker_progress));
        std::thread::sleep(Duration::from_millis(20));
    }
    let sample = samples
        .iter()
        .find(|s| s["percent"].is_number() && s["eta_seconds"].is_number())
        .unwrap_or_else(|| panic!("no progress with a percent and an ETA: {samples:?}"));
    let estimated = sample["rows_estimated"].as_u64().unwrap();
    assert!(
        (270_000..=330_000).contains(&estimated),
        "the planner's estimate of 300,002 rows: {sample}"
    );
    let percent = sample["percent"].as_f64().unwrap();
    assert!(percent > 0.0 && percent <= 99.9, "{sample}");
    let metrics = http_get(rig.http_port, "/metrics").unwrap().body;
    let reported = metric(&metrics, "powersync_mdbx_snapshot_rows_estimated").unwrap();
    assert_eq!(reported, estimated as f64, "{metrics}");
}
