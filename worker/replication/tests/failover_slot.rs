//! A failover keeps the slot: with `slot_failover` the slot is created with `failover =
//! true` on a PostgreSQL 17+ primary whose physical standby synchronizes slots
//! (`sync_replication_slots`, `synchronized_standby_slots` on the primary). The standby is
//! promoted and the connection moves to it: the stream resumes the same slot there, with
//! no rebuild, nothing lost and nothing applied twice. On an older primary `slot_failover`
//! is refused (`PSM_R1016`).
use std::sync::Arc;

use replication::{bootstrap, Progress};
use testkit::buckets::lsn;
use testkit::{Cluster, PgInstall, TestDir};

use crate::stalled_primary::{assert_matches, follow, rig_on, Rig, SLOT};

/// A physical standby of the rig's primary on its slot `standby_phys`; `syncing`: it
/// synchronizes the primary's failover slots (`sync_replication_slots`).
fn standby_of(rig: &Rig, dir: &TestDir, syncing: bool) -> Cluster {
    let mut settings = vec![
        "primary_slot_name = 'standby_phys'".to_owned(),
        "hot_standby_feedback = on".to_owned(),
    ];
    if syncing {
        settings.push("sync_replication_slots = on".to_owned());
    }
    Cluster::start_standby_with(&rig.install, dir, "standby", &rig.primary, &settings)
}

/// Promotes `standby` and moves the rig's connection to it. The promoted server copied the
/// old primary's settings; it has no standby of its own yet, so its logical walsenders
/// would wait for one forever (an operator names the new primary's standbys there, or
/// empties it, at the failover).
fn fail_over_to(rig: &Rig, standby: &Cluster) {
    standby.promote();
    standby.sql("ALTER SYSTEM RESET synchronized_standby_slots");
    standby.sql("SELECT pg_reload_conf()");
    rig.proxy.retarget(standby.port());
    rig.proxy.stall_open_connections();
}

/// Waits until `standby` replayed everything the primary wrote so far.
fn wait_replayed(rig: &Rig, standby: &Cluster) {
    let head = lsn(&rig.primary.sql("SELECT pg_current_wal_lsn()"));
    testkit::wait_until("the standby replaying the primary's head", || {
        let replayed = standby.sql("SELECT pg_last_wal_replay_lsn()");
        (lsn(&replayed) >= head).then_some(())
    });
}

/// The standby's copy of the slot: `(synced, confirmed_flush_lsn)`, once it has one.
fn standby_slot(standby: &Cluster) -> Option<(bool, u64)> {
    let row = standby.sql(&format!(
        "SELECT synced::text || ' ' || confirmed_flush_lsn FROM pg_replication_slots \
         WHERE slot_name = '{SLOT}'"
    ));
    let (synced, flushed) = row.trim().split_once(' ')?;
    Some((synced == "true", lsn(flushed)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_slot_is_resumed_on_the_promoted_standby_without_a_rebuild() {
    let rig = rig_on(PgInstall::primary_with_failover_slots(), true).await;
    let failover = rig.primary.sql(&format!(
        "SELECT failover FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
    ));
    assert_eq!(failover.trim(), "t", "the slot is created with failover");

    // A standby that synchronizes the slot; the primary sends the slot's consumer nothing
    // the standby has not received (`synchronized_standby_slots`, set by the rig).
    let dir = TestDir::new(&rig.install);
    let standby = standby_of(&rig, &dir, true);

    let mut following = follow(&rig);
    rig.primary
        .sql("INSERT INTO notes VALUES ('a1', 'u1', 'before the failover')");
    following.sync_point(&rig.primary).await;
    let applied = rig.store.read(|v| v.checkpoint()).unwrap().lsn;
    testkit::wait_until(
        "the standby's copy of the slot at the applied position",
        || standby_slot(&standby).filter(|(synced, flushed)| *synced && *flushed >= applied),
    );
    // Written while the promotion happens: the stream may or may not have it yet.
    rig.primary
        .sql("UPDATE notes SET body = 'during the failover' WHERE id = 'n4'");
    wait_replayed(&rig, &standby);
    let slots_before = rig.store.read(|v| v.checkpoint()).unwrap();
    fail_over_to(&rig, &standby);

    standby.sql("INSERT INTO notes VALUES ('a2', 'u1', 'after the failover')");
    standby.sql("UPDATE notes SET body = 'changed after the failover' WHERE id = 'n5'");
    following.sync_point(&standby).await;
    assert_matches(
        &rig,
        &standby,
        "the same slot resumed on the promoted standby",
    )
    .await;
    let (synced, _) = standby_slot(&standby).expect("the slot is on the promoted standby");
    assert!(synced, "the slot the standby synchronized, not a new one");
    assert!(!following
        .progress
        .rebuilding
        .load(std::sync::atomic::Ordering::Relaxed));
    assert!(
        following.progress.last_rebuild.lock().is_none(),
        "no rebuild"
    );
    let after = rig.store.read(|v| v.checkpoint()).unwrap();
    assert!(after.lsn > slots_before.lsn);
    println!(
        "failover: resumed the synchronized slot on the promoted standby; checkpoint \
         {:X} before, {:X} after",
        slots_before.lsn, after.lsn
    );
}

/// A promotion that came before the standby synchronized the slot (here a standby that
/// does not synchronize slots at all): the stream rebuilds from a new slot on the promoted
/// server, as without `slot_failover`, and the reason it gives says the slot had not been
/// synchronized and what to check before a promotion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_before_the_slot_was_synchronized_rebuilds_and_says_why() {
    let rig = rig_on(PgInstall::primary_with_failover_slots(), true).await;
    let dir = TestDir::new(&rig.install);
    let standby = standby_of(&rig, &dir, false);
    let mut following = follow(&rig);
    rig.primary
        .sql("INSERT INTO notes VALUES ('a1', 'u1', 'before the failover')");
    following.sync_point(&rig.primary).await;
    wait_replayed(&rig, &standby);
    fail_over_to(&rig, &standby);

    standby.sql("INSERT INTO notes VALUES ('a2', 'u1', 'after the failover')");
    following.sync_point(&standby).await;
    assert_matches(&rig, &standby, "the rebuild on the promoted standby").await;
    let done = following
        .progress
        .last_rebuild
        .lock()
        .clone()
        .expect("the store was rebuilt from a new slot");
    assert!(
        done.why.contains("PSM_R2005") && done.why.contains("had not synchronized the slot"),
        "{}",
        done.why
    );
}

/// `slot_failover` set after the slot was made without failover: the next stream setup
/// makes it a failover slot, which the standby then synchronizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_made_before_slot_failover_was_set_becomes_a_failover_slot() {
    let mut rig = rig_on(PgInstall::primary_with_failover_slots(), false).await;
    let failover = |rig: &Rig| {
        rig.primary.sql(&format!(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
        ))
    };
    assert_eq!(failover(&rig).trim(), "f", "made without failover");
    rig.primary
        .sql("SELECT pg_create_physical_replication_slot('standby_phys')");
    rig.primary
        .sql("ALTER SYSTEM SET synchronized_standby_slots = 'standby_phys'");
    rig.primary.sql("SELECT pg_reload_conf()");
    let dir = TestDir::new(&rig.install);
    let standby = standby_of(&rig, &dir, true);
    rig.slot_failover = true;
    let mut following = follow(&rig);
    rig.primary
        .sql("INSERT INTO notes VALUES ('a1', 'u1', 'after slot_failover was set')");
    following.sync_point(&rig.primary).await;
    assert_eq!(failover(&rig).trim(), "t", "made a failover slot");
    testkit::wait_until("the standby's synchronized copy of the slot", || {
        standby_slot(&standby).filter(|(synced, _)| *synced)
    });
    assert_matches(&rig, &rig.primary, "streaming on from the altered slot").await;
}

/// The error a bootstrap with `slot_failover` on `install`'s primary (with
/// `extra_conf`) ends with; no slot is made.
async fn refused_failover(install: PgInstall, extra_conf: &[String]) -> String {
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(
        &install,
        &dir,
        "primary",
        testkit::ClusterKind::Primary,
        extra_conf,
    );
    primary.sql(
        "CREATE TABLE notes (id text PRIMARY KEY, owner text NOT NULL, body text);
         CREATE PUBLICATION powersync FOR TABLE notes;",
    );
    let mut connection = config::SourceConnection::from_uri(&primary.uri("postgres")).unwrap();
    connection.slot_failover = true;
    let plan = replication::SourcePlan {
        connection,
        slot: SLOT.into(),
    };
    let store_dir = tempfile::tempdir().unwrap();
    let store = Arc::new(store::Store::open(&store_dir.path().join("store")).unwrap());
    let rules = Arc::new(
        rules::SyncRules::parse(
            "bucket_definitions:\n  all:\n    data:\n      - SELECT * FROM notes\n",
        )
        .unwrap(),
    );
    let err = bootstrap(&plan, rules, store, Arc::new(Progress::default()))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(err.needs_operator(), "{text}");
    let slots = primary.sql("SELECT count(*) FROM pg_replication_slots");
    assert_eq!(slots.trim(), "0", "no slot was made: {text}");
    text
}

/// `slot_failover` on a primary without failover slots is refused before a slot is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_failover_on_a_primary_older_than_17_is_refused() {
    let text = refused_failover(PgInstall::pg16(), &[]).await;
    assert!(
        text.contains("PSM_R1016") && text.contains("came with 17"),
        "{text}"
    );
}

/// `slot_failover` where the primary would send changes no standby has received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_failover_without_synchronized_standby_slots_is_refused() {
    let text = refused_failover(PgInstall::primary_with_failover_slots(), &[]).await;
    assert!(
        text.contains("PSM_R1017") && text.contains("synchronized_standby_slots"),
        "{text}"
    );
}
