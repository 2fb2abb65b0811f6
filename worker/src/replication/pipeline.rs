//! The snapshot pipeline: COPY bytes arrive on the async side; one thread decodes and
//! evaluates rows against the rules; one thread writes batches into MDBX. Bounded
//! channels between them keep memory flat and let the three overlap.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;

use super::toast::stash_for;
use super::{BootstrapIntent, Progress, ReplicationError};
use crate::rules::{PgType, RowEvaluation, SourceColumn, SourceRow, SyncRules};
use crate::source::{ColumnMeta, CopyFields};
use crate::store::{encode_values, identity_key, LookupPut, RowPut, Stash, Store};

/// Rows per MDBX write transaction during the snapshot.
const BATCH_ROWS: usize = 2048;
/// Row chunks buffered between COPY and the evaluator.
const EVAL_QUEUE: usize = 16;
/// Batches buffered between the evaluator and the writer.
const WRITE_QUEUE: usize = 1;

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
    /// Every table is copied: flush and complete with this record.
    Finish(Box<BootstrapIntent>),
}

enum WriteMsg {
    Batch(Vec<EvaluatedRow>),
    Finish(Box<BootstrapIntent>),
}

struct EvaluatedRow {
    table_id: u32,
    identity: Vec<u8>,
    eval: RowEvaluation,
    lookups: Vec<(String, Vec<u8>)>,
    stash: Stash,
}

/// The two pipeline threads.
/// A pipeline thread and what it ends with.
type Stage = JoinHandle<Result<(), ReplicationError>>;

/// Dropping it (on cancellation) closes the input and waits for both threads, so no
/// writer outlives the bootstrap that started it.
pub(super) struct Pipeline {
    pub input: tokio::sync::mpsc::Sender<EvalMsg>,
    threads: Option<(Stage, Stage)>,
}

impl Pipeline {
    pub fn start(
        rules: Arc<SyncRules>,
        jobs: Vec<TableJob>,
        store: Arc<Store>,
        progress: Arc<Progress>,
    ) -> std::io::Result<Self> {
        let (input, eval_rx) = tokio::sync::mpsc::channel(EVAL_QUEUE);
        let (write_tx, write_rx) = sync_channel(WRITE_QUEUE);
        let writer = std::thread::Builder::new()
            .name("psm-snapshot-write".into())
            .spawn(move || write_loop(&store, write_rx, &progress))?;
        let evaluator = std::thread::Builder::new()
            .name("psm-snapshot-eval".into())
            .spawn(move || eval_loop(&rules, &jobs, eval_rx, write_tx))?;
        Ok(Self {
            input,
            threads: Some((evaluator, writer)),
        })
    }

    /// Waits for both threads (after `Finish`, or after the input was dropped) and
    /// returns the first error.
    pub fn join(mut self) -> Result<(), ReplicationError> {
        self.join_threads()
    }

    fn join_threads(&mut self) -> Result<(), ReplicationError> {
        let Some((evaluator, writer)) = self.threads.take() else {
            return Ok(());
        };
        // Closing the input ends the evaluator, which ends the writer.
        let (closed, _) = tokio::sync::mpsc::channel(1);
        drop(std::mem::replace(&mut self.input, closed));
        let evaluated = evaluator
            .join()
            .unwrap_or_else(|_| Err(panicked("evaluator")));
        let written = writer.join().unwrap_or_else(|_| Err(panicked("writer")));
        // A writer error is the cause when both failed (the evaluator then saw a closed channel).
        written.and(evaluated)
    }
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
    mut input: tokio::sync::mpsc::Receiver<EvalMsg>,
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
        .map(|j| rules.plan_for(&j.schema, &j.name))
        .collect();
    let mut batch = Vec::with_capacity(BATCH_ROWS);
    while let Some(msg) = input.blocking_recv() {
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
                        Some(plan) => plan.evaluate(&row)?,
                        None => RowEvaluation::default(),
                    };
                    if eval.buckets.is_empty() && eval.lookups.is_empty() {
                        continue;
                    }
                    let identity = identity_key(job.identity.iter().map(|&i| fields.get(i)));
                    let lookups = eval
                        .lookups
                        .iter()
                        .map(|l| (l.key.encode(), encode_values(&l.outputs)))
                        .collect();
                    let stash = stash_for(&job.columns, |i| fields.get(i), false);
                    batch.push(EvaluatedRow {
                        table_id: job.id,
                        identity,
                        eval,
                        lookups,
                        stash,
                    });
                    if batch.len() >= BATCH_ROWS {
                        let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH_ROWS));
                        if output.send(WriteMsg::Batch(full)).is_err() {
                            return Ok(()); // the writer failed; its error is reported
                        }
                    }
                }
            }
            EvalMsg::Finish(intent) => {
                let _ = output.send(WriteMsg::Batch(std::mem::take(&mut batch)));
                let _ = output.send(WriteMsg::Finish(intent));
                return Ok(());
            }
        }
    }
    Ok(())
}

fn write_loop(
    store: &Store,
    input: Receiver<WriteMsg>,
    progress: &Progress,
) -> Result<(), ReplicationError> {
    while let Ok(msg) = input.recv() {
        match msg {
            WriteMsg::Batch(rows) => {
                if rows.is_empty() {
                    continue;
                }
                let count = rows.len() as u64;
                store.write_unsynced(0, |w| {
                    for row in rows {
                        write_row(w, row)?;
                    }
                    Ok(())
                })?;
                progress.add_rows(count);
            }
            WriteMsg::Finish(mut intent) => {
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

fn write_row(
    w: &mut crate::store::WriteTxn<'_, '_>,
    row: EvaluatedRow,
) -> Result<(), crate::store::StoreError> {
    let puts: Vec<RowPut<'_>> = row.eval.buckets.iter().map(RowPut::from).collect();
    let lookups: Vec<LookupPut<'_>> = row
        .lookups
        .iter()
        .map(|(k, v)| LookupPut {
            key: k.as_bytes(),
            outputs: v,
        })
        .collect();
    w.insert_row_stashed(row.table_id, &row.identity, &puts, &lookups, row.stash)
}
