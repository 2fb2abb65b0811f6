//! The snapshot pipeline's ordering and stopping, without PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::cost::{complete_intent, task_columns};
use super::{Pipeline, TableJob};
use crate::error::ReplicationError;
use crate::intent::BootstrapIntent;
use crate::progress::Progress;
use rules::SyncRules;
use store::Store;

const CHUNKS: usize = 40;
const CHUNK_ROWS: usize = 100;

fn rules() -> Arc<SyncRules> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../e2e/fixture/sync-config.yaml"
    );
    Arc::new(SyncRules::parse(&std::fs::read_to_string(path).unwrap()).unwrap())
}

fn line(i: usize) -> Bytes {
    Bytes::from(format!(
        "task-{i:05}\torg-1\tproject-{}\tuser-1\tTask {i}\ttodo\t1\tuser-2\t3\t2026-01-01 00:00:00+00\tsummary {i}\n",
        i % 7
    ))
}

fn job() -> TableJob {
    TableJob {
        id: 1,
        schema: "public".into(),
        name: "tasks".into(),
        columns: task_columns(),
        identity: vec![0],
    }
}

/// Sends `chunks` through a pipeline into `store`; returns what joining it gave.
fn run(store: &Arc<Store>, chunks: Vec<Vec<Bytes>>) -> Result<(), ReplicationError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut pipeline = Pipeline::start(
        rules(),
        vec![job()],
        store.clone(),
        Arc::new(Progress::default()),
    )
    .unwrap();
    runtime.block_on(async {
        let send = async {
            for chunk in chunks {
                if !pipeline.send_rows(0, chunk).await {
                    return;
                }
            }
            pipeline.finish(complete_intent()).await;
        };
        tokio::time::timeout(Duration::from_secs(60), send)
            .await
            .expect("the pipeline stopped taking chunks without saying so");
    });
    pipeline.join()
}

/// Rows reach the store in COPY order, whichever evaluator took their chunk, and the
/// completion record is written with every row counted.
#[test]
fn rows_are_written_in_copy_order_and_the_snapshot_completes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("store")).unwrap());
    let chunks = (0..CHUNKS)
        .map(|c| (0..CHUNK_ROWS).map(|r| line(c * CHUNK_ROWS + r)).collect())
        .collect();
    run(&store, chunks).unwrap();
    let (ids, intent) = store
        .read(|r| {
            let state = r.bucket("1#tasks|0[]")?.unwrap();
            let page = r.ops(state.id, 0, u64::MAX, usize::MAX)?;
            let ids: Vec<String> = page
                .ops
                .into_iter()
                .map(|o| o.object.unwrap().object_id)
                .collect();
            Ok((ids, BootstrapIntent::load(r).expect("a readable intent")))
        })
        .unwrap();
    let expected: Vec<String> = (0..CHUNKS * CHUNK_ROWS)
        .map(|i| format!("task-{i:05}"))
        .collect();
    assert_eq!(ids, expected);
    let intent = intent.unwrap();
    assert_eq!(intent.rows, (CHUNKS * CHUNK_ROWS) as u64);
}

/// A row that cannot be decoded stops the pipeline with its error; nothing hangs and
/// the snapshot is not marked complete.
#[test]
fn a_bad_row_stops_the_snapshot_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("store")).unwrap());
    let chunks = (0..CHUNKS)
        .map(|c| {
            (0..CHUNK_ROWS)
                .map(|r| {
                    if c == 17 && r == 50 {
                        Bytes::from_static(b"only\ttwo fields\n")
                    } else {
                        line(c * CHUNK_ROWS + r)
                    }
                })
                .collect()
        })
        .collect();
    let err = run(&store, chunks).unwrap_err().to_string();
    assert!(
        err.contains("public.tasks") && err.contains("fields"),
        "{err}"
    );
    let intent = store
        .read(|r| Ok(BootstrapIntent::load(r).expect("a readable intent")))
        .unwrap();
    assert!(
        intent.is_none(),
        "an incomplete snapshot was marked complete"
    );
}
