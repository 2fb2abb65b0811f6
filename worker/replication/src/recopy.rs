//! Re-copying one table while the stream goes on, after its columns changed in a way the
//! rules see (a column they read added, dropped, renamed or retyped, one under `SELECT *`
//! included), it was dropped and created again, its replica identity changed, or a
//! partitioned table's partitions changed (one attached, detached, dropped or emptied): a
//! temporary slot exports a snapshot consistent at some LSN `C`, the table is copied
//! inside it with the columns it has there, its rows are evaluated beside the applier,
//! which merges them once it has applied every transaction that committed before `C`
//! (see `merge`). The temporary slot lives as long as its connection, which this task
//! holds until the copy is read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;

use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

use crate::copied::{evaluate_copied, CopiedEvaluation, CopiedRow, RecopyEvent};
use crate::error::{stream_error, ReplicationError};
use crate::plan::SourcePlan;
use crate::row::EvaluatedRow;
use crate::store_input::StoreInput;
use crate::table::StreamTable;
use rules::SyncRules;
use source::{
    connect, create_temporary_slot, enter_snapshot, format_lsn, primary_identity, table_columns,
    table_partitions, ColumnMeta, SourceTable,
};
use store::{Checkpoint, Store, StoredAs};

/// Rows per batch handed to the applier (each batch is one store commit).
const BATCH_ROWS: usize = 4096;
/// Batches handed to the applier and not merged yet, at most: a copy faster than the
/// merge waits in the primary's COPY, not in memory.
const QUEUED_BATCHES: usize = 2;
/// Batches a re-copy reads ahead of the applier.
const EVENT_BUFFER: usize = 1;
/// Batches evaluated at a time.
const EVALUATING: usize = 2;

/// One table's re-copy: where from, which table, with which rules.
struct RecopyJob {
    plan: SourcePlan,
    /// The primary the store was built from: a re-copy reads from no other.
    system_identifier: String,
    /// The stream's index of the table.
    table: usize,
    base: StreamTable,
    rules: Arc<SyncRules>,
    /// The replica identity the stored rows are keyed by, when not the table's.
    rekey_from: Vec<String>,
    applied: Applied,
    /// The applier holds its writes until this re-copy is merged (`merge::Merge::holds`).
    holds: bool,
}

/// Copies `job`'s table in a snapshot of its own and sends what it reads to `out`. Ends
/// early, without error, when `out` is closed.
async fn recopy_table(job: RecopyJob, out: mpsc::Sender<Result<RecopyEvent, ReplicationError>>) {
    let source = job.base.source();
    let result = copy(job, &out).await;
    if let Err(e) = result {
        // What only the operator can fix (another cluster behind the connection, a key
        // column gone) waits for them; the rest is tried again.
        let operator = e.needs_operator();
        let next = if operator {
            "it waits for the operator"
        } else {
            "the re-copy starts again"
        };
        let _ = out
            .send(Err(ReplicationError::Stream {
                code: "PSM_R2011",
                message: format!(
                    "re-copying table {source} after it changed on the primary failed ({e}); \
                     the served rows stay as they are and {next}"
                ),
                operator,
            }))
            .await;
    }
}

async fn copy(
    job: RecopyJob,
    out: &mpsc::Sender<Result<RecopyEvent, ReplicationError>>,
) -> Result<(), ReplicationError> {
    let RecopyJob {
        plan,
        system_identifier,
        table,
        base,
        rules,
        rekey_from,
        mut applied,
        holds,
    } = job;
    let (plan, system_identifier, base, rules, rekey_from) = (
        &plan,
        system_identifier.as_str(),
        &base,
        &rules,
        rekey_from.as_slice(),
    );
    let (oid, source) = (base.oid, &base.source());
    let client = connect(&plan.connection).await?;
    check_primary(&client, system_identifier).await?;
    // Published as the stream can follow it (no row filter or column list, a key, a
    // table): a table the stream met only through its Relation messages (a new one a
    // wildcard matches) was not checked against the publication yet.
    source::published_tables(&client, std::slice::from_ref(source)).await?;
    let slot = temporary_slot_name(&plan.slot, table);
    let exported = create_temporary_slot(&plan.connection, &client, &slot).await?;
    // A logical message past the consistent point: the stream learns it has passed it
    // even while the primary writes nothing else.
    source::emit_marker(&client, "recopy").await?;
    let reader = connect(&plan.connection).await?;
    enter_snapshot(&reader, &exported.snapshot).await?;
    let columns = table_columns(&reader, oid).await?;
    let partitions = table_partitions(&reader, oid).await?;
    if columns.is_empty() {
        return Err(ReplicationError::Stream {
            code: "PSM_R2011",
            message: format!("table {source} (OID {oid}) is gone from the primary"),
            operator: false,
        });
    }
    tracing::info!(
        table = %source,
        consistent_point = %format_lsn(exported.consistent_point),
        "re-copying the table: it changed in a way the sync rules see"
    );
    let partitioned = partitions.is_some();
    let started = RecopyEvent::Started {
        table,
        consistent_point: exported.consistent_point,
        columns: columns.clone(),
        partitions,
    };
    if out.send(Ok(started)).await.is_err() {
        return Ok(());
    }
    let shape = Arc::new(base.with_columns(columns.clone(), rules).ok_or_else(|| {
        ReplicationError::Stream {
            code: "PSM_R2002",
            message: format!(
                "table {source} lost a replica identity column ({}) on the primary; nothing \
                 of the new shape was applied: run SELECT powersync_mdbx.reset()",
                base.identity_names.join(", ")
            ),
            operator: true,
        }
    })?);
    let mut copy = TableCopy::start(
        &reader,
        (source, partitioned),
        &columns,
        plan.connection.bounds.stall_after,
    )
    .await?;
    // Rows are compared with the store only once it holds every transaction committed
    // before the snapshot; from then on a stored row changes only by a stream change the
    // merge sees (it skips such rows) or by this merge. Rows keyed by another identity
    // are compared by the applier (it moves them), and so are the rows of a re-copy the
    // applier holds its writes for: what they wrote since is not committed, and no
    // checkpoint reaches the snapshot before the merge ends.
    let compare = if rekey_from.is_empty() && !holds {
        let reached = applied
            .checkpoints
            .wait_for(|c| c.lsn >= exported.consistent_point)
            .await;
        reached.is_ok().then(|| applied.store.clone())
    } else {
        None
    };
    if !hand_over(&mut copy, &shape, rekey_from, compare, table, out).await? {
        return Ok(());
    }
    reader
        .batch_execute("COMMIT")
        .await
        .map_err(source::SourceError::query("end the snapshot"))?;
    // Closing the replication connection drops the temporary slot.
    drop(exported);
    let _ = out.send(Ok(RecopyEvent::Done { table })).await;
    Ok(())
}

/// Refuses a primary (behind `client`) that is not the cluster `system_identifier` the
/// store was built from.
async fn check_primary(
    client: &tokio_postgres::Client,
    system_identifier: &str,
) -> Result<(), ReplicationError> {
    let reached = primary_identity(client).await?.system_identifier;
    if reached != system_identifier {
        return Err(ReplicationError::Stream {
            code: "PSM_R2008",
            message: format!(
                "the connection leads to another PostgreSQL cluster (system identifier \
                 {reached}, the storage was built from {system_identifier}); nothing was \
                 copied from it"
            ),
            operator: true,
        });
    }
    Ok(())
}

/// Reads `copy` to its end and hands its rows to `out` for table `table`, evaluated with
/// `shape` (their previous keys by `rekey_from`) and, with `compare`, compared with that
/// store. Returns `false` when `out` was closed.
async fn hand_over(
    copy: &mut TableCopy,
    shape: &Arc<StreamTable>,
    rekey_from: &[String],
    compare: Option<Arc<Store>>,
    table: usize,
    out: &mpsc::Sender<Result<RecopyEvent, ReplicationError>>,
) -> Result<bool, ReplicationError> {
    // Batches are evaluated (and compared) off the runtime threads, up to EVALUATING at a
    // time while the next is read, and handed over in order.
    let mut evaluating = std::collections::VecDeque::new();
    let mut read_all = false;
    loop {
        while !read_all && evaluating.len() < EVALUATING {
            let Some(copied) = copy.next_batch().await? else {
                read_all = true;
                break;
            };
            let (shape, rekey_from) = (shape.clone(), rekey_from.to_vec());
            let compare = compare.clone();
            evaluating.push_back(tokio::task::spawn_blocking(move || {
                let rows = evaluate_copied(&shape, &rekey_from, copied)?;
                match compare {
                    Some(store) => set_aside_unchanged(&store, shape.store_id, rows),
                    None => Ok((
                        rows.into_iter().map(|row| (row, None)).collect(),
                        Vec::new(),
                    )),
                }
            }));
        }
        let Some(next) = evaluating.pop_front() else {
            break;
        };
        let (rows, unchanged) = next
            .await
            .map_err(|e| stream_error(format!("re-copy thread: {e}")))??;
        let event = RecopyEvent::Rows {
            table,
            rows,
            unchanged,
        };
        if out.send(Ok(event)).await.is_err() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// What a re-copy compares copied rows with: the store, and its published checkpoints.
#[derive(Clone)]
pub(super) struct Applied {
    pub store: Arc<Store>,
    pub checkpoints: watch::Receiver<Checkpoint>,
}

/// Splits evaluated `rows` of table `table_id` into those the applier must merge, with
/// their comparison, and the row ids of those the store holds exactly so (compared in one
/// read, beside the applier: most rows of a re-copy are unchanged, and the applier need
/// not look at them).
fn set_aside_unchanged(
    store: &Store,
    table_id: u32,
    rows: Vec<EvaluatedRow>,
) -> Result<(Vec<CopiedEvaluation>, Vec<u64>), ReplicationError> {
    let compared = store.read(|view| {
        let mut cursors = view.row_cursors()?;
        rows.iter()
            .map(|row| {
                let input = StoreInput::of(&row.eval);
                let lookups = input.lookup_puts();
                view.stored_as(
                    &mut cursors,
                    table_id,
                    &row.identity,
                    &input.memberships,
                    &lookups,
                    &row.stash,
                )
            })
            .collect::<Result<Vec<(StoredAs, Option<u64>)>, _>>()
    })?;
    let mut merge = Vec::new();
    let mut unchanged = Vec::new();
    for (row, compared) in rows.into_iter().zip(compared) {
        match compared {
            (StoredAs::Same, Some(row_id)) => unchanged.push(row_id),
            compared => merge.push((row, Some(compared))),
        }
    }
    Ok((merge, unchanged))
}

/// A table's `COPY` inside a snapshot, read in batches of lines (decoded where they are
/// evaluated, off the runtime threads).
pub(super) struct TableCopy {
    rows: source::CopyRows,
    /// The stream ended (it is not polled again).
    ended: bool,
}

impl TableCopy {
    /// Starts `COPY source (columns)` on `reader` (inside its snapshot), every partition's
    /// rows of a `partitioned` one; no rows for `stall_after` fail it (`source::CopyRows`).
    pub(super) async fn start(
        reader: &tokio_postgres::Client,
        (source, partitioned): (&SourceTable, bool),
        columns: &[ColumnMeta],
        stall_after: std::time::Duration,
    ) -> Result<Self, ReplicationError> {
        let rows = source::copy_table(reader, source, columns, partitioned, stall_after).await?;
        Ok(Self { rows, ended: false })
    }

    /// The next rows, up to [`BATCH_ROWS`]; `None` after the last.
    pub(super) async fn next_batch(&mut self) -> Result<Option<Vec<CopiedRow>>, ReplicationError> {
        let mut rows = Vec::with_capacity(BATCH_ROWS);
        while rows.len() < BATCH_ROWS && !self.ended {
            let Some(line) = self.rows.next().await else {
                self.ended = true;
                break;
            };
            let mut line = line?;
            if line.last() == Some(&b'\n') {
                line.truncate(line.len() - 1);
            }
            rows.push(line);
        }
        Ok((!rows.is_empty()).then_some(rows))
    }
}

/// The temporary slot of a re-copy: the stream's slot name, the table's index and the
/// time, so that re-copies of several tables, and one started again while the primary
/// still ends the last, never share a name; within PostgreSQL's 63 bytes.
fn temporary_slot_name(slot: &str, table: usize) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let suffix = format!("_rc{table}_{millis:x}");
    let keep = slot.len().min(63usize.saturating_sub(suffix.len()));
    format!("{}{suffix}", &slot[..keep])
}

/// The re-copies a stream runs, one per table at most, with the event each has ready
/// for the applier.
pub(super) struct Recopies {
    plan: SourcePlan,
    /// The primary the store was built from: a re-copy reads from no other.
    system_identifier: String,
    rules: Arc<SyncRules>,
    running: HashMap<usize, Running>,
    handover: Arc<Handover>,
    applied: Applied,
}

/// Re-copy batches handed to the applier and not merged yet (shared by the stream, which
/// hands them over, and the applier, which merges them).
#[derive(Debug, Default)]
pub(super) struct Handover {
    queued: AtomicUsize,
    freed: Notify,
}

impl Handover {
    /// The applier merged a batch.
    pub(super) fn merged(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
        self.freed.notify_one();
    }

    /// Resolves once the applier merged a batch since the last call (cancel-safe).
    pub(super) async fn freed(&self) {
        self.freed.notified().await;
    }
}

struct Running {
    task: JoinHandle<()>,
    events: mpsc::Receiver<Result<RecopyEvent, ReplicationError>>,
    consistent_point: Option<u64>,
    /// Received, not yet handed to the applier.
    pending: Option<RecopyEvent>,
    /// The replica identity the stored rows are keyed by, when not the table's.
    rekey_from: Vec<String>,
}

impl Recopies {
    pub(super) fn new(
        plan: &SourcePlan,
        system_identifier: &str,
        rules: Arc<SyncRules>,
        handover: Arc<Handover>,
        applied: Applied,
    ) -> Self {
        Self {
            plan: plan.clone(),
            system_identifier: system_identifier.to_owned(),
            rules,
            running: HashMap::new(),
            handover,
            applied,
        }
    }

    /// Starts copying `table` (index `index`) again, its stored rows keyed by replica
    /// identity `rekey_from` (empty: its own; a re-copy in progress passes its own on),
    /// the applier holding its writes until it is merged when `holds`; a re-copy of it in
    /// progress is abandoned (it read the columns before).
    pub(super) fn start(
        &mut self,
        index: usize,
        table: &StreamTable,
        rekey_from: &[String],
        holds: bool,
    ) {
        let rekey_from = match self.running.get(&index) {
            Some(running) if rekey_from.is_empty() => running.rekey_from.clone(),
            _ => rekey_from.to_vec(),
        };
        let (out, events) = mpsc::channel(EVENT_BUFFER);
        let job = RecopyJob {
            plan: self.plan.clone(),
            system_identifier: self.system_identifier.clone(),
            table: index,
            base: table.clone(),
            rules: self.rules.clone(),
            rekey_from: rekey_from.clone(),
            applied: self.applied.clone(),
            holds,
        };
        let task = tokio::spawn(recopy_table(job, out));
        let running = Running {
            task,
            events,
            consistent_point: None,
            pending: None,
            rekey_from,
        };
        if let Some(old) = self.running.insert(index, running) {
            old.task.abort();
        }
    }

    /// An event the applier may take now: a copy's start at once, its rows and end once
    /// every transaction committed before its snapshot was decoded (`passed`: every
    /// transaction committing below it was), rows while fewer than [`QUEUED_BATCHES`]
    /// wait for the applier.
    pub(super) fn ready(&mut self, passed: u64) -> Option<RecopyEvent> {
        let room = self.handover.queued.load(Ordering::Acquire) < QUEUED_BATCHES;
        let (&index, running) = self.running.iter_mut().find(|(_, r)| match &r.pending {
            Some(RecopyEvent::Started { .. }) => true,
            Some(RecopyEvent::Rows { .. }) => {
                room && r.consistent_point.is_some_and(|c| c <= passed)
            }
            Some(RecopyEvent::Done { .. }) => r.consistent_point.is_some_and(|c| c <= passed),
            None => false,
        })?;
        let event = running.pending.take()?;
        match event {
            RecopyEvent::Done { .. } => {
                self.running.remove(&index);
            }
            RecopyEvent::Rows { .. } => {
                self.handover.queued.fetch_add(1, Ordering::AcqRel);
            }
            RecopyEvent::Started { .. } => {}
        }
        Some(event)
    }

    /// Receives the next event of a re-copy that has none pending (cancel-safe); pending
    /// while there is none. A re-copy that failed ends the stream with its error.
    pub(super) async fn next_event(&mut self) -> Result<(), ReplicationError> {
        std::future::poll_fn(|cx| {
            for running in self.running.values_mut() {
                if running.pending.is_some() {
                    continue;
                }
                match running.events.poll_recv(cx) {
                    Poll::Ready(Some(Ok(event))) => {
                        if let RecopyEvent::Started {
                            consistent_point, ..
                        } = &event
                        {
                            running.consistent_point = Some(*consistent_point);
                        }
                        running.pending = Some(event);
                        return Poll::Ready(Ok(()));
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                    Poll::Ready(None) => {
                        return Poll::Ready(Err(ReplicationError::Stream {
                            code: "PSM_R2011",
                            message: "a table's re-copy ended before its last row (a bug); \
                                      it starts again"
                                .into(),
                            operator: false,
                        }))
                    }
                    Poll::Pending => {}
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Stops the re-copy of table `index`, if one runs (the table is gone).
    pub(super) fn stop(&mut self, index: usize) {
        if let Some(running) = self.running.remove(&index) {
            running.task.abort();
        }
    }

    /// Stops every re-copy (the stream ends; a restart starts them again).
    pub(super) fn abort(&mut self) {
        for (_, running) in self.running.drain() {
            running.task.abort();
        }
    }
}
