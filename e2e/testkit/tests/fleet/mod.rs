//! Live test of a fleet's seeding: replica B starts on empty storage with
//! `powersync_mdbx.seed_from` pointing at replica A, copies A's store instead of taking a
//! snapshot, streams its own slot from the copy's position, and then holds exactly A's
//! buckets — names, op counts, checksums and last op ids — through inserts, updates,
//! deletes and a TRUNCATE; a replica with a wrong secret is refused and says why.
//!
//! Seeding in `seeding`, equal announcements through a churn in `churn`, a client moving
//! between replicas in `forked_histories` and `failover`; the shared fleet set-up here.

mod churn;
mod failover;
mod forked_histories;
mod seeding;

use testkit::{rules_config, Cluster, ClusterKind, PgInstall, TestDir};

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

/// A replica's settings: its slot, the fleet's secret (in a file of `dir`), and `extra`.
fn replica_conf(dir: &TestDir, slot: &str, extra: &[String]) -> Vec<String> {
    let secret_file = dir.write_private("peer_secret", PEER_SECRET);
    let mut conf = vec![
        format!("powersync_mdbx.slot_name = '{slot}'"),
        format!(
            "powersync_mdbx.peer_secret_file = '{}'",
            secret_file.display()
        ),
        "powersync_mdbx.peer_loopback = on".to_owned(),
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
        &replica_conf(dir, &format!("psm_{name}"), &seed),
    );
    replica.wait_worker_phase("streaming");
    replica
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
