//! Rebuilding from a new slot when the store's slot is gone from the primary or was
//! invalidated (`PSM_R2005`, `PSM_R2006`): the changes since the last checkpoint are lost
//! with it, so the store cannot follow on. Instead of waiting for `reset()` (a new store,
//! every client downloading everything), a new slot is created with an exported snapshot
//! (consistent at `C`), every table is copied inside it and merged into the served store
//! as a table's re-copy is (`merge`: rows whose output did not change keep their ops,
//! clients download only what changed), and streaming resumes at `C`.
//!
//! Until the rebuild ends the store serves its last checkpoint, and nothing of the rebuild
//! (stale: `status().replication.rebuilding`): the store holds the rebuild's writes
//! (`Store::hold`) and commits them as one checkpoint at `C`, so a client never sees some
//! tables rebuilt and others not. The bootstrap record is marked first, so a rebuild that
//! is interrupted (a stop, a failure, a crash: the held writes go with it) is done again
//! from the start.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use crate::context::StreamContext;
use crate::copied::{evaluate_copied, CopiedRow};
use crate::error::{stream_error, ReplicationError};
use crate::intent::{BootstrapIntent, IntentTable};
use crate::merge::{unix_now, Merge, Merged};
use crate::plan::SourcePlan;
use crate::progress::{RebuildDone, RebuildProgress};
use crate::recopy::TableCopy;
use crate::table::StreamTable;
use source::{
    connect, create_slot_after_loss, drop_slot, enter_snapshot, format_lsn, published_tables,
    slot_info, table_columns, table_partitions, validate_primary, SourceTable,
};
use store::{Checkpoint, Store};

/// Rebuilds the store from a new slot; returns the bootstrap record it ends with
/// (consistent point `C`, from where the stream goes on). `why` says what happened to the
/// old slot.
pub(super) async fn rebuild(
    plan: &SourcePlan,
    context: &StreamContext,
    intent: &BootstrapIntent,
    why: &str,
) -> Result<BootstrapIntent, ReplicationError> {
    let started = Instant::now();
    context.progress.rebuilding.store(true, Relaxed);
    let report = Report {
        context,
        file_bytes_at_start: context.store.file_bytes(),
    };
    *context.progress.rebuild.lock() = Some(RebuildProgress {
        why: why.to_owned(),
        started_at: unix_now(),
        tables_total: intent.tables.len() as u64,
        ..RebuildProgress::default()
    });
    tracing::warn!(
        slot = %plan.slot,
        "{why}; rebuilding from a new slot: clients keep the last checkpoint meanwhile (stale) \
         and then download only the rows that changed"
    );
    let store = context.store.clone();
    let mut marked = intent.clone();
    marked.rebuilding = true;
    write(&store, move |w| {
        Ok(BootstrapIntent::save(&marked.encode()?, w)?)
    })
    .await?;

    let client = connect(&plan.connection).await?;
    let (published, primary) = published_on_primary(&client, intent).await?;
    // The old slot, invalidated or left half-made by an interrupted rebuild, goes first
    // (the store owns the name); one in use is retried.
    if let Some(old) = slot_info(&client, &plan.slot).await? {
        if old.active {
            return Err(stream_error(format!(
                "replication slot \"{}\" is in use by another connection; the rebuild \
                 retries",
                plan.slot
            )));
        }
        drop_slot(&client, &plan.slot).await?;
    }
    let exported = create_slot_after_loss(&plan.connection, &client, &plan.slot).await?;
    let consistent_point = exported.consistent_point;
    let reader = connect(&plan.connection).await?;
    enter_snapshot(&reader, &exported.snapshot).await?;
    let oids: Vec<u32> = primary.tables.iter().map(|t| t.oid).collect();
    let estimated = source::estimated_rows(&reader, &oids).await?;
    if let Some(p) = context.progress.rebuild.lock().as_mut() {
        p.rows_estimated = estimated;
    }

    // From here to the release, clients see none of the rebuild's writes.
    let held = HeldRebuild::begin(&store).await?;
    let mut rebuilt = intent.clone();
    let snapshot = Snapshot {
        reader: &reader,
        consistent_point,
        primary: &primary,
        stall_after: plan.connection.bounds.stall_after,
    };
    let total = rebuild_tables(&report, &snapshot, &mut rebuilt, &published).await?;
    reader
        .batch_execute("COMMIT")
        .await
        .map_err(source::SourceError::query("end the snapshot"))?;
    drop(exported);

    rebuilt.consistent_point = Some(consistent_point);
    rebuilt.timeline = Some(primary.timeline);
    rebuilt.rebuilding = false;
    let record = rebuilt.clone();
    let ((), written) = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            // Streaming goes on from the new slot's consistent point.
            store.write_with(consistent_point, |w| {
                Ok::<_, ReplicationError>(BootstrapIntent::save(&record.encode()?, w)?)
            })
        })
        .await
        .map_err(|e| stream_error(format!("rebuild thread: {e}")))??
    };
    let checkpoint = held.release().await?.unwrap_or(written);
    // Done before the checkpoint is published: whoever wakes on it sees the rebuild over.
    context.progress.rebuilding.store(false, Relaxed);
    *context.progress.rebuild.lock() = None;
    *context.progress.last_rebuild.lock() = Some(RebuildDone {
        why: why.to_owned(),
        finished_at: unix_now(),
        millis: started.elapsed().as_millis() as u64,
        rows: total.rows,
    });
    context.published.send_replace(checkpoint);
    tracing::info!(
        slot = %plan.slot,
        consistent_point = %format_lsn(consistent_point),
        rows = total.rows,
        written = total.written,
        deleted = total.deleted,
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "rebuilt from a new slot, published in one checkpoint; clients got ops only for the \
         rows that changed"
    );
    Ok(rebuilt)
}

/// The store's writes held for a rebuild (`Store::hold`): abandoned, leaving the last
/// checkpoint clients saw, unless released.
struct HeldRebuild {
    store: Option<Arc<Store>>,
}

impl HeldRebuild {
    async fn begin(store: &Arc<Store>) -> Result<Self, ReplicationError> {
        let holding = store.clone();
        tokio::task::spawn_blocking(move || holding.hold())
            .await
            .map_err(|e| stream_error(format!("rebuild thread: {e}")))??;
        Ok(Self {
            store: Some(store.clone()),
        })
    }

    /// Commits the held writes as one checkpoint (returned).
    async fn release(mut self) -> Result<Option<Checkpoint>, ReplicationError> {
        let Some(store) = self.store.take() else {
            return Ok(None);
        };
        Ok(tokio::task::spawn_blocking(move || store.release())
            .await
            .map_err(|e| stream_error(format!("rebuild thread: {e}")))??)
    }
}

impl Drop for HeldRebuild {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            if let Err(e) = store.abandon() {
                tracing::warn!("abandoning an interrupted rebuild's held writes: {e}");
            }
        }
    }
}

/// What the merges of a rebuild did so far, shown in `status()`.
struct Report<'a> {
    context: &'a StreamContext,
    /// The store's file size when the rebuild started.
    file_bytes_at_start: u64,
}

impl Report<'_> {
    /// `done` tables merged, `merged` rows so far, while the store's file holds `file_bytes`.
    fn show(&self, done: u64, merged: Merged, file_bytes: u64) {
        if let Some(p) = self.context.progress.rebuild.lock().as_mut() {
            p.tables_done = done;
            p.rows_merged = merged.rows;
            p.rows_written = merged.written;
            p.extra_file_bytes = file_bytes.saturating_sub(self.file_bytes_at_start);
        }
    }
}

/// Which of `intent`'s tables are still published under their name (`None`: rebuilt empty,
/// gone, as the stream leaves it), and the primary as validated for those; refuses a
/// primary that is another cluster.
async fn published_on_primary(
    client: &tokio_postgres::Client,
    intent: &BootstrapIntent,
) -> Result<(Vec<Option<SourceTable>>, source::PrimaryInfo), ReplicationError> {
    // A table no longer published under its name is rebuilt empty (gone, as the stream
    // leaves it).
    let covered: Vec<SourceTable> = intent
        .tables
        .iter()
        .map(|t| SourceTable {
            schema: t.schema.clone(),
            name: t.name.clone(),
        })
        .collect();
    let published: Vec<Option<SourceTable>> = published_tables(client, &covered)
        .await?
        .into_iter()
        .zip(covered)
        .map(|(info, table)| info.map(|_| table))
        .collect();
    let asked: Vec<SourceTable> = published.iter().flatten().cloned().collect();
    let primary = validate_primary(client, &asked).await?;
    if primary.system_identifier != intent.system_identifier {
        return Err(ReplicationError::Stream {
            code: "PSM_R2008",
            message: format!(
                "the primary this worker reached is another PostgreSQL cluster (system \
                 identifier {}, the storage was built from {}); nothing was rebuilt from it: \
                 point the connection back at the original primary, or run SELECT \
                 powersync_mdbx.reset() to replicate from this one",
                primary.system_identifier, intent.system_identifier
            ),
            operator: true,
        });
    }
    Ok((published, primary))
}

/// The new slot's snapshot the tables are copied in.
struct Snapshot<'a> {
    /// The connection inside the snapshot.
    reader: &'a tokio_postgres::Client,
    consistent_point: u64,
    /// The published tables, in the order of the record's.
    primary: &'a source::PrimaryInfo,
    /// A copy's progress bound (`SourceBounds::stall_after`).
    stall_after: std::time::Duration,
}

/// Copies every table of `rebuilt` (its record, updated as each is rebuilt) in the
/// snapshot and merges it into the store; a table not `published` is emptied. Returns
/// what the merges did.
async fn rebuild_tables(
    report: &Report<'_>,
    snapshot: &Snapshot<'_>,
    rebuilt: &mut BootstrapIntent,
    published: &[Option<SourceTable>],
) -> Result<Merged, ReplicationError> {
    let (context, store) = (report.context, &report.context.store);
    let mut total = Merged::default();
    let mut infos = snapshot.primary.tables.iter();
    let mut done = 0u64;
    let mut forked = false;
    for (table, published) in rebuilt.tables.iter_mut().zip(published) {
        let Some(info) = published.as_ref().and_then(|_| infos.next()) else {
            let store_id = table.id;
            write(store, move |w| {
                w.truncate_table(store_id)?;
                Ok(())
            })
            .await?;
            tracing::warn!(
                table = %format!("{}.{}", table.schema, table.name),
                "the sync rules read this table, but it is no longer published under its name: \
                 it is rebuilt empty; publish a table of this name again (it is then copied) or \
                 point the sync rules at its new name"
            );
            table.gone = true;
            table.recopy = false;
            table.rekey_from.clear();
            done += 1;
            continue;
        };
        *table = IntentTable {
            columns: table_columns(snapshot.reader, info.oid).await?,
            identity: info.identity_columns.clone(),
            oid: info.oid,
            recopy: false,
            rekey_from: Vec::new(),
            gone: false,
            partitions: table_partitions(snapshot.reader, info.oid).await?,
            ..table.clone()
        };
        let shape = StreamTable::from_intent(table, &context.rules).ok_or_else(|| {
            ReplicationError::Copy {
                table: info.table.to_string(),
                problem: "a replica identity column is not published (generated?)".into(),
            }
        })?;
        // The rebuild forks the history once, before the first op any table's merge writes.
        let mut merge = Merge::default().after_fork(forked);
        merge.start(snapshot.consistent_point, shape);
        let mut copy = TableCopy::start(
            snapshot.reader,
            (&info.table, table.partitions.is_some()),
            &table.columns,
            snapshot.stall_after,
        )
        .await?;
        while let Some(rows) = copy.next_batch().await? {
            // The stream waits for the rebuild: its rows are what is heard of the primary.
            context.progress.heard.now();
            merge = merge_rows(context, merge, rows).await?;
            let (rows, written) = merge.merged_rows();
            let mut so_far = total;
            so_far.add(Merged {
                rows,
                written,
                deleted: 0,
            });
            report.show(done, so_far, store.file_bytes());
        }
        let (merged, merge_forked) = {
            let store = store.clone();
            let mut merge = merge;
            tokio::task::spawn_blocking(move || {
                let lsn = store.read(|view| view.checkpoint())?.lsn;
                let (merged, _) = store.write_with(lsn, |w| merge.finish(w))?;
                Ok::<_, ReplicationError>((merged, merge.has_forked()))
            })
            .await
            .map_err(|e| stream_error(format!("rebuild thread: {e}")))??
        };
        forked |= merge_forked;
        total.add(merged);
        done += 1;
        report.show(done, total, store.file_bytes());
    }
    Ok(total)
}

/// Merges a batch of copied rows in a store write of its own (off the runtime threads,
/// held with the rebuild's others).
async fn merge_rows(
    context: &StreamContext,
    mut merge: Merge,
    rows: Vec<CopiedRow>,
) -> Result<Merge, ReplicationError> {
    let store = context.store.clone();
    tokio::task::spawn_blocking(move || {
        let evaluated = match merge.shape() {
            Some(shape) => evaluate_copied(shape, &[], rows)?,
            None => Vec::new(),
        };
        let lsn = store.read(|view| view.checkpoint())?.lsn;
        let evaluated = evaluated.into_iter().map(|row| (row, None)).collect();
        store.write_with(lsn, |w| merge.rows(w, evaluated, Vec::new()))?;
        Ok::<_, ReplicationError>(merge)
    })
    .await
    .map_err(|e| stream_error(format!("rebuild thread: {e}")))?
}

/// A store write off the runtime threads (held with the rebuild's others).
async fn write(
    store: &Arc<Store>,
    work: impl FnOnce(&mut store::WriteTxn<'_, '_>) -> Result<(), ReplicationError> + Send + 'static,
) -> Result<Checkpoint, ReplicationError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        let lsn = store.read(|view| view.checkpoint())?.lsn;
        store
            .write_with(lsn, work)
            .map(|((), checkpoint)| checkpoint)
    })
    .await
    .map_err(|e| stream_error(format!("rebuild thread: {e}")))?
}
