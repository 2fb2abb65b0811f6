//! The network to the primary fails without closing anything (a proxy in between stops
//! forwarding): the stream notices within its liveness bound, reconnects, ends its own
//! stale walsender that still holds the slot, and loses and duplicates nothing. A
//! reconnect that reaches another cluster (the connection now leads elsewhere) fails
//! closed with its code and reads nothing from it; one that reaches a promoted standby
//! (a failover that did not carry the slot over) reports the slot lost to it.
use std::sync::Arc;
use std::time::Duration;

use config::SourceConnection;
use parking_lot::Mutex;
use replication::{
    bootstrap, follow_slot, Liveness, Progress, ReplicationError, SourcePlan, StreamContext,
    StreamProgress,
};
use rules::SyncRules;
use store::{Checkpoint, Store};
use testkit::buckets::{diff, expected, lsn, stored};
use testkit::{Cluster, ClusterKind, PgInstall, TcpProxy, TestDir, Waiting};
use tokio::sync::watch;

pub(crate) const SLOT: &str = "psm_stalled";

const SCHEMA: &str = "
CREATE TABLE notes (id text PRIMARY KEY, owner text NOT NULL, body text);
CREATE PUBLICATION powersync FOR TABLE notes;
INSERT INTO notes SELECT 'n' || g, 'u' || (g % 3), 'first ' || g FROM generate_series(1, 30) g;
";

const RULES: &str = "
bucket_definitions:
  by_owner:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT * FROM notes WHERE owner = bucket.owner
";

/// Quick bounds, so the test sees the detection in seconds.
const LIVENESS: Liveness = Liveness {
    quiet_after: Duration::from_secs(1),
    check_every: Duration::from_millis(500),
    dead_after: Some(Duration::from_secs(3)),
    setup_within: Duration::from_secs(10),
};

pub(crate) struct Rig {
    _dir: TestDir,
    pub(crate) install: PgInstall,
    pub(crate) primary: Cluster,
    pub(crate) proxy: TcpProxy,
    pub(crate) store: Arc<Store>,
    _store_dir: tempfile::TempDir,
    rules: Arc<SyncRules>,
    /// The connection's `slot_failover` from here on (the slot was made with it or not).
    pub(crate) slot_failover: bool,
}

impl Rig {
    fn plan(&self) -> SourcePlan {
        let mut connection = SourceConnection::from_uri(&self.proxy.uri()).unwrap();
        connection.slot_failover = self.slot_failover;
        SourcePlan {
            connection,
            slot: SLOT.into(),
        }
    }
}

/// A primary whose walsenders wait 10 minutes for a silent client (so a stale one stays
/// until this worker ends it), reached through a proxy; bootstrapped.
async fn rig() -> Rig {
    rig_on(PgInstall::primary(), false).await
}

/// A bootstrapped store of `install`'s primary, reached through a proxy, its slot created
/// with `failover` when `slot_failover` (the primary then waits for a standby on the
/// physical slot `standby_phys` before it sends the slot's changes).
pub(crate) async fn rig_on(install: PgInstall, slot_failover: bool) -> Rig {
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(
        &install,
        &dir,
        "primary",
        ClusterKind::Primary,
        &["wal_sender_timeout = '10min'".to_owned()],
    );
    primary.sql(SCHEMA);
    if slot_failover {
        // A failover slot is made only where a standby's slot holds back what the primary
        // sends its consumer (`PSM_R1017`): the standby's physical slot, named here.
        primary.sql("SELECT pg_create_physical_replication_slot('standby_phys')");
        primary.sql("ALTER SYSTEM SET synchronized_standby_slots = 'standby_phys'");
        primary.sql("SELECT pg_reload_conf()");
    }
    let proxy = TcpProxy::start(primary.port());
    let store_dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&store_dir.path().join("store")).unwrap());
    let rig = Rig {
        _dir: dir,
        install,
        primary,
        proxy,
        store,
        _store_dir: store_dir,
        rules: Arc::new(SyncRules::parse(RULES).unwrap()),
        slot_failover,
    };
    bootstrap(
        &rig.plan(),
        rig.rules.clone(),
        rig.store.clone(),
        Arc::new(Progress::default()),
    )
    .await
    .unwrap();
    rig
}

/// Follows the slot as the engine does: errors that may pass are noted and retried.
pub(crate) struct Following {
    checkpoints: watch::Receiver<Checkpoint>,
    pub(crate) progress: Arc<StreamProgress>,
    retried: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<Result<(), ReplicationError>>,
    _stop: watch::Sender<bool>,
}

pub(crate) fn follow(rig: &Rig) -> Following {
    let initial = rig.store.read(|v| v.checkpoint()).unwrap();
    let (published, checkpoints) = watch::channel(initial);
    let progress = Arc::new(StreamProgress::default());
    let context = StreamContext {
        rules: rig.rules.clone(),
        store: rig.store.clone(),
        published,
        progress: progress.clone(),
        liveness: LIVENESS,
        write_checkpoint_max_age: replication::WRITE_CHECKPOINT_MAX_AGE,
        gone_after: replication::GONE_AFTER,
        group_window: replication::GROUP_WINDOW,
    };
    let (stop, stopped) = watch::channel(false);
    let plan = rig.plan();
    let retried = Arc::new(Mutex::new(Vec::new()));
    let noted = retried.clone();
    let task = tokio::spawn(async move {
        loop {
            match follow_slot(&plan, &context, stopped.clone()).await {
                Err(e) if !e.needs_operator() && !e.needs_restart() => {
                    noted.lock().push(e.to_string());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                ended => return ended,
            }
        }
    });
    Following {
        checkpoints,
        progress,
        retried,
        task,
        _stop: stop,
    }
}

impl Following {
    /// Waits until everything committed on `primary` so far is in a published checkpoint.
    pub(crate) async fn sync_point(&mut self, primary: &Cluster) {
        let head = lsn(&primary.sql("SELECT pg_current_wal_lsn()"));
        primary.sql("SELECT pg_logical_emit_message(false, 'powersync', 'sync point')");
        let mut waiting = Waiting::new(format!("a checkpoint at {head:X}"));
        loop {
            let checkpoint = *self.checkpoints.borrow_and_update();
            if checkpoint.lsn >= head {
                return;
            }
            if self.task.is_finished() {
                let ended = (&mut self.task).await;
                panic!("the stream ended before {head:X}: {ended:?}");
            }
            // The errors retried so far: a stalled wait shows why the stream restarted.
            let retried = self.retried.lock().clone();
            waiting.progress((checkpoint, self.progress.activity(), retried));
            let _ =
                tokio::time::timeout(Duration::from_millis(50), self.checkpoints.changed()).await;
        }
    }
}

impl Following {
    /// Waits (while it keeps retrying) until the stream stops with an error for the
    /// operator with `code`, reached at `where_`; returns the error's text.
    async fn stopped_for_the_operator(&mut self, where_: &str, code: &str) -> String {
        let retried = self.retried.clone();
        let ended = testkit::wait_for_future(
            &format!("the stream to stop at {where_}"),
            || retried.lock().len(),
            &mut self.task,
        )
        .await
        .unwrap();
        let error = ended.expect_err("the stream stops with an error");
        let text = error.to_string();
        assert!(text.contains(code), "{text}");
        assert!(error.needs_operator(), "{text}");
        text
    }
}

async fn assert_matches_primary(rig: &Rig, when: &str) {
    assert_matches(rig, &rig.primary, when).await;
}

/// The store holds exactly what the rules make of `primary`'s rows.
pub(crate) async fn assert_matches(rig: &Rig, primary: &Cluster, when: &str) {
    let conn = SourceConnection::from_uri(&primary.uri("postgres")).unwrap();
    let expected = expected(&conn, &rig.rules, &["notes"]).await;
    let stored = stored(&rig.store);
    assert!(
        stored == expected,
        "buckets after {when}: {}",
        diff(&stored, &expected)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_network_is_detected_and_the_stream_resumes_without_loss() {
    let rig = rig().await;
    let mut following = follow(&rig);
    let p = &rig.primary;
    p.sql("INSERT INTO notes VALUES ('a1', 'u1', 'before the stall')");
    following.sync_point(p).await;

    // The network stops forwarding; changes go on on the primary.
    rig.proxy.stall_open_connections();
    p.sql("INSERT INTO notes VALUES ('a2', 'u2', 'during the stall')");
    p.sql("UPDATE notes SET body = 'changed during the stall' WHERE id = 'n5'");
    p.sql("DELETE FROM notes WHERE id = 'n6'");
    following.sync_point(p).await;
    assert_matches_primary(&rig, "a stalled connection").await;

    let retried = following.retried.lock().clone();
    assert!(
        retried
            .iter()
            .any(|e| e.contains("has heard nothing from this worker")),
        "the stall was detected by the liveness check: {retried:?}"
    );
    let stale = p.sql(&format!(
        "SELECT count(*) FROM pg_stat_replication r JOIN pg_replication_slots s \
         ON s.active_pid = r.pid WHERE s.slot_name = '{SLOT}'"
    ));
    assert_eq!(
        stale, "1",
        "one walsender holds the slot: the stale one was ended"
    );
    following.task.abort();
}

/// A stream with nothing to say for longer than the liveness bound is idle, not dead:
/// this worker reports progress only when there is some, and the primary's walsender asks
/// for a reply only every five minutes here, so the check proves it by a message sent
/// through the primary instead of reconnecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_is_not_taken_for_a_dead_one() {
    let rig = rig().await;
    let mut following = follow(&rig);
    let p = &rig.primary;
    p.sql("INSERT INTO notes VALUES ('a1', 'u1', 'before the quiet')");
    following.sync_point(p).await;
    let bound = LIVENESS.quiet_after + LIVENESS.dead_after.unwrap();
    tokio::time::sleep(bound * 3).await;
    p.sql("INSERT INTO notes VALUES ('a2', 'u2', 'after the quiet')");
    following.sync_point(p).await;
    assert_matches_primary(&rig, "a quiet stream").await;
    let retried = following.retried.lock().clone();
    assert!(
        retried.is_empty(),
        "the quiet stream was restarted: {retried:?}"
    );
    following.task.abort();
}

/// The network stops forwarding just as the liveness check tests an idle stream with a
/// message through the primary: the check's wait for that message's answer is bounded
/// like its questions, so the stream's own stall that follows is still noticed (before,
/// the check waited for the answer forever and nothing was ever applied again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_that_stalls_while_the_liveness_check_sends_its_message_is_left_in_time() {
    let rig = rig().await;
    let mut following = follow(&rig);
    let p = &rig.primary;
    p.sql("INSERT INTO notes VALUES ('a1', 'u1', 'before the quiet')");
    following.sync_point(p).await;

    // The check's message (the catalog watcher sends one of its own, without a parameter).
    rig.proxy
        .stall_when_client_sends(Some("pg_logical_emit_message(false, 'powersync', $1)"));
    testkit::wait_until("the liveness check to test the idle stream", || {
        (rig.proxy.stalled_on_sending() > 0).then_some(())
    });
    rig.proxy.stall_when_client_sends(None);
    rig.proxy.stall_open_connections();
    p.sql("INSERT INTO notes VALUES ('a2', 'u2', 'after the stall')");
    following.sync_point(p).await;
    assert_matches_primary(&rig, "a stall while the liveness check sent its message").await;
    let retried = following.retried.lock().clone();
    assert!(
        retried
            .iter()
            .any(|e| e.contains("a logical message to test it got no answer")),
        "the liveness check gave up on its message: {retried:?}"
    );
    following.task.abort();
}

/// The network stops forwarding while a stream is set up (its connections open, and then
/// no answer arrives): the setup gives up within its bound and is made again once the
/// network forwards, instead of waiting forever where the liveness check does not watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_that_stalls_while_the_stream_is_set_up_is_left_in_time() {
    let rig = rig().await;
    rig.proxy.answer_only_handshakes(true);
    let mut following = follow(&rig);
    let retried = following.retried.clone();
    testkit::wait_until("the setup to give up", || {
        retried
            .lock()
            .iter()
            .any(|e| e.contains("setting up the stream took longer"))
            .then_some(())
    });
    rig.proxy.answer_only_handshakes(false);
    rig.primary
        .sql("INSERT INTO notes VALUES ('a1', 'u1', 'after the network came back')");
    following.sync_point(&rig.primary).await;
    assert_matches_primary(&rig, "a stall during the setup").await;
    following.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_that_reaches_another_cluster_fails_closed() {
    let rig = rig().await;
    let mut following = follow(&rig);
    rig.primary
        .sql("INSERT INTO notes VALUES ('a1', 'u1', 'from the real primary')");
    following.sync_point(&rig.primary).await;

    // Another cluster with the same schema, publication and slot name (a clone, or a
    // connection that now leads elsewhere); it has a row of its own.
    let dir = TestDir::new(&rig.install);
    let other = Cluster::start_new(&rig.install, &dir, "other", ClusterKind::Primary, &[]);
    other.sql(SCHEMA);
    other.sql(&format!(
        "SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')"
    ));
    other.sql("INSERT INTO notes VALUES ('x1', 'u1', 'from another cluster')");
    rig.proxy.retarget(other.port());
    rig.proxy.stall_open_connections();

    let text = following
        .stopped_for_the_operator("the other cluster", "PSM_R2008")
        .await;
    assert!(text.contains("another PostgreSQL cluster"), "{text}");
    assert_matches_primary(&rig, "the refused reconnect").await;
}

/// A failover to a physical standby loses the slot (PostgreSQL 16 does not carry logical
/// slots over a promotion): the stream rebuilds from a new slot on the promoted server
/// (the same cluster) and follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lost_to_a_failover_is_rebuilt_on_the_promoted_server() {
    let rig = rig().await;
    let mut following = follow(&rig);
    rig.primary
        .sql("INSERT INTO notes VALUES ('a1', 'u1', 'before the failover')");
    following.sync_point(&rig.primary).await;

    // A physical standby catches up and is promoted; the connection now leads to it. A
    // PostgreSQL 16 standby does not carry logical slots over a promotion.
    let dir = TestDir::new(&rig.install);
    let standby = Cluster::start_standby(&rig.install, &dir, "standby", &rig.primary);
    let head = lsn(&rig.primary.sql("SELECT pg_current_wal_lsn()"));
    testkit::wait_until("the standby replaying the primary's head", || {
        let replayed = standby.sql("SELECT pg_last_wal_replay_lsn()");
        (lsn(&replayed) >= head).then_some(())
    });
    standby.promote();
    rig.proxy.retarget(standby.port());
    rig.proxy.stall_open_connections();

    standby.sql("INSERT INTO notes VALUES ('a2', 'u1', 'after the failover')");
    standby.sql("UPDATE notes SET body = 'changed after the failover' WHERE id = 'n5'");
    following.sync_point(&standby).await;
    assert_matches(&rig, &standby, "the rebuild on the promoted standby").await;
    assert!(!following
        .progress
        .rebuilding
        .load(std::sync::atomic::Ordering::Relaxed));
}
