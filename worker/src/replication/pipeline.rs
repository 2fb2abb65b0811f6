//! The snapshot pipeline: COPY bytes arrive on the async side in chunks; evaluator
//! threads (two or more) decode the rows, evaluate them against the rules and pack their
//! records; one thread writes them into MDBX. Chunks go to the evaluators in turn and the
//! writer takes their results in the same turn, so rows reach MDBX in COPY order (keys
//! inserted in order keep B-tree pages full) without a reorder buffer. Bounded channels
//! between the stages keep memory flat and let them overlap.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;

use super::toast::stash_for;
use super::{BootstrapIntent, Progress, ReplicationError};
use crate::rules::{PgType, RowEvaluation, SourceColumn, SourceRow, SyncRules};
use crate::source::{ColumnMeta, CopyFields};
use crate::store::{encode_values, identity_key, PreparedRow, Store};

/// Rows per MDBX write transaction during the snapshot (at least; whole chunks).
const BATCH_ROWS: usize = 2048;
/// Row chunks buffered between COPY and each evaluator.
const EVAL_QUEUE: usize = 4;
/// Evaluated chunks buffered between each evaluator and the writer.
const WRITE_QUEUE: usize = 4;
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

enum EvalMsg {
    /// Rows of table `table` (index into the jobs), one line each.
    Rows(usize, Vec<Bytes>),
    /// Every table is copied: the evaluator says so to the writer and stops.
    Finish(Arc<BootstrapIntent>),
}

enum WriteMsg {
    /// One chunk's rows, prepared (exactly one message per chunk, even when empty).
    Rows(Vec<PreparedRow>),
    /// The evaluator evaluated every chunk it was given.
    Done(Arc<BootstrapIntent>),
}

/// A pipeline thread and what it ends with.
type Stage = JoinHandle<Result<(), ReplicationError>>;

/// Dropping it (on cancellation) closes the inputs and waits for every thread, so no
/// writer outlives the bootstrap that started it.
pub(super) struct Pipeline {
    inputs: Vec<tokio::sync::mpsc::Sender<EvalMsg>>,
    /// The evaluator whose turn the next chunk is.
    turn: usize,
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
        let jobs = Arc::new(jobs);
        let mut pipeline = Self {
            inputs: Vec::with_capacity(count),
            turn: 0,
            evaluators: Vec::with_capacity(count),
            writer: None,
        };
        let mut results = Vec::with_capacity(count);
        for n in 0..count {
            let (input, eval_rx) = tokio::sync::mpsc::channel(EVAL_QUEUE);
            let (write_tx, write_rx) = sync_channel(WRITE_QUEUE);
            let (rules, jobs, store) = (rules.clone(), jobs.clone(), store.clone());
            let evaluator = std::thread::Builder::new()
                .name(format!("psm-snapshot-eval{n}"))
                .spawn(move || eval_loop(&rules, &jobs, &store, eval_rx, write_tx))?;
            pipeline.inputs.push(input);
            pipeline.evaluators.push(evaluator);
            results.push(write_rx);
        }
        pipeline.writer = Some(
            std::thread::Builder::new()
                .name("psm-snapshot-write".into())
                .spawn(move || write_loop(&store, InTurn::new(results), &progress))?,
        );
        Ok(pipeline)
    }

    /// Hands a chunk of rows of table `table` to the next evaluator. False when the
    /// pipeline stopped (its error is reported by [`Self::join`]).
    pub async fn send_rows(&mut self, table: usize, rows: Vec<Bytes>) -> bool {
        let Some(input) = self.inputs.get(self.turn) else {
            return false;
        };
        self.turn = (self.turn + 1) % self.inputs.len();
        input.send(EvalMsg::Rows(table, rows)).await.is_ok()
    }

    /// Tells every evaluator that all rows were sent; the writer then completes the
    /// snapshot with `intent`. False when the pipeline already stopped.
    pub async fn finish(&self, intent: BootstrapIntent) -> bool {
        let intent = Arc::new(intent);
        for input in &self.inputs {
            if input.send(EvalMsg::Finish(intent.clone())).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Waits for every thread (after `finish`, or after the inputs were dropped) and
    /// returns the first error.
    pub fn join(mut self) -> Result<(), ReplicationError> {
        self.join_threads()
    }

    fn join_threads(&mut self) -> Result<(), ReplicationError> {
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        // Closing the inputs ends the evaluators, which ends the writer.
        self.inputs.clear();
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
        .map(|j| {
            rules.plan_for(&j.schema, &j.name).map(|plan| {
                let binding = plan.bind(j.columns.iter().map(|c| c.name.as_str()));
                (plan, binding)
            })
        })
        .collect();
    // Records are packed with the store's codec of the moment; once the store trains
    // its dictionary, the next chunk is packed with it.
    loop {
        let codec = store.row_codec();
        let mut packer = codec.packer();
        while !codec.is_stale(store) {
            let Some(msg) = input.blocking_recv() else {
                return Ok(()); // cancelled
            };
            let (index, lines) = match msg {
                EvalMsg::Rows(index, lines) => (index, lines),
                EvalMsg::Finish(intent) => {
                    let _ = output.send(WriteMsg::Done(intent));
                    return Ok(());
                }
            };
            let (Some(job), Some(decoder), Some(types), Some(plan)) = (
                jobs.get(index),
                decoders.get_mut(index),
                types.get(index),
                plans.get(index),
            ) else {
                return Err(panicked("evaluator (rows of an unknown table)"));
            };
            let mut rows = Vec::with_capacity(lines.len());
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
                rows.push(row);
            }
            packer.pack(&mut rows);
            if output.send(WriteMsg::Rows(rows)).is_err() {
                return Ok(()); // the writer failed; its error is reported
            }
        }
    }
}

/// The evaluators' outputs, read in the turn their chunks were handed out.
struct InTurn {
    outputs: Vec<Receiver<WriteMsg>>,
    turn: usize,
}

/// The writer's input stopped early: an evaluator failed or the snapshot was cancelled.
struct Stopped;

impl InTurn {
    fn new(outputs: Vec<Receiver<WriteMsg>>) -> Self {
        Self { outputs, turn: 0 }
    }

    /// The next message in turn, waiting for it when `wait`; `Ok(None)` when it is not
    /// there yet.
    fn next(&mut self, wait: bool) -> Result<Option<WriteMsg>, Stopped> {
        let output = self.outputs.get(self.turn).ok_or(Stopped)?;
        let msg = if wait {
            output.recv().map_err(|_| Stopped)?
        } else {
            match output.try_recv() {
                Ok(msg) => msg,
                Err(TryRecvError::Empty) => return Ok(None),
                Err(TryRecvError::Disconnected) => return Err(Stopped),
            }
        };
        self.turn = (self.turn + 1) % self.outputs.len();
        Ok(Some(msg))
    }
}

/// Writes chunks in turn (grouping consecutive ones into transactions of about
/// [`BATCH_ROWS`]) until the evaluators are done, then commits the completion record.
/// When an evaluator stops without being done (an error, or cancellation), the snapshot
/// stays incomplete.
fn write_loop(
    store: &Store,
    mut input: InTurn,
    progress: &Progress,
) -> Result<(), ReplicationError> {
    let mut done = None;
    while done.is_none() {
        let mut batch: Vec<PreparedRow> = Vec::with_capacity(BATCH_ROWS + 1024);
        let mut wait = true;
        while batch.len() < BATCH_ROWS {
            match input.next(wait) {
                Err(Stopped) => return Ok(()),
                Ok(None) => break,
                Ok(Some(WriteMsg::Rows(rows))) => batch.extend(rows),
                Ok(Some(WriteMsg::Done(intent))) => {
                    done = Some(intent);
                    break;
                }
            }
            wait = false;
        }
        if batch.is_empty() {
            continue;
        }
        let count = batch.len() as u64;
        store.write_unsynced(0, |w| {
            batch.into_iter().try_for_each(|row| w.insert_prepared(row))
        })?;
        progress.add_rows(count);
    }
    // The first evaluator that is done had no chunk left in its turn, so no chunk is left
    // at all: every other evaluator's next message must be its own `Done`.
    for _ in 1..input.outputs.len() {
        match input.next(true) {
            Err(Stopped) => return Ok(()),
            Ok(Some(WriteMsg::Done(_))) => {}
            Ok(_) => return Err(panicked("writer (a chunk after the end)")),
        }
    }
    let Some(intent) = done else {
        return Ok(());
    };
    let mut intent = BootstrapIntent::clone(&intent);
    intent.rows = progress.rows();
    let lsn = intent.consistent_point.unwrap_or(0);
    let encoded = intent.encode()?;
    store.write(lsn, |w| BootstrapIntent::save(&encoded, w))?;
    Ok(())
}
