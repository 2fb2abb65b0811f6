//! Live test: a slot the primary invalidated (`max_slot_wal_keep_size` exceeded, so
//! `wal_status = 'lost'`), whether the stream was stopped or following it, is rebuilt
//! from a new slot: the store ends equal to the rules applied to the primary's rows, and
//! rows that did not change keep their ops (clients download only what changed). A slot
//! that confirmed more than the store holds (a store restored from a backup) is refused
//! with `PSM_R2007`: that slot may be another replica's.
use testkit::buckets;

use std::sync::Arc;

use crate::observer::{assert_each_was_had, of_user, Observer};
use buckets::{expected, lsn, stored};
use config::SourceConnection;
use replication::{
    bootstrap, follow_slot, Progress, ReplicationError, SourcePlan, StreamContext, StreamProgress,
};
use rules::SyncRules;
use store::{Checkpoint, Store};
use testkit::{wait_for_future, wait_until, Cluster, ClusterKind, PgInstall, TestDir};
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
    bootstrapped_with(primary, RULES).await
}

/// Bootstraps what `rules` read of the primary into a new store through slot [`SLOT`].
async fn bootstrapped_with(primary: &Cluster, rules: &str) -> Bootstrapped {
    let connection = SourceConnection::from_uri(&primary.uri("postgres")).unwrap();
    let plan = SourcePlan {
        connection: connection.clone(),
        slot: SLOT.into(),
    };
    let rules = Arc::new(SyncRules::parse(rules).unwrap());
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

/// The op id of each row's PUT in each bucket (bucket, row id) at the store's checkpoint.
fn put_op_ids(store: &Store) -> std::collections::BTreeMap<(String, String), u64> {
    store
        .read(|view| {
            let checkpoint = view.checkpoint()?;
            let mut ids = std::collections::BTreeMap::new();
            for (id, name) in view.bucket_names()? {
                for op in view.ops(id, 0, checkpoint.op_id, usize::MAX)?.ops {
                    if let (store::OpKind::Put, Some(object)) = (op.kind, op.object) {
                        ids.insert((name.clone(), object.object_id), op.op_id);
                    }
                }
            }
            Ok(ids)
        })
        .unwrap()
}

/// Waits until the stream published a checkpoint at the primary's current position.
async fn caught_up(primary: &Cluster, checkpoints: &mut watch::Receiver<Checkpoint>) {
    let head = lsn(&primary.sql("SELECT pg_current_wal_lsn()"));
    primary.sql("SELECT pg_logical_emit_message(false, 'powersync', 'sync point')");
    let seen = checkpoints.clone();
    wait_for_future(
        "a checkpoint at the primary's head",
        || *seen.borrow(),
        checkpoints.wait_for(|c| c.lsn >= head),
    )
    .await
    .unwrap();
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
        gone_after: replication::GONE_AFTER,
        group_window: replication::GROUP_WINDOW,
    };
    let (stop, stopped) = watch::channel(false);
    let plan = plan.clone();
    let task = tokio::spawn(async move { follow_slot(&plan, &context, stopped).await });
    (stop, checkpoints, task)
}

/// The slot is invalidated while nothing reads it; the rows changed meanwhile are lost
/// with it. The next stream rebuilds from a new slot: the store equals the primary again,
/// and only the rows that changed got new ops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_slot_is_rebuilt_and_unchanged_rows_keep_their_ops() {
    let install = PgInstall::primary();
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
    caught_up(&primary, &mut checkpoints).await;
    stop.send_replace(true);
    wait_for_future("the stream task to end", || (), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored(&store),
        expected(&connection, &rules, &["items"]).await
    );
    let ops_before = put_op_ids(&store);

    // While nothing reads the slot: changes, then WAL past max_slot_wal_keep_size and
    // checkpoints until the primary invalidates the slot.
    primary.sql("UPDATE items SET body = 'never seen' WHERE id > 20");
    primary.sql("DELETE FROM items WHERE id = 1");
    primary.sql("INSERT INTO items VALUES (31, 'u1', 'new')");
    let rounds = invalidate_slot(&primary);
    eprintln!("slot lost after {rounds} WAL switch + checkpoint rounds");

    let (stop, mut checkpoints, task) = start(&plan, &rules, &store);
    caught_up(&primary, &mut checkpoints).await;
    assert_eq!(
        stored(&store),
        expected(&connection, &rules, &["items"]).await
    );
    // A new slot, followed: the rebuild publishes at its consistent point just before the
    // stream starts reading it.
    wait_until("the new slot followed", || {
        (slot_state(&primary) == "reserved true").then_some(())
    });
    // Rows 2..=20 did not change while the slot was gone: their PUTs are the same ops.
    let ops_after = put_op_ids(&store);
    let unchanged: Vec<_> = ops_before
        .iter()
        .filter(|((_, id), _)| id.parse::<u32>().is_ok_and(|id| (2..=20).contains(&id)))
        .collect();
    assert_eq!(unchanged.len(), 19);
    for (key, op_id) in unchanged {
        assert_eq!(ops_after.get(key), Some(op_id), "{key:?} got a new op");
    }
    for changed in ["21", "30", "31"] {
        let key = ops_after
            .keys()
            .find(|(_, id)| id == changed)
            .unwrap_or_else(|| panic!("row {changed} is stored"));
        assert!(ops_before.get(key) != ops_after.get(key), "{key:?}");
    }

    // It follows the new slot.
    primary.sql("UPDATE items SET body = 'after the rebuild' WHERE id = 2");
    caught_up(&primary, &mut checkpoints).await;
    assert_eq!(
        stored(&store),
        expected(&connection, &rules, &["items"]).await
    );
    stop.send_replace(true);
    wait_for_future("the stream task to end", || (), task)
        .await
        .unwrap()
        .unwrap();
}

/// The primary invalidates the slot while the stream follows it: an open transaction
/// holds the slot's restart point back, WAL passes `max_slot_wal_keep_size`, and the
/// checkpoint terminates our walsender. The stream ends with an error that may pass and
/// nothing half-applied; the next one rebuilds from a new slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_invalidated_while_streaming_is_rebuilt() {
    let install = PgInstall::primary();
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
    let (_stop, mut checkpoints, task) = start(&plan, &rules, &store);
    primary.sql("UPDATE items SET body = 'streamed' WHERE id <= 10");
    caught_up(&primary, &mut checkpoints).await;
    let before = stored(&store);
    assert_eq!(before, expected(&connection, &rules, &["items"]).await);

    // An open transaction with an xid: decoding must restart before it, so the slot's
    // restart_lsn stays put while WAL grows.
    let held = primary.hold_transaction("INSERT INTO items VALUES (500, 'u1', 'held open')");

    let rounds = invalidate_slot(&primary);
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
    assert!(!error.needs_operator(), "the stream is made again: {error}");
    assert_eq!(stored(&store), before, "nothing half-applied");
    assert!(primary
        .log_text()
        .contains("to release replication slot \"psm_lost_slot_test\""));

    // The next stream rebuilds from a new slot, the held transaction's row included.
    let (stop, mut checkpoints, task) = start(&plan, &rules, &store);
    caught_up(&primary, &mut checkpoints).await;
    let rebuilt = stored(&store);
    assert_ne!(rebuilt, before);
    assert_eq!(rebuilt, expected(&connection, &rules, &["items"]).await);
    stop.send_replace(true);
    wait_for_future("the stream task to end", || (), task)
        .await
        .unwrap()
        .unwrap();
}

/// Makes the primary invalidate slot [`SLOT`]: WAL past `max_slot_wal_keep_size` in a table
/// no rule reads, switched and checkpointed, round by round; returns the rounds it took.
fn invalidate_slot(primary: &Cluster) -> u32 {
    primary.sql("CREATE TABLE IF NOT EXISTS filler (id serial PRIMARY KEY, body text)");
    let mut rounds = 0;
    while !slot_state(primary).starts_with("lost") {
        rounds += 1;
        assert!(
            rounds <= 20,
            "slot not invalidated: {}",
            slot_state(primary)
        );
        primary
            .sql("INSERT INTO filler (body) SELECT repeat('x', 100) FROM generate_series(1, 2000)");
        primary.sql("SELECT pg_switch_wal()");
        primary.sql("CHECKPOINT");
    }
    rounds
}

/// Whole checkpoints through a rebuild (`docs/correctness.md`): one transaction changes
/// five of a user's rows in two tables (a list renamed, a todo edited, one inserted, one
/// deleted, one moved in) while the replica is down, and the slot is lost. While the
/// store rebuilds from a new slot — lists first, then 20,000 todos in many batches — a
/// client reading the user's buckets after every commit sees the state before that
/// transaction and then the state after it, never one with part of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_publishes_once_and_a_client_never_sees_part_of_a_transaction() {
    const SCHEMA: &str = "
    CREATE TABLE lists (id text PRIMARY KEY, owner text NOT NULL, name text);
    CREATE TABLE todos (id integer PRIMARY KEY, owner text NOT NULL, title text);
    CREATE PUBLICATION powersync FOR TABLE lists, todos;
    INSERT INTO lists VALUES ('l1', 'u1', 'groceries'), ('l2', 'u2', 'chores');
    INSERT INTO todos SELECT g, CASE WHEN g % 4000 = 0 THEN 'u1' ELSE 'u' || (g % 7 + 2) END,
      'todo ' || g FROM generate_series(1, 20000) g;
    ";
    const RULES: &str = "
bucket_definitions:
  mine:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT id, name FROM lists WHERE owner = bucket.owner
      - SELECT id, title FROM todos WHERE owner = bucket.owner
";
    let install = PgInstall::primary();
    let dir = TestDir::new(&install);
    let primary = small_wal_primary(&install, &dir);
    primary.sql(SCHEMA);
    let Bootstrapped {
        connection,
        plan,
        rules,
        store,
        _store_dir,
    } = bootstrapped_with(&primary, RULES).await;
    let tables = ["lists", "todos"];
    let before = of_user(expected(&connection, &rules, &tables).await, "u1");
    assert_eq!(of_user(stored(&store), "u1"), before);

    // The replica is down: one transaction over both tables, then the slot is lost.
    primary.sql(
        "BEGIN; \
         UPDATE lists SET name = 'renamed' WHERE id = 'l1'; \
         UPDATE todos SET title = 'edited' WHERE id = 16000; \
         INSERT INTO todos VALUES (30000, 'u1', 'new'); \
         DELETE FROM todos WHERE id = 8000; \
         UPDATE todos SET owner = 'u1' WHERE id = 19999; \
         COMMIT",
    );
    let after = of_user(expected(&connection, &rules, &tables).await, "u1");
    invalidate_slot(&primary);

    let observer = Observer::start(&store, "u1");
    let (stop, mut checkpoints, task) = start(&plan, &rules, &store);
    caught_up(&primary, &mut checkpoints).await;
    let seen = observer.stop();
    assert_eq!(
        seen.last(),
        Some(&after),
        "the client ends at the primary's state"
    );
    assert_each_was_had(&seen, &[before, after], "during a rebuild");
    assert_eq!(stored(&store), expected(&connection, &rules, &tables).await);
    stop.send_replace(true);
    wait_for_future("the stream task to end", || (), task)
        .await
        .unwrap()
        .unwrap();
}

/// A store that is behind its slot (as after restoring a backup: the slot confirmed
/// changes the store never received) is refused, and keeps what it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_behind_its_slot_is_refused() {
    let install = PgInstall::primary();
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
