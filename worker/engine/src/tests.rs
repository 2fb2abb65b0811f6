//! The engine in-process: start, probes, stop; and the errors that stop it.
use super::*;
use config::ServiceConfig;
use status::Phase;
use std::io::{Read, Write};
use std::path::Path;

fn config(dir: &Path, port: u16) -> EngineConfig {
    let yaml = format!(
        "replication:\n  connections:\n    - uri: postgresql://u@127.0.0.1/db?sslmode=disable\n\
         sync_config:\n  content: 'bucket_definitions: {{}}'\nport: {port}\n"
    );
    let service = ServiceConfig::parse(&dir.join("config.yaml"), &yaml, &|_| None).unwrap();
    EngineConfig {
        service,
        storage_dir: dir.join("store"),
        listen_addresses: vec!["127.0.0.1".into()],
        runtime_threads: 1,
        slot_name: "powersync_mdbx_test".into(),
        admin_socket: None,
        http_limits: None,
        write_checkpoint_max_age: None,
        fleet: crate::Fleet::default(),
    }
}

use testkit::free_port;

fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text[9..12].parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (code, body)
}

/// Waits for `phase` while the engine's status keeps moving (bounded by progress).
fn wait_for(status: &StatusCell, phase: Phase) {
    testkit::wait_for(&format!("the engine in phase {phase:?}"), || {
        let snap = status.snapshot();
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
fn serves_probes_and_stops_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let status = Arc::new(StatusCell::new(std::process::id()));
    let engine = Engine::start(config(dir.path(), port), status.clone()).unwrap();
    // No primary listens at the configured address: the engine serves probes and keeps
    // retrying the source, not ready.
    wait_for(&status, Phase::Validating);
    let snap = status.snapshot();
    assert!(!snap.ready);
    assert_eq!(snap.listen, vec![format!("127.0.0.1:{port}")]);
    assert_eq!(snap.engine_starts, 1);
    assert!(snap.store.is_some());
    assert!(
        snap.config_warnings.is_empty(),
        "{:?}",
        snap.config_warnings
    );

    let (code, body) = get(port, "/probes/liveness");
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["ready"], false);
    assert_eq!(get(port, "/probes/readiness").0, 400);
    let (code, body) = get(port, "/nope");
    assert_eq!(code, 404);
    assert!(body.contains("\"code\":\"PSM_H1404\""), "{body}");

    let started = Instant::now();
    assert!(engine.shutdown(Duration::from_secs(2)));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status.snapshot().phase, Phase::Stopped);
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn busy_port_and_foreign_storage_need_the_operator() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let status = Arc::new(StatusCell::new(1));
    let engine = Engine::start(config(dir.path(), port), status.clone()).unwrap();
    wait_for(&status, Phase::Failed);
    let err = loop {
        if let Some(result) = engine.finished() {
            break result.unwrap_err();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(err.needs_operator());
    let report = status.snapshot().last_error.unwrap();
    assert_eq!(report.code, "PSM_H1001");
    assert!(!status.snapshot().ready);

    let foreign = tempfile::tempdir().unwrap();
    std::fs::create_dir(foreign.path().join("store")).unwrap();
    std::fs::write(foreign.path().join("store/base"), "").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        foreign.path().join("store"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let status = Arc::new(StatusCell::new(1));
    let _engine = Engine::start(config(foreign.path(), free_port()), status.clone()).unwrap();
    wait_for(&status, Phase::Failed);
    assert_eq!(status.snapshot().last_error.unwrap().code, "PSM_S1002");
}

#[test]
fn serves_the_admin_socket_while_running_and_removes_it_on_stop() {
    use admin::{self, AdminRequest, AdminResponse};
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(admin::SOCKET_NAME);
    // A socket left by a crashed engine is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut config = config(dir.path(), free_port());
    config.admin_socket = Some(socket.clone());
    let status = Arc::new(StatusCell::new(std::process::id()));
    let engine = Engine::start(config, status.clone()).unwrap();
    wait_for(&status, Phase::Validating);
    assert_eq!(
        status.snapshot().admin_socket,
        Some(socket.display().to_string())
    );
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let mut waits = 0;
    let answer = admin::call(
        &socket,
        &AdminRequest::Streams,
        Duration::from_secs(5),
        || waits += 1,
    )
    .unwrap();
    assert_eq!(answer, AdminResponse::Streams { streams: vec![] });
    let answer = admin::call(
        &socket,
        &AdminRequest::Buckets,
        Duration::from_secs(5),
        || {},
    )
    .unwrap();
    assert_eq!(
        answer,
        AdminResponse::Buckets {
            op_id: 0,
            buckets: vec![]
        }
    );
    let answer = admin::call(
        &socket,
        &AdminRequest::UserBuckets {
            claims: serde_json::json!({"no": "sub"}),
            request: serde_json::Value::Null,
        },
        Duration::from_secs(5),
        || {},
    )
    .unwrap();
    assert!(
        matches!(&answer, AdminResponse::Error { code, .. } if code == "PSM_A1010"),
        "{answer:?}"
    );
    assert!(engine.shutdown(Duration::from_secs(2)));
    assert!(
        !socket.exists(),
        "the socket is removed when the engine stops"
    );
    let err = admin::call(
        &socket,
        &AdminRequest::Streams,
        Duration::from_secs(1),
        || {},
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("PSM_A1004"), "{err}");
}

#[test]
fn a_foreign_file_at_the_socket_path_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(admin::SOCKET_NAME);
    std::fs::write(&path, "not a socket").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = runtime.block_on(async { admin::bind(&path) }).unwrap_err();
    assert!(err.to_string().starts_with("PSM_A1002"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
    let long = dir.path().join("x".repeat(120));
    let err = runtime.block_on(async { admin::bind(&long) }).unwrap_err();
    assert!(err.to_string().starts_with("PSM_A1001"), "{err}");
}

#[test]
fn a_short_hmac_secret_is_warned_about_in_the_status() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let yaml = format!(
        "replication:\n  connections:\n    - uri: postgresql://u@127.0.0.1/db?sslmode=disable\n\
         sync_config:\n  content: 'bucket_definitions: {{}}'\n\
         client_auth:\n  audience: [a]\n  jwks:\n    keys:\n      - {{kty: oct, kid: short, k: c2VjcmV0}}\n\
         port: {port}\n"
    );
    let mut engine_config = config(dir.path(), port);
    engine_config.service =
        ServiceConfig::parse(&dir.path().join("config.yaml"), &yaml, &|_| None).unwrap();
    let status = Arc::new(StatusCell::new(std::process::id()));
    let engine = Engine::start(engine_config, status.clone()).unwrap();
    wait_for(&status, Phase::Validating);
    let warnings = status.snapshot().config_warnings;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("(kid short): an HMAC secret of 6 bytes"),
        "{warnings:?}"
    );
    assert!(engine.shutdown(Duration::from_secs(2)));
}
