//! The snapshot pipeline: COPY bytes arrive on the async side; evaluator threads (two or
//! more, sharing one queue) decode rows and evaluate them against the rules; one thread
//! writes batches into MDBX. Bounded channels between them keep memory flat and let the
//! stages overlap. Rows may reach the writer in any order: op ids follow the writer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use bytes::Bytes;

use super::toast::stash_for;
use super::{BootstrapIntent, Progress, ReplicationError};
use crate::rules::{PgType, RowEvaluation, SourceColumn, SourceRow, SyncRules};
use crate::source::{ColumnMeta, CopyFields};
use crate::store::{encode_values, identity_key, PreparedRow, Store};

/// Rows per MDBX write transaction during the snapshot.
const BATCH_ROWS: usize = 2048;
/// Row chunks buffered between COPY and the evaluator.
const EVAL_QUEUE: usize = 16;
/// Batches buffered between the evaluators and the writer.
const WRITE_QUEUE: usize = 2;
/// At most this many evaluator threads (at least two: the writer is the only other
/// thread, so one evaluator would leave a core idle while it waits).
const MAX_EVALUATORS: usize = 4;

/// What the evaluator needs to know about a table.
pub(super) struct TableJob {
    pub id: u32,
    pub schema: String,
    pub name: String,
    pub columns: Vec<ColumnMeta>,
    /// Indices (into `columns`) of the replica identity.
    pub identity: Vec<usize>,
}

pub(super) enum EvalMsg {
    /// Rows of table `table` (index into the jobs), one line each.
    Rows(usize, Vec<Bytes>),
    /// Every table is copied: the evaluator that takes it flushes and stops. One is sent
    /// per evaluator ([`Pipeline::finish`]).
    Finish(Arc<BootstrapIntent>),
}

enum WriteMsg {
    Batch(Vec<PreparedRow>),
    /// One evaluator flushed everything it took; the snapshot is complete when every
    /// evaluator said so.
    Done(Arc<BootstrapIntent>),
}

/// A pipeline thread and what it ends with.
type Stage = JoinHandle<Result<(), ReplicationError>>;

/// Dropping it (on cancellation) closes the input and waits for every thread, so no
/// writer outlives the bootstrap that started it.
pub(super) struct Pipeline {
    pub input: tokio::sync::mpsc::Sender<EvalMsg>,
    evaluators: Vec<Stage>,
    writer: Option<Stage>,
}

impl Pipeline {
    pub fn start(
        rules: Arc<SyncRules>,
        jobs: Vec<TableJob>,
        store: Arc<Store>,
        progress: Arc<Progress>,
    ) -> std::io::Result<Self> {
        let count = std::thread::available_parallelism()
            .map_or(2, usize::from)
            .clamp(2, MAX_EVALUATORS);
        let (input, eval_rx) = tokio::sync::mpsc::channel(EVAL_QUEUE);
        let (write_tx, write_rx) = sync_channel(WRITE_QUEUE);
        let writer = std::thread::Builder::new()
            .name("psm-snapshot-write".into())
            .spawn({
                let store = store.clone();
                move || write_loop(&store, write_rx, count, &progress)
            })?;
        let mut pipeline = Self {
            input,
            evaluators: Vec::with_capacity(count),
            writer: Some(writer),
        };
        let shared = Arc::new(SharedInput {
            rows: Mutex::new(eval_rx),
            failed: AtomicBool::new(false),
        });
        let jobs = Arc::new(jobs);
        for n in 0..count {
            let (rules, jobs, shared, output, store) = (
                rules.clone(),
                jobs.clone(),
                shared.clone(),
                write_tx.clone(),
                store.clone(),
            );
            let evaluator = std::thread::Builder::new()
                .name(format!("psm-snapshot-eval{n}"))
                .spawn(move || {
                    let result = eval_loop(&rules, &jobs, &store, &shared, output);
                    if result.is_err() {
                        shared.failed.store(true, Ordering::Relaxed);
                    }
                    result
                })?;
            pipeline.evaluators.push(evaluator);
        }
        Ok(pipeline)
    }

    /// Tells every evaluator that all rows were sent; the writer then completes the
    /// snapshot with `intent`. False when the pipeline already stopped.
    pub async fn finish(&self, intent: BootstrapIntent) -> bool {
        let intent = Arc::new(intent);
        for _ in 0..self.evaluators.len() {
            if self
                .input
                .send(EvalMsg::Finish(intent.clone()))
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }

    /// Waits for every thread (after `finish`, or after the input was dropped) and
    /// returns the first error.
    pub fn join(mut self) -> Result<(), ReplicationError> {
        self.join_threads()
    }

    fn join_threads(&mut self) -> Result<(), ReplicationError> {
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        // Closing the input ends the evaluators, which ends the writer.
        let (closed, _) = tokio::sync::mpsc::channel(1);
        drop(std::mem::replace(&mut self.input, closed));
        let mut evaluated = Ok(());
        for evaluator in self.evaluators.drain(..) {
            let result = evaluator
                .join()
                .unwrap_or_else(|_| Err(panicked("evaluator")));
            evaluated = evaluated.and(result);
        }
        let written = writer.join().unwrap_or_else(|_| Err(panicked("writer")));
        // A writer error is the cause when both failed (an evaluator then saw a closed channel).
        written.and(evaluated)
    }
}

/// The queue the evaluators share, and whether one of them failed (the others then stop
/// instead of evaluating rows that will never be written).
struct SharedInput {
    rows: Mutex<tokio::sync::mpsc::Receiver<EvalMsg>>,
    failed: AtomicBool,
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let _ = self.join_threads();
    }
}

fn panicked(which: &str) -> ReplicationError {
    ReplicationError::Copy {
        table: "-".into(),
        problem: format!("the snapshot {which} thread panicked (a bug)"),
    }
}

fn eval_loop(
    rules: &SyncRules,
    jobs: &[TableJob],
    store: &Store,
    input: &SharedInput,
    output: SyncSender<WriteMsg>,
) -> Result<(), ReplicationError> {
    let mut decoders: Vec<CopyFields> = jobs
        .iter()
        .map(|j| CopyFields::new(j.columns.len()))
        .collect();
    let types: Vec<Vec<PgType>> = jobs
        .iter()
        .map(|j| {
            j.columns
                .iter()
                .map(|c| PgType {
                    oid: c.type_oid,
                    element: c.element_oid.or(PgType::from_oid(c.type_oid).element),
                })
                .collect()
        })
        .collect();
    let plans: Vec<_> = jobs
        .iter()
        .map(|j| {
            rules.plan_for(&j.schema, &j.name).map(|plan| {
                let binding = plan.bind(j.columns.iter().map(|c| c.name.as_str()));
                (plan, binding)
            })
        })
        .collect();
    let mut batch = Vec::with_capacity(BATCH_ROWS);
    loop {
        // One evaluator waits on the queue while the others work; the lock is only held
        // for the wait.
        let next = input.rows.lock().blocking_recv();
        let Some(msg) = next else { return Ok(()) };
        if input.failed.load(Ordering::Relaxed) {
            return Ok(()); // another evaluator failed; its error is reported
        }
        match msg {
            EvalMsg::Rows(index, lines) => {
                let (Some(job), Some(decoder), Some(types), Some(plan)) = (
                    jobs.get(index),
                    decoders.get_mut(index),
                    types.get(index),
                    plans.get(index),
                ) else {
                    return Err(panicked("evaluator (rows of an unknown table)"));
                };
                for line in &lines {
                    let line = line.strip_suffix(b"\n").unwrap_or(line);
                    let fields = decoder.decode(line).map_err(|e| ReplicationError::Copy {
                        table: format!("{}.{}", job.schema, job.name),
                        problem: e.to_string(),
                    })?;
                    let columns: Vec<SourceColumn<'_>> = job
                        .columns
                        .iter()
                        .zip(types)
                        .enumerate()
                        .map(|(i, (c, t))| SourceColumn {
                            name: &c.name,
                            pg_type: *t,
                            value: fields.get(i),
                        })
                        .collect();
                    let row = SourceRow {
                        schema: &job.schema,
                        table: &job.name,
                        columns: &columns,
                    };
                    let eval = match plan {
                        Some((plan, binding)) => plan.evaluate_bound(binding, &row)?,
                        None => RowEvaluation::default(),
                    };
                    if eval.buckets.is_empty() && eval.lookups.is_empty() {
                        continue;
                    }
                    let identity = identity_key(job.identity.iter().map(|&i| fields.get(i)));
                    let lookups = eval
                        .lookups
                        .iter()
                        .map(|l| (l.key.encode().into_bytes(), encode_values(&l.outputs)))
                        .collect();
                    let stash = stash_for(&job.columns, |i| fields.get(i), false);
                    let row = PreparedRow::new(job.id, identity, eval.buckets, lookups, stash)
                        .ok_or_else(|| ReplicationError::Copy {
                            table: format!("{}.{}", job.schema, job.name),
                            problem: "a row with more than 255 distinct outputs".into(),
                        })?;
                    batch.push(row);
                    if batch.len() >= BATCH_ROWS {
                        let mut full =
                            std::mem::replace(&mut batch, Vec::with_capacity(BATCH_ROWS));
                        store.pack_rows(&mut full);
                        if output.send(WriteMsg::Batch(full)).is_err() {
                            return Ok(()); // the writer failed; its error is reported
                        }
                    }
                }
            }
            EvalMsg::Finish(intent) => {
                store.pack_rows(&mut batch);
                let _ = output.send(WriteMsg::Batch(std::mem::take(&mut batch)));
                let _ = output.send(WriteMsg::Done(intent));
                return Ok(());
            }
        }
    }
}

/// Writes batches until every one of `evaluators` is done, then commits the completion
/// record. When an evaluator stops without being done (an error, or cancellation), the
/// channel closes early and the snapshot stays incomplete.
fn write_loop(
    store: &Store,
    input: Receiver<WriteMsg>,
    evaluators: usize,
    progress: &Progress,
) -> Result<(), ReplicationError> {
    let mut done = 0;
    while let Ok(msg) = input.recv() {
        match msg {
            WriteMsg::Batch(rows) => {
                if rows.is_empty() {
                    continue;
                }
                let count = rows.len() as u64;
                store.write_unsynced(0, |w| {
                    for row in rows {
                        w.insert_prepared(row)?;
                    }
                    Ok(())
                })?;
                progress.add_rows(count);
            }
            WriteMsg::Done(intent) => {
                done += 1;
                if done < evaluators {
                    continue;
                }
                let mut intent = BootstrapIntent::clone(&intent);
                intent.rows = progress.rows();
                let lsn = intent.consistent_point.unwrap_or(0);
                let encoded = intent.encode()?;
                store.write(lsn, |w| BootstrapIntent::save(&encoded, w))?;
                return Ok(());
            }
        }
    }
    Ok(())
}
