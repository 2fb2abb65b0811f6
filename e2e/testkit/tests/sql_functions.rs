//! Live test of the SQL control plane on a real primary and sync replica (the extension
//! preloaded): `validate_rules()`, `buckets()` against an independent evaluation of the
//! primary's rows, `user_buckets()` for two users before and after a parameter row
//! changes, `streams()` with a real `/sync/stream` connection, `replication()`; and the
//! errors without the worker (no preload, an engine waiting for its configuration).
#[allow(dead_code)]
use testkit::buckets;

use std::collections::BTreeMap;
use std::io::{Read, Write};

use config::SourceConnection;
use rules::SyncRules;
use serde_json::Value;
use testkit::{
    free_port, rules_config, wait_until, Cluster, ClusterKind, Patience, PgInstall, TestDir,
};

const SECRET: &[u8] = b"sql-functions-secret-of-32-bytes";
const AUDIENCE: &str = "powersync-mdbx-test";

const SCHEMA: &str = "
CREATE TABLE lists (id text PRIMARY KEY, owner_id text NOT NULL, name text);
CREATE TABLE todos (id text PRIMARY KEY, list_id text, title text);
CREATE PUBLICATION powersync FOR ALL TABLES;
INSERT INTO lists VALUES ('l1', 'u1', 'groceries'), ('l2', 'u2', 'chores'), ('l3', 'u1', 'misc');
INSERT INTO todos SELECT 't' || g, 'l' || (g % 3 + 1), 'todo ' || g FROM generate_series(1, 20) g;
";

const RULES: &str = "bucket_definitions:
  by_list:
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT * FROM todos WHERE list_id = bucket.list_id
  lists:
    data:
      - SELECT id, owner_id, name FROM lists
  picked:
    parameters: SELECT request.parameters() ->> 'list' AS list_id WHERE request.parameters() ->> 'list' IS NOT NULL
    data:
      - SELECT id, title FROM todos WHERE list_id = bucket.list_id
";

fn token(sub: &str) -> String {
    testkit::hs256_token(SECRET, AUDIENCE, sub, 600)
}

fn config(primary: &Cluster, http_port: u16) -> String {
    rules_config(&primary.uri("postgres"), RULES, SECRET, AUDIENCE, http_port)
}

fn json(cluster: &Cluster, sql: &str) -> Value {
    serde_json::from_str(&cluster.sql(sql)).unwrap()
}

/// `bucket → ops` from `buckets()`, by name without the tag (the evaluation here names
/// buckets of another history).
fn stored_counts(replica: &Cluster) -> BTreeMap<String, u64> {
    replica
        .sql("SELECT bucket || ' ' || ops FROM powersync_mdbx.buckets()")
        .lines()
        .map(|l| {
            let (name, ops) = l.rsplit_once(' ').unwrap();
            (buckets::untagged(name).to_owned(), ops.parse().unwrap())
        })
        .collect()
}

/// Bucket names of `user_buckets()` for these claims and body, without tags, sorted.
fn user_buckets(replica: &Cluster, sub: &str, body: &str) -> Vec<String> {
    let out = replica.sql(&format!(
        "SELECT bucket FROM powersync_mdbx.user_buckets('{{\"sub\": \"{sub}\"}}', '{body}') \
         ORDER BY bucket"
    ));
    let mut names: Vec<String> = out
        .lines()
        .map(|b| buckets::untagged(b).to_owned())
        .collect();
    names.sort();
    names
}

fn expected_counts(primary: &Cluster) -> BTreeMap<String, u64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let connection = SourceConnection::from_uri(&primary.uri("postgres")).unwrap();
    let rules = SyncRules::parse(RULES).unwrap();
    runtime
        .block_on(buckets::expected(&connection, &rules, &["lists", "todos"]))
        .into_iter()
        .map(|(name, rows)| (buckets::untagged(&name).to_owned(), rows.len() as u64))
        .collect()
}

#[test]
fn sql_functions_answer_support_questions() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(SCHEMA);
    let http_port = free_port();
    let replica = Cluster::start_sync_replica(&install, &dir, &config(&primary, http_port), &[]);
    replica.wait_worker_phase("streaming");

    validate_rules_answers(&replica);
    buckets_match_the_primary(&primary, &replica);
    user_buckets_follow_the_parameter_rows(&primary, &replica);
    streams_lists_open_connections(&replica, http_port);
    only_superusers_and_monitors_read(&replica);
}

/// `validate_rules()`: the names the rules define, or the error with its location.
fn validate_rules_answers(replica: &Cluster) {
    // validate_rules: the names it defines, or the error with its location.
    let good = json(
        replica,
        &format!("SELECT powersync_mdbx.validate_rules($r${RULES}$r$)"),
    );
    assert_eq!(good["valid"], true, "{good}");
    assert_eq!(
        good["buckets"],
        serde_json::json!(["by_list", "lists", "picked"])
    );
    let bad = json(
        replica,
        "SELECT powersync_mdbx.validate_rules($r$bucket_definitions:\n  broken:\n    data:\n      - SELECT * FROM todos WHERE list_id = bucket.nope$r$)",
    );
    assert_eq!(bad["valid"], false, "{bad}");
    let error = &bad["errors"][0];
    assert_eq!(error["code"], "PSM_RULES_SQL", "{bad}");
    assert_eq!(
        (&error["rule"], &error["query"]),
        (&"broken".into(), &"data[0]".into()),
        "{bad}"
    );
    assert!(
        error["line"].as_u64() >= Some(1) && error["column"].as_u64() >= Some(1),
        "{bad}"
    );
    let yaml = json(
        replica,
        "SELECT powersync_mdbx.validate_rules('bucket_definitions: [')",
    );
    assert_eq!(yaml["errors"][0]["code"], "PSM_RULES_YAML", "{yaml}");
    assert!(yaml["errors"][0]["line"].as_u64() >= Some(1), "{yaml}");
}

/// `buckets()` and `replication()` against the primary's rows.
fn buckets_match_the_primary(primary: &Cluster, replica: &Cluster) {
    // buckets(): the stored buckets match the primary's rows, also after more inserts.
    assert_eq!(stored_counts(replica), expected_counts(primary));
    primary
        .sql("INSERT INTO todos SELECT 'n' || g, 'l2', 'new ' || g FROM generate_series(1, 5) g");
    replica.wait_applied(primary);
    let counts = stored_counts(replica);
    assert_eq!(counts, expected_counts(primary));
    assert_eq!(counts["by_list[\"l2\"]"], 12, "{counts:?}");
    let last: i64 = replica
        .sql("SELECT max(last_op_id) FROM powersync_mdbx.buckets()")
        .parse()
        .unwrap();
    let replication = replica.sql(
        "SELECT slot || ' ' || last_op_id || ' ' || (applied_lsn IS NOT NULL) || ' ' \
         || (retained_wal_bytes >= 0) || ' ' || (lag_bytes >= 0) FROM powersync_mdbx.replication()",
    );
    assert_eq!(replication, format!("powersync_mdbx {last} true true true"));
}

/// `user_buckets()` before and after a parameter row changes.
fn user_buckets_follow_the_parameter_rows(primary: &Cluster, replica: &Cluster) {
    // user_buckets(): each user's set from the parameter rows; client parameters.
    let lists = "lists[]".to_owned();
    let by = |l: &str| format!("by_list[\"{l}\"]");
    assert_eq!(
        user_buckets(replica, "u1", "{}"),
        [by("l1"), by("l3"), lists.clone()]
    );
    assert_eq!(user_buckets(replica, "u2", "{}"), [by("l2"), lists.clone()]);
    assert_eq!(
        user_buckets(replica, "u2", r#"{"parameters": {"list": "l1"}}"#),
        [by("l2"), lists.clone(), "picked[\"l1\"]".to_owned()]
    );
    assert_eq!(
        user_buckets(replica, "u2", r#"{"list": "l1"}"#),
        user_buckets(replica, "u2", r#"{"parameters": {"list": "l1"}}"#),
        "a bare object is the client parameters"
    );
    let row = replica.sql(
        "SELECT priority || ' ' || source || ' ' || ops FROM powersync_mdbx.user_buckets('{\"sub\": \"u2\"}') \
         WHERE bucket LIKE '%#by_list[\"l2\"]'",
    );
    assert_eq!(row, "3 by_list 12");
    primary.sql("UPDATE lists SET owner_id = 'u2' WHERE id = 'l3'");
    replica.wait_applied(primary);
    assert_eq!(user_buckets(replica, "u1", "{}"), [by("l1"), lists.clone()]);
    assert_eq!(
        user_buckets(replica, "u2", "{}"),
        [by("l2"), by("l3"), lists.clone()]
    );
    let err = replica
        .try_sql("SELECT * FROM powersync_mdbx.user_buckets('{\"name\": \"no sub\"}')")
        .unwrap_err();
    assert!(err.contains("PSM_A1010") && err.contains("HINT:"), "{err}");
}

/// `streams()` with a real `/sync/stream` connection on `http_port`.
fn streams_lists_open_connections(replica: &Cluster, http_port: u16) {
    // streams(): a real connection is listed while open, and gone once closed.
    assert_eq!(
        replica.sql("SELECT count(*) FROM powersync_mdbx.streams()"),
        "0"
    );
    let body = r#"{"buckets":[],"client_id":"client-7","raw_data":true}"#;
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", http_port)).unwrap();
    write!(
        socket,
        "POST /sync/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Token {}\r\n\
         Accept: application/x-ndjson\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        token("u1"),
        body.len()
    )
    .unwrap();
    socket
        .set_read_timeout(Some(Patience::of_run().stall))
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("checkpoint_complete") {
        let n = socket.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let listed = replica.sql(
        "SELECT user_id || ' ' || client_id || ' ' || buckets || ' ' || last_checkpoint || ' ' \
         || (connected_at <= now()) || ' ' || (token_expires_at > now()) FROM powersync_mdbx.streams()",
    );
    let op_id = replica.sql("SELECT last_op_id FROM powersync_mdbx.replication()");
    assert_eq!(listed, format!("u1 client-7 2 {op_id} true true"));
    drop(socket);
    wait_until("the closed stream leaving streams()", || {
        (replica.sql("SELECT count(*) FROM powersync_mdbx.streams()") == "0").then_some(())
    });
}

/// Who may read the engine's data and its status.
fn only_superusers_and_monitors_read(replica: &Cluster) {
    // Only superusers may read the engine's data; its status (configuration paths,
    // errors, slot) only superusers and members of pg_monitor.
    replica.sql("CREATE ROLE app LOGIN; CREATE ROLE monitor LOGIN IN ROLE pg_monitor");
    for call in [
        "SELECT * FROM powersync_mdbx.buckets()",
        "SELECT powersync_mdbx.status()",
        "SELECT * FROM powersync_mdbx.replication()",
    ] {
        let err = replica
            .try_sql(&format!("SET ROLE app; {call}"))
            .unwrap_err();
        assert!(err.contains("permission denied"), "{call}: {err}");
    }
    for call in [
        "SELECT powersync_mdbx.status() IS NOT NULL",
        "SELECT count(*) >= 0 FROM powersync_mdbx.replication()",
    ] {
        assert_eq!(
            replica.sql(&format!("SET ROLE monitor; {call}")),
            "t",
            "{call}"
        );
    }
}

#[test]
fn functions_fail_clearly_without_a_serving_engine() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);

    // A database where the library is not preloaded: only validate_rules works.
    let plain = Cluster::start_new(&install, &dir, "plain", ClusterKind::Plain, &[]);
    plain.sql("CREATE EXTENSION powersync_mdbx");
    let report = json(
        &plain,
        &format!("SELECT powersync_mdbx.validate_rules($r${RULES}$r$)"),
    );
    assert_eq!(report["valid"], true, "{report}");
    for call in [
        "SELECT * FROM powersync_mdbx.buckets()",
        "SELECT * FROM powersync_mdbx.user_buckets('{\"sub\": \"u1\"}')",
        "SELECT * FROM powersync_mdbx.streams()",
        "SELECT * FROM powersync_mdbx.replication()",
    ] {
        let err = plain.try_sql(call).unwrap_err();
        assert!(
            err.contains("not loaded through shared_preload_libraries") && err.contains("HINT:"),
            "{call}: {err}"
        );
    }
    drop(plain);

    // Preloaded, but the engine waits for a valid configuration: no socket to answer.
    let replica = Cluster::start_sync_replica(&install, &dir, "replication: [\n", &[]);
    replica.wait_worker_phase("config_error");
    let err = replica
        .try_sql("SELECT * FROM powersync_mdbx.buckets()")
        .unwrap_err();
    assert!(
        err.contains("PSM_A1004") && err.contains("config_error") && err.contains("HINT:"),
        "{err}"
    );
    let replication =
        replica.sql("SELECT phase || ' ' || (slot IS NULL) FROM powersync_mdbx.replication()");
    assert_eq!(replication, "config_error true");
}
