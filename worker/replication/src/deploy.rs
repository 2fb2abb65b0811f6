//! A rules deploy inside the served store: the stream evaluates the served rules and the
//! new ones together (`SyncRules::with_rows_of`) while the tables the new rules read
//! differently are copied again; clients are then switched to the new rules over the same
//! store, so every bucket of an unchanged definition keeps its op ids and checksums.
//!
//! The store records the deploy (stage record `deploy`: the new rules' text) with the
//! tables it marked, in one commit, so a restart resumes it.

use std::sync::Arc;

use super::intent::{BootstrapIntent, IntentTable};
use crate::covered::covered_tables;
use crate::error::ReplicationError;
use config::SourceConnection;
use rules::{SyncRules, TableRef};
use source::{connect, table_columns, table_partitions, validate_primary, SourceTable};
use store::{ReadTxn, Store, StoreError};

/// Stage-record key of the rules a deploy in progress adds.
pub(super) const KEY: &str = "deploy";

/// Why a deploy's tables are copied again (the re-copy's reason in `status()`).
pub(super) const RECOPY_REASON: &str = "a rules deploy reads it differently";

/// The rules text of a deploy in progress in this store, if any.
pub fn deploy_in_progress(view: &ReadTxn<'_, '_>) -> Result<Option<String>, ReplicationError> {
    match view.stage_record(KEY)? {
        None => Ok(None),
        Some(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| ReplicationError::Store(StoreError::corrupt(view.dir(), "deploy record"))),
    }
}

/// Starts the deploy of `next` in `store` (its stream stopped), whose data was built with `served`: every
/// table whose readers differ between them is marked for a re-copy, each table only `next`
/// reads is added (its columns and identity from the primary's catalog) and marked, and
/// the deploy is recorded, in one commit. The stream must be stopped; started again with
/// `served.with_rows_of(next)` it copies the marked tables. Returns how many are marked.
pub async fn begin_deploy(
    connection: &SourceConnection,
    store: &Arc<Store>,
    served: &SyncRules,
    next: &SyncRules,
) -> Result<usize, ReplicationError> {
    let intent = store
        .read(|view| Ok(BootstrapIntent::load(view)))??
        .ok_or_else(|| {
            ReplicationError::Store(StoreError::corrupt(store.dir(), "bootstrap record missing"))
        })?;
    let client = connect(connection).await?;
    let new_tables: Vec<SourceTable> = covered_tables(&client, next)
        .await?
        .into_iter()
        .filter(|t| intent.table_id(&t.schema, &t.name).is_none())
        .collect();
    let mut added = Vec::new();
    if !new_tables.is_empty() {
        let primary = validate_primary(&client, &new_tables).await?;
        for info in primary.tables {
            let columns = table_columns(&client, info.oid).await?;
            let partitions = table_partitions(&client, info.oid).await?;
            added.push((info, columns, partitions));
        }
    }
    let mut tables = intent.tables.clone();
    for t in &mut tables {
        let table = TableRef {
            schema: t.schema.clone(),
            name: t.name.clone(),
        };
        if !t.gone && !next.reads_table_as(served, &table) {
            t.recopy = true;
        }
    }
    let first_id = tables.iter().map(|t| t.id).max().unwrap_or(0) + 1;
    for (id, (info, columns, partitions)) in (first_id..).zip(added) {
        tables.push(IntentTable {
            id,
            schema: info.table.schema,
            name: info.table.name,
            columns,
            identity: info.identity_columns,
            oid: info.oid,
            recopy: true,
            rekey_from: Vec::new(),
            gone: false,
            partitions,
        });
    }
    let marked = tables.iter().filter(|t| t.recopy).count();
    let text = next.text().to_owned();
    store.write(applied(store)?, move |w| {
        rewrite_intent(w, |intent| intent.tables = tables)?;
        // Every op from here on depends on when this replica deployed: its op ids leave
        // the history its peers share (`store::forks`).
        w.fork_history()?;
        w.put_stage_record(KEY, text.as_bytes())
    })?;
    Ok(marked)
}

/// Ends the deploy of `next`: it becomes the rules the store records (its text, and its
/// hash in the bootstrap record), and the deploy record goes, in one commit.
pub fn finish_deploy(store: &Store, next: &SyncRules) -> Result<(), ReplicationError> {
    let (text, hash) = (next.text().to_owned(), next.content_hash_hex());
    store.write(applied(store)?, move |w| {
        rewrite_intent(w, |intent| intent.rules_hash = hash)?;
        BootstrapIntent::save_rules_text(&text, w)?;
        w.delete_stage_record(KEY)
    })?;
    Ok(())
}

/// Abandons a deploy in progress: only its record goes. The tables it marked are still
/// copied again, under the served rules: a row whose stored outputs included the
/// abandoned rules' gets a REMOVE in their buckets, which nobody is served.
pub fn abandon_deploy(store: &Store) -> Result<(), ReplicationError> {
    store.write(applied(store)?, |w| w.delete_stage_record(KEY))?;
    Ok(())
}

/// Changes the bootstrap record in `w`'s transaction.
fn rewrite_intent(
    w: &store::WriteTxn<'_, '_>,
    change: impl FnOnce(&mut BootstrapIntent),
) -> Result<(), StoreError> {
    let bytes = w
        .stage_record(BootstrapIntent::KEY)?
        .ok_or_else(|| StoreError::corrupt(w.dir(), "bootstrap record missing"))?;
    let mut intent = BootstrapIntent::decode(&bytes)
        .map_err(|_| StoreError::corrupt(w.dir(), "bootstrap record"))?;
    change(&mut intent);
    let encoded = intent
        .encode()
        .map_err(|_| StoreError::corrupt(w.dir(), "bootstrap record"))?;
    BootstrapIntent::save(&encoded, w)
}

/// The position the store holds (its commits here keep it: the stream is stopped).
fn applied(store: &Store) -> Result<u64, ReplicationError> {
    Ok(store.read(|view| view.checkpoint())?.lsn)
}
