//! The bootstrap: validate the primary, take ownership of (or create) the slot, copy every
//! table the rules read inside the slot's exported snapshot, and commit the completion with
//! the consistent point. Restartable and fail-closed: the stored intent decides which slot
//! is ours, and a bootstrap that did not complete starts over from an empty store.

use std::sync::Arc;
use std::time::Instant;

use super::intent::{BootstrapIntent, BootstrapState, IntentTable};
use super::pipeline::{Pipeline, TableJob};
use crate::covered::covered_tables;
use crate::error::ReplicationError;
use crate::plan::SourcePlan;
use crate::progress::Progress;
use rules::SyncRules;
use source::{
    connect, copy_table, create_slot, drop_slot, enter_snapshot, format_lsn, slot_info,
    table_columns, table_partitions, validate_primary, within, SourceError, SourceTable,
};
use store::Store;

/// Rows sent to the evaluator per message.
const CHUNK_ROWS: usize = 1024;

/// How the bootstrap ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootstrapOutcome {
    /// A snapshot was copied now.
    Copied {
        /// The slot's consistent point.
        consistent_point: u64,
        /// Rows written.
        rows: u64,
    },
    /// The store already holds a complete snapshot from this slot.
    AlreadyComplete {
        /// The slot's consistent point.
        consistent_point: u64,
        /// Rows copied back then.
        rows: u64,
    },
}

/// Runs the bootstrap to completion (or to the first error).
pub async fn bootstrap(
    plan: &SourcePlan,
    rules: Arc<SyncRules>,
    store: Arc<Store>,
    progress: Arc<Progress>,
) -> Result<BootstrapOutcome, ReplicationError> {
    let generation = match rules.bucket_version() {
        rules::BucketVersion::Versioned(g) => g,
        rules::BucketVersion::Derived(_) => 1,
        rules::BucketVersion::Unversioned => 0,
    };
    bootstrap_with(plan, rules, store, progress, Start { generation }).await
}

/// How the engine starts a store.
#[derive(Clone, Copy)]
pub struct Start {
    /// The generation the store records (its directory's number; with generation-numbered
    /// bucket names, the number in them).
    pub generation: u64,
}

/// [`bootstrap`] as `start` says.
pub async fn bootstrap_with(
    plan: &SourcePlan,
    rules: Arc<SyncRules>,
    store: Arc<Store>,
    progress: Arc<Progress>,
    start: Start,
) -> Result<BootstrapOutcome, ReplicationError> {
    progress.reset();
    let bound = plan.connection.bounds.stall_after;
    let client = connect(&plan.connection).await?;
    let stored = store.read(|view| Ok(BootstrapIntent::load(view)))??;
    // A complete store's tables are the stream's to follow (one renamed or dropped since is
    // removed from the buckets there, not refused here).
    let complete = stored
        .as_ref()
        .is_some_and(|i| i.state == BootstrapState::Complete);
    let (tables, primary, slot) = within(bound, "the checks of the primary", async {
        let tables = covered_tables(&client, &rules).await?;
        let primary = validate_primary(&client, if complete { &[] } else { &tables }).await?;
        let slot = slot_info(&client, &plan.slot).await?;
        Ok::<_, ReplicationError>((tables, primary, slot))
    })
    .await??;
    progress.heard.now();
    let rules_hash = rules.content_hash_hex();

    let existing = Existing {
        stored: stored.as_ref(),
        slot: slot.as_ref(),
        system_identifier: &primary.system_identifier,
        rules_hash: &rules_hash,
    };
    if let Some(complete) = resume_or_start_over(plan, &rules, &store, &client, existing).await? {
        return Ok(complete);
    }

    let started = Instant::now();
    let mut intent = BootstrapIntent::creating_slot(
        &primary,
        plan,
        rules_hash,
        start.generation,
        intent_tables(&tables),
    );
    let encoded = intent.encode()?;
    store.write(0, |w| {
        BootstrapIntent::save_rules_text(rules.text(), w)?;
        BootstrapIntent::save(&encoded, w)
    })?;
    let exported = create_slot(&plan.connection, &client, &plan.slot).await?;
    intent.state = BootstrapState::Snapshotting;
    intent.consistent_point = Some(exported.consistent_point);
    let encoded = intent.encode()?;
    store.write(0, |w| BootstrapIntent::save(&encoded, w))?;
    tracing::info!(
        slot = %plan.slot,
        consistent_point = %format_lsn(exported.consistent_point),
        tables = tables.len(),
        "slot created, copying the snapshot"
    );

    progress.start_copy();
    let reader = connect(&plan.connection).await?;
    let jobs = within(bound, "the start of the snapshot's copy", async {
        enter_snapshot(&reader, &exported.snapshot).await?;
        let oids: Vec<u32> = primary.tables.iter().map(|t| t.oid).collect();
        progress.set_rows_estimated(source::estimated_rows(&reader, &oids).await?);
        table_jobs(&reader, &primary, &mut intent).await
    })
    .await??;
    progress.heard.now();
    let copies: Vec<SnapshotCopy> = primary
        .tables
        .iter()
        .zip(&jobs)
        .zip(&intent.tables)
        .map(|((i, j), t)| SnapshotCopy {
            table: i.table.clone(),
            columns: j.columns.clone(),
            partitioned: t.partitions.is_some(),
        })
        .collect();
    let mut pipeline = Pipeline::start(rules, jobs, store.clone(), progress.clone())
        .map_err(|e| SourceError::Connection(format!("cannot start snapshot threads: {e}")))?;
    let copied = copy_all(&reader, &copies, &mut pipeline, &progress, bound).await;
    if copied.is_ok() {
        intent.state = BootstrapState::Complete;
        pipeline.finish(intent.clone()).await;
    }
    let joined = tokio::task::spawn_blocking(move || pipeline.join())
        .await
        .map_err(|e| SourceError::Connection(format!("snapshot threads: {e}")))?;
    // A pipeline error explains a failed send; otherwise report the COPY error.
    joined?;
    copied?;
    drop(exported);
    let rows = progress.rows();
    tracing::info!(
        rows,
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "snapshot complete"
    );
    Ok(BootstrapOutcome::Copied {
        consistent_point: intent.consistent_point.unwrap_or(0),
        rows,
    })
}

/// What a bootstrap finds when it starts: the stored record, the slot of the plan's name,
/// the primary's system identifier and the rules' hash.
struct Existing<'a> {
    stored: Option<&'a BootstrapIntent>,
    slot: Option<&'a source::SlotInfo>,
    system_identifier: &'a str,
    rules_hash: &'a str,
}

/// Checks what the store and the primary hold before a bootstrap: a complete snapshot of
/// this slot is kept (its outcome returned); an interrupted bootstrap's slot is dropped and
/// its store cleared; a slot the store does not own is refused.
async fn resume_or_start_over(
    plan: &SourcePlan,
    rules: &SyncRules,
    store: &Store,
    client: &tokio_postgres::Client,
    existing: Existing<'_>,
) -> Result<Option<BootstrapOutcome>, ReplicationError> {
    let Existing {
        stored,
        slot,
        system_identifier,
        rules_hash,
    } = existing;
    if let Some(intent) = stored {
        check_ownership(intent, plan, system_identifier, rules_hash)?;
        if intent.state == BootstrapState::Complete
            && store
                .read(|view| Ok(BootstrapIntent::load_rules_text(view)))??
                .is_none()
        {
            // Built before the rules text was recorded: record it (the hash matched).
            store.write(0, |w| BootstrapIntent::save_rules_text(rules.text(), w))?;
        }
        if intent.state == BootstrapState::Complete {
            check_naming(intent, rules, store)?;
            // A slot gone or invalidated is the stream's to rebuild (`resync`): the store
            // keeps serving meanwhile.
            let consistent_point = intent.consistent_point.unwrap_or(0);
            tracing::info!(slot = %plan.slot, consistent_point = %format_lsn(consistent_point), "snapshot already complete");
            return Ok(Some(BootstrapOutcome::AlreadyComplete {
                consistent_point,
                rows: intent.rows,
            }));
        }
        // Interrupted: the slot (if it exists) is ours when it matches the intent and is idle.
        if let Some(slot) = slot {
            if slot.active {
                return Err(ownership(
                    "PSM_B1005",
                    format!("replication slot \"{}\" is in use by another process; stop it or set powersync_mdbx.slot_name", plan.slot),
                ));
            }
            if slot.database.as_deref() != Some(intent.database.as_str())
                || slot.plugin.as_deref() != Some("pgoutput")
            {
                return Err(foreign_slot(&plan.slot));
            }
            tracing::info!(slot = %plan.slot, "dropping the slot of an interrupted bootstrap");
            drop_slot(client, &plan.slot).await?;
        }
        tracing::info!("starting the interrupted bootstrap over");
        store.clear_data()?;
    } else if slot.is_some() {
        return Err(foreign_slot(&plan.slot));
    }
    Ok(None)
}

/// The store's record of `tables`, numbered from 1, before their columns are read.
fn intent_tables(tables: &[SourceTable]) -> Vec<IntentTable> {
    tables
        .iter()
        .zip(1u32..)
        .map(|(t, id)| IntentTable {
            id,
            schema: t.schema.clone(),
            name: t.name.clone(),
            columns: Vec::new(),
            identity: Vec::new(),
            oid: 0,
            recopy: false,
            rekey_from: Vec::new(),
            gone: false,
            partitions: None,
        })
        .collect()
}

/// Reads each table's columns (and a partitioned one's partitions) in the snapshot
/// (`reader`), records them with its replica identity and OID in `intent`, and returns the
/// pipeline's job for each.
async fn table_jobs(
    reader: &tokio_postgres::Client,
    primary: &source::PrimaryInfo,
    intent: &mut BootstrapIntent,
) -> Result<Vec<TableJob>, ReplicationError> {
    let mut jobs = Vec::new();
    for (info, table) in primary.tables.iter().zip(intent.tables.iter_mut()) {
        let columns = table_columns(reader, info.oid).await?;
        table.columns = columns.clone();
        table.identity = info.identity_columns.clone();
        table.oid = info.oid;
        table.partitions = table_partitions(reader, info.oid).await?;
        let identity = info
            .identity_columns
            .iter()
            .map(|name| columns.iter().position(|c| &c.name == name))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| ReplicationError::Copy {
                table: info.table.to_string(),
                problem: "a replica identity column is not published (generated?)".into(),
            })?;
        jobs.push(TableJob {
            id: table.id,
            schema: table.schema.clone(),
            name: table.name.clone(),
            columns,
            identity,
        });
    }
    Ok(jobs)
}

/// One table's copy in the snapshot.
struct SnapshotCopy {
    table: SourceTable,
    columns: Vec<source::ColumnMeta>,
    /// Partitioned: every partition's rows are read.
    partitioned: bool,
}

async fn copy_all(
    reader: &tokio_postgres::Client,
    copies: &[SnapshotCopy],
    pipeline: &mut Pipeline,
    progress: &Progress,
    stall_after: std::time::Duration,
) -> Result<(), ReplicationError> {
    for (index, copy) in copies.iter().enumerate() {
        let SnapshotCopy {
            table,
            columns,
            partitioned,
        } = copy;
        let mut rows = copy_table(reader, table, columns, *partitioned, stall_after).await?;
        let mut chunk = Vec::with_capacity(CHUNK_ROWS);
        while let Some(row) = rows.next().await {
            chunk.push(row?);
            if chunk.len() == CHUNK_ROWS {
                progress.heard.now();
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK_ROWS));
                if !pipeline.send_rows(index, full).await {
                    return Ok(()); // the pipeline stopped; its error is reported
                }
            }
        }
        if !chunk.is_empty() && !pipeline.send_rows(index, chunk).await {
            return Ok(());
        }
        progress.table_done();
    }
    Ok(())
}

/// The rules name buckets as the stored data does: by the generation it was built with, or
/// by its store's history id.
fn check_naming(
    intent: &BootstrapIntent,
    rules: &SyncRules,
    store: &Store,
) -> Result<(), ReplicationError> {
    let stored = match rules.bucket_version() {
        rules::BucketVersion::Derived(_) => store.read(|v| v.history())?.map_or(
            rules::BucketVersion::Versioned(intent.generation),
            rules::BucketVersion::Derived,
        ),
        rules::BucketVersion::Versioned(_) => rules::BucketVersion::Versioned(intent.generation),
        rules::BucketVersion::Unversioned => return Ok(()),
    };
    if stored == rules.bucket_version() {
        return Ok(());
    }
    Err(ownership(
        "PSM_B1010",
        format!(
            "the storage holds buckets named {stored:?}, the rules were compiled for {:?} (a \
             bug: the engine takes the naming from the storage); run SELECT \
             powersync_mdbx.reset()",
            rules.bucket_version()
        ),
    ))
}

fn check_ownership(
    intent: &BootstrapIntent,
    plan: &SourcePlan,
    system_identifier: &str,
    rules_hash: &str,
) -> Result<(), ReplicationError> {
    if intent.system_identifier != system_identifier || intent.database != plan.connection.database
    {
        return Err(ownership(
            "PSM_B1001",
            format!(
                "the storage holds data of another primary (system identifier {}, database {}), not of the \
                 configured one ({system_identifier}, {}); point the config back, or run SELECT powersync_mdbx.reset()",
                intent.system_identifier, intent.database, plan.connection.database
            ),
        ));
    }
    if intent.slot != plan.slot {
        return Err(ownership(
            "PSM_B1002",
            format!(
                "the storage was built through slot \"{}\", but powersync_mdbx.slot_name is \"{}\"; set it back, \
                 or run SELECT powersync_mdbx.reset()",
                intent.slot, plan.slot
            ),
        ));
    }
    // An interrupted bootstrap starts over with the rules it is given.
    if intent.state == BootstrapState::Complete && intent.rules_hash != rules_hash {
        return Err(ownership(
            "PSM_B1003",
            "the sync rules changed since the storage was built; run SELECT powersync_mdbx.reset() to rebuild \
             with the new rules"
                .to_owned(),
        ));
    }
    Ok(())
}

pub(super) fn foreign_slot(name: &str) -> ReplicationError {
    ownership(
        "PSM_R1013",
        format!(
            "replication slot \"{name}\" exists on the primary but this storage did not create it; drop it \
             (SELECT pg_drop_replication_slot('{name}')) if it is stale, or set powersync_mdbx.slot_name to another name"
        ),
    )
}

fn ownership(code: &'static str, message: String) -> ReplicationError {
    ReplicationError::Ownership { code, message }
}
