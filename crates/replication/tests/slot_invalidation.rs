//! Live test: a slot the primary invalidated (`max_slot_wal_keep_size` exceeded while
//! the stream was stopped, so `wal_status = 'lost'`) is refused with `PSM_R2006`, an
//! error for the operator, and the store keeps exactly what it had: nothing of the
//! changes it can no longer see, nothing half-applied. Likewise a slot that confirmed
//! more than the store holds (a store restored from a backup): `PSM_R2007`.
use testkit::buckets;

use std::sync::Arc;

use buckets::{expected, lsn, stored};
use config::SourceConnection;
use replication::{
    bootstrap, follow_slot, Progress, ReplicationError, SourcePlan, StreamContext, StreamProgress,
};
use rules::SyncRules;
use store::{Checkpoint, Store};
use testkit::{wait_for_future, Cluster, ClusterKind, PgInstall, TestDir};
use tokio::sync::watch;

const SLOT: &str = "psm_lost_slot_test";

const SCHEMA: &str = "
CREATE TABLE items (id integer PRIMARY KEY, owner text NOT NULL, body text);
CREATE PUBLICATION powersync FOR TABLE items;
INSERT INTO items SELECT g, 'u' || (g % 3), 'first' FROM generate_series(1, 30) g;
";

const RULES: &str = "
bucket_definitions:
  by_owner:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT id, body FROM items WHERE owner = bucket.owner
";

/// A primary that invalidates slots retaining more than 1 MB of WAL.
fn small_wal_primary(install: &PgInstall, dir: &TestDir) -> Cluster {
    Cluster::start_new(
        install,
        dir,
        "primary",
        ClusterKind::Primary,
        &["max_slot_wal_keep_size = 1MB".to_owned()],
    )
}

fn slot_state(primary: &Cluster) -> String {
    primary.sql(&format!(
        "SELECT coalesce(wal_status, 'null') || ' ' || active FROM pg_replication_slots \
         WHERE slot_name = '{SLOT}'"
    ))
}

/// What a test needs after the primary's data is bootstrapped into a new store.
struct Bootstrapped {
    connection: SourceConnection,
    plan: SourcePlan,
    rules: Arc<SyncRules>,
    store: Arc<Store>,
    _store_dir: tempfile::TempDir,
}

/// Bootstraps the primary's `items` into a new store through slot [`SLOT`].
async fn bootstrapped(primary: &Cluster) -> Bootstrapped {
    let connection = SourceConnection::from_uri(&primary.uri("postgres")).unwrap();
    let plan = SourcePlan {
        connection: connection.clone(),
        slot: SLOT.into(),
    };
    let rules = Arc::new(SyncRules::parse(RULES).unwrap());
    let store_dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&store_dir.path().join("store")).unwrap());
    bootstrap(
        &plan,
        rules.clone(),
        store.clone(),
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    Bootstrapped {
        connection,
        plan,
        rules,
        store,
        _store_dir: store_dir,
    }
}

/// Runs `follow_slot` on `store` and returns the error it must stop with.
async fn refused(
    plan: &SourcePlan,
    rules: &Arc<SyncRules>,
    store: &Arc<Store>,
) -> ReplicationError {
    let (_stop, _checkpoints, task) = start(plan, rules, store);
    wait_for_future("the stream task to end", || (), task)
        .await
        .unwrap()
        .unwrap_err()
}

/// Runs `follow_slot` on `store`; returns its stop switch, checkpoints and task.
fn start(
    plan: &SourcePlan,
    rules: &Arc<SyncRules>,
    store: &Arc<Store>,
) -> (
    watch::Sender<bool>,
    watch::Receiver<Checkpoint>,
    tokio::task::JoinHandle<Result<(), ReplicationError>>,
) {
    let initial = store.read(|v| v.checkpoint()).unwrap();
    let (published, checkpoints) = watch::channel(initial);
    let context = StreamContext {
        rules: rules.clone(),
        store: store.clone(),
        published,
        progress: Arc::new(StreamProgress::default()),
        liveness: replication::Liveness::default(),
        write_checkpoint_max_age: replication::WRITE_CHECKPOINT_MAX_AGE,
    };
    let (stop, stopped) = watch::channel(false);
    let plan = plan.clone();
    let task = tokio::spawn(async move { follow_slot(&plan, &context, stopped).await });
    (stop, checkpoints, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_slot_is_refused_and_the_store_is_kept() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = small_wal_primary(&install, &dir);
    primary.sql(SCHEMA);
    let Bootstrapped {
        connection,
        plan,
        rules,
        store,
        _store_dir,
    } = bootstrapped(&primary).await;

    // Stream a change, then stop.
    let (stop, mut checkpoints, task) = start(&plan, &rules, &store);
    primary.sql("UPDATE items SET body = 'streamed' WHERE id <= 10");
    let head = lsn(&primary.sql("SELECT pg_current_wal_lsn()"));
    primary.sql("SELECT pg_logical_emit_message(false, 'powersync', 'sync point')");
    wait_for_future(
        "a checkpoint at the primary's head",
        || (),
        checkpoints.wait_for(|c| c.lsn >= head),
    )
    .await
    .unwrap();
    stop.send_replace(true);
    wait_for_future("the stream task to end", || (), task)
        .await
        .unwrap()
        .unwrap();
    let before = stored(&store);
    assert_eq!(before, expected(&connection, &rules, &["items"]).await);
    let checkpoint_before = store.read(|v| v.checkpoint()).unwrap();

    // While nothing reads the slot: changes, then WAL past max_slot_wal_keep_size and
    // checkpoints until the primary invalidates the slot.
    primary.sql("UPDATE items SET body = 'never seen' WHERE id > 10");
    primary.sql("DELETE FROM items WHERE id = 1");
    let mut rounds = 0;
    while !slot_state(&primary).starts_with("lost") {
        rounds += 1;
        assert!(
            rounds <= 20,
            "slot not invalidated: {}",
            slot_state(&primary)
        );
        primary.sql(
            "INSERT INTO items SELECT 1000 + g, 'filler', repeat('x', 100) \
             FROM generate_series(1, 2000) g ON CONFLICT (id) DO UPDATE SET body = 'again'",
        );
        primary.sql("SELECT pg_switch_wal()");
        primary.sql("CHECKPOINT");
    }
    eprintln!("slot lost after {rounds} WAL switch + checkpoint rounds");

    let error = refused(&plan, &rules, &store).await;
    let message = error.to_string();
    assert!(message.starts_with("PSM_R2006"), "{message}");
    assert!(error.needs_operator(), "{message}");
    assert!(
        message.contains("invalidated")
            && message.contains("powersync_mdbx.reset()")
            && message.contains("max_slot_wal_keep_size"),
        "{message}"
    );
    // Nothing changed in the store: same checkpoint, same buckets.
    assert_eq!(store.read(|v| v.checkpoint()).unwrap(), checkpoint_before);
    assert_eq!(stored(&store), before);
    assert_ne!(
        before,
        expected(&connection, &rules, &["items"]).await,
        "the primary did change meanwhile"
    );
}

/// The primary invalidates the slot while the stream follows it: an open transaction
/// holds the slot's restart point back, WAL passes `max_slot_wal_keep_size`, and the
/// checkpoint terminates our walsender. The stream ends with an error; the next start
/// is refused with `PSM_R2006`; the store holds exactly the rows of its last checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_invalidated_while_streaming_stops_the_stream() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = small_wal_primary(&install, &dir);
    primary.sql(SCHEMA);
    primary.sql("CREATE TABLE filler (id serial PRIMARY KEY, body text)");
    let Bootstrapped {
        connection,
        plan,
        rules,
        store,
        _store_dir,
    } = bootstrapped(&primary).await;
    let (_stop, mut checkpoints, task) = start(&plan, &rules, &store);
    primary.sql("UPDATE items SET body = 'streamed' WHERE id <= 10");
    let head = lsn(&primary.sql("SELECT pg_current_wal_lsn()"));
    primary.sql("SELECT pg_logical_emit_message(false, 'powersync', 'sync point')");
    wait_for_future(
        "a checkpoint at the primary's head",
        || (),
        checkpoints.wait_for(|c| c.lsn >= head),
    )
    .await
    .unwrap();
    let before = stored(&store);
    assert_eq!(before, expected(&connection, &rules, &["items"]).await);

    // An open transaction with an xid: decoding must restart before it, so the slot's
    // restart_lsn stays put while WAL grows.
    let held = primary.hold_transaction("INSERT INTO items VALUES (500, 'u1', 'held open')");

    let mut rounds = 0;
    while !slot_state(&primary).starts_with("lost") {
        rounds += 1;
        assert!(
            rounds <= 20,
            "slot not invalidated: {}",
            slot_state(&primary)
        );
        primary
            .sql("INSERT INTO filler (body) SELECT repeat('x', 100) FROM generate_series(1, 2000)");
        primary.sql("SELECT pg_switch_wal()");
        primary.sql("CHECKPOINT");
    }
    eprintln!("slot lost while streaming after {rounds} rounds");
    held.commit();

    let ended = wait_for_future("the stream task to end", || (), task)
        .await
        .unwrap();
    let error = ended.unwrap_err();
    eprintln!(
        "the stream ended with (needs_operator = {}): {error}",
        error.needs_operator()
    );
    let error = refused(&plan, &rules, &store).await;
    let message = error.to_string();
    assert!(message.starts_with("PSM_R2006"), "{message}");
    assert!(error.needs_operator(), "{message}");
    assert_eq!(stored(&store), before);
    assert!(primary
        .log_text()
        .contains("to release replication slot \"psm_lost_slot_test\""));
}

/// A store that is behind its slot (as after restoring a backup: the slot confirmed
/// changes the store never received) is refused, and keeps what it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_behind_its_slot_is_refused() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(SCHEMA);
    let Bootstrapped {
        connection: _,
        plan,
        rules,
        store,
        _store_dir,
    } = bootstrapped(&primary).await;
    let before = stored(&store);
    let checkpoint_before = store.read(|v| v.checkpoint()).unwrap();

    // Someone else consumes the slot past a change (here: the primary advances it).
    primary.sql("UPDATE items SET body = 'not in this store' WHERE id <= 5");
    primary.sql(&format!(
        "SELECT pg_replication_slot_advance('{SLOT}', pg_current_wal_lsn())"
    ));

    let error = refused(&plan, &rules, &store).await;
    let message = error.to_string();
    assert!(message.starts_with("PSM_R2007"), "{message}");
    assert!(error.needs_operator(), "{message}");
    assert!(message.contains("powersync_mdbx.reset()"), "{message}");
    assert_eq!(store.read(|v| v.checkpoint()).unwrap(), checkpoint_before);
    assert_eq!(stored(&store), before);
}
