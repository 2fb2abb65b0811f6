//! The host's decisions: waiting on bad configuration, reloading, resetting.
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

fn wait_phase(host: &mut Host, phase: Phase) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert_eq!(host.tick(), Tick::Continue);
        if host.status().snapshot().phase == phase {
            return;
        }
        assert!(Instant::now() < deadline, "{:?}", host.status().snapshot());
        std::thread::sleep(Duration::from_millis(10));
    }
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
