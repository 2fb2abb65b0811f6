//! Live TLS tests against Debian's PostgreSQL 15 as the primary (`ssl = on`, `hostssl`
//! only; the PostgreSQL 16 in use has no OpenSSL). A CA made at test time signs the
//! server certificate. `verify-full` with that CA bootstraps and streams (the SQL
//! connections through tokio-postgres/rustls and the replication connection through
//! pg_walstream); an unknown CA and a certificate for another host name are refused on
//! both kinds of connection with `PSM_R2001`, an error that needs the operator.
use testkit::buckets;

use std::sync::Arc;
use std::time::{Duration, Instant};

use buckets::{expected, lsn, stored};
use config::{SourceConnection, SslMode};
use replication::{
    bootstrap, follow_slot, Progress, ReplicationError, SourcePlan, StreamContext, StreamProgress,
};
use rules::SyncRules;
use source::{connect, start_stream, SourceError};
use store::Store;
use testkit::{wait_for_future, Cluster, ClusterKind, PgInstall, TestCa, TestDir};
use tokio::sync::watch;

const SLOT: &str = "psm_tls_test";

const SCHEMA: &str = "
CREATE TABLE lists (id text PRIMARY KEY, owner_id text NOT NULL, name text);
CREATE PUBLICATION powersync FOR TABLE lists;
INSERT INTO lists VALUES ('l1', 'u1', 'groceries'), ('l2', 'u2', 'chores');
";

const RULES: &str = "
bucket_definitions:
  by_owner:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT id, name FROM lists WHERE owner_id = bucket.owner
";

/// TCP only over TLS; the test itself uses the Unix socket.
const HBA: &str = "local all all trust
hostssl all all 127.0.0.1/32 trust
hostssl replication all 127.0.0.1/32 trust
";

/// A PostgreSQL 15 primary with TLS on, its certificate issued by `ca` for `sans`.
struct TlsRig {
    primary: Cluster,
    ca: TestCa,
    rules: Arc<SyncRules>,
    /// Last: fields drop in order, and a cluster stops by the pid in its data directory.
    dir: TestDir,
}

impl TlsRig {
    fn new(sans: &[&str]) -> Self {
        let install = PgInstall::pg15();
        let dir = TestDir::new(&install);
        let ca = TestCa::new(dir.path(), "test-ca");
        let server = ca.issue_server("server", sans, install.run_as());
        let primary = Cluster::start_new(
            &install,
            &dir,
            "primary",
            ClusterKind::Primary,
            &server.ssl_conf(),
        );
        std::fs::write(primary.data_dir().join("pg_hba.conf"), HBA).unwrap();
        assert_eq!(primary.sql("SELECT pg_reload_conf()"), "t");
        primary.sql(SCHEMA);
        assert_eq!(primary.sql("SHOW ssl"), "on");
        Self {
            dir,
            primary,
            ca,
            rules: Arc::new(SyncRules::parse(RULES).unwrap()),
        }
    }

    /// A connection to `host` (the server listens on 127.0.0.1) with `sslmode` and a
    /// `cacert` file.
    fn conn(
        &self,
        host: &str,
        sslmode: &str,
        cacert: Option<&std::path::Path>,
    ) -> SourceConnection {
        let mut uri = format!(
            "postgresql://postgres@{host}:{}/postgres?sslmode={sslmode}",
            self.primary.port()
        );
        if let Some(path) = cacert {
            uri.push_str(&format!("&sslrootcert={}", path.display()));
        }
        SourceConnection::from_uri(&uri).unwrap()
    }

    fn plan(&self, connection: SourceConnection) -> SourcePlan {
        SourcePlan {
            connection,
            slot: SLOT.into(),
        }
    }
}

fn new_store(dir: &tempfile::TempDir) -> Arc<Store> {
    Arc::new(Store::open(&dir.path().join("store")).unwrap())
}

/// Asserts `message` is the TLS configuration error and names `detail`.
fn assert_tls_refusal(message: &str, detail: &[&str]) {
    eprintln!("refused as expected: {message}");
    assert!(
        message.starts_with("PSM_R2001 TLS to the primary"),
        "{message}"
    );
    assert!(
        detail.iter().any(|d| message.contains(d)),
        "expected one of {detail:?} in: {message}"
    );
}

/// Every connection of the worker code open on the primary, with its TLS state: SQL
/// connections carry `application_name`, walsenders do not (pg_walstream's native
/// client ignores `application_name`).
fn worker_connections(primary: &Cluster) -> String {
    primary.sql(
        "SELECT string_agg(a.backend_type || ':' || s.ssl::text, ',' ORDER BY a.backend_type) \
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'powersync_mdbx' OR a.backend_type = 'walsender'",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_ca_bootstraps_and_streams() {
    let rig = TlsRig::new(&["DNS:localhost", "IP:127.0.0.1"]);
    // TCP without TLS is refused by pg_hba: TLS is really in use below.
    let plain = connect(&rig.conn("127.0.0.1", "disable", None))
        .await
        .err()
        .unwrap();
    assert!(
        plain.to_string().contains("no pg_hba.conf entry"),
        "{plain}"
    );

    let connection = rig.conn("127.0.0.1", "verify-full", Some(&rig.ca.cert));
    assert_eq!(connection.sslmode, SslMode::VerifyFull);
    let plan = rig.plan(connection.clone());
    let store_dir = tempfile::tempdir().unwrap();
    let store = new_store(&store_dir);
    bootstrap(
        &plan,
        rig.rules.clone(),
        store.clone(),
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert_eq!(
        stored(&store),
        expected(&connection, &rig.rules, &["lists"]).await
    );

    let initial = store.read(|v| v.checkpoint()).unwrap();
    let (published, mut checkpoints) = watch::channel(initial);
    let context = StreamContext {
        rules: rig.rules.clone(),
        store: store.clone(),
        published,
        progress: Arc::new(StreamProgress::default()),
        liveness: replication::Liveness::default(),
        write_checkpoint_max_age: replication::WRITE_CHECKPOINT_MAX_AGE,
        gone_after: replication::GONE_AFTER,
        group_window: replication::GROUP_WINDOW,
    };
    let (stop, stopped) = watch::channel(false);
    let task_plan = plan.clone();
    let task = tokio::spawn(async move { follow_slot(&task_plan, &context, stopped).await });

    let p = &rig.primary;
    p.sql("INSERT INTO lists VALUES ('l3', 'u1', 'over TLS')");
    p.sql("UPDATE lists SET name = 'renamed' WHERE id = 'l1'");
    p.sql("DELETE FROM lists WHERE id = 'l2'");
    let head = lsn(&p.sql("SELECT pg_current_wal_lsn()"));
    p.sql("SELECT pg_logical_emit_message(false, 'powersync', 'sync point')");
    let reached = wait_for_future(
        "a checkpoint over TLS",
        || (),
        checkpoints.wait_for(|c| c.lsn >= head),
    )
    .await
    // Copy the checkpoint out: a held watch reference blocks the next publish.
    .map(|c| *c);
    assert!(
        reached.is_ok(),
        "no checkpoint over TLS (stream ended: {})",
        task.is_finished()
    );
    // The walsender that streams to us runs over TLS.
    let connections = worker_connections(p);
    assert!(connections.contains("walsender:true"), "{connections}");
    assert!(!connections.contains(":false"), "{connections}");
    let stored_now = stored(&store);
    assert_eq!(
        stored_now,
        expected(&connection, &rig.rules, &["lists"]).await
    );
    assert!(stored_now["1#by_owner[\"u1\"]"].contains_key(&("lists".into(), "l3".into())));

    stop.send_replace(true);
    wait_for_future("the stream task to end", || (), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_ca_is_refused_and_needs_the_operator() {
    let rig = TlsRig::new(&["DNS:localhost", "IP:127.0.0.1"]);
    let other = TestCa::new(rig.dir.path(), "other-ca");
    let wrong = rig.conn("127.0.0.1", "verify-full", Some(&other.cert));

    // The SQL connection (tokio-postgres + rustls).
    let started = Instant::now();
    let error = connect(&wrong).await.err().unwrap();
    assert!(matches!(error, SourceError::Tls(_)), "{error:?}");
    assert!(error.needs_operator());
    assert_tls_refusal(&error.to_string(), &["UnknownIssuer", "unknown issuer"]);

    // The replication connection (pg_walstream's own rustls client).
    let error = start_stream(&wrong, SLOT, 0).await.err().unwrap();
    assert!(matches!(error, SourceError::Tls(_)), "{error:?}");
    assert!(error.needs_operator(), "{error}");
    assert_tls_refusal(&error.to_string(), &["UnknownIssuer", "unknown issuer"]);

    // The bootstrap stops at once with the same error.
    let store_dir = tempfile::tempdir().unwrap();
    let store = new_store(&store_dir);
    let error = bootstrap(
        &rig.plan(wrong.clone()),
        rig.rules.clone(),
        store.clone(),
        Arc::new(Progress::default()),
    )
    .await
    .err()
    .unwrap();
    assert!(error.needs_operator(), "{error}");
    assert_tls_refusal(&error.to_string(), &["UnknownIssuer", "unknown issuer"]);

    // A store bootstrapped with the right CA: following the slot with the wrong one
    // fails the same way, and promptly (no retry loop inside).
    let right = rig.conn("127.0.0.1", "verify-full", Some(&rig.ca.cert));
    bootstrap(
        &rig.plan(right),
        rig.rules.clone(),
        store.clone(),
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    let before = stored(&store);
    let error = follow(&rig.plan(wrong), &rig.rules, &store)
        .await
        .unwrap_err();
    assert!(error.needs_operator(), "{error}");
    assert_tls_refusal(&error.to_string(), &["UnknownIssuer", "unknown issuer"]);
    assert_eq!(stored(&store), before);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // No connection of ours stayed open on the primary.
    assert_eq!(worker_connections(&rig.primary), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused_under_verify_full() {
    let rig = TlsRig::new(&["DNS:other.example"]);
    let mismatch = rig.conn("127.0.0.1", "verify-full", Some(&rig.ca.cert));

    let error = connect(&mismatch).await.err().unwrap();
    assert!(error.needs_operator(), "{error}");
    assert_tls_refusal(
        &error.to_string(),
        &["NotValidForName", "not valid for name"],
    );
    let error = start_stream(&mismatch, SLOT, 0).await.err().unwrap();
    assert!(error.needs_operator(), "{error}");
    assert_tls_refusal(
        &error.to_string(),
        &["NotValidForName", "not valid for name"],
    );
    let store_dir = tempfile::tempdir().unwrap();
    let store = new_store(&store_dir);
    let error = bootstrap(
        &rig.plan(mismatch),
        rig.rules.clone(),
        store.clone(),
        Arc::new(Progress::default()),
    )
    .await
    .err()
    .unwrap();
    assert!(error.needs_operator(), "{error}");
    assert_tls_refusal(
        &error.to_string(),
        &["NotValidForName", "not valid for name"],
    );
    assert_eq!(
        rig.primary.sql("SELECT count(*) FROM pg_replication_slots"),
        "0",
        "no slot was created"
    );

    // verify-ca checks the chain only: the same server is accepted, on both connections.
    let chain_only = rig.conn("127.0.0.1", "verify-ca", Some(&rig.ca.cert));
    bootstrap(
        &rig.plan(chain_only.clone()),
        rig.rules.clone(),
        store.clone(),
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert_eq!(
        stored(&store),
        expected(&chain_only, &rig.rules, &["lists"]).await
    );
}

/// `cacert` given inline as PEM text (as PowerSync service configs usually carry it, e.g.
/// from an environment variable): `source/tls.rs` accepts it for the SQL connections, so
/// the replication connection must accept it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_pem_cacert_works_for_both_connections() {
    let rig = TlsRig::new(&["DNS:localhost", "IP:127.0.0.1"]);
    let mut inline = rig.conn("127.0.0.1", "verify-full", None);
    inline.cacert = Some(rig.ca.pem());
    connect(&inline).await.unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let store = new_store(&store_dir);
    bootstrap(
        &rig.plan(inline.clone()),
        rig.rules.clone(),
        store.clone(),
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    assert_eq!(
        stored(&store),
        expected(&inline, &rig.rules, &["lists"]).await
    );
}

/// Runs `follow_slot` until it ends by itself (within the stall limit).
async fn follow(
    plan: &SourcePlan,
    rules: &Arc<SyncRules>,
    store: &Arc<Store>,
) -> Result<(), ReplicationError> {
    let initial = store.read(|v| v.checkpoint()).unwrap();
    let (published, _checkpoints) = watch::channel(initial);
    let context = StreamContext {
        rules: rules.clone(),
        store: store.clone(),
        published,
        progress: Arc::new(StreamProgress::default()),
        liveness: replication::Liveness::default(),
        write_checkpoint_max_age: replication::WRITE_CHECKPOINT_MAX_AGE,
        gone_after: replication::GONE_AFTER,
        group_window: replication::GROUP_WINDOW,
    };
    let (_stop, stopped) = watch::channel(false);
    wait_for_future(
        "the stream to end",
        || (),
        follow_slot(plan, &context, stopped),
    )
    .await
}
