//! Live tests: after the snapshot, every change on the primary reaches the buckets —
//! inserts, updates moving rows between buckets, deletes, TRUNCATE, unchanged TOAST
//! values, REPLICA IDENTITY FULL, parameter rows — and after each sync point the live
//! rows of every stored bucket equal an independent evaluation of the primary's rows,
//! and every bucket's ops add up to its announced checksum and count. Also: restart
//! mid-stream, a changed table, and a dropped slot.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use config::SourceConnection;
use replication::{
    bootstrap, follow_slot, Progress, ReplicationError, SourcePlan, StreamContext, StreamProgress,
};
use rules::SyncRules;
use store::{Checkpoint, OpKind, Store};
use testkit::{wait_for_future, wait_until, Cluster, ClusterKind, PgInstall, TestDir, Waiting};
use tokio::sync::watch;

use buckets::{diff, expected, lsn, stored};
use testkit::buckets;

mod changes;
mod columns;
mod messages;
mod partitions;
mod tables;

const SLOT: &str = "psm_stream_test";

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(50);

/// How long a table missing under its name keeps its rows in these tests (the swap in
/// `a_re_keyed_table_…` waits for the catalog reading to miss the table first).
const GONE_AFTER: Duration = Duration::from_secs(8);

const SCHEMA: &str = "
CREATE TABLE lists (id text PRIMARY KEY, owner_id text NOT NULL);
CREATE TABLE todos (id text PRIMARY KEY, list_id text, title text, status text);
CREATE TABLE docs (id integer PRIMARY KEY, title text, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE notes (owner text, note text);
ALTER TABLE notes REPLICA IDENTITY FULL;
CREATE PUBLICATION powersync FOR TABLE lists, todos, docs, notes;
INSERT INTO lists VALUES ('l1', 'u1'), ('l2', 'u2');
INSERT INTO todos VALUES ('t1', 'l1', 'one', 'open'), ('t2', 'l1', 'two', 'done'),
                         ('t3', 'l2', 'three', 'open');
INSERT INTO docs VALUES (1, 'small', 'tiny body');
INSERT INTO notes VALUES ('u1', 'first'), ('u1', 'other'), ('u2', 'second');
";

const RULES: &str = "
bucket_definitions:
  by_list:
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT * FROM todos WHERE list_id = bucket.list_id
  by_status:
    parameters: SELECT request.jwt() ->> 'status' AS status
    data:
      - SELECT id, title FROM todos WHERE status = bucket.status
  docs:
    data:
      - SELECT id, title, body, length(body) AS size FROM docs
  notes:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT owner || '-' || note AS id, note FROM notes WHERE owner = bucket.owner
";

const TABLES: &[&str] = &["lists", "todos", "docs", "notes"];

/// A primary with `schema` and the rules the stores are built with.
pub(crate) struct Rig {
    _dir: TestDir,
    pub(crate) primary: Cluster,
    store_dir: tempfile::TempDir,
    pub(crate) rules: Arc<SyncRules>,
}

impl Rig {
    fn new() -> Self {
        Self::with(SCHEMA, RULES)
    }

    pub(crate) fn with(schema: &str, rules: &str) -> Self {
        let install = PgInstall::primary();
        let dir = TestDir::new(&install);
        let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
        primary.sql(schema);
        Self {
            _dir: dir,
            primary,
            store_dir: tempfile::tempdir().unwrap(),
            rules: Arc::new(SyncRules::parse(rules).unwrap()),
        }
    }

    fn plan(&self) -> SourcePlan {
        self.plan_on(SLOT)
    }

    /// The source plan of a store that owns `slot`.
    pub(crate) fn plan_on(&self, slot: &str) -> SourcePlan {
        SourcePlan {
            connection: SourceConnection::from_uri(&self.primary.uri("postgres")).unwrap(),
            slot: slot.into(),
        }
    }

    fn open_store(&self) -> Arc<Store> {
        self.open_store_in("store")
    }

    /// The store in the rig's directory `name` (several replicas of one primary).
    pub(crate) fn open_store_in(&self, name: &str) -> Arc<Store> {
        Arc::new(Store::open(&self.store_dir.path().join(name)).unwrap())
    }
}

/// A running stream task and its stop switch.
pub(crate) struct Streaming {
    stop: watch::Sender<bool>,
    checkpoints: watch::Receiver<Checkpoint>,
    progress: Arc<StreamProgress>,
    task: tokio::task::JoinHandle<Result<(), ReplicationError>>,
}

/// Starts following the slot once the primary released it: after a stop the walsender
/// may still hold it for a moment, and `follow_slot` refuses a busy slot (the engine
/// retries; these tests start once).
fn start_streaming(rig: &Rig, store: &Arc<Store>) -> Streaming {
    start_streaming_on(rig, store, rig.plan())
}

/// [`start_streaming`] for a store that owns `plan`'s slot.
pub(crate) fn start_streaming_on(rig: &Rig, store: &Arc<Store>, plan: SourcePlan) -> Streaming {
    start_streaming_with(rig, store, plan, replication::GROUP_WINDOW)
}

/// [`start_streaming_on`] with the store commits' `group_window`.
fn start_streaming_with(
    rig: &Rig,
    store: &Arc<Store>,
    plan: SourcePlan,
    group_window: Duration,
) -> Streaming {
    let busy = format!(
        "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = \
         '{}'",
        plan.slot
    );
    wait_until("the primary to release the slot", || {
        (rig.primary.sql(&busy) == "f").then_some(())
    });
    let initial = store.read(|v| v.checkpoint()).unwrap();
    let (published, checkpoints) = watch::channel(initial);
    let progress = Arc::new(StreamProgress::default());
    let context = StreamContext {
        rules: rig.rules.clone(),
        store: store.clone(),
        published,
        progress: progress.clone(),
        liveness: replication::Liveness::default(),
        write_checkpoint_max_age: replication::WRITE_CHECKPOINT_MAX_AGE,
        gone_after: GONE_AFTER,
        group_window,
    };
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(async move { follow_slot(&plan, &context, stopped).await });
    Streaming {
        stop,
        checkpoints,
        progress,
        task,
    }
}

impl Streaming {
    /// Waits until everything committed on the primary so far is in a published
    /// checkpoint (a logical message makes an idle source advance), while the stream
    /// advances (checkpoints, changes received and applied).
    pub(crate) async fn sync_point(&mut self, primary: &Cluster) -> Checkpoint {
        // The insert position: it includes non-transactional logical messages that the
        // WAL writer has not written out yet.
        let head = lsn(&primary.sql("SELECT pg_current_wal_insert_lsn()"));
        primary.sql("SELECT pg_logical_emit_message(false, 'powersync', 'sync point')");
        let mut waiting = Waiting::new(format!("a checkpoint at {head:X}"));
        loop {
            let checkpoint = *self.checkpoints.borrow_and_update();
            if checkpoint.lsn >= head {
                return checkpoint;
            }
            if self.task.is_finished() {
                let ended = (&mut self.task).await;
                panic!("the stream ended before {head:X}: {ended:?}");
            }
            waiting.progress((checkpoint, self.progress.activity()));
            let _ = tokio::time::timeout(POLL, self.checkpoints.changed()).await;
        }
    }

    pub(crate) async fn stop(self) -> Result<(), ReplicationError> {
        self.stop.send_replace(true);
        wait_for_future("the stream task to end", || (), self.task)
            .await
            .unwrap()
    }
}

async fn assert_matches_primary(rig: &Rig, store: &Store, when: &str) {
    let expected = expected(&rig.plan().connection, &rig.rules, TABLES).await;
    let stored = stored(store);
    assert!(
        stored == expected,
        "buckets after {when}: {}",
        diff(&stored, &expected)
    );
}

async fn bootstrapped(rig: &Rig) -> Arc<Store> {
    bootstrapped_on(rig, rig.open_store(), rig.plan()).await
}

/// `store` bootstrapped with its own slot (`plan`).
pub(crate) async fn bootstrapped_on(rig: &Rig, store: Arc<Store>, plan: SourcePlan) -> Arc<Store> {
    bootstrap(
        &plan,
        rig.rules.clone(),
        store.clone(),
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    store
}

/// A rig whose `todos` hold `count` more rows (`seed1`, `seed2`, ...), bootstrapped.
async fn seeded(count: u32) -> (Rig, Arc<Store>) {
    let rig = Rig::new();
    rig.primary.sql(&format!(
        "INSERT INTO todos SELECT 'seed' || g, 'l' || (g % 3), 'seeded ' || g, 'open' \
         FROM generate_series(1, {count}) g"
    ));
    let store = bootstrapped(&rig).await;
    (rig, store)
}

/// Waits until no table is being copied again and the store holds exactly what the
/// rules make of the primary's rows now, while the stream advances.
async fn until_matches_primary(rig: &Rig, store: &Store, streaming: &mut Streaming, when: &str) {
    let mut waiting = Waiting::new(format!("the buckets to match the primary after {when}"));
    loop {
        streaming.sync_point(&rig.primary).await;
        let expected = expected(&rig.plan().connection, &rig.rules, TABLES).await;
        let stored = stored(store);
        let recopying = streaming.progress.recopying.load(Relaxed);
        if stored == expected && recopying == 0 {
            return;
        }
        let checkpoint = store.read(|v| v.checkpoint()).unwrap();
        waiting.progress((checkpoint.op_id, diff(&stored, &expected)));
        tokio::time::sleep(POLL).await;
    }
}

/// Like [`until_matches_primary`], but writes nothing to the primary while it waits (what
/// must come without a write after the change).
async fn until_stored_matches(rig: &Rig, store: &Store, streaming: &Streaming, when: &str) {
    until_tables_match(rig, store, streaming, TABLES, when).await;
}

/// Waits, writing nothing to the primary, until no table is being copied again and the
/// store holds exactly what the rules make of the rows of `tables` (the other covered
/// tables hold none).
async fn until_tables_match(
    rig: &Rig,
    store: &Store,
    streaming: &Streaming,
    tables: &[&str],
    when: &str,
) {
    let mut waiting = Waiting::new(format!("the buckets to match the primary after {when}"));
    loop {
        let expected = expected(&rig.plan().connection, &rig.rules, tables).await;
        let stored = stored(store);
        let recopying = streaming.progress.recopying.load(Relaxed);
        if stored == expected && recopying == 0 {
            return;
        }
        let checkpoint = store.read(|v| v.checkpoint()).unwrap();
        waiting.progress((checkpoint.op_id, recopying, diff(&stored, &expected)));
        tokio::time::sleep(POLL).await;
    }
}
