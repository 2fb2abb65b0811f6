//! End-to-end: the official PowerSync JavaScript SDK (`@powersync/node`, run by
//! `e2e/client.mjs`) syncs from a PostgreSQL 16 sync replica running the extension, and
//! what the client holds is compared with what the primary says the user should see:
//! the initial sync, incremental changes (insert, update, delete, a column no rule reads
//! added by a migration, a row moving between buckets, a parameter row adding a bucket,
//! TRUNCATE, reset()), local writes uploaded through the connector and acknowledged by a
//! write checkpoint, reconnects and a new process resuming from the stored positions, and
//! token refreshes.
//!
//! The session's steps are in `end_to_end` (step 2 in `source_changes`, step 8 in
//! `deploys`); tokens in `auth`, checkpoint requests, transports and metrics in their
//! modules; the shared rig and checks here.
//!
//! Without the e2e packages (`e2e/install.sh`, which `scripts/setup.sh` and so
//! `scripts/test.sh` run) every test here fails and says so.

mod auth;
mod checkpoint_requests;
mod cli;
mod deploys;
mod end_to_end;
mod joins;
mod metrics;
mod primary_failover;
mod reads_stay_up;
mod selftest;
mod source_changes;
mod transports;

use std::collections::BTreeSet;

use serde_json::{json, Value};
use testkit::{
    fixture_dir, free_port, require_sdk_client, Cluster, ClusterKind, PgInstall, SdkClient, TestDir,
};

/// base64url of the HS256 key `psm-e2e-test-secret-0123456789abcdef`.
const SECRET: &str = "cHNtLWUyZS10ZXN0LXNlY3JldC0wMTIzNDU2Nzg5YWJjZGVm";
const AUDIENCE: &str = "powersync-mdbx-test";
const USER: &str = "user-org-001-0001";

/// Which rules the replica runs; they differ in how a timestamptz is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rules {
    /// `e2e/fixture/sync-config.yaml`: edition 3 streams, ISO 8601 with microseconds.
    Streams,
    /// `e2e/fixture/sync-rules-legacy.yaml`: bucket_definitions, `YYYY-MM-DD HH:MM:SSZ`.
    Legacy,
}

impl Rules {
    fn file(self) -> &'static str {
        match self {
            Self::Streams => "sync-config.yaml",
            Self::Legacy => "sync-rules-legacy.yaml",
        }
    }

    /// SQL rendering `updated_at` as the rules' output does (whole seconds only in the
    /// legacy form: the tests never write fractions).
    fn updated_at_sql(self) -> &'static str {
        match self {
            Self::Streams => {
                "to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
            }
            Self::Legacy => "to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS\"Z\"')",
        }
    }

    /// Buckets that do not depend on the user's project access.
    fn global_buckets(self) -> usize {
        match self {
            Self::Streams => 1, // tasks, which tasks_dashboard shares
            Self::Legacy => 1,  // all_tasks
        }
    }
}

/// The `client_auth` section of the test tokens (HS256 with [`SECRET`]).
fn client_auth() -> String {
    format!(
        "client_auth:\n  audience: [{AUDIENCE}]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, kid: psm-e2e, k: {SECRET}}}\n"
    )
}

/// Fields drop in order: the clusters stop (their drop reads the pid from the data
/// directory) before the directory is removed.
struct Rig {
    replica: Cluster,
    primary: Cluster,
    http_port: u16,
    rules: Rules,
    rules_path: std::path::PathBuf,
    /// The replica's configuration file, as written.
    config: String,
    db_dir: tempfile::TempDir,
    _dir: TestDir,
}

impl Rig {
    /// The primary with the fixture at a small profile and a sync replica streaming
    /// from it; fails when the SDK client is not installed.
    fn start(rules: Rules) -> Self {
        Self::start_with(rules, &client_auth(), PgInstall::pg16())
    }

    /// [`Self::start`] with a `client_auth` section (YAML) of the test's own, and servers
    /// started from `install` (which may carry environment variables).
    fn start_with(rules: Rules, client_auth: &str, install: PgInstall) -> Self {
        let text = std::fs::read_to_string(fixture_dir().join(rules.file())).unwrap();
        Self::start_serving(rules, &text, client_auth, install, &[])
    }

    /// [`Self::start`] with the replica's store in `storage` (a directory the clusters'
    /// user may create).
    fn start_on_storage(rules: Rules, storage: &std::path::Path) -> Self {
        let text = std::fs::read_to_string(fixture_dir().join(rules.file())).unwrap();
        let setting = format!("powersync_mdbx.storage_dir = '{}'", storage.display());
        Self::start_serving(rules, &text, &client_auth(), PgInstall::pg16(), &[setting])
    }

    /// [`Self::start`] serving `rules_text` (of the `rules` format) instead of the fixture's.
    fn start_with_rules(rules: Rules, rules_text: &str) -> Self {
        Self::start_serving(rules, rules_text, &client_auth(), PgInstall::pg16(), &[])
    }

    fn start_serving(
        rules: Rules,
        rules_text: &str,
        client_auth: &str,
        install: PgInstall,
        settings: &[String],
    ) -> Self {
        require_sdk_client();
        let dir = TestDir::new(&install);
        // The primary of the version matrix (`PSM_PRIMARY_BIN`); the sync replica is `install`.
        let primary = Cluster::start_new(
            &PgInstall::primary(),
            &dir,
            "primary",
            ClusterKind::Primary,
            &[],
        );
        primary.sql_file(&fixture_dir().join("schema.sql"), &[]);
        primary.sql_file(
            &fixture_dir().join("data.sql"),
            &[("U", "8"), ("P", "12"), ("T", "25"), ("D", "6"), ("S", "4")],
        );
        let http_port = free_port();
        let rules_path = dir.write("rules.yaml", rules_text);
        let config = format!(
            "replication:\n  connections:\n    - type: postgresql\n      uri: {}\n      sslmode: disable\n\
             sync_config:\n  path: {}\n{client_auth}port: {http_port}\n",
            primary.uri("postgres"),
            rules_path.display(),
        );
        let replica = Cluster::start_sync_replica(&install, &dir, &config, settings);
        let rig = Self {
            replica,
            primary,
            http_port,
            rules,
            rules_path,
            config,
            db_dir: tempfile::tempdir().unwrap(),
            _dir: dir,
        };
        rig.wait_streaming();
        rig
    }

    fn wait_streaming(&self) {
        self.replica.wait_worker_phase("streaming");
    }

    fn client(&self) -> SdkClient {
        let mut client = SdkClient::new(
            &format!("http://127.0.0.1:{}", self.http_port),
            SECRET,
            USER,
            self.db_dir.path(),
            &self.primary.uri("postgres"),
        )
        .unwrap();
        if self.rules == Rules::Streams {
            client = client.with_env("PSM_SUBSCRIBE", "tasks_by_auth_project");
        }
        client
    }

    /// Every task, as the client's `tasks` table should hold it: both rule sets give the
    /// user every row (the global `tasks` stream / `all_tasks` bucket).
    fn expected_tasks(&self) -> Value {
        self.expected_tasks_where("true", "summary")
    }

    /// The tasks `filter` selects, with `summary` as the expression for that column.
    fn expected_tasks_where(&self, filter: &str, summary: &str) -> Value {
        self.expected_tasks_in("tasks", filter, summary)
    }

    /// [`Self::expected_tasks_where`] over the rows of `source` (a table, or a subquery
    /// with an alias) instead of `tasks`.
    fn expected_tasks_in(&self, source: &str, filter: &str, summary: &str) -> Value {
        let sql = format!(
            "SELECT coalesce(json_agg(json_build_object('id', id, 'org_id', org_id, \
             'project_id', project_id, 'title', title, 'status', status, 'priority', priority, \
             'assignee_id', assignee_id, 'story_points', story_points, 'updated_at', {}, \
             'summary', {summary}) ORDER BY id), '[]') FROM {source} WHERE {filter}",
            self.rules.updated_at_sql()
        );
        serde_json::from_str(&self.primary.sql(&sql)).unwrap()
    }

    /// The worker's status.
    fn status(&self) -> Value {
        serde_json::from_str(&self.replica.sql("SELECT powersync_mdbx.status()")).unwrap()
    }

    /// Writes `rules` to the rules file and has the worker reload it.
    fn deploy(&self, rules: &str) -> Value {
        std::fs::write(&self.rules_path, rules).unwrap();
        serde_json::from_str(&self.replica.sql("SELECT powersync_mdbx.reload()")).unwrap()
    }

    /// Waits until the worker serves `rules` with no deploy in progress.
    fn wait_rules(&self, rules: &str) {
        let hash = rules::SyncRules::parse(rules).unwrap().content_hash_hex();
        self.replica.wait_worker("the deployed rules served", |s| {
            (s["rules_hash"] == hash.as_str() && s["deploy"].is_null() && s["phase"] == "streaming")
                .then_some(())
        })
    }

    /// The projects the user's access rows name: one parameter bucket each.
    fn access_projects(&self) -> BTreeSet<String> {
        self.primary
            .sql(&format!(
                "SELECT project_id FROM user_project_access WHERE user_id = '{USER}'"
            ))
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Every change committed on the primary so far is in the store: the worker's
    /// `applied_lsn` passed the primary's WAL position (a logical message makes an idle
    /// source advance). The slot's `confirmed_flush_lsn` is not used: it was seen to stay
    /// at the consistent point for about 28 s while the store had applied later commits.
    fn wait_replicated(&self) {
        let head = lsn(&self.primary.sql("SELECT pg_current_wal_lsn()"));
        self.primary
            .sql("SELECT pg_logical_emit_message(false, 'powersync', 'e2e sync point')");
        self.replica
            .wait_worker("the worker's applied_lsn to pass the primary's head", |s| {
                let applied = s["replication"]["applied_lsn"].as_str().map(lsn)?;
                (applied >= head).then_some(())
            });
    }
}

/// `X/Y` → a 64-bit LSN.
fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.trim().split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Project ids named by bucket names.
fn bucket_projects(buckets: &Value) -> BTreeSet<String> {
    buckets
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| {
            let name = b.as_str().unwrap();
            let at = name.find("project-org-001-")?;
            name.get(at..at + "project-org-001-0000".len())
                .map(str::to_owned)
        })
        .collect()
}

fn assert_rows(label: &str, got: &Value, want: &Value) {
    if got == want {
        return;
    }
    let ids = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (g, w) = (ids(got), ids(want));
    let first_diff = got
        .as_array()
        .unwrap()
        .iter()
        .zip(want.as_array().unwrap())
        .find(|(a, b)| a != b);
    panic!(
        "{label}: client rows differ from the primary: {} rows vs {}; missing {:?}; extra {:?}; \
         first differing pair {first_diff:?}",
        g.len(),
        w.len(),
        w.difference(&g).take(5).collect::<Vec<_>>(),
        g.difference(&w).take(5).collect::<Vec<_>>()
    );
}

fn wait_equal(client: &mut testkit::WatchClient, rig: &Rig, what: &str) {
    wait_equal_to(client, rig.expected_tasks(), what);
}

/// Waits until the client holds exactly `expected` as its tasks.
fn wait_equal_to(client: &mut testkit::WatchClient, expected: Value, what: &str) {
    let answer = client.try_send(&json!({"cmd": "wait_equal", "table": "tasks", "rows": expected}));
    assert!(
        answer["ok"] == true,
        "{what}: the client did not reach the primary's rows: {answer}"
    );
}

fn assert_no_warnings(dump: &Value, what: &str) {
    assert_eq!(
        dump["warnings"],
        json!([]),
        "{what}: the SDK logged warnings or errors"
    );
}

/// The value of the sample `name` (no labels) in a Prometheus exposition.
fn metric(exposition: &str, name: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}
