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

    let report = host.reset();
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
