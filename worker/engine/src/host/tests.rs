//! The host's decisions: waiting on bad configuration, reloading, resetting, retrying a
//! repeating fault with growing waits.
use super::*;
use std::path::Path;

fn no_guard(f: &mut dyn FnMut()) {
    f()
}

use testkit::free_port;

fn write_config(path: &Path, port: u16) {
    write_config_with_rules(path, port, "{}");
}

/// A configuration whose `bucket_definitions` are `definitions` (YAML flow style).
fn write_config_with_rules(path: &Path, port: u16, definitions: &str) {
    std::fs::write(
        path,
        format!(
            "replication:\n  connections:\n    - uri: postgresql://u@127.0.0.1/db?sslmode=disable\n\
             sync_config:\n  content: 'bucket_definitions: {definitions}'\nport: {port}\n"
        ),
    )
    .unwrap();
}

fn settings(dir: &Path) -> HostSettings {
    HostSettings {
        config_file: Some(dir.join("config.yaml")),
        storage_dir: dir.join("store"),
        listen_addresses: vec!["127.0.0.1".into()],
        runtime_threads: 1,
        slot_name: "powersync_mdbx_test".into(),
        admin_socket: None,
        peer_secret_file: None,
        peer_secret_in_setting: false,
        peer_loopback: false,
        seed_from: None,
        peer_listen: None,
        peer_tls: Default::default(),
        in_rotation: true,
    }
}

/// Ticks the host until it reports `phase`, while its status keeps moving (a wait bounded
/// by progress: `testkit::wait_for`).
fn wait_phase(host: &mut Host, phase: Phase) {
    testkit::wait_for(&format!("the host in phase {phase:?}"), || {
        assert_eq!(host.tick(), Tick::Continue);
        let snap = host.status().snapshot();
        if snap.phase == phase {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
        Err(testkit::worker_progress(
            &serde_json::to_value(snap).unwrap(),
        ))
    });
}

#[test]
fn bad_config_waits_then_a_reload_starts_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), "replication: [oops\n").unwrap();
    let mut host = Host::new(settings(dir.path()), Arc::new(StatusCell::new(1)), no_guard);
    host.start();
    let snap = host.status().snapshot();
    assert_eq!(snap.phase, Phase::ConfigError);
    let err = snap.last_error.unwrap();
    assert_eq!(err.code, "PSM_C1003");
    assert!(err.needs_operator);
    assert_eq!(host.tick(), Tick::Continue);

    write_config(&dir.path().join("config.yaml"), free_port());
    host.reload(settings(dir.path()));
    wait_phase(&mut host, Phase::Validating);
    // The configuration error is gone (a connection error to the absent primary may show).
    let last = host.status().snapshot().last_error;
    assert!(last.is_none_or(|e| e.code != "PSM_C1003"));

    // A broken file on reload keeps the running engine and shows the error.
    std::fs::write(dir.path().join("config.yaml"), "port: 0\n").unwrap();
    host.reload(settings(dir.path()));
    let snap = host.status().snapshot();
    assert_eq!(snap.phase, Phase::Validating);
    assert!(snap
        .last_error
        .unwrap()
        .message
        .contains("replication.connections[0]"));

    // So do rules that do not compile in a file that parses: the engine keeps its rules.
    let starts = host.status().snapshot().engine_starts;
    write_config_with_rules(
        &dir.path().join("config.yaml"),
        free_port(),
        "{b: {data: [SELECT FROM]}}",
    );
    host.reload(settings(dir.path()));
    let snap = host.status().snapshot();
    assert_eq!(snap.phase, Phase::Validating);
    assert_eq!(snap.engine_starts, starts, "the running engine was kept");
    assert!(snap.last_error.unwrap().message.contains("PSM_RULES"));

    // Rules that compile but differ: a running, ready engine would build them beside
    // the served ones; one that has served nothing yet restarts with them.
    write_config_with_rules(
        &dir.path().join("config.yaml"),
        free_port(),
        "{b: {data: [SELECT * FROM t]}}",
    );
    let result = host.reload(settings(dir.path()));
    assert_eq!(result["outcome"], "engine_restarted", "{result}");
    wait_phase(&mut host, Phase::Validating);
    let snap = host.status().snapshot();
    assert_eq!(snap.engine_starts, starts + 1);
    assert!(snap.last_error.is_none_or(|e| !e.code.starts_with("PSM_C")));
    assert!(host.shutdown());
    assert_eq!(host.status().snapshot().phase, Phase::Stopped);
}

#[test]
fn missing_setting_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.config_file = None;
    let mut host = Host::new(s, Arc::new(StatusCell::new(1)), no_guard);
    host.start();
    let err = host.status().snapshot().last_error.unwrap();
    assert!(
        err.message.contains("powersync_mdbx.config_file"),
        "{}",
        err.message
    );
}

#[test]
fn reset_recreates_the_store_and_reload_restarts_only_on_change() {
    let dir = tempfile::tempdir().unwrap();
    write_config(&dir.path().join("config.yaml"), free_port());
    let mut host = Host::new(settings(dir.path()), Arc::new(StatusCell::new(1)), no_guard);
    host.start();
    wait_phase(&mut host, Phase::Validating);
    let first_id = host.status().snapshot().store.unwrap().identity.store_id;

    host.reload(settings(dir.path()));
    assert_eq!(
        host.status().snapshot().engine_starts,
        1,
        "unchanged config must not restart"
    );

    let report = reset_and_wait(&mut host, false);
    assert_eq!(report["reset"], true, "{report}");
    assert_eq!(
        report["removed_files"],
        serde_json::json!(["mdbx.dat", "mdbx.lck"])
    );
    wait_phase(&mut host, Phase::Validating);
    let snap = host.status().snapshot();
    assert_ne!(snap.store.unwrap().identity.store_id, first_id);
    assert_eq!(snap.engine_starts, 2);

    write_config(&dir.path().join("config.yaml"), free_port());
    host.reload(settings(dir.path()));
    wait_phase(&mut host, Phase::Validating);
    assert_eq!(host.status().snapshot().engine_starts, 3);
    assert!(host.shutdown());
}

#[test]
fn a_repeating_fault_is_retried_ever_more_slowly_and_recovered_from_once_it_clears() {
    let dir = tempfile::tempdir().unwrap();
    write_config(&dir.path().join("config.yaml"), free_port());
    // A data file libmdbx cannot open (a directory where the file belongs): the store
    // fails with an error a restart may fix, on every start, until it is removed.
    let store = dir.path().join("store");
    std::fs::create_dir_all(store.join("mdbx.dat")).unwrap();
    std::fs::set_permissions(&store, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut host = Host::new(settings(dir.path()), Arc::new(StatusCell::new(1)), no_guard);
    host.start();

    // Every failure is reported and retried in the same process (no exit), each wait
    // twice the one before: starts at about 0, 1, 3 s. Progress: the failures seen.
    let began = Instant::now();
    let mut seen = Vec::new();
    let mut waiting = testkit::Waiting::new("three failures in a row");
    while seen.len() < 3 {
        assert_eq!(
            host.tick(),
            Tick::Continue,
            "a failure never exits the process"
        );
        let snap = host.status().snapshot();
        if let Some(error) = snap.last_error.filter(|_| snap.phase == Phase::Failed) {
            let attempt = format!("failure {} in a row", seen.len() + 1);
            if error.message.contains(&attempt) {
                assert!(error.code.starts_with("PSM_S"), "{error:?}");
                assert!(!error.needs_operator, "{error:?}");
                seen.push((began.elapsed(), error.message));
            }
        }
        waiting.progress(seen.len());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(seen[0].1.contains("starts again in 1 s"), "{seen:?}");
    assert!(seen[1].1.contains("starts again in 2 s"), "{seen:?}");
    assert!(seen[2].1.contains("starts again in 4 s"), "{seen:?}");
    let gap = seen[2].0 - seen[1].0;
    assert!(
        gap >= Duration::from_secs(2),
        "the second wait took {gap:?}"
    );

    // The fault clears: the next start succeeds by itself.
    std::fs::remove_dir(store.join("mdbx.dat")).unwrap();
    wait_phase(&mut host, Phase::Validating);
    assert!(host.status().snapshot().store.is_some());
    assert!(host.shutdown());
}

#[test]
fn the_backoff_doubles_up_to_its_limit() {
    assert_eq!(restart_backoff(1), RESTART_BACKOFF_FIRST);
    assert_eq!(restart_backoff(2), RESTART_BACKOFF_FIRST * 2);
    assert_eq!(restart_backoff(3), RESTART_BACKOFF_FIRST * 4);
    assert_eq!(restart_backoff(7), RESTART_BACKOFF_MAX);
    assert_eq!(restart_backoff(u32::MAX), RESTART_BACKOFF_MAX);
}

/// A store of ours in `dir` whose bootstrap record names `slot` on database `postgres`.
fn store_owning_slot(dir: &Path, slot: &str) {
    let store = store::Store::open(dir).unwrap();
    let intent = replication::BootstrapIntent {
        system_identifier: "7000000000000000001".into(),
        timeline: Some(1),
        database: "postgres".into(),
        slot: slot.into(),
        publication: "powersync".into(),
        rules_hash: String::new(),
        generation: 1,
        tables: Vec::new(),
        state: replication::BootstrapState::Complete,
        consistent_point: Some(1),
        rows: 0,
        rebuilding: false,
    };
    store
        .put_stage_record(replication::BootstrapIntent::KEY, &intent.encode().unwrap())
        .unwrap();
}

/// An MDBX environment another program wrote (no powersync_mdbx metadata) in `dir`.
fn foreign_mdbx(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let db = libmdbx::Database::<libmdbx::NoWriteMap>::open(dir).unwrap();
    let txn = db.begin_rw_txn().unwrap();
    let table = txn.create_table(None, Default::default()).unwrap();
    txn.put(&table, b"their", b"data", libmdbx::WriteFlags::UPSERT)
        .unwrap();
    txn.commit().unwrap();
}

#[test]
fn reset_removes_nothing_of_a_data_file_that_is_not_ours() {
    for case in ["foreign MDBX environment", "not an MDBX file", "unreadable"] {
        let dir = tempfile::tempdir().unwrap();
        write_config(&dir.path().join("config.yaml"), free_port());
        let root = dir.path().join("store");
        // Our own store serves; the other store directory holds someone else's file.
        drop(store::Store::open(&root).unwrap());
        let other = root.join("g2");
        match case {
            "foreign MDBX environment" => foreign_mdbx(&other),
            "not an MDBX file" => {
                std::fs::create_dir(&other).unwrap();
                std::fs::write(other.join("mdbx.dat"), vec![0x42u8; 64 * 1024]).unwrap();
            }
            _ => {
                // Cannot be opened or read, also by root (the tests may run as root).
                std::fs::create_dir_all(other.join("mdbx.dat")).unwrap();
                std::fs::write(other.join("mdbx.dat/inside"), "kept").unwrap();
            }
        }
        let before = std::fs::read_dir(&other).unwrap().count();
        let mut host = Host::new(settings(dir.path()), Arc::new(StatusCell::new(1)), no_guard);
        let report = reset_and_wait(&mut host, false);
        assert_eq!(report["reset"], false, "{case}: {report}");
        let error = report["error"].as_str().unwrap_or_default();
        assert!(error.starts_with("PSM_E1003"), "{case}: {report}");
        assert!(error.contains("g2"), "{case}: {report}");
        assert!(error.contains("move that file"), "{case}: {report}");
        assert!(
            other.join("mdbx.dat").exists(),
            "{case}: its file was removed"
        );
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), before, "{case}");
        assert!(
            root.join("mdbx.dat").exists(),
            "{case}: nothing at all is removed"
        );
        // Not even force removes it: force is about slots, not about other files.
        let report = reset_and_wait(&mut host, true);
        assert_eq!(report["reset"], false, "{case}: {report}");
        assert!(other.join("mdbx.dat").exists(), "{case}: removed by force");
        assert!(host.shutdown());
    }
}

#[test]
fn reset_refuses_when_the_configuration_cannot_be_loaded_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), "replication: [oops\n").unwrap();
    let root = dir.path().join("store");
    store_owning_slot(&root, "powersync_mdbx_test");
    let mut host = Host::new(settings(dir.path()), Arc::new(StatusCell::new(1)), no_guard);
    let report = reset_and_wait(&mut host, false);
    assert_eq!(report["reset"], false, "{report}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("PSM_E1004"), "{report}");
    assert!(error.contains("PSM_C1003"), "says why: {report}");
    assert!(
        error.contains("SELECT pg_drop_replication_slot('powersync_mdbx_test')"),
        "{report}"
    );
    assert!(error.contains("force => true"), "{report}");
    assert!(root.join("mdbx.dat").exists(), "nothing removed");
    assert_eq!(report["removed_files"], serde_json::json!([]), "{report}");

    // Forced: the store goes, and the slot left behind is named.
    let report = reset_and_wait(&mut host, true);
    assert_eq!(report["reset"], true, "{report}");
    assert_eq!(
        report["removed_files"],
        serde_json::json!(["mdbx.dat", "mdbx.lck"]),
        "{report}"
    );
    assert_eq!(
        report["slots_left"][0]["slot"], "powersync_mdbx_test",
        "{report}"
    );
    assert!(report["warning"]
        .as_str()
        .is_some_and(|w| w.starts_with("PSM_E1004")));
    assert!(!root.join("mdbx.dat").exists());
    assert!(host.shutdown());
}

/// A loopback listener that accepts connections and never answers (a hung primary, a
/// proxy whose far side is gone); connections are held until the returned guard drops.
fn silent_primary() -> (u16, std::sync::mpsc::Sender<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Err(std::sync::mpsc::TryRecvError::Empty) = stopped.try_recv() {
            if let Ok((socket, _)) = listener.accept() {
                held.push(socket);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    (port, stop)
}

/// A configuration whose primary listens on `port` of the loopback address.
fn write_config_for_primary(path: &Path, port: u16) {
    std::fs::write(
        path,
        format!(
            "replication:\n  connections:\n    - uri: postgresql://u@127.0.0.1:{port}/postgres?sslmode=disable\n\
             sync_config:\n  content: 'bucket_definitions: {{}}'\nport: {}\n",
            free_port()
        ),
    )
    .unwrap();
}

#[test]
fn a_silent_primary_gets_a_timely_refusal_while_the_host_loop_keeps_answering() {
    let dir = tempfile::tempdir().unwrap();
    let (port, _stop) = silent_primary();
    write_config_for_primary(&dir.path().join("config.yaml"), port);
    let root = dir.path().join("store");
    store_owning_slot(&root, "powersync_mdbx_test");
    let mut host = Host::new(settings(dir.path()), Arc::new(StatusCell::new(1)), no_guard);
    let bound = Duration::from_secs(2);
    host.set_release_timeout(bound);

    // The network work runs on its own thread: the host's thread is back at once and
    // its loop keeps answering (ticks, status) while the primary says nothing.
    let began = Instant::now();
    host.start_reset(false);
    let took = began.elapsed();
    // Not waiting for the primary: back well before the release's own bound.
    assert!(took < bound, "the host's thread was held {took:?}");
    assert!(host.resetting());
    assert_eq!(host.status().snapshot().phase, Phase::Resetting);
    let report = testkit::wait_until("the reset's refusal", || {
        assert_eq!(host.tick(), Tick::Continue);
        std::thread::sleep(Duration::from_millis(10));
        host.take_reset_result()
    });
    let took = began.elapsed();
    assert!(
        took >= bound && took < bound + RELEASE_GRACE_FOR_TESTS,
        "refused after {took:?}: {report}"
    );
    assert_eq!(report["reset"], false, "{report}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("PSM_E1004"), "{report}");
    assert!(error.contains("did not answer within 2 s"), "{report}");
    assert_eq!(report["slots_left"][0]["slot"], "powersync_mdbx_test");
    assert!(root.join("mdbx.dat").exists(), "nothing removed");

    // SIGTERM during a reset: the host stops at once, the reset removed nothing and
    // says so (the worker answers the waiting reset() with it).
    host.start_reset(true);
    assert!(host.resetting());
    let began = Instant::now();
    assert!(host.shutdown());
    // The release thread still waits on the silent primary; the stop does not.
    assert!(began.elapsed() < bound, "{:?}", began.elapsed());
    let report = host
        .take_reset_result()
        .expect("the interrupted reset answers");
    assert_eq!(report["reset"], false, "{report}");
    assert!(
        report["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("PSM_E1005")),
        "{report}"
    );
    assert!(root.join("mdbx.dat").exists(), "nothing removed");
}

/// What the host waits beyond the release thread's bound, plus the test's own slack.
const RELEASE_GRACE_FOR_TESTS: Duration = Duration::from_secs(4);

/// Starts a reset and ticks the host until it has finished; its result.
fn reset_and_wait(host: &mut Host, force: bool) -> serde_json::Value {
    host.start_reset(force);
    testkit::wait_until("the reset's result", || {
        assert_eq!(host.tick(), Tick::Continue);
        let result = host.take_reset_result();
        if result.is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        result
    })
}

#[test]
fn reset_drops_the_slot_on_a_primary_and_without_it_refuses_unless_forced() {
    use testkit::{Cluster, ClusterKind, PgInstall, TestDir};
    let install = PgInstall::pg16();
    let cluster_dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &cluster_dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(
        "CREATE TABLE lists (id text PRIMARY KEY, name text);
         INSERT INTO lists VALUES ('l1', 'groceries');
         CREATE PUBLICATION powersync FOR ALL TABLES;",
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        format!(
            "replication:\n  connections:\n    - uri: {}\n\
             sync_config:\n  content: 'bucket_definitions: {{global: {{data: [SELECT * FROM lists]}}}}'\n\
             port: {}\n",
            primary.uri("postgres"),
            free_port()
        ),
    )
    .unwrap();
    let root = dir.path().join("store");
    let slots =
        || primary.sql("SELECT coalesce(string_agg(slot_name, ','), '') FROM pg_replication_slots");
    let mut host = Host::new(settings(dir.path()), Arc::new(StatusCell::new(1)), no_guard);
    host.start();
    wait_phase(&mut host, Phase::Streaming);
    assert_eq!(slots(), "powersync_mdbx_test");

    // Reachable: the slot is dropped, the store rebuilt with a new one.
    let report = reset_and_wait(&mut host, false);
    assert_eq!(report["reset"], true, "{report}");
    assert_eq!(
        report["slots_dropped"],
        serde_json::json!(["powersync_mdbx_test"])
    );
    assert_eq!(report["slots_left"], serde_json::json!([]));
    wait_phase(&mut host, Phase::Streaming);

    // The slot in use by another consumer: refused, nothing removed.
    assert!(host.shutdown());
    let mut consumer = install
        .command("pg_recvlogical")
        .args([
            "--no-loop",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .args(["-p", &primary.port().to_string()])
        .args([
            "--slot",
            "powersync_mdbx_test",
            "--start",
            "-f",
            "/dev/null",
        ])
        .args(["-o", "proto_version=1", "-o", "publication_names=powersync"])
        .spawn()
        .unwrap();
    testkit::wait_until("the other consumer holding the slot", || {
        (primary.sql("SELECT active FROM pg_replication_slots") == "t").then_some(())
    });
    let report = reset_and_wait(&mut host, false);
    assert_eq!(report["reset"], false, "{report}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("PSM_E1004") && error.contains("PSM_B1005"),
        "{report}"
    );
    assert!(root.join("mdbx.dat").exists());
    primary.sql("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots");
    consumer.wait().unwrap();
    assert!(host.shutdown());

    // The primary down: refused, naming the slot and how to drop it by hand.
    primary.stop_fast();
    let report = reset_and_wait(&mut host, false);
    assert_eq!(report["reset"], false, "{report}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("PSM_E1004"), "{report}");
    assert!(error.contains("PSM_R3001"), "says why: {report}");
    assert!(
        error.contains("in database \"postgres\" of the primary: SELECT pg_drop_replication_slot('powersync_mdbx_test')"),
        "{report}"
    );
    assert!(root.join("mdbx.dat").exists(), "nothing removed");

    // Forced: the store goes, the slot stays on the primary and is named.
    let report = reset_and_wait(&mut host, true);
    assert_eq!(report["reset"], true, "{report}");
    assert_eq!(
        report["removed_files"],
        serde_json::json!(["mdbx.dat", "mdbx.lck"])
    );
    assert_eq!(
        report["slots_left"][0]["slot"], "powersync_mdbx_test",
        "{report}"
    );
    assert!(host.shutdown());
    primary.start();
    assert_eq!(slots(), "powersync_mdbx_test", "the slot left behind");
    // The statement the result gives drops it.
    primary.sql(report["slots_left"][0]["drop_by_hand"].as_str().unwrap());
    assert_eq!(slots(), "");
}

#[test]
fn a_store_whose_slot_is_not_known_is_removed_only_when_forced() {
    let dir = tempfile::tempdir().unwrap();
    write_config(&dir.path().join("config.yaml"), free_port());
    // A deploy's build whose bootstrap record does not parse.
    let build = dir.path().join("store").join("g3");
    std::fs::create_dir_all(dir.path().join("store")).unwrap();
    std::fs::set_permissions(
        dir.path().join("store"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let store = store::Store::open(&build).unwrap();
    store
        .put_stage_record(replication::BootstrapIntent::KEY, b"{not json")
        .unwrap();
    drop(store);
    let mut host = Host::new(settings(dir.path()), Arc::new(StatusCell::new(1)), no_guard);
    let report = reset_and_wait(&mut host, false);
    assert_eq!(report["reset"], false, "{report}");
    let error = report["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("PSM_E1004"), "{report}");
    assert!(error.contains("is not known"), "{report}");
    assert!(error.contains("\"powersync_mdbx_test_g3\""), "{report}");
    assert!(build.join("mdbx.dat").exists());
    let report = reset_and_wait(&mut host, true);
    assert_eq!(report["reset"], true, "{report}");
    assert_eq!(
        report["slots_left"][0]["slot"],
        serde_json::Value::Null,
        "{report}"
    );
    assert!(!build.exists(), "{report}");
    assert!(host.shutdown());
}

#[test]
fn a_generation_left_behind_is_removed_but_a_data_file_not_ours_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    write_config(&dir.path().join("config.yaml"), free_port());
    let root = dir.path().join("store");
    drop(store::Store::open(&root).unwrap());
    // Left behind by a crash during a deploy (before its slot existed): removed at start.
    let ours = root.join("g3");
    drop(store::Store::open(&ours).unwrap());
    // A generation directory holding another program's file: never removed.
    let other = root.join("g2");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("mdbx.dat"), vec![0x42u8; 64 * 1024]).unwrap();
    let mut host = Host::new(settings(dir.path()), Arc::new(StatusCell::new(1)), no_guard);
    host.start();
    testkit::wait_for("the generation left behind to be removed", || {
        assert_eq!(host.tick(), Tick::Continue);
        if ours.exists() {
            std::thread::sleep(Duration::from_millis(10));
            let snap = host.status().snapshot();
            Err(testkit::worker_progress(
                &serde_json::to_value(snap).unwrap(),
            ))
        } else {
            Ok(())
        }
    });
    assert!(
        other.join("mdbx.dat").exists(),
        "the engine removed a data file that is not a powersync_mdbx store"
    );
    assert!(host.shutdown());
}

mod fleet;
