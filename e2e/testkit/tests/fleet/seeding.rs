//! A replica seeded from a peer: over plain HTTP with the fleet's secret (a wrong one
//! refused), and over TLS (an untrusted certificate refused).
use testkit::{free_port, Cluster, ClusterKind, PgInstall, TestDir};

use super::{buckets, config, replica_conf, PEER_SECRET, SCHEMA};

#[test]
fn a_replica_seeded_from_a_peer_continues_its_history() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(SCHEMA);
    let port_a = free_port();
    let a = Cluster::start_sync_replica_named(
        &install,
        &dir,
        "replica_a",
        &config(&primary, port_a),
        &replica_conf(&dir, "psm_fleet_a", &[]),
    );
    a.wait_worker_phase("streaming");
    // pg_monitor (granted status()) reads every setting: the secret is in none of them.
    a.sql("CREATE ROLE watcher IN ROLE pg_monitor");
    let shown = a.sql(&format!(
        "SET ROLE watcher; SELECT count(*) FROM pg_settings WHERE setting LIKE '%{PEER_SECRET}%'"
    ));
    assert_eq!(
        shown.lines().last(),
        Some("0"),
        "a pg_monitor member sees the peer secret"
    );
    // A history of its own before B exists: updates, deletes, inserts.
    primary.sql_each(&[
        "UPDATE todos SET done = true WHERE id LIKE 't1%'",
        "DELETE FROM todos WHERE id LIKE 't2%'",
        "INSERT INTO todos SELECT 'n' || g, 'l' || (g % 50 + 1), 'new ' || g FROM generate_series(1, 500) g",
        "UPDATE lists SET name = name || '!' WHERE owner_id = 'u3'",
    ]);
    a.wait_applied(&primary);

    let port_b = free_port();
    let b = Cluster::start_sync_replica_named(
        &install,
        &dir,
        "replica_b",
        &config(&primary, port_b),
        &replica_conf(
            &dir,
            "psm_fleet_b",
            &[format!(
                "powersync_mdbx.seed_from = 'http://127.0.0.1:{port_a}'"
            )],
        ),
    );
    b.wait_worker_phase("streaming");
    let log = b.log_text();
    assert!(
        log.contains("seeded from the peer"),
        "B did not seed:\n{log}"
    );
    assert!(
        !log.contains("snapshot complete"),
        "B took a snapshot:\n{log}"
    );
    a.wait_applied(&primary);
    b.wait_applied(&primary);
    let seeded = buckets(&b);
    assert!(seeded.lines().count() > 3, "B serves buckets: {seeded}");
    assert_eq!(seeded, buckets(&a), "B holds A's buckets after seeding");

    // Both follow the primary with one history: the same ops, checksums and op ids.
    primary.sql_each(&[
        "INSERT INTO todos SELECT 'm' || g, 'l' || (g % 50 + 1), 'more ' || g FROM generate_series(1, 300) g",
        "UPDATE todos SET title = title || ' (edited)' WHERE id LIKE 't3%'",
        "DELETE FROM todos WHERE id LIKE 'n1%'",
        "UPDATE lists SET owner_id = 'u1' WHERE id = 'l10'",
    ]);
    a.wait_applied(&primary);
    b.wait_applied(&primary);
    assert_eq!(
        buckets(&b),
        buckets(&a),
        "after inserts, updates and deletes"
    );
    primary.sql_each(&[
        "TRUNCATE todos",
        "INSERT INTO todos SELECT 'z' || g, 'l' || (g % 50 + 1), 'again ' || g FROM generate_series(1, 200) g",
    ]);
    a.wait_applied(&primary);
    b.wait_applied(&primary);
    assert_eq!(buckets(&b), buckets(&a), "after a TRUNCATE");

    // A replica that presents another secret is refused, and the error says what to do.
    let port_c = free_port();
    let c = Cluster::start_sync_replica_named(
        &install,
        &dir,
        "replica_c",
        &config(&primary, port_c),
        &[
            "powersync_mdbx.slot_name = 'psm_fleet_c'".to_owned(),
            format!(
                "powersync_mdbx.peer_secret_file = '{}'",
                dir.write_private("other_secret", "another-secret-of-enough-bytes")
                    .display()
            ),
            format!("powersync_mdbx.seed_from = 'http://127.0.0.1:{port_a}'"),
        ],
    );
    let error = c.wait_worker("the replica with a wrong secret refused", |s| {
        (s["phase"] == "failed")
            .then(|| s["last_error"]["message"].as_str().unwrap_or("").to_owned())
    });
    assert!(
        error.contains("PSM_B1029")
            && error.contains("same secret in powersync_mdbx.peer_secret_file"),
        "{error}"
    );
}

#[test]
fn a_replica_seeds_from_a_peer_over_tls_and_refuses_an_untrusted_certificate() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(SCHEMA);
    let ca = testkit::TestCa::new(dir.path(), "fleet-ca");
    let other = testkit::TestCa::new(dir.path(), "other-ca");
    let cert = ca.issue_server(
        "replica_a",
        &["DNS:localhost", "IP:127.0.0.1"],
        install.run_as(),
    );
    let (port_a, peer_port) = (free_port(), free_port());
    let a = Cluster::start_sync_replica_named(
        &install,
        &dir,
        "replica_a",
        &config(&primary, port_a),
        &replica_conf(
            &dir,
            "psm_tls_a",
            &[
                format!("powersync_mdbx.peer_listen = '127.0.0.1:{peer_port}'"),
                format!(
                    "powersync_mdbx.peer_tls_cert_file = '{}'",
                    cert.cert.display()
                ),
                format!(
                    "powersync_mdbx.peer_tls_key_file = '{}'",
                    cert.key.display()
                ),
            ],
        ),
    );
    a.wait_worker_phase("streaming");
    primary.sql_each(&[
        "UPDATE todos SET done = true WHERE id LIKE 't1%'",
        "DELETE FROM todos WHERE id LIKE 't2%'",
    ]);
    a.wait_applied(&primary);
    // The sync port is plain HTTP: the peer listener answers TLS only.
    assert!(
        testkit::http_get(peer_port, "/peer/store").is_none_or(|r| r.status == 0),
        "the peer listener answered plain HTTP"
    );

    // B seeds over TLS, trusting the fleet's CA, naming the host the certificate names.
    let seed = |name: &str, trusted: &testkit::TestCa| {
        Cluster::start_sync_replica_named(
            &install,
            &dir,
            name,
            &config(&primary, free_port()),
            &replica_conf(
                &dir,
                &format!("psm_{name}"),
                &[
                    format!("powersync_mdbx.seed_from = 'https://localhost:{peer_port}'"),
                    format!(
                        "powersync_mdbx.peer_tls_ca_file = '{}'",
                        trusted.cert.display()
                    ),
                ],
            ),
        )
    };
    let b = seed("tls_b", &ca);
    b.wait_worker_phase("streaming");
    let log = b.log_text();
    assert!(
        log.contains("seeded from the peer"),
        "B did not seed:\n{log}"
    );
    primary.sql("INSERT INTO todos SELECT 'm' || g, 'l1', 'more' FROM generate_series(1, 50) g");
    a.wait_applied(&primary);
    b.wait_applied(&primary);
    assert_eq!(buckets(&b), buckets(&a), "B holds A's history");

    // C trusts another CA: the handshake is refused, and the error says what to fix.
    let c = seed("tls_c", &other);
    let error = c.wait_worker("the untrusted peer refused", |s| {
        (s["phase"] == "failed")
            .then(|| s["last_error"]["message"].as_str().unwrap_or("").to_owned())
    });
    assert!(
        error.contains("PSM_B1030") && error.contains("powersync_mdbx.peer_tls_ca_file"),
        "{error}"
    );
}
