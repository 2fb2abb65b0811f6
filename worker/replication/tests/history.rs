//! Live test: a store's op history is a function of the source transactions alone. Two
//! stores follow one primary through slots of their own; one of them stops and starts again
//! in the middle of a run of updates and then receives the rest at once (fewer, larger
//! commits), the other commits them one by one. At the end both hold the same ops, op for
//! op: op ids, kinds, checksums and compaction.
use std::sync::Arc;

use store::{OpKind, Store};

use crate::streaming::{bootstrapped_on, start_streaming_on, Rig};

const SCHEMA: &str = "
CREATE TABLE items (id integer PRIMARY KEY, v integer);
CREATE PUBLICATION powersync FOR TABLE items;
INSERT INTO items SELECT g, 0 FROM generate_series(1, 100) g;
";

const RULES: &str = "
bucket_definitions:
  items:
    data:
      - SELECT * FROM items
";

/// Updates of every row: each supersedes 100 ops, so compaction (due at 1,024) falls
/// inside the second half of them.
const UPDATES_PER_HALF: usize = 6;
const UPDATE: &str = "UPDATE items SET v = v + 1";

/// Every op of every bucket, in order: (bucket, op id, kind, checksum).
fn history(store: &Store) -> Vec<(String, u64, OpKind, u32)> {
    store
        .read(|view| {
            let mut ops = Vec::new();
            for (name, state) in view.bucket_states()? {
                for op in view.ops(state.id, 0, u64::MAX, usize::MAX)?.ops {
                    ops.push((name.clone(), op.op_id, op.kind, op.checksum));
                }
            }
            Ok(ops)
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_hold_one_history_whatever_their_restarts_and_commits() {
    let rig = Rig::with(SCHEMA, RULES);
    let (plan_a, plan_b) = (rig.plan_on("psm_history_a"), rig.plan_on("psm_history_b"));
    let a: Arc<Store> = bootstrapped_on(&rig, rig.open_store_in("a"), plan_a.clone()).await;
    let b: Arc<Store> = bootstrapped_on(&rig, rig.open_store_in("b"), plan_b.clone()).await;
    assert_eq!(history(&a), history(&b), "the snapshots differ");

    let mut stream_a = start_streaming_on(&rig, &a, plan_a.clone());
    let mut stream_b = start_streaming_on(&rig, &b, plan_b);
    for _ in 0..UPDATES_PER_HALF {
        rig.primary.sql(UPDATE);
    }
    stream_a.sync_point(&rig.primary).await;
    stream_b.sync_point(&rig.primary).await;

    // A stops; B commits each of the next updates on its own; A, started again, receives
    // them all at once.
    stream_a.stop().await.unwrap();
    for _ in 0..UPDATES_PER_HALF {
        rig.primary.sql(UPDATE);
        stream_b.sync_point(&rig.primary).await;
    }
    let mut stream_a = start_streaming_on(&rig, &a, plan_a);
    let at_a = stream_a.sync_point(&rig.primary).await;
    let at_b = stream_b.sync_point(&rig.primary).await;

    let (history_a, history_b) = (history(&a), history(&b));
    assert!(
        history_a == history_b,
        "the stores' histories differ:\nA (restarted): {:?}\nB: {:?}",
        summary(&history_a),
        summary(&history_b)
    );
    assert_eq!(at_a.op_id, at_b.op_id);
    assert!(
        history_a.iter().any(|op| op.2 == OpKind::Clear),
        "no bucket was compacted, so the test shows nothing about compaction"
    );
    stream_a.stop().await.unwrap();
    stream_b.stop().await.unwrap();
}

/// Kinds and op ids in runs (`PUT×100 1..100`), short enough for a failure message.
fn summary(ops: &[(String, u64, OpKind, u32)]) -> Vec<String> {
    let mut runs: Vec<(OpKind, usize, u64, u64)> = Vec::new();
    for (_, id, kind, _) in ops {
        match runs.last_mut() {
            Some((k, n, _, last)) if k == kind => {
                *n += 1;
                *last = *id;
            }
            _ => runs.push((*kind, 1, *id, *id)),
        }
    }
    runs.iter()
        .map(|(k, n, first, last)| format!("{k:?}×{n} {first}..{last}"))
        .collect()
}
