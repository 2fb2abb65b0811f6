//! Live test of a fleet's seeding: replica B starts on empty storage with
//! `powersync_mdbx.seed_from` pointing at replica A, copies A's store instead of taking a
//! snapshot, streams its own slot from the copy's position, and then holds exactly A's
//! buckets — names, op counts, checksums and last op ids — through inserts, updates,
//! deletes and a TRUNCATE; a replica with a wrong secret is refused and says why.
use testkit::{free_port, rules_config, Cluster, ClusterKind, PgInstall, TestDir};

const SECRET: &[u8] = b"fleet-test-secret-of-32-bytes-ok";
const AUDIENCE: &str = "powersync-mdbx-test";
const PEER_SECRET: &str = "a-peer-secret-shared-by-the-fleet";

const SCHEMA: &str = "
CREATE TABLE lists (id text PRIMARY KEY, owner_id text NOT NULL, name text);
CREATE TABLE todos (id text PRIMARY KEY, list_id text, title text, done boolean DEFAULT false);
CREATE PUBLICATION powersync FOR ALL TABLES;
INSERT INTO lists SELECT 'l' || g, 'u' || (g % 7), 'list ' || g FROM generate_series(1, 50) g;
INSERT INTO todos SELECT 't' || g, 'l' || (g % 50 + 1), 'todo ' || g FROM generate_series(1, 5000) g;
";

const RULES: &str = "bucket_definitions:
  by_owner:
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT * FROM todos WHERE list_id = bucket.list_id
  lists:
    data:
      - SELECT id, owner_id, name FROM lists
  all_todos:
    data:
      - SELECT id, title, done FROM todos
";

fn config(primary: &Cluster, http_port: u16) -> String {
    rules_config(&primary.uri("postgres"), RULES, SECRET, AUDIENCE, http_port)
}

/// Every bucket with its ops, checksum and last op id, as `buckets()` lists them.
fn buckets(replica: &Cluster) -> String {
    replica.sql(
        "SELECT bucket || ' ' || ops || ' ' || checksum || ' ' || last_op_id \
         FROM powersync_mdbx.buckets() ORDER BY bucket",
    )
}

fn replica_conf(slot: &str, extra: &[String]) -> Vec<String> {
    let mut conf = vec![
        format!("powersync_mdbx.slot_name = '{slot}'"),
        format!("powersync_mdbx.peer_secret = '{PEER_SECRET}'"),
    ];
    conf.extend(extra.iter().cloned());
    conf
}

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
        &replica_conf("psm_fleet_a", &[]),
    );
    a.wait_worker_phase("streaming");
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
            "powersync_mdbx.peer_secret = 'another-secret-of-enough-bytes'".to_owned(),
            format!("powersync_mdbx.seed_from = 'http://127.0.0.1:{port_a}'"),
        ],
    );
    let error = c.wait_worker("the replica with a wrong secret refused", |s| {
        (s["phase"] == "failed")
            .then(|| s["last_error"]["message"].as_str().unwrap_or("").to_owned())
    });
    assert!(
        error.contains("PSM_B1029") && error.contains("same powersync_mdbx.peer_secret"),
        "{error}"
    );
}
