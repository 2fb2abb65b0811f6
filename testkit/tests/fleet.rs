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
/// `/probes/readiness`, a connection refused by one replica retried on another. Stopped
/// (by pid) when dropped.
struct Balancer(std::process::Child);

impl Balancer {
    fn start(dir: &TestDir, port: u16, replicas: &[u16]) -> Self {
        let haproxy = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or_else(|| {
                panic!("haproxy is not installed: run scripts/setup.sh (apt package haproxy)")
            });
        let servers: String = replicas
            .iter()
            .enumerate()
            .map(|(i, p)| format!("  server r{i} 127.0.0.1:{p} check\n"))
            .collect();
        let config = dir.write(
            "haproxy.cfg",
            &format!(
                "defaults\n  mode http\n  timeout connect 2s\n  timeout client 120s\n  \
                 timeout server 120s\n  retries 3\n  option redispatch\n\
                 frontend sync\n  bind 127.0.0.1:{port}\n  default_backend replicas\n\
                 backend replicas\n  balance roundrobin\n  option httpchk GET /probes/readiness\n  \
                 http-check expect status 200\n  default-server inter 300ms fall 2 rise 1\n{servers}"
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
        Self(child)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_client_moves_to_a_seeded_replica_behind_haproxy_without_downloading_again() {
    testkit::require_sdk_client();
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql_file(&testkit::fixture_dir().join("schema.sql"), &[]);
    primary.sql_file(
        &testkit::fixture_dir().join("data.sql"),
        &[("U", "8"), ("P", "12"), ("T", "25"), ("D", "6"), ("S", "4")],
    );
    let rules = dir.write(
        "rules.yaml",
        &std::fs::read_to_string(testkit::fixture_dir().join("sync-config.yaml")).unwrap(),
    );
    let config = |port: u16| {
        format!(
            "replication:\n  connections:\n    - type: postgresql\n      uri: {}\n      sslmode: disable\n\
             sync_config:\n  path: {}\n\
             client_auth:\n  audience: [{AUDIENCE}]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, kid: psm-e2e, k: {E2E_SECRET}}}\n\
             port: {port}\n",
            primary.uri("postgres"),
            rules.display()
        )
    };
    let (port_a, port_b) = (free_port(), free_port());
    let a = Cluster::start_sync_replica_named(
        &install,
        &dir,
        "replica_a",
        &config(port_a),
        &replica_conf("psm_ha_a", &[]),
    );
    a.wait_worker_phase("streaming");
    let b = Cluster::start_sync_replica_named(
        &install,
        &dir,
        "replica_b",
        &config(port_b),
        &replica_conf(
            "psm_ha_b",
            &[format!(
                "powersync_mdbx.seed_from = 'http://127.0.0.1:{port_a}'"
            )],
        ),
    );
    b.wait_worker_phase("streaming");
    let port_lb = free_port();
    let _balancer = Balancer::start(&dir, port_lb, &[port_a, port_b]);

    let db_dir = tempfile::tempdir().unwrap();
    let mut client = testkit::SdkClient::new(
        &format!("http://127.0.0.1:{port_lb}"),
        E2E_SECRET,
        E2E_USER,
        db_dir.path(),
        &primary.uri("postgres"),
    )
    .expect("the SDK client is installed")
    .watch();
    let expected = || -> serde_json::Value {
        serde_json::from_str(&primary.sql(
            "SELECT coalesce(json_agg(json_build_object('id', id, 'org_id', org_id, \
             'project_id', project_id, 'title', title, 'status', status, 'priority', priority, \
             'assignee_id', assignee_id, 'story_points', story_points, 'updated_at', \
             to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
             'summary', summary) ORDER BY id), '[]') FROM tasks",
        ))
        .unwrap()
    };
    let wait_equal = |client: &mut testkit::WatchClient, what: &str| {
        let answer = client.try_send(
            &serde_json::json!({"cmd": "wait_equal", "table": "tasks", "rows": expected()}),
        );
        assert!(answer["ok"] == true, "{what}: {answer}");
    };
    wait_equal(&mut client, "the first sync through HAProxy");
    // A local write, uploaded and acknowledged by a write checkpoint.
    client.send(&serde_json::json!({"cmd": "update", "table": "tasks",
        "id": "task-org-001-0002-0005", "set": {"title": "Closed on the client"}}));
    client.send(&serde_json::json!({"cmd": "wait_synced_after_upload"}));
    primary.sql("UPDATE tasks SET priority = priority + 1 WHERE id LIKE 'task-org-001-0001-%'");
    wait_equal(&mut client, "a change followed through HAProxy");

    // The replica holding the stream goes down for good; the other takes the client.
    let (down, survivor, survivor_port) = if metric(port_a, "powersync_mdbx_sync_streams_open") > 0
    {
        (&a, &b, port_b)
    } else {
        (&b, &a, port_a)
    };
    survivor.wait_applied(&primary);
    let buckets_before = buckets(survivor);
    let sent_before = metric(survivor_port, "powersync_mdbx_sync_ops_sent_total");
    down.stop_immediate();
    primary.sql("UPDATE tasks SET status = 'done' WHERE id LIKE 'task-org-001-0003-%'");
    survivor.wait_applied(&primary);
    wait_equal(&mut client, "the churn after the failover");
    // What the client received from the survivor: exactly the churn's ops in its buckets.
    let ops = |listing: &str| -> std::collections::BTreeMap<String, u64> {
        listing
            .lines()
            .map(|l| {
                let mut words = l.split(' ');
                (
                    words.next().unwrap().to_owned(),
                    words.next().unwrap().parse().unwrap(),
                )
            })
            .collect()
    };
    let (before, after) = (ops(&buckets_before), ops(&buckets(survivor)));
    let dump = client.send(&serde_json::json!({"cmd": "dump"}));
    let held: Vec<String> = dump["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap_or_default().to_owned())
        .collect();
    let churn_ops: u64 = held
        .iter()
        .map(|name| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0))
        .sum();
    let sent = metric(survivor_port, "powersync_mdbx_sync_ops_sent_total") - sent_before;
    eprintln!(
        "after the failover: {sent} ops sent, the churn wrote {churn_ops} in the client's {} \
         buckets",
        held.len()
    );
    assert!(churn_ops > 0, "the churn wrote ops in the client's buckets");
    assert_eq!(
        sent, churn_ops,
        "after the failover the client received the churn's ops only, not its buckets again"
    );
    // The replica's end cuts the stream ("terminated"); nothing else, and no checksum.
    let warnings = dump["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().all(|w| {
            let text = w["text"].as_str().unwrap_or_default();
            text.contains("terminated") && !text.to_lowercase().contains("checksum")
        }),
        "the SDK logged more than the cut connection: {warnings:?}"
    );
    client.finish();
}
