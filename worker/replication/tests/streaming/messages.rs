//! Logical messages outside transactions: this service's own (write-checkpoint notes,
//! sync points) share store commits with what is queued beside them; other tools'
//! messages cost no store commit each, yet the slot's confirmed position passes them.

use super::*;

/// Messages emitted together in one statement.
const MESSAGES: u32 = 2_000;

/// The slot's confirmed flush position.
fn confirmed_flush(primary: &Cluster) -> u64 {
    primary
        .sql(&format!(
            "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = \
             '{SLOT}'"
        ))
        .parse()
        .unwrap()
}

/// Waits until the slot confirmed everything up to `lsn`, while the stream runs.
async fn until_confirmed(primary: &Cluster, streaming: &mut Streaming, lsn: u64) {
    let mut waiting = Waiting::new(format!("the slot to confirm {lsn:X}"));
    loop {
        let confirmed = confirmed_flush(primary);
        if confirmed >= lsn {
            return;
        }
        assert!(!streaming.task.is_finished(), "the stream ended");
        waiting.progress((confirmed, streaming.progress.activity()));
        tokio::time::sleep(POLL).await;
    }
}

/// A heartbeat tool's (or another service's) messages on the primary: the stream moves
/// past them without a durable store commit per message, the slot confirms them (the
/// primary keeps no WAL for them), and a restart resumes from the store (the slot is
/// never ahead of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tools_messages_cost_no_store_commit_each() {
    let rig = Rig::new();
    // The stream tells the primary what it flushed as frames arrive: on an idle primary,
    // at its keepalives, every half `wal_sender_timeout`.
    rig.primary
        .sql("ALTER SYSTEM SET wal_sender_timeout = '4s'");
    rig.primary.sql("SELECT pg_reload_conf()");
    let store = bootstrapped(&rig).await;
    let mut streaming = start_streaming(&rig, &store);
    let p = &rig.primary;
    streaming.sync_point(p).await;
    let syncs = store.syncs();
    let last: u64 = p
        .sql(&format!(
            "SELECT max(pg_logical_emit_message(false, 'heartbeat', 'beat ' || g) - '0/0') \
             FROM generate_series(1, {MESSAGES}) g"
        ))
        .parse()
        .unwrap();
    until_confirmed(p, &mut streaming, last).await;
    let syncs = store.syncs() - syncs;
    assert!(
        syncs <= 5,
        "{MESSAGES} messages of another prefix took {syncs} durable store commits"
    );
    // A transaction after them is applied as usual, and a restart resumes.
    p.sql("INSERT INTO todos VALUES ('after', 'l1', 'after the beats', 'open')");
    streaming.sync_point(p).await;
    streaming.stop().await.unwrap();
    p.sql("SELECT pg_logical_emit_message(false, 'heartbeat', 'while stopped')");
    let mut streaming = start_streaming(&rig, &store);
    streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "messages of another prefix and a restart").await;
    streaming.stop().await.unwrap();
}

/// A fleet's write checkpoints: notes of this service queued together are recorded in
/// a few store commits, every one of them, and the checkpoint passes each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_checkpoint_notes_queued_together_share_store_commits() {
    let rig = Rig::new();
    let store = bootstrapped(&rig).await;
    let mut streaming = start_streaming(&rig, &store);
    let p = &rig.primary;
    streaming.sync_point(p).await;
    let syncs = store.syncs();
    let asked = lsn(&p.sql("SELECT pg_current_wal_lsn()"));
    p.sql(&format!(
        "SELECT pg_logical_emit_message(false, 'powersync', \
           'write-checkpoint write_checkpoint/' || lpad(to_hex(g), 64, '0') || ' {asked}') \
         FROM generate_series(1, {MESSAGES}) g"
    ));
    let checkpoint = streaming.sync_point(p).await;
    let syncs = store.syncs() - syncs;
    assert!(
        syncs * 20 <= u64::from(MESSAGES),
        "{MESSAGES} write-checkpoint notes took {syncs} durable store commits"
    );
    assert!(checkpoint.lsn >= asked);
    let recorded = store
        .read(|v| v.stage_records(store::WRITE_CHECKPOINT_PREFIX))
        .unwrap();
    assert_eq!(recorded.len(), MESSAGES as usize, "every note recorded");
    assert!(recorded.iter().all(|(_, record)| {
        store::WriteCheckpointRecord::decode(record).is_some_and(|r| r.lsn == asked)
    }));
    streaming.stop().await.unwrap();
}

/// Transactions, this service's notes and other tools' messages interleaved share store
/// commits in their order: every row is applied, every note recorded with the position
/// asked, and the published checkpoints only move forward.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_and_messages_interleaved_keep_their_order() {
    let rig = Rig::new();
    let store = bootstrapped(&rig).await;
    let mut streaming = start_streaming(&rig, &store);
    let p = &rig.primary;
    streaming.sync_point(p).await;
    let mut checkpoints = streaming.checkpoints.clone();
    let watched = tokio::spawn(async move {
        let mut seen = vec![*checkpoints.borrow_and_update()];
        while checkpoints.changed().await.is_ok() {
            seen.push(*checkpoints.borrow_and_update());
        }
        seen
    });
    p.sql(
        "DO $$ BEGIN FOR i IN 1..300 LOOP \
           INSERT INTO todos VALUES ('mixed' || i, 'l' || (i % 3), 'mixed', 'open'); \
           COMMIT; \
           PERFORM pg_logical_emit_message(false, 'heartbeat', 'beat ' || i); \
           PERFORM pg_logical_emit_message(false, 'powersync', \
             'write-checkpoint write_checkpoint/' || lpad(to_hex(i), 64, '0') || ' ' || \
             (pg_current_wal_insert_lsn() - '0/0')); \
           UPDATE todos SET title = 'mixed ' || i WHERE id = 'mixed' || (i / 2); \
           COMMIT; \
         END LOOP; END $$",
    );
    let last = streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "interleaved transactions and messages").await;
    let recorded = store
        .read(|v| v.stage_records(store::WRITE_CHECKPOINT_PREFIX))
        .unwrap();
    assert_eq!(recorded.len(), 300, "every note recorded");
    assert!(recorded.iter().all(|(_, record)| {
        store::WriteCheckpointRecord::decode(record).is_some_and(|r| r.lsn <= last.lsn)
    }));
    streaming.stop().await.unwrap();
    let seen = watched.await.unwrap();
    assert!(
        seen.windows(2)
            .all(|w| w[0].lsn <= w[1].lsn && w[0].op_id <= w[1].op_id),
        "published checkpoints went back: {seen:?}"
    );
}
