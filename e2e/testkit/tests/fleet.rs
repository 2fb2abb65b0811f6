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

/// Replica `name` (slot `psm_<name>`) with `config`, seeded from the sync port `peer` when
/// given, once it streams.
fn start_replica(
    install: &PgInstall,
    dir: &TestDir,
    name: &str,
    config: &str,
    peer: Option<u16>,
) -> Cluster {
    let seed: Vec<String> = peer
        .map(|p| format!("powersync_mdbx.seed_from = 'http://127.0.0.1:{p}'"))
        .into_iter()
        .collect();
    let replica = Cluster::start_sync_replica_named(
        install,
        dir,
        name,
        config,
        &replica_conf(&format!("psm_{name}"), &seed),
    );
    replica.wait_worker_phase("streaming");
    replica
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

/// What one replica announced on a sync stream: per checkpoint op id, every bucket's
/// checksum and count; and whether a compaction showed (a count that fell, or a CLEAR).
#[derive(Debug, Default)]
struct Announced {
    at: std::collections::BTreeMap<u64, std::collections::BTreeMap<String, (i64, u64)>>,
    compacted: bool,
    /// Buckets whose announced count fell (a compaction landed in them).
    count_fell: std::collections::BTreeSet<String>,
}

/// Reads `stream` until `stop`, keeping what it announced; `latest` follows the last
/// checkpoint op id.
fn watch_announcements(
    stream: testkit::SyncStreamReader,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    latest: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> std::thread::JoinHandle<Announced> {
    use serde_json::Value;
    std::thread::spawn(move || {
        let mut seen = Announced::default();
        let mut current: std::collections::BTreeMap<String, (i64, u64)> = Default::default();
        let entry = |b: &Value| {
            (
                b["bucket"].as_str().unwrap().to_owned(),
                (
                    b["checksum"].as_i64().unwrap(),
                    b["count"].as_u64().unwrap(),
                ),
            )
        };
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Some(line) = stream.next_line(std::time::Duration::from_millis(100)) else {
                continue;
            };
            let op_id = if let Some(cp) = line.get("checkpoint") {
                current = cp["buckets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(entry)
                    .collect();
                &cp["last_op_id"]
            } else if let Some(diff) = line.get("checkpoint_diff") {
                for removed in diff["removed_buckets"].as_array().unwrap() {
                    current.remove(removed.as_str().unwrap());
                }
                for (name, (checksum, count)) in diff["updated_buckets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(entry)
                {
                    let before = current.insert(name.clone(), (checksum, count));
                    if before.is_some_and(|(_, c)| c > count) {
                        seen.compacted = true;
                        seen.count_fell.insert(name);
                    }
                }
                &diff["last_op_id"]
            } else {
                if let Some(ops) = line["data"]["data"].as_array() {
                    seen.compacted |= ops.iter().any(|op| op["op"] == "CLEAR");
                }
                continue;
            };
            let op_id = op_id.as_str().unwrap().parse().unwrap();
            seen.at.insert(op_id, current.clone());
            latest.store(op_id, std::sync::atomic::Ordering::Relaxed);
        }
        seen
    })
}

#[test]
fn three_replicas_of_one_history_announce_equal_checksums_throughout_a_churn() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(SCHEMA);
    let ports = [free_port(), free_port(), free_port()];
    let replica = |name: &str, port: u16, peer: Option<u16>| {
        start_replica(&install, &dir, name, &config(&primary, port), peer)
    };
    let a = replica("churn_a", ports[0], None);
    let b = replica("churn_b", ports[1], Some(ports[0]));
    let c = replica("churn_c", ports[2], Some(ports[0]));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let token = testkit::hs256_token(SECRET, AUDIENCE, "u3", 600);
    let latest: Vec<_> = ports
        .iter()
        .map(|_| std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)))
        .collect();
    let watchers: Vec<_> = ports
        .iter()
        .zip(&latest)
        .map(|(&port, latest)| {
            let stream = testkit::SyncStreamReader::open(port, &token);
            watch_announcements(stream, stop.clone(), latest.clone())
        })
        .collect();

    // Inserts, updates, deletes, single-row changes and a TRUNCATE (which makes every op
    // of the todo buckets compactable: CLEAR compaction folds them).
    for round in 0..6 {
        let mut statements = vec![
            format!(
                "INSERT INTO todos SELECT 'c{round}_' || g, 'l' || (g % 50 + 1), 'churn' \
                 FROM generate_series(1, 300) g"
            ),
            format!(
                "UPDATE todos SET title = title || '.', done = NOT done \
                 WHERE id LIKE 't%' AND substr(id, 2)::int % 6 = {round}"
            ),
            format!(
                "UPDATE lists SET name = name || '+' WHERE id = 'l{}'",
                round + 1
            ),
            format!("DELETE FROM todos WHERE id LIKE 'c{round}_%' AND length(id) = 4"),
            format!(
                "UPDATE todos SET list_id = 'l3' WHERE id = 't{}'",
                round * 7 + 3
            ),
        ];
        if round == 3 {
            statements.push("TRUNCATE todos".to_owned());
            statements.push(
                "INSERT INTO todos SELECT 't' || g, 'l' || (g % 50 + 1), 'again ' || g \
                 FROM generate_series(1, 2000) g"
                    .to_owned(),
            );
        }
        let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
        primary.sql_each(&statements);
        // Rounds apart, so the streams announce checkpoints between them too.
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    for r in [&a, &b, &c] {
        r.wait_applied(&primary);
    }
    let head: u64 = a
        .sql("SELECT last_op_id FROM powersync_mdbx.replication()")
        .parse()
        .unwrap();
    testkit::wait_for("every stream announcing the last checkpoint", || {
        let announced: Vec<u64> = latest
            .iter()
            .map(|l| l.load(std::sync::atomic::Ordering::Relaxed))
            .collect();
        if announced.iter().all(|&op_id| op_id >= head) {
            Ok(())
        } else {
            Err(announced)
        }
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen: Vec<Announced> = watchers.into_iter().map(|w| w.join().unwrap()).collect();

    // Wherever two replicas announced the same op id, they announced the same buckets
    // with the same checksums and counts, but for the count of a bucket where a compaction
    // landed: a CLEAR compaction commits after the transaction that made it due and makes
    // no new op id, so a replica that announced the checkpoint before it counts the folded
    // ops and one that announced it after counts one CLEAR (a count is "used only for
    // progress", and drops at the same checkpoint when a compaction lands).
    let checksums = |buckets: &std::collections::BTreeMap<String, (i64, u64)>| {
        buckets
            .iter()
            .map(|(name, (checksum, _))| (name.clone(), *checksum))
            .collect::<Vec<_>>()
    };
    let mut common_during = 0;
    for (i, x) in seen.iter().enumerate() {
        assert!(x.compacted, "replica {i} showed no compaction");
        assert!(
            x.at.contains_key(&head),
            "replica {i} announced the last checkpoint {head}"
        );
        for y in &seen[i + 1..] {
            for (op_id, buckets) in &x.at {
                if let Some(other) = y.at.get(op_id) {
                    assert_eq!(
                        checksums(buckets),
                        checksums(other),
                        "announced at op id {op_id}: {buckets:?} against {other:?}"
                    );
                    for (name, (_, count)) in buckets {
                        let compacted = x.count_fell.contains(name) || y.count_fell.contains(name);
                        assert!(
                            compacted || other.get(name).map(|(_, c)| c) == Some(count),
                            "announced at op id {op_id}: {name} counts {count} against {:?}, \
                             no compaction seen in it",
                            other.get(name)
                        );
                    }
                    common_during += usize::from(*op_id < head);
                }
            }
        }
    }
    eprintln!(
        "checkpoints announced: {:?}; op ids announced by two replicas during the churn: \
         {common_during}",
        seen.iter().map(|s| s.at.len()).collect::<Vec<_>>()
    );
    assert!(
        common_during >= 3,
        "too few points to compare during the churn ({common_during})"
    );
}

/// base64url of the HS256 key the e2e client signs with (`e2e/README.md`).
const E2E_SECRET: &str = "cHNtLWUyZS10ZXN0LXNlY3JldC0wMTIzNDU2Nzg5YWJjZGVm";
const E2E_USER: &str = "user-org-001-0001";

/// One unlabelled sample of a replica's `/metrics`.
fn metric(port: u16, name: &str) -> u64 {
    let reply = testkit::http_get(port, "/metrics").expect("/metrics answers");
    reply
        .body
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics")) as u64
}

/// Debian's HAProxy in front of the replicas: round robin, health checks on
/// `/probes/readiness`, a connection refused by one replica retried on another, and an
/// admin socket to drain a server. Stopped (by pid) when dropped.
struct Balancer {
    child: std::process::Child,
    socket: std::path::PathBuf,
}

impl Balancer {
    fn start(dir: &TestDir, port: u16, replicas: &[u16]) -> Self {
        let haproxy = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or_else(|| {
                panic!("haproxy is not installed: run scripts/setup.sh (apt package haproxy)")
            });
        let socket = dir.path().join("haproxy.sock");
        let servers: String = replicas
            .iter()
            .enumerate()
            .map(|(i, p)| format!("  server r{i} 127.0.0.1:{p} check\n"))
            .collect();
        let config = dir.write(
            "haproxy.cfg",
            &format!(
                "global\n  stats socket {} mode 600 level admin\n\
                 defaults\n  mode http\n  timeout connect 2s\n  timeout client 120s\n  \
                 timeout server 120s\n  retries 3\n  option redispatch\n\
                 frontend sync\n  bind 127.0.0.1:{port}\n  default_backend replicas\n\
                 backend replicas\n  balance roundrobin\n  option httpchk GET /probes/readiness\n  \
                 http-check expect status 200\n  default-server inter 300ms fall 2 rise 1\n{servers}",
                socket.display()
            ),
        );
        let child = std::process::Command::new(haproxy)
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("haproxy starts");
        testkit::wait_until("HAProxy answering", || {
            testkit::http_get(port, "/probes/readiness")
                .filter(|r| r.status == 200)
                .map(|_| ())
        });
        Self { child, socket }
    }

    /// One command on the admin socket; its answer.
    fn admin(&self, command: &str) -> String {
        use std::io::{Read, Write};
        let mut stream = std::os::unix::net::UnixStream::connect(&self.socket)
            .unwrap_or_else(|e| panic!("HAProxy's admin socket {}: {e}", self.socket.display()));
        stream.write_all(format!("{command}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    /// Drains server `index` as an operator does before taking a replica down: no new
    /// connections go to it, then the ones it holds are closed (their clients reconnect
    /// through the balancer to the others).
    fn drain(&self, index: usize) {
        for command in [
            format!("set server replicas/r{index} state drain"),
            format!("shutdown sessions server replicas/r{index}"),
        ] {
            let answer = self.admin(&command);
            assert!(answer.trim().is_empty(), "`{command}`: {answer}");
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A primary holding a small benchmark fixture, and the sync config of its replicas.
struct FixtureSource {
    primary: Cluster,
    rules: std::path::PathBuf,
}

impl FixtureSource {
    fn start(install: &PgInstall, dir: &TestDir) -> Self {
        let primary = Cluster::start_new(install, dir, "primary", ClusterKind::Primary, &[]);
        primary.sql_file(&testkit::fixture_dir().join("schema.sql"), &[]);
        primary.sql_file(
            &testkit::fixture_dir().join("data.sql"),
            &[("U", "8"), ("P", "12"), ("T", "25"), ("D", "6"), ("S", "4")],
        );
        let rules = dir.write(
            "rules.yaml",
            &std::fs::read_to_string(testkit::fixture_dir().join("sync-config.yaml")).unwrap(),
        );
        Self { primary, rules }
    }

    /// The config of a replica serving on `port`.
    fn config(&self, port: u16) -> String {
        format!(
            "replication:\n  connections:\n    - type: postgresql\n      uri: {}\n      sslmode: disable\n\
             sync_config:\n  path: {}\n\
             client_auth:\n  audience: [{AUDIENCE}]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, kid: psm-e2e, k: {E2E_SECRET}}}\n\
             port: {port}\n",
            self.primary.uri("postgres"),
            self.rules.display()
        )
    }

    /// Replica `name` (slot `psm_<name>`) on `port`, seeded from `peer` when given.
    fn replica(
        &self,
        install: &PgInstall,
        dir: &TestDir,
        name: &str,
        port: u16,
        peer: Option<u16>,
    ) -> Cluster {
        start_replica(install, dir, name, &self.config(port), peer)
    }

    /// The SDK's user, syncing from `endpoint` with its database in `db_dir`.
    fn client(&self, endpoint: u16, db_dir: &std::path::Path) -> testkit::WatchClient {
        testkit::SdkClient::new(
            &format!("http://127.0.0.1:{endpoint}"),
            E2E_SECRET,
            E2E_USER,
            db_dir,
            &self.primary.uri("postgres"),
        )
        .expect("the SDK client is installed")
        .watch()
    }

    /// Waits until the client holds exactly the primary's tasks.
    fn wait_equal(&self, client: &mut testkit::WatchClient, what: &str) {
        let rows: serde_json::Value = serde_json::from_str(&self.primary.sql(
            "SELECT coalesce(json_agg(json_build_object('id', id, 'org_id', org_id, \
             'project_id', project_id, 'title', title, 'status', status, 'priority', priority, \
             'assignee_id', assignee_id, 'story_points', story_points, 'updated_at', \
             to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
             'summary', summary) ORDER BY id), '[]') FROM tasks",
        ))
        .unwrap();
        let answer = client
            .try_send(&serde_json::json!({"cmd": "wait_equal", "table": "tasks", "rows": rows}));
        assert!(answer["ok"] == true, "{what}: {answer}");
    }
}

/// The SDK's warnings that mention a checksum.
fn checksum_warnings(dump: &serde_json::Value) -> Vec<serde_json::Value> {
    dump["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| {
            w["text"]
                .as_str()
                .unwrap_or_default()
                .to_lowercase()
                .contains("checksum")
        })
        .cloned()
        .collect()
}

#[test]
fn a_client_moving_between_replicas_whose_histories_forked_downloads_again_without_a_mismatch() {
    testkit::require_sdk_client();
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let source = FixtureSource::start(&install, &dir);
    let (port_a, port_b) = (free_port(), free_port());
    let a = source.replica(&install, &dir, "fork_a", port_a, None);
    let b = source.replica(&install, &dir, "fork_b", port_b, Some(port_a));
    let db_dir = tempfile::tempdir().unwrap();
    let mut client = source.client(port_a, db_dir.path());
    source.wait_equal(&mut client, "the first sync from A");

    // A rewrite that changes every title: each replica copies the table again when it
    // sees it, so each writes the new titles at a moment of its own and forks its history.
    source
        .primary
        .sql("ALTER TABLE tasks ALTER COLUMN title TYPE varchar(300) USING title || ' (v2)'");
    source.wait_equal(&mut client, "the rewrite, on A");
    // Each replica sees the rewrite in the primary's catalog within seconds (it
    // carries no row change), copies the table again and forks when it merges.
    for (replica, port) in [(&a, port_a), (&b, port_b)] {
        let forks = replica.wait_worker("the re-copy's fork, in status()", |s| {
            s["store"]["history_forks"].as_u64().filter(|&n| n >= 1)
        });
        replica.wait_worker("the re-copy to end", |s| {
            (s["phase"] == "streaming" && s["replication"]["recopying"] == 0).then_some(())
        });
        replica.wait_applied(&source.primary);
        let log = replica.log_text();
        assert!(
            log.contains("op ids leave the history shared with peers"),
            "the re-copy forked the history:\n{log}"
        );
        assert_eq!(metric(port, "powersync_mdbx_history_forks"), forks);
    }
    let dump = client.send(&serde_json::json!({"cmd": "dump"}));
    assert_eq!(checksum_warnings(&dump), Vec::<serde_json::Value>::new());
    client.finish();

    // The client moves to B with A's positions: B never gave those op ids out, so it
    // sends the client's buckets again behind a CLEAR; no checksum fails.
    let mut client = source.client(port_b, db_dir.path());
    source.wait_equal(&mut client, "the same rows from B");
    source
        .primary
        .sql("UPDATE tasks SET status = 'done' WHERE id LIKE 'task-org-001-0003-%'");
    source.wait_equal(&mut client, "a change followed on B");
    let dump = client.send(&serde_json::json!({"cmd": "dump"}));
    assert_eq!(
        checksum_warnings(&dump),
        Vec::<serde_json::Value>::new(),
        "the SDK logged a checksum mismatch"
    );
    client.finish();
}

/// Ops of each bucket a replica holds, by name.
fn ops_per_bucket(replica: &Cluster) -> std::collections::BTreeMap<String, u64> {
    buckets(replica)
        .lines()
        .map(|l| {
            let mut words = l.split(' ');
            (
                words.next().unwrap().to_owned(),
                words.next().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// Ops written into the client's buckets between two listings.
fn churn_in(
    held: &[String],
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> u64 {
    held.iter()
        .map(|name| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0))
        .sum()
}

#[test]
fn a_client_moves_between_seeded_replicas_behind_haproxy_without_downloading_again() {
    testkit::require_sdk_client();
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let source = FixtureSource::start(&install, &dir);
    let ports = [free_port(), free_port(), free_port()];
    let a = source.replica(&install, &dir, "ha_a", ports[0], None);
    // The balancer knows all three; only A is up, so the client syncs from A.
    let port_lb = free_port();
    let balancer = Balancer::start(&dir, port_lb, &ports);
    let db_dir = tempfile::tempdir().unwrap();
    let mut client = source.client(port_lb, db_dir.path());
    source.wait_equal(&mut client, "the first sync through HAProxy, from A");
    // B and C join, seeded from A while A serves.
    let b = source.replica(&install, &dir, "ha_b", ports[1], Some(ports[0]));
    let c = source.replica(&install, &dir, "ha_c", ports[2], Some(ports[0]));
    // A local write, uploaded and acknowledged by a write checkpoint.
    client.send(&serde_json::json!({"cmd": "update", "table": "tasks",
        "id": "task-org-001-0002-0005", "set": {"title": "Closed on the client"}}));
    client.send(&serde_json::json!({"cmd": "wait_synced_after_upload"}));
    source
        .primary
        .sql("UPDATE tasks SET priority = priority + 1 WHERE id LIKE 'task-org-001-0001-%'");
    source.wait_equal(&mut client, "a change followed through HAProxy");
    assert!(
        metric(ports[0], "powersync_mdbx_sync_streams_open") > 0,
        "the client is on A"
    );
    let held: Vec<String> = client.send(&serde_json::json!({"cmd": "dump"}))["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap_or_default().to_owned())
        .collect();
    for replica in [&a, &b, &c] {
        replica.wait_applied(&source.primary);
    }
    assert_eq!(buckets(&b), buckets(&a), "B holds A's history");
    assert_eq!(buckets(&c), buckets(&a), "C holds A's history");
    let full: u64 = held.iter().map(|n| ops_per_bucket(&a)[n]).sum();

    // A goes down for good; B or C takes the client.
    let sent = |port: u16| metric(port, "powersync_mdbx_sync_ops_sent_total");
    let sent_before = [sent(ports[1]), sent(ports[2])];
    let before = ops_per_bucket(&b);
    a.stop_immediate();
    source
        .primary
        .sql("UPDATE tasks SET status = 'done' WHERE id LIKE 'task-org-001-0003-000%'");
    b.wait_applied(&source.primary);
    c.wait_applied(&source.primary);
    source.wait_equal(&mut client, "the churn after the failover");
    let after = ops_per_bucket(&b);
    let churn = churn_in(&held, &before, &after);
    let sent_after = [sent(ports[1]), sent(ports[2])];
    let failover_sent = sent_after[0] - sent_before[0] + sent_after[1] - sent_before[1];
    eprintln!(
        "failover: {failover_sent} ops sent; the churn wrote {churn} in the client's {} buckets \
         (a full download: {full})",
        held.len()
    );
    assert!(
        churn > 0 && full >= 20 * churn,
        "a full download ({full}) is ≥ 20× the churn ({churn})"
    );
    assert_eq!(
        failover_sent, churn,
        "after the failover the client received the churn's ops only, not its buckets again"
    );

    // The replica holding the client is drained; the other takes it, again without a
    // download.
    let (drained, other) = if metric(ports[1], "powersync_mdbx_sync_streams_open") > 0 {
        (1, 2)
    } else {
        (2, 1)
    };
    let other_before = sent(ports[other]);
    let before = after;
    balancer.drain(drained);
    source
        .primary
        .sql("UPDATE tasks SET priority = priority - 1 WHERE id LIKE 'task-org-001-0002-001%'");
    b.wait_applied(&source.primary);
    c.wait_applied(&source.primary);
    source.wait_equal(&mut client, "the churn after the drain");
    let churn = churn_in(&held, &before, &ops_per_bucket(&b));
    let drain_sent = sent(ports[other]) - other_before;
    eprintln!("drain: {drain_sent} ops sent by the other replica; the churn wrote {churn}");
    assert!(churn > 0);
    assert_eq!(drain_sent, churn, "after the drain: the churn's ops only");
    testkit::wait_until("the drained replica to hold no stream", || {
        (metric(ports[drained], "powersync_mdbx_sync_streams_open") == 0).then_some(())
    });

    // Each cut connection shows as one; no checksum failed.
    let dump = client.send(&serde_json::json!({"cmd": "dump"}));
    let warnings = dump["warnings"].as_array().unwrap();
    eprintln!("SDK warnings: {warnings:?}");
    assert_eq!(checksum_warnings(&dump), Vec::<serde_json::Value>::new());
    assert!(
        warnings.iter().all(|w| {
            w["text"]
                .as_str()
                .unwrap_or_default()
                .contains("terminated")
        }),
        "the SDK logged more than the cut connections: {warnings:?}"
    );
    client.finish();
}
