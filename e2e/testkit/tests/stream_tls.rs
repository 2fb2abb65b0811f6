//! Live test with the real extension and a TLS-only primary (Debian's PostgreSQL 15,
//! `ssl = on`, `hostssl` only; a CA made at test time): with a `cacert` from another CA
//! the worker stops in phase `failed` with `PSM_R2001`, needing the operator, and does
//! not retry; after the operator fixes `cacert` and reloads, it bootstraps and streams
//! over TLS.
use std::time::Duration;

use serde_json::Value;
use testkit::{free_port, Cluster, ClusterKind, PgInstall, TestCa, TestDir};

fn status(replica: &Cluster) -> Option<Value> {
    replica.worker_status()
}

fn wait_phase(replica: &Cluster, phase: &str) -> Value {
    replica.wait_worker_phase(phase)
}

fn config(primary: &Cluster, cacert: &std::path::Path, http_port: u16) -> String {
    format!(
        "replication:\n  connections:\n    - type: postgresql\n      \
         uri: postgresql://postgres@127.0.0.1:{}/postgres\n      sslmode: verify-full\n      \
         cacert: {}\n\
         sync_config:\n  content: |\n    bucket_definitions:\n      global:\n        data:\n          - SELECT * FROM lists\n\
         client_auth:\n  audience: [powersync-test]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, k: c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA}}\n\
         port: {http_port}\n",
        primary.port(),
        cacert.display()
    )
}

/// A PostgreSQL 15 primary with TLS only, its certificate from `ca`, and a table.
fn tls_primary(pg15: &PgInstall, dir: &TestDir, ca: &TestCa) -> Cluster {
    let server = ca.issue_server("server", &["DNS:localhost", "IP:127.0.0.1"], pg15.run_as());
    let primary = Cluster::start_new(
        pg15,
        dir,
        "primary",
        ClusterKind::Primary,
        &server.ssl_conf(),
    );
    std::fs::write(
        primary.data_dir().join("pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\n\
         hostssl replication all 127.0.0.1/32 trust\n",
    )
    .unwrap();
    primary.sql("SELECT pg_reload_conf()");
    primary.sql(
        "CREATE TABLE lists (id text PRIMARY KEY, name text);
         INSERT INTO lists VALUES ('l1', 'groceries'), ('l2', 'chores');
         CREATE PUBLICATION powersync FOR ALL TABLES;",
    );
    primary
}

fn replica(pg16: &PgInstall, dir: &TestDir, config_text: &str) -> Cluster {
    Cluster::start_sync_replica(pg16, dir, config_text, &[])
}

/// Streams over TLS: a change reaches the store, and the walsender runs over TLS.
fn assert_streams_over_tls(primary: &Cluster, replica: &Cluster) {
    let s = wait_phase(replica, "streaming");
    assert!(s["last_error"].is_null(), "{s}");
    assert_eq!(s["replication"]["rows"], 2, "{s}");
    primary.sql("INSERT INTO lists VALUES ('l3', 'over TLS')");
    let changes = replica.wait_worker("the change applied", |s| {
        let n = s["replication"]["changes"].as_u64()?;
        (n >= 1).then_some(n)
    });
    assert_eq!(changes, 1);
    let ssl = primary.sql(
        "SELECT string_agg(s.ssl::text, ',') FROM pg_stat_activity a JOIN pg_stat_ssl s \
         USING (pid) WHERE a.backend_type = 'walsender'",
    );
    assert_eq!(ssl, "true", "one walsender, over TLS");
}

#[test]
fn the_worker_streams_from_a_tls_primary_with_verify_full() {
    let (pg15, pg16) = (PgInstall::pg15(), PgInstall::pg16());
    let dir = TestDir::new(&pg16);
    let ca = TestCa::new(dir.path(), "test-ca");
    let primary = tls_primary(&pg15, &dir, &ca);
    let replica = replica(&pg16, &dir, &config(&primary, &ca.cert, free_port()));
    assert_streams_over_tls(&primary, &replica);
}

#[test]
fn a_wrong_ca_waits_for_the_operator_and_a_reload_recovers() {
    let (pg15, pg16) = (PgInstall::pg15(), PgInstall::pg16());
    let dir = TestDir::new(&pg16);
    let ca = TestCa::new(dir.path(), "test-ca");
    let other = TestCa::new(dir.path(), "other-ca");
    let primary = tls_primary(&pg15, &dir, &ca);
    let http_port = free_port();
    let replica = replica(&pg16, &dir, &config(&primary, &other.cert, http_port));

    let s = wait_phase(&replica, "failed");
    let error = &s["last_error"];
    assert_eq!(error["code"], "PSM_R2001", "{s}");
    assert_eq!(error["needs_operator"], true, "{s}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("UnknownIssuer"), "{message}");
    // It stays there: no retries against the primary, no restarts.
    let pid = s["worker_pid"].as_i64().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let s = status(&replica).unwrap();
    assert_eq!(
        (s["phase"].as_str(), s["worker_pid"].as_i64()),
        (Some("failed"), Some(pid))
    );
    assert_eq!(s["engine_starts"], 1, "{s}");
    let log = replica.log_text();
    assert_eq!(log.matches("PSM_R2001").count(), 1, "{log}");
    assert_eq!(
        primary.sql("SELECT count(*) FROM pg_replication_slots"),
        "0"
    );

    // The operator fixes cacert and reloads.
    dir.write("config.yaml", &config(&primary, &ca.cert, http_port));
    replica.sql("SELECT pg_reload_conf()");
    assert_streams_over_tls(&primary, &replica);
}
