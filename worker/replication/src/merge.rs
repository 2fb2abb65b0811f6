//! The applier's side of a table's re-copy (`recopy`): from the Relation message that
//! changed the table's columns on, the applier notes the commit LSN of every stream change
//! of each of its rows; the copy, consistent at LSN `C`, then replaces what the stream has
//! not changed since `C`:
//!
//! - a copied row whose identity the stream changed in a transaction committed at or
//!   after `C` is skipped (the stream's version is newer);
//! - any other copied row is evaluated with the rules; when the store holds exactly that
//!   output already, nothing is written (clients get no op), else it is written with a PUT
//!   only in the buckets where its output changed (and a REMOVE in those it left);
//! - a stored row the copy did not have and the stream did not change since `C` is
//!   deleted (it was gone at `C`).
//!
//! The copy is merged only after every transaction committed before `C` was applied, so a
//! stream change older than the copy can never overwrite it.

use std::collections::{HashMap, HashSet};

use crate::copied::CopiedEvaluation;
use crate::error::ReplicationError;
use crate::progress::RecopyProgress;
use crate::row::EvaluatedRow;
use crate::store_input::StoreInput;
use crate::table::StreamTable;
use store::{StoredAs, WriteTxn};

/// One table's re-copy as the applier merges it.
#[derive(Debug, Default)]
pub(super) struct Merge {
    /// Commit LSN of the last stream change of each row (store identity) since the
    /// table's columns changed.
    touched: HashMap<Vec<u8>, u64>,
    /// Commit LSN of the last TRUNCATE of the table since then.
    truncated: Option<u64>,
    /// The replica identity changed: the one the stored rows are keyed by until the copy
    /// or the stream meets them (empty: unchanged).
    rekey_from: Vec<String>,
    copy: Option<Copied>,
    /// Why the table is copied again.
    why: String,
    /// When the re-copy started (Unix seconds).
    started_at: u64,
    /// The store's file size then.
    file_bytes_at_start: u64,
    /// The history forked for this merge (`store::forks`).
    forked: bool,
    /// Clients see none of the stream's writes from this re-copy's start until it is
    /// merged (`Store::hold`): it changes what they see of the table (a schema change),
    /// unlike a deploy's, which writes only into buckets not served yet.
    holds: bool,
}

#[derive(Debug)]
struct Copied {
    consistent_point: u64,
    /// The table with the columns the copy has.
    shape: StreamTable,
    /// Row ids of the stored rows the copy holds: the final sweep deletes the others
    /// (unless the stream changed them since the copy's consistent point).
    held: HashSet<u64, foldhash::fast::FixedState>,
    rows: u64,
    written: u64,
}

/// What a finished merge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Merged {
    /// Rows the copy held.
    pub rows: u64,
    /// Rows written because their output changed.
    pub written: u64,
    /// Stored rows deleted because the copy did not hold them.
    pub deleted: u64,
}

impl Merged {
    /// Adds another table's counts.
    pub fn add(&mut self, other: Merged) {
        self.rows += other.rows;
        self.written += other.written;
        self.deleted += other.deleted;
    }
}

impl Merge {
    /// A merge whose stored rows are keyed by replica identity `rekey_from` (empty: the
    /// table's own), started for `why` while the store's file held `file_bytes`.
    pub fn rekeying(rekey_from: Vec<String>, why: String, file_bytes: u64) -> Self {
        Self {
            rekey_from,
            why,
            started_at: unix_now(),
            file_bytes_at_start: file_bytes,
            ..Self::default()
        }
    }

    /// The same merge, holding what clients see until it is merged when `holds`.
    pub fn holding(mut self, holds: bool) -> Self {
        self.holds = holds;
        self
    }

    /// Whether clients see nothing new until this merge is done.
    pub fn holds(&self) -> bool {
        self.holds
    }

    /// The same merge, told whether the event it is part of (a rebuild of every table)
    /// forked the history already.
    pub fn after_fork(mut self, forked: bool) -> Self {
        self.forked = forked;
        self
    }

    /// Whether the history forked for this merge (or the event it is part of).
    pub fn has_forked(&self) -> bool {
        self.forked
    }

    /// Copied rows merged so far, and of those the rows written.
    pub fn merged_rows(&self) -> (u64, u64) {
        self.copy.as_ref().map_or((0, 0), |c| (c.rows, c.written))
    }

    /// Its progress, for table `table` while the store's file holds `file_bytes`.
    pub fn progress(&self, table: String, file_bytes: u64) -> RecopyProgress {
        let (rows_merged, rows_written) = self.merged_rows();
        RecopyProgress {
            table,
            why: self.why.clone(),
            started_at: self.started_at,
            rows_merged,
            rows_written,
            extra_file_bytes: file_bytes.saturating_sub(self.file_bytes_at_start),
        }
    }

    /// The identity the stored rows are keyed by, when it is not the table's.
    pub fn rekey_from(&self) -> &[String] {
        &self.rekey_from
    }

    /// A stream change of row `identity` in the transaction committing at `commit_lsn`.
    pub fn touch(&mut self, identity: &[u8], commit_lsn: u64) {
        self.touched.insert(identity.to_vec(), commit_lsn);
    }

    /// A TRUNCATE of the table in the transaction committing at `commit_lsn`.
    pub fn truncate(&mut self, commit_lsn: u64) {
        self.truncated = Some(commit_lsn);
    }

    /// The copy is consistent at `consistent_point`; its rows come as `shape` has them.
    pub fn start(&mut self, consistent_point: u64, shape: StreamTable) {
        self.copy = Some(Copied {
            consistent_point,
            shape,
            held: HashSet::default(),
            rows: 0,
            written: 0,
        });
    }

    /// The copy's columns, once started.
    pub fn shape(&self) -> Option<&StreamTable> {
        self.copy.as_ref().map(|c| &c.shape)
    }

    /// True when the stream changed the row (or emptied the table) at or after the copy's
    /// consistent point.
    fn newer_than_copy(&self, identity: &[u8], consistent_point: u64) -> bool {
        self.truncated.is_some_and(|lsn| lsn >= consistent_point)
            || self
                .touched
                .get(identity)
                .is_some_and(|&lsn| lsn >= consistent_point)
    }

    /// Merges copied rows, evaluated (see [`evaluate_copied`](crate::copied::evaluate_copied)), and notes the stored rows
    /// found exactly as evaluated beforehand (`unchanged`, by row id).
    pub fn rows(
        &mut self,
        w: &mut WriteTxn<'_, '_>,
        rows: Vec<CopiedEvaluation>,
        unchanged: Vec<u64>,
    ) -> Result<(), ReplicationError> {
        let Some(mut copy) = self.copy.take() else {
            return Ok(());
        };
        // When the copy was taken is this replica's own: its ops are not its peers'. The
        // history forks once per merge, before its first op.
        if !self.forked {
            w.diverge();
        }
        copy.rows += unchanged.len() as u64;
        copy.held.extend(unchanged);
        let result = (|| {
            let table_id = copy.shape.store_id;
            for (row, compared) in rows {
                let EvaluatedRow {
                    identity,
                    previous,
                    eval,
                    stash,
                } = row;
                copy.rows += 1;
                if self.newer_than_copy(&identity, copy.consistent_point) {
                    // Not held: the sweep keeps it for the stream's change.
                    continue;
                }
                if let Some(previous) = &previous {
                    // The row keeps its row id (and so its ops) under its new key.
                    w.rekey_row(table_id, previous, &identity)?;
                }
                let input = StoreInput::of(&eval);
                let lookups = input.lookup_puts();
                // A comparison made beside the applier still holds: since then the row
                // changed only if the stream changed it (skipped above).
                let (verdict, row_id) = match compared {
                    Some(compared) => compared,
                    None => {
                        w.stored_as(table_id, &identity, &input.memberships, &lookups, &stash)?
                    }
                };
                let row_id = match verdict {
                    StoredAs::Same => row_id,
                    StoredAs::SameButStash => {
                        w.restash_row(table_id, &identity, stash)?;
                        row_id
                    }
                    StoredAs::Different => {
                        copy.written += 1;
                        w.merge_row_stashed(
                            table_id,
                            &identity,
                            &input.memberships,
                            &lookups,
                            stash,
                        )?
                    }
                };
                copy.held.extend(row_id);
            }
            Ok(())
        })();
        self.copy = Some(copy);
        w.converge();
        self.forked |= w.has_forked();
        result
    }

    /// Ends the merge: deletes the stored rows the copy did not hold and the stream did
    /// not change since the copy's consistent point.
    pub fn finish(&mut self, w: &mut WriteTxn<'_, '_>) -> Result<Merged, ReplicationError> {
        let Some(copy) = self.copy.take() else {
            return Ok(Merged::default());
        };
        if !self.forked {
            w.diverge();
        }
        let table_id = copy.shape.store_id;
        let gone: Vec<Vec<u8>> = w
            .table_rows_not_held(table_id, |row_id| copy.held.contains(&row_id))?
            .into_iter()
            .filter(|identity| !self.newer_than_copy(identity, copy.consistent_point))
            .collect();
        for identity in &gone {
            w.delete_row(table_id, identity)?;
        }
        w.converge();
        self.forked |= w.has_forked();
        Ok(Merged {
            rows: copy.rows,
            written: copy.written,
            deleted: gone.len() as u64,
        })
    }
}

/// Unix seconds now (0 before 1970).
pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
