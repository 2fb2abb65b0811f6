//! Applying one decoded change inside the open store transaction: a row written (as the
//! stream's task prepared it, or evaluated here), updated with its unchanged TOAST values
//! filled in, deleted, a table emptied, rebound to new columns (its re-copy started) or
//! gone.

use std::collections::HashMap;

use super::Applier;
use crate::change::Change;
use crate::error::ReplicationError;
use crate::intent::{BootstrapIntent, IntentTable};
use crate::merge::Merge;
use crate::row::{
    evaluate_row, fill_unchanged, identity_of, old_identity_of, values_of, PreparedRow, Presence,
};
use crate::store_input::StoreInput;
use crate::table::{key_columns, rebind, table_at, StreamTable};
use source::Tuple;
use store::{identity_key, WriteTxn};

impl Applier {
    /// Applies one change of the transaction committing at `commit_lsn`; returns the rows
    /// it touched. A table being re-copied has its changed rows noted (see `merge`).
    /// The change is left to be dropped by the caller (the stream's thread, which made its
    /// buffers: `handoff`).
    pub(super) fn apply(
        &self,
        w: &mut WriteTxn<'_, '_>,
        tables: &mut Vec<StreamTable>,
        merges: &mut HashMap<usize, Merge>,
        commit_lsn: u64,
        change: &mut Change,
    ) -> Result<u64, ReplicationError> {
        let touch = |merges: &mut HashMap<usize, Merge>, index: usize, identity: &[u8]| {
            if let Some(merge) = merges.get_mut(&index) {
                merge.touch(identity, commit_lsn);
            }
        };
        match change {
            Change::Insert {
                table: index,
                new,
                prepared,
            } => {
                let index = *index;
                let table = table_at(tables, index)?;
                let identity = match prepared {
                    Some(prepared) => write_prepared(w, table, prepared)?,
                    None => {
                        let values = values_of(table, new);
                        let filled: Vec<Option<&[u8]>> =
                            values.iter().map(|v| v.as_deref()).collect();
                        self.write_row(w, table, &filled, false)?
                    }
                };
                touch(merges, index, &identity);
                Ok(1)
            }
            Change::Update {
                table: index,
                old,
                new,
                prepared,
            } => {
                let index = *index;
                let table = table_at(tables, index)?;
                let rekey_from = merges.get(&index).map_or(&[][..], |m| m.rekey_from());
                let (old_identity, new_identity) = self.update(
                    w,
                    table,
                    old.as_deref(),
                    new,
                    prepared.as_deref_mut(),
                    rekey_from,
                )?;
                touch(merges, index, &old_identity);
                if let Some(new_identity) = new_identity {
                    touch(merges, index, &new_identity);
                }
                Ok(1)
            }
            Change::Delete { table: index, old } => {
                let index = *index;
                let table = table_at(tables, index)?;
                let values = values_of(table, old);
                let identity = identity_of(table, &values);
                let rekey_from = merges.get(&index).map_or(&[][..], |m| m.rekey_from());
                carry_over(w, table, rekey_from, &[&values], &identity)?;
                w.delete_row(table.store_id, &identity)?;
                touch(merges, index, &identity);
                Ok(1)
            }
            Change::Truncate { tables: truncated } => {
                let mut rows = 0;
                for &mut index in truncated {
                    rows += w.truncate_table(table_at(tables, index)?.store_id)?;
                    if let Some(merge) = merges.get_mut(&index) {
                        merge.truncate(commit_lsn);
                    }
                }
                Ok(rows)
            }
            Change::Relation {
                table: index,
                oid,
                identity,
                columns,
                repartitioned,
                recopy,
                rekey_from,
                why,
            } => {
                let (index, oid, recopy) = (*index, *oid, *recopy);
                let (identity, columns) = (std::mem::take(identity), std::mem::take(columns));
                let (rekey_from, why) = (std::mem::take(rekey_from), std::mem::take(why));
                let repartitioned = repartitioned.take();
                rebind(
                    tables,
                    index,
                    oid,
                    identity,
                    columns,
                    repartitioned,
                    &self.rules,
                )?;
                if recopy {
                    self.start_recopy(w, tables, merges, index, rekey_from, why)?;
                }
                Ok(0)
            }
            Change::Gone { table: index } => self.gone(w, tables, merges, *index),
            Change::Added { index, table } => self.add(w, tables, merges, *index, table),
            Change::Begin { .. }
            | Change::Commit { .. }
            | Change::Advance { .. }
            | Change::Passed { .. }
            | Change::Recopy(_) => Ok(0),
        }
    }

    /// A table the stream follows from now on (`index`: its place, the next one): recorded
    /// in the bootstrap record, and its rows copied, holding what clients see until then.
    fn add(
        &self,
        w: &mut WriteTxn<'_, '_>,
        tables: &mut Vec<StreamTable>,
        merges: &mut HashMap<usize, Merge>,
        index: usize,
        table: &StreamTable,
    ) -> Result<u64, ReplicationError> {
        if index != tables.len() {
            return Err(crate::error::stream_error(format!(
                "table #{index} added after {} tables (a bug)",
                tables.len()
            )));
        }
        BootstrapIntent::add_table(
            w,
            IntentTable {
                id: table.store_id,
                schema: table.schema.clone(),
                name: table.name.clone(),
                columns: table.columns.clone(),
                identity: table.identity_names.clone(),
                oid: table.oid,
                recopy: true,
                rekey_from: Vec::new(),
                gone: false,
                partitions: table.partitions.clone(),
            },
        )?;
        tables.push(table.clone());
        let why = "it is new, and the sync rules read it through a wildcard table";
        self.start_recopy(w, tables, merges, index, Vec::new(), why.into())?;
        Ok(0)
    }

    /// A Relation change asks for the table's rows to be copied again: recorded in the
    /// bootstrap record, and its merge started, holding what clients see until it ends.
    fn start_recopy(
        &self,
        w: &mut WriteTxn<'_, '_>,
        tables: &[StreamTable],
        merges: &mut HashMap<usize, Merge>,
        index: usize,
        rekey_from: Vec<String>,
        why: String,
    ) -> Result<(), ReplicationError> {
        // Any re-copy in progress read the old columns: it starts over (rows
        // not yet moved to their new keys are still under the old ones).
        let rekey_from = match merges.remove(&index) {
            Some(running) if rekey_from.is_empty() => running.rekey_from().to_vec(),
            _ => rekey_from,
        };
        let table = table_at(tables, index)?;
        BootstrapIntent::update_table(w, table.store_id, |t| {
            t.columns = table.columns.clone();
            t.identity = table.identity_names.clone();
            t.oid = table.oid;
            t.recopy = true;
            t.rekey_from = rekey_from.clone();
            t.gone = false;
            t.partitions = table.partitions.clone();
        })?;
        // The table's rows switch to their new outputs in one published checkpoint: from
        // this write on (the first in the table's new shape) clients see nothing new until
        // the copy is merged (`publish`).
        w.hold_open();
        merges.insert(
            index,
            Merge::rekeying(rekey_from, why, self.store.file_bytes()).holding(true),
        );
        Ok(())
    }

    /// Table `index` is gone from the primary under its name: its rows leave the buckets;
    /// returns how many were removed.
    fn gone(
        &self,
        w: &mut WriteTxn<'_, '_>,
        tables: &mut [StreamTable],
        merges: &mut HashMap<usize, Merge>,
        index: usize,
    ) -> Result<u64, ReplicationError> {
        merges.remove(&index);
        let table = table_at(tables, index)?;
        // When the grace period ended is this replica's own (see `forks`).
        w.diverge();
        let removed = w.truncate_table(table.store_id)?;
        w.converge();
        BootstrapIntent::update_table(w, table.store_id, |t| {
            t.gone = true;
            t.recopy = false;
            t.rekey_from.clear();
        })?;
        tracing::info!(
            table = %table.qualified(),
            rows = removed,
            "the table's rows left the buckets"
        );
        if let Some(table) = tables.get_mut(index) {
            table.gone = true;
        }
        Ok(removed)
    }

    /// Applies an update; returns the row's old identity and its new one when it changed.
    fn update(
        &self,
        w: &mut WriteTxn<'_, '_>,
        table: &StreamTable,
        old: Option<&Tuple>,
        new: &Tuple,
        prepared: Option<&mut PreparedRow>,
        rekey_from: &[String],
    ) -> Result<(Vec<u8>, Option<Vec<u8>>), ReplicationError> {
        let prepared = match (old, prepared) {
            // The key did not change (no old tuple) and the new tuple was complete: the
            // prepared row's identity is the row's, nothing is filled in, and outside a
            // re-keying re-copy nothing is carried over (most rows of a bulk UPDATE).
            (None, Some(prepared)) if rekey_from.is_empty() => {
                return Ok((write_prepared(w, table, prepared)?, None));
            }
            (_, prepared) => prepared,
        };
        let old_values = old.map(|old| values_of(table, old));
        let mut values = values_of(table, new);
        let old_identity = old_identity_of(table, old_values.as_deref(), &values)?;
        let tuples: Vec<&[Presence]> = old_values
            .as_deref()
            .into_iter()
            .chain([&values[..]])
            .collect();
        carry_over(w, table, rekey_from, &tuples, &old_identity)?;
        let used_stash = fill_unchanged(table, old_values.as_deref(), &mut values, || {
            Ok(w.stash(table.store_id, &old_identity)?.unwrap_or_default())
        })?;
        let new_identity = identity_of(table, &values);
        if new_identity != old_identity {
            w.rekey_row(table.store_id, &old_identity, &new_identity)?;
        }
        match prepared {
            // Prepared from a complete new tuple: nothing was filled in above.
            Some(prepared) => {
                write_prepared(w, table, prepared)?;
            }
            None => {
                let filled: Vec<Option<&[u8]>> = values.iter().map(|v| v.as_deref()).collect();
                self.write_row(w, table, &filled, used_stash)?;
            }
        }
        let changed = (new_identity != old_identity).then_some(new_identity);
        Ok((old_identity, changed))
    }

    /// Evaluates a complete row and stores it under its identity, which it returns.
    fn write_row(
        &self,
        w: &mut WriteTxn<'_, '_>,
        table: &StreamTable,
        values: &[Option<&[u8]>],
        used_stash: bool,
    ) -> Result<Vec<u8>, ReplicationError> {
        let row = evaluate_row(table, values, used_stash)?;
        let input = StoreInput::of(&row.eval);
        w.upsert_row_stashed(
            table.store_id,
            &row.identity,
            &input.memberships,
            &input.lookup_puts(),
            row.stash,
        )?;
        Ok(row.identity)
    }
}

/// Stores a row the stream's task evaluated and packed (`prepare`) under its identity,
/// which it returns (taken out of it, as its stash; the rest is dropped with the change).
fn write_prepared(
    w: &mut WriteTxn<'_, '_>,
    table: &StreamTable,
    prepared: &mut PreparedRow,
) -> Result<Vec<u8>, ReplicationError> {
    let PreparedRow { row, packed } = prepared;
    let input = StoreInput::of(&row.eval);
    w.upsert_row_packed(
        table.store_id,
        &row.identity,
        &input.memberships,
        &input.lookup_puts(),
        std::mem::take(&mut row.stash),
        packed,
    )?;
    Ok(std::mem::take(&mut row.identity))
}

/// During a re-copy after the replica identity changed (the stored rows keyed by
/// `rekey_from`): moves the row a change addresses from its old key to `target` (the key
/// the change looks it up by), taking the old identity's values from the first of
/// `tuples` that holds them all; nothing when none does (the re-copy moves or removes the
/// row).
fn carry_over(
    w: &mut WriteTxn<'_, '_>,
    table: &StreamTable,
    rekey_from: &[String],
    tuples: &[&[Presence]],
    target: &[u8],
) -> Result<(), ReplicationError> {
    let Some(columns) = key_columns(table, rekey_from) else {
        return Ok(());
    };
    let previous = tuples.iter().find_map(|values| {
        columns
            .iter()
            .map(|&i| {
                values
                    .get(i)
                    .filter(|v| v.is_known())
                    .map(Presence::as_deref)
            })
            .collect::<Option<Vec<Option<&[u8]>>>>()
    });
    if let Some(previous) = previous.map(identity_key) {
        if previous != target {
            w.rekey_row(table.store_id, &previous, target)?;
        }
    }
    Ok(())
}
