//! Row changes reaching the buckets: every kind of change, write-checkpoint notes of
//! another replica, small transactions sharing store commits, a large transaction
//! interrupted by a restart.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_checkpoint_asked_of_another_replica_is_recorded_here_too() {
    let rig = Rig::new();
    let store = bootstrapped(&rig).await;
    let mut streaming = start_streaming(&rig, &store);
    streaming.sync_point(&rig.primary).await;
    // What another replica's /write-checkpoint2.json writes into the WAL behind its answer.
    let key = format!("write_checkpoint/{}", "ab".repeat(32));
    let asked = lsn(&rig.primary.sql("SELECT pg_current_wal_lsn()"));
    let bootstrap_before = store.read(|v| v.stage_record("bootstrap")).unwrap();
    rig.primary.sql(&format!(
        "SELECT pg_logical_emit_message(false, 'powersync', 'write-checkpoint {key} {asked}'), \
                pg_logical_emit_message(false, 'powersync', 'write-checkpoint bootstrap 1')"
    ));
    streaming.sync_point(&rig.primary).await;
    let stored_lsn = || {
        store
            .read(|v| v.stage_record(&key))
            .unwrap()
            .and_then(|v| store::WriteCheckpointRecord::decode(&v))
            .map(|r| r.lsn)
    };
    assert_eq!(stored_lsn(), Some(asked));
    assert_eq!(
        store.read(|v| v.stage_record("bootstrap")).unwrap(),
        bootstrap_before,
        "a message naming another record changes nothing"
    );
    // An older request of the same key does not replace a later one.
    rig.primary.sql(&format!(
        "SELECT pg_logical_emit_message(false, 'powersync', 'write-checkpoint {key} 1')"
    ));
    streaming.sync_point(&rig.primary).await;
    assert_eq!(stored_lsn(), Some(asked));
    streaming.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_reaches_the_buckets() {
    let rig = Rig::new();
    let store = bootstrapped(&rig).await;
    assert_matches_primary(&rig, &store, "the snapshot").await;
    let mut streaming = start_streaming(&rig, &store);
    let p = &rig.primary;

    // Inserts, an update moving a row to another list's bucket, a status change, deletes.
    p.sql("INSERT INTO todos VALUES ('t4', 'l2', 'four', 'open'), ('t5', NULL, 'five', NULL)");
    p.sql("UPDATE todos SET list_id = 'l2' WHERE id = 't1'");
    p.sql("UPDATE todos SET status = 'done', title = 'three!' WHERE id = 't3'");
    p.sql("DELETE FROM todos WHERE id = 't2'");
    let first = streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "inserts, updates and deletes").await;

    // A primary key update (the row keeps its subkey) and a transaction of many rows.
    p.sql("UPDATE todos SET id = 't4b' WHERE id = 't4'");
    p.sql(
        "INSERT INTO todos SELECT 'bulk' || g, CASE WHEN g % 2 = 0 THEN 'l1' ELSE 'l2' END, \
         'bulk', 'open' FROM generate_series(1, 5000) g",
    );
    p.sql("UPDATE todos SET status = 'done' WHERE id LIKE 'bulk%' AND id LIKE '%7'");
    streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "a key update and a bulk transaction").await;

    // Full-table update rounds: superseded history is CLEAR-compacted, storage stays flat.
    for _ in 0..3 {
        p.sql("UPDATE todos SET title = title || '!'");
    }
    streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "full-table update rounds").await;
    let (count, live) = store
        .read(|v| {
            let state = v.bucket("1#by_list[\"l1\"]")?.unwrap();
            let cp = v.checkpoint()?.op_id;
            let ops = v.ops(state.id, 0, cp, usize::MAX)?.ops;
            assert_eq!(ops.len() as u64, state.count);
            let live = ops.iter().filter(|o| o.kind == OpKind::Put).count() as u64;
            assert_eq!(ops[0].kind, OpKind::Clear);
            Ok((state.count, live))
        })
        .unwrap();
    assert_eq!(count, live + 1, "one CLEAR, then the live rows");

    // A TOASTed value left unchanged by an update; then changed.
    p.sql("INSERT INTO docs SELECT 2, 'big', string_agg(md5(g::text), '') FROM generate_series(1, 400) g");
    p.sql("UPDATE docs SET title = 'big, renamed' WHERE id = 2");
    streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "an unchanged TOAST value").await;
    p.sql("UPDATE docs SET body = 'short now' WHERE id = 2");
    p.sql("UPDATE docs SET title = 'again' WHERE id = 2");
    streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "a TOAST value replaced").await;

    // REPLICA IDENTITY FULL: an update (the identity is the whole row) and a delete.
    p.sql("UPDATE notes SET note = 'changed' WHERE note = 'first'");
    p.sql("DELETE FROM notes WHERE note = 'second'");
    streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "FULL identity changes").await;

    // Parameter rows: a list changes owner, a list is added, one is deleted.
    p.sql("UPDATE lists SET owner_id = 'u2' WHERE id = 'l1'");
    p.sql("INSERT INTO lists VALUES ('l3', 'u3')");
    p.sql("DELETE FROM lists WHERE id = 'l2'");
    streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "parameter rows").await;

    // TRUNCATE across tables in one statement.
    p.sql("TRUNCATE todos, notes");
    let last = streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "TRUNCATE").await;
    assert!(last.op_id > first.op_id);

    // Restart: nothing is applied twice, nothing lost.
    streaming.stop().await.unwrap();
    p.sql("INSERT INTO todos VALUES ('t9', 'l1', 'while stopped', 'open')");
    let mut streaming = start_streaming(&rig, &store);
    streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "a restart").await;
    streaming.stop().await.unwrap();
}

/// Single-row transactions a millisecond apart share store commits: a commit that would
/// follow the last one within the group window waits that long for the transactions after
/// it, instead of paying a durable commit (page writes and sync) per transaction (the
/// window widened here to 50 ms, so that a slow machine groups them too). Every one is
/// applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_transactions_in_quick_succession_share_store_commits() {
    use std::sync::atomic::Ordering::Relaxed;
    let rig = Rig::new();
    let store = bootstrapped(&rig).await;
    let mut streaming = start_streaming_with(&rig, &store, rig.plan(), Duration::from_millis(50));
    let p = &rig.primary;
    streaming.sync_point(p).await;
    let counted = |s: &Streaming| {
        (
            s.progress.transactions.load(Relaxed),
            s.progress.transaction_commits.load(Relaxed),
        )
    };
    let (transactions_before, commits_before) = counted(&streaming);
    p.sql(
        "DO $$ BEGIN FOR i IN 1..200 LOOP \
           INSERT INTO todos VALUES ('quick' || i, 'l1', 'quick', 'open'); COMMIT; \
           PERFORM pg_sleep(0.001); \
         END LOOP; END $$",
    );
    streaming.sync_point(p).await;
    assert_matches_primary(&rig, &store, "200 transactions a millisecond apart").await;
    let (transactions, commits) = counted(&streaming);
    let (transactions, commits) = (transactions - transactions_before, commits - commits_before);
    assert_eq!(transactions, 200, "each source transaction applied once");
    assert!(
        commits * 4 <= transactions,
        "{transactions} transactions took {commits} store commits"
    );
    streaming.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_large_transaction_is_applied_once_after_restart() {
    let rig = Rig::new();
    let store = bootstrapped(&rig).await;
    let streaming = start_streaming(&rig, &store);
    rig.primary.sql(
        "INSERT INTO todos SELECT 'big' || g, 'l1', repeat('x', 50), 'open' \
         FROM generate_series(1, 200000) g",
    );
    let commit = lsn(&rig.primary.sql("SELECT pg_current_wal_lsn()"));
    // Stop once the applier wrote part of the transaction to its open store transaction:
    // it is abandoned whole.
    let mut waiting = Waiting::new("the applier inside the transaction");
    while streaming.progress.uncommitted.load(Relaxed) == 0 {
        assert!(!streaming.task.is_finished(), "the stream ended");
        waiting.progress(streaming.progress.activity());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    streaming.task.abort();
    let _ = streaming.task.await;
    let before = store.read(|v| v.checkpoint()).unwrap();
    assert!(
        before.lsn < commit,
        "the transaction was committed before the stop ({:X} >= {commit:X})",
        before.lsn
    );
    let mut streaming = start_streaming(&rig, &store);
    let after = streaming.sync_point(&rig.primary).await;
    assert!(after.op_id >= before.op_id);
    assert_matches_primary(&rig, &store, "a restart inside a large transaction").await;
    streaming.stop().await.unwrap();
}
