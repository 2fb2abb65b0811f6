//! The snapshot pipeline: COPY bytes arrive on the async side in chunks; evaluator
//! threads (two or more) decode the rows, evaluate them against the rules and pack their
//! records; one thread writes them into MDBX. Any evaluator takes the next chunk from one
//! shared queue, and the writer puts the results back in COPY order (keys inserted in order
//! keep B-tree pages full) with a small reorder buffer. A fixed number of chunks may be in
//! flight between the COPY and the writer, which keeps memory flat and lets the stages
//! overlap without one slow evaluator holding up the others.

use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::sync::Semaphore;

use super::toast::stash_for;
use crate::error::ReplicationError;
use crate::intent::BootstrapIntent;
use crate::progress::Progress;
use crate::store_input::StoreInput;
use rules::{PgType, RowEvaluation, SourceColumn, SourceRow, SyncRules};
use source::{ColumnMeta, CopyFields};
use store::{identity_key, PreparedRow, Store};

/// Rows per MDBX write transaction during the snapshot (at least; whole chunks).
const BATCH_ROWS: usize = 2048;
/// Chunks handed to the evaluators and not yet written (queued, being evaluated, or
/// waiting for an earlier chunk in the writer's reorder buffer).
const IN_FLIGHT: usize = 8;
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
    /// Chunk `seq`: rows of table `table` (index into the jobs), one line each.
    Rows {
        seq: u64,
        table: usize,
        rows: Vec<Bytes>,
    },
    /// Every table is copied: the evaluator that takes it says so to the writer and
    /// stops (one per evaluator).
    Finish(Arc<BootstrapIntent>),
}

enum WriteMsg {
    /// Chunk `seq`, prepared (exactly one message per chunk, even when empty).
    Rows(u64, Vec<PreparedRow>),
    /// An evaluator evaluated every chunk it took and stopped.
    Done(Arc<BootstrapIntent>),
    /// An evaluator stopped early (an error, or cancellation): the snapshot stays
    /// incomplete.
    Stopped,
}

/// A pipeline thread and what it ends with.
type Stage = JoinHandle<Result<(), ReplicationError>>;

/// Dropping it (on cancellation) closes the input and waits for every thread, so no
/// writer outlives the bootstrap that started it.
pub(super) struct Pipeline {
    input: Option<tokio::sync::mpsc::Sender<EvalMsg>>,
    /// One permit per chunk that may be in flight; the writer returns them as it writes,
    /// and closes it when it stops.
    in_flight: Arc<Semaphore>,
    next_seq: u64,
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
        let (input, eval_rx) = tokio::sync::mpsc::channel(IN_FLIGHT);
        let eval_rx = Arc::new(Mutex::new(eval_rx));
        let (write_tx, write_rx) = sync_channel(IN_FLIGHT);
        let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
        let mut pipeline = Self {
            input: Some(input),
            in_flight: in_flight.clone(),
            next_seq: 0,
            evaluators: Vec::with_capacity(count),
            writer: None,
        };
        for n in 0..count {
            let (rules, jobs, store) = (rules.clone(), jobs.clone(), store.clone());
            let (input, output) = (eval_rx.clone(), write_tx.clone());
            let evaluator = std::thread::Builder::new()
                .name(format!("psm-snapshot-eval{n}"))
                .spawn(move || {
                    yield_to_writer();
                    let mut output = StopsWriterOnDrop(Some(output));
                    eval_loop(&rules, &jobs, &store, &input, &mut output)
                })?;
            pipeline.evaluators.push(evaluator);
        }
        drop(write_tx);
        pipeline.writer = Some(
            std::thread::Builder::new()
                .name("psm-snapshot-write".into())
                .spawn(move || {
                    let _close = ClosesOnDrop(&in_flight);
                    write_loop(&store, &write_rx, count, &in_flight, &progress)
                })?,
        );
        Ok(pipeline)
    }

    /// Hands a chunk of rows of table `table` to the evaluators, waiting while
    /// [`IN_FLIGHT`] chunks are. False when the pipeline stopped (its error is reported by
    /// [`Self::join`]).
    pub async fn send_rows(&mut self, table: usize, rows: Vec<Bytes>) -> bool {
        let Some(input) = &self.input else {
            return false;
        };
        match self.in_flight.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => return false, // the writer stopped
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        input.send(EvalMsg::Rows { seq, table, rows }).await.is_ok()
    }

    /// Tells every evaluator that all rows were sent; the writer then completes the
    /// snapshot with `intent`. False when the pipeline already stopped.
    pub async fn finish(&self, intent: BootstrapIntent) -> bool {
        let Some(input) = &self.input else {
            return false;
        };
        let intent = Arc::new(intent);
        for _ in 0..self.evaluators.len() {
            if input.send(EvalMsg::Finish(intent.clone())).await.is_err() {
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
        self.input = None;
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

/// Lowers the calling evaluator thread's scheduling priority (nice +[`EVALUATOR_NICE`]).
/// The one writer is the stage every row waits for; the evaluators can run up to
/// [`IN_FLIGHT`] chunks ahead, so when the cores are short they should be the ones to
/// wait. Best effort: a failure leaves the thread as it was.
fn yield_to_writer() {
    // SAFETY: `nice` only changes the calling thread's scheduling priority on Linux.
    let _ = unsafe { libc::nice(EVALUATOR_NICE) };
}

/// How much lower the evaluators' scheduling priority is than the writer's.
const EVALUATOR_NICE: libc::c_int = 5;

/// An evaluator's way to the writer. However the evaluator ends without saying `Done`
/// (an error, cancellation, a panic), the writer hears `Stopped`: the other evaluators
/// keep the channel open, so its closing alone would not tell.
struct StopsWriterOnDrop(Option<SyncSender<WriteMsg>>);

impl StopsWriterOnDrop {
    /// Sends `msg`; false when the writer is gone.
    fn send(&self, msg: WriteMsg) -> bool {
        self.0.as_ref().is_some_and(|o| o.send(msg).is_ok())
    }

    /// Says `Done`; nothing more is sent.
    fn done(&mut self, intent: Arc<BootstrapIntent>) {
        if let Some(output) = self.0.take() {
            let _ = output.send(WriteMsg::Done(intent));
        }
    }
}

impl Drop for StopsWriterOnDrop {
    fn drop(&mut self) {
        if let Some(output) = self.0.take() {
            let _ = output.send(WriteMsg::Stopped);
        }
    }
}

/// Closes the in-flight permits when the writer stops, so a sender waiting for one
/// learns that the pipeline stopped.
struct ClosesOnDrop<'s>(&'s Semaphore);

impl Drop for ClosesOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
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
    input: &Mutex<tokio::sync::mpsc::Receiver<EvalMsg>>,
    output: &mut StopsWriterOnDrop,
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
            // Waiting holds the lock: the others wait for their turn at the queue.
            let Some(msg) = input.lock().blocking_recv() else {
                return Ok(()); // cancelled
            };
            let (seq, index, lines) = match msg {
                EvalMsg::Rows { seq, table, rows } => (seq, table, rows),
                EvalMsg::Finish(intent) => {
                    output.done(intent);
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
                let columns: SmallVec<[SourceColumn<'_>; 16]> = job
                    .columns
                    .iter()
                    .zip(types)
                    .enumerate()
                    .map(|(i, (c, t))| SourceColumn {
                        name: &c.name,
                        pg_type: *t,
                        value: fields.get_str(i),
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
                let input = StoreInput::of(&eval);
                let stash = stash_for(&job.columns, |i| fields.get(i), false);
                let row = PreparedRow::new(
                    job.id,
                    &identity,
                    &input.memberships,
                    input.lookups,
                    stash,
                    &mut packer,
                )
                        .ok_or_else(|| ReplicationError::Copy {
                            table: format!("{}.{}", job.schema, job.name),
                            problem: "a row with more than 255 distinct outputs (or over 4 GiB of bucket names and outputs)".into(),
                        })?;
                rows.push(row);
            }
            if !output.send(WriteMsg::Rows(seq, rows)) {
                return Ok(()); // the writer failed; its error is reported
            }
        }
    }
}

/// Writes chunks in COPY order (grouping consecutive ones into transactions of about
/// [`BATCH_ROWS`]) until every evaluator is done, then commits the completion record.
/// When an evaluator stops without being done (an error, or cancellation), the snapshot
/// stays incomplete.
fn write_loop(
    store: &Store,
    input: &Receiver<WriteMsg>,
    evaluators: usize,
    in_flight: &Semaphore,
    progress: &Progress,
) -> Result<(), ReplicationError> {
    // Chunks that arrived before an earlier one, by sequence number.
    let mut early: BTreeMap<u64, Vec<PreparedRow>> = BTreeMap::new();
    let mut next = 0u64;
    let mut done = 0;
    let mut intent = None;
    // One buffer for every transaction's rows (it is drained, not dropped).
    let mut batch: Vec<PreparedRow> = Vec::with_capacity(BATCH_ROWS + 1024);
    loop {
        let mut chunks = 0;
        loop {
            while let Some(rows) = early.remove(&next) {
                next += 1;
                chunks += 1;
                batch.extend(rows);
            }
            if batch.len() >= BATCH_ROWS || done == evaluators {
                break;
            }
            // Wait only while there is nothing to write.
            let msg = if chunks == 0 {
                match input.recv() {
                    Ok(msg) => msg,
                    Err(_) => return Ok(()),
                }
            } else {
                match input.try_recv() {
                    Ok(msg) => msg,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return Ok(()),
                }
            };
            match msg {
                WriteMsg::Rows(seq, rows) => {
                    early.insert(seq, rows);
                }
                WriteMsg::Done(finished) => {
                    done += 1;
                    intent = Some(finished);
                }
                WriteMsg::Stopped => return Ok(()),
            }
        }
        if chunks == 0 {
            if done == evaluators {
                break;
            }
            continue;
        }
        let count = batch.len() as u64;
        if count > 0 {
            store.write_unsynced(0, |w| {
                batch.drain(..).try_for_each(|row| w.insert_prepared(row))
            })?;
            progress.add_rows(count);
        }
        in_flight.add_permits(chunks);
    }
    // Every evaluator sent its chunks before its `Done`, so every chunk arrived and was
    // written; one left over means a gap in the sequence.
    if !early.is_empty() {
        return Err(panicked("writer (a chunk went missing)"));
    }
    let Some(intent) = intent else {
        return Ok(());
    };
    let mut intent = BootstrapIntent::clone(&intent);
    intent.rows = progress.rows();
    let lsn = intent.consistent_point.unwrap_or(0);
    let encoded = intent.encode()?;
    store.write(lsn, |w| BootstrapIntent::save(&encoded, w))?;
    Ok(())
}

#[cfg(test)]
mod cost;
#[cfg(test)]
mod tests;
