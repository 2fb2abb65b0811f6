//! Row records: a source row's insert, update, delete, new identity and truncation,
//! and the row ids its keys claim.

use std::path::Path;

use libmdbx::{Cursor, Table, WriteFlags, RW};

use super::puts::{LookupPut, RowPut, Stash};
use super::txn::WriteTxn;
use crate::env::Txn;
use crate::record::{Membership, Output, RowRecord};
use crate::stored_row;
use crate::tables::{row_key, RowIdValue};
use crate::StoreError;

impl WriteTxn<'_, '_> {
    /// Applies an inserted or updated source row: a PUT in every bucket of `puts`,
    /// a REMOVE in every bucket it left, and its lookup entries replaced.
    pub fn upsert_row(
        &mut self,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
    ) -> Result<(), StoreError> {
        self.apply_row(
            table_id,
            identity,
            puts,
            lookups,
            Stash::new(),
            RowWrite::Upsert,
            Outputs::Encode,
        )
        .map(drop)
    }

    /// [`Self::upsert_row`] that also keeps `stash` with the row (see [`Self::stash`]).
    pub fn upsert_row_stashed(
        &mut self,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
        stash: Stash,
    ) -> Result<(), StoreError> {
        self.apply_row(
            table_id,
            identity,
            puts,
            lookups,
            stash,
            RowWrite::Upsert,
            Outputs::Encode,
        )
        .map(drop)
    }

    /// Writes a row as a table's re-copy found it: like [`Self::upsert_row_stashed`], but a
    /// bucket whose output of the row is exactly what it holds keeps its op (no PUT), so
    /// clients get ops only in the buckets where the row's output changed. Returns the
    /// row's id (`None`: it feeds nothing and is not stored).
    pub fn merge_row_stashed(
        &mut self,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
        stash: Stash,
    ) -> Result<Option<u64>, StoreError> {
        self.apply_row(
            table_id,
            identity,
            puts,
            lookups,
            stash,
            RowWrite::Merge,
            Outputs::Encode,
        )
    }

    /// Adds a row known not to be stored yet (the initial snapshot into an empty store):
    /// skips the lookup of an earlier version. A duplicate identity is an error.
    pub fn insert_row(
        &mut self,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
    ) -> Result<(), StoreError> {
        self.apply_row(
            table_id,
            identity,
            puts,
            lookups,
            Stash::new(),
            RowWrite::Insert,
            Outputs::Encode,
        )
        .map(drop)
    }

    /// Writes a row, its outputs section made as `outputs` says; returns its row id
    /// (`None`: it feeds nothing and is not stored).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_row(
        &mut self,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
        stash: Stash,
        mode: RowWrite,
        outputs: Outputs<'_>,
    ) -> Result<Option<u64>, StoreError> {
        self.flush_if_full()?;
        let key = row_key(table_id, identity);
        let known_new = mode == RowWrite::Insert;
        if known_new && self.claim_row(&key)?.is_none() {
            let mode = RowWrite::Upsert;
            return self.apply_row(table_id, identity, puts, lookups, stash, mode, outputs);
        }
        let (existing, row_id, old) = self.locate_row(&key, known_new)?;
        let mut record = RowRecord {
            table_id,
            stash,
            ..RowRecord::default()
        };
        let packed = match outputs {
            Outputs::Packed { indices, bytes } if mode != RowWrite::Merge => Some((indices, bytes)),
            _ => None,
        };
        let kept = self.kept_memberships(old.as_ref(), mode, puts, &mut record)?;
        let indices = packed.map(|(indices, _)| indices);
        self.put_memberships(puts, &kept, indices, old.as_ref(), row_id, &mut record)?;
        if let Some(old) = &old {
            // The row's memberships are its puts', in order (kept or new).
            let gone = old.memberships.iter().filter(|m| {
                let o = old.output(m);
                !record.memberships.iter().zip(puts).any(|(now, put)| {
                    now.bucket_id == m.bucket_id
                        && put.object_type == o.object_type
                        && put.object_id == o.object_id
                })
            });
            self.remove_memberships(old, gone, row_id)?;
        }
        record.lookups = self.replace_lookups(row_id, old.as_ref(), lookups)?;
        if record.memberships.is_empty() && record.lookups.is_empty() {
            // The row feeds nothing now: forget it (its REMOVEs were written above).
            if existing.is_some() || known_new {
                self.forget_row(&key, row_id)?;
            }
            return Ok(None);
        }
        let bytes = packed.map(|(_, bytes)| bytes);
        self.write_row(&key, row_id, &record, bytes, existing.is_some(), known_new)?;
        Ok(Some(row_id))
    }

    /// Where [`Self::apply_row`] finds the row `key` names: its stored id (`None` when it
    /// is not stored or `known_new`), the id it is written under and its stored record.
    #[inline]
    #[allow(clippy::type_complexity)]
    fn locate_row(
        &mut self,
        key: &[u8],
        known_new: bool,
    ) -> Result<(Option<u64>, u64, Option<RowRecord>), StoreError> {
        let existing = if known_new {
            None
        } else {
            self.row_id_at(key)?
        };
        // A stored row is read through the rows cursor, which then rewrites it in place.
        let (row_id, old) = match existing {
            Some(row_id) => (row_id, Some(self.load_row_at(row_id)?)),
            None if known_new => (self.counters.next_row - 1, None),
            None => {
                let row_id = self.counters.next_row;
                self.counters.next_row += 1;
                (row_id, None)
            }
        };
        Ok((existing, row_id, old))
    }

    /// A merge keeps the op of each bucket that shows the row as before; the old
    /// outputs then stay at their places in `record`, since a kept op names its output by
    /// index (one no longer shown stays in the record until the row's next update).
    /// Returns per put the membership a merge keeps (empty unless merging: no allocation
    /// on the ordinary paths).
    #[inline]
    fn kept_memberships(
        &mut self,
        old: Option<&RowRecord>,
        mode: RowWrite,
        puts: &[RowPut<'_>],
        record: &mut RowRecord,
    ) -> Result<Vec<Option<Membership>>, StoreError> {
        let mut kept: Vec<Option<Membership>> = Vec::new();
        if let Some(old) =
            old.filter(|old| mode == RowWrite::Merge && old.outputs.len() <= KEPT_OUTPUTS_MAX)
        {
            for put in puts {
                kept.push(match self.existing_bucket_id(put.bucket)? {
                    Some(bucket_id) => old.membership_showing(bucket_id, put).copied(),
                    None => None,
                });
            }
            if kept.iter().any(Option::is_some) {
                record.outputs = old.outputs.clone();
            }
        }
        Ok(kept)
    }

    /// The row's memberships into `record`, in the puts' order: each kept one as it was,
    /// each other one a new PUT (its output from `indices` when packed ahead) that
    /// supersedes the row's previous op in that bucket.
    #[inline]
    fn put_memberships(
        &mut self,
        puts: &[RowPut<'_>],
        kept: &[Option<Membership>],
        indices: Option<&[u8]>,
        old: Option<&RowRecord>,
        row_id: u64,
        record: &mut RowRecord,
    ) -> Result<(), StoreError> {
        for (i, put) in puts.iter().enumerate() {
            if let Some(&Some(kept)) = kept.get(i) {
                record.memberships.push(kept);
                continue;
            }
            let output = match indices {
                Some(indices) => indices.get(i).copied(),
                None => record.output_index(put),
            }
            .ok_or_else(|| {
                StoreError::corrupt(self.dir, "a row with more than 255 distinct outputs")
            })?;
            let membership = self.put_op(put.bucket, output, put.checksum, row_id)?;
            if let Some(previous) = old.and_then(|old| {
                old.membership_of(membership.bucket_id, put.object_type, put.object_id)
            }) {
                self.supersede(membership.bucket_id, previous.op_id, membership.op_id)?;
            }
            record.memberships.push(membership);
        }
        Ok(())
    }

    /// Stores the row's record (`bytes`: its outputs packed ahead) and, for a row not
    /// stored before nor claimed, its key.
    #[inline]
    fn write_row(
        &mut self,
        key: &[u8],
        row_id: u64,
        record: &RowRecord,
        bytes: Option<&[u8]>,
        stored: bool,
        known_new: bool,
    ) -> Result<(), StoreError> {
        // New rows get increasing ids: appending skips the search for their place; a
        // stored one is where the rows cursor stands (nothing wrote `rows` since).
        let flags = if known_new {
            WriteFlags::APPEND
        } else if stored {
            WriteFlags::CURRENT
        } else {
            WriteFlags::UPSERT
        };
        match bytes {
            Some(bytes) => self.store_packed(row_id, &record.encode_head(), bytes, flags)?,
            None => self.store_record(row_id, record, flags)?,
        }
        if !stored && !known_new {
            self.row_keys_end = None;
            self.txn
                .put(
                    &self.tables.row_keys,
                    key,
                    row_id.to_le_bytes(),
                    WriteFlags::UPSERT,
                )
                .map_err(self.mdbx("write a row key"))?;
        }
        Ok(())
    }

    /// The source values stored with a row, `None` when the row is not stored.
    pub fn stash(&self, table_id: u32, identity: &[u8]) -> Result<Option<Stash>, StoreError> {
        let key = row_key(table_id, identity);
        match self.row_id(&key)? {
            Some(row_id) => Ok(Some(self.load_row(row_id)?.stash)),
            None => Ok(None),
        }
    }

    /// Moves a row to a new replica identity (a FULL identity changes with every update,
    /// a key update changes a DEFAULT one), keeping its row id and so its subkey.
    /// Returns false when no row has `old`; an existing row at `new` is deleted first.
    pub fn rekey_row(&mut self, table_id: u32, old: &[u8], new: &[u8]) -> Result<bool, StoreError> {
        if old == new {
            return Ok(true);
        }
        let old_key = row_key(table_id, old);
        let Some(row_id) = self.row_id(&old_key)? else {
            return Ok(false);
        };
        self.delete_row(table_id, new)?;
        self.txn
            .del(&self.tables.row_keys, &old_key, None)
            .map_err(self.mdbx("remove a row key"))?;
        self.row_keys_end = None;
        self.txn
            .put(
                &self.tables.row_keys,
                row_key(table_id, new),
                row_id.to_le_bytes(),
                WriteFlags::UPSERT,
            )
            .map_err(self.mdbx("write a row key"))?;
        Ok(true)
    }

    /// Applies a TRUNCATE: every stored row of the table is deleted (REMOVE ops).
    /// Returns the number of rows removed.
    pub fn truncate_table(&mut self, table_id: u32) -> Result<u64, StoreError> {
        let prefix = table_id.to_be_bytes();
        let mut removed = 0;
        loop {
            // Collect a slice of identities, then delete them (no cursor across writes).
            let mut identities = Vec::new();
            {
                let mut cursor = self
                    .txn
                    .cursor(&self.tables.row_keys)
                    .map_err(self.mdbx("open a cursor"))?;
                let mut next: Option<(Vec<u8>, Vec<u8>)> = cursor
                    .set_range(&prefix)
                    .map_err(self.mdbx("seek row keys"))?;
                while let Some((key, _)) = next {
                    if !key.starts_with(&prefix) || identities.len() == 1024 {
                        break;
                    }
                    identities.push(key[prefix.len()..].to_vec());
                    next = cursor.next().map_err(self.mdbx("read row keys"))?;
                }
            }
            if identities.is_empty() {
                return Ok(removed);
            }
            for identity in &identities {
                if self.delete_row(table_id, identity)? {
                    removed += 1;
                }
            }
        }
    }

    /// Applies a deleted source row: a REMOVE in each of its buckets, lookups dropped.
    /// Returns false when the row was not stored (a redelivered delete).
    pub fn delete_row(&mut self, table_id: u32, identity: &[u8]) -> Result<bool, StoreError> {
        self.flush_if_full()?;
        let key = row_key(table_id, identity);
        let Some(row_id) = self.row_id_at(&key)? else {
            return Ok(false);
        };
        let old = self.load_row_at(row_id)?;
        self.remove_memberships(&old, &old.memberships, row_id)?;
        self.remove_lookups(&old.lookups)?;
        // Both cursors still stand on the row: nothing wrote `rows` or `row_keys` since.
        self.forget_row_at()?;
        Ok(true)
    }

    /// Claims `key` for a new row and returns its row id; `None` when the key is taken
    /// (identical rows of a REPLICA IDENTITY FULL table: the caller turns the insert into
    /// an update of that row, as pgoutput would).
    pub(crate) fn claim_row(&mut self, key: &[u8]) -> Result<Option<u64>, StoreError> {
        let row_id = self.counters.next_row;
        // Rows copied in key order (a serial or time-ordered key, a table clustered on
        // it) land past the tree's end: appending skips the search for their place.
        let mut appending = key > self.row_keys_end()?;
        let flags = if appending {
            WriteFlags::APPEND
        } else {
            WriteFlags::NO_OVERWRITE
        };
        let (table, value) = (&self.tables.row_keys, row_id.to_le_bytes());
        let mut claim = self.txn.put(table, key, value, flags);
        if let Err(libmdbx::Error::KeyMismatch) = claim {
            // Not past the end after all: place it by searching.
            (appending, self.row_keys_end) = (false, None);
            claim = self.txn.put(table, key, value, WriteFlags::NO_OVERWRITE);
        }
        match claim {
            Ok(()) => {
                self.counters.next_row += 1;
                if let (true, Some(end)) = (appending, &mut self.row_keys_end) {
                    end.clear();
                    end.extend_from_slice(key);
                }
                Ok(Some(row_id))
            }
            Err(libmdbx::Error::KeyExist) => Ok(None),
            Err(e) => Err(self.mdbx("write a row key")(e)),
        }
    }

    /// The largest key in `row_keys`, empty when there is none (read once per
    /// transaction, then kept by [`Self::claim_row`]).
    fn row_keys_end(&mut self) -> Result<&[u8], StoreError> {
        if self.row_keys_end.is_none() {
            let last: Option<(Vec<u8>, ())> = self
                .txn
                .cursor(&self.tables.row_keys)
                .and_then(|mut c| c.last())
                .map_err(self.mdbx("read the last row key"))?;
            self.row_keys_end = Some(last.map(|(key, ())| key).unwrap_or_default());
        }
        Ok(self.row_keys_end.as_deref().unwrap_or_default())
    }

    pub(super) fn row_id(&self, key: &[u8]) -> Result<Option<u64>, StoreError> {
        let value: Option<RowIdValue> = self
            .txn
            .get(&self.tables.row_keys, key)
            .map_err(self.mdbx("read a row key"))?;
        self.row_id_in(value)
    }

    /// The row id a `row_keys` value holds, `None` for no value.
    fn row_id_in(&self, value: Option<RowIdValue>) -> Result<Option<u64>, StoreError> {
        value
            .map(|v| v.0.ok_or_else(|| StoreError::corrupt(self.dir, "row key")))
            .transpose()
    }

    /// [`Self::row_id`] through the row keys cursor, which stays on the key: a delete
    /// ([`Self::forget_row_at`]) next removes it without a search, and the next key of a
    /// change that follows the key order (a bulk change in a table clustered on its key)
    /// is found on the cursor's page without a search from the root.
    pub(super) fn row_id_at(&mut self, key: &[u8]) -> Result<Option<u64>, StoreError> {
        let cursor = kept_cursor(
            self.txn,
            &self.tables.row_keys,
            &mut self.row_keys_cursor,
            self.dir,
        )?;
        let value: Option<RowIdValue> = cursor
            .set(key)
            .map_err(|e| StoreError::mdbx(self.dir, "read a row key", e))?;
        self.row_id_in(value)
    }

    /// Removes the row where [`Self::row_id_at`] and [`Self::load_row_at`] left their
    /// cursors: its record and its key.
    fn forget_row_at(&mut self) -> Result<(), StoreError> {
        let dir = self.dir;
        let (Some(rows), Some(row_keys)) = (&mut self.rows_cursor, &mut self.row_keys_cursor)
        else {
            return Err(StoreError::corrupt(dir, "row cursors"));
        };
        rows.del(WriteFlags::empty())
            .map_err(|e| StoreError::mdbx(dir, "remove a row", e))?;
        row_keys
            .del(WriteFlags::empty())
            .map_err(|e| StoreError::mdbx(dir, "remove a row key", e))
    }

    /// Reads row `row_id`'s record through the rows cursor, which stays on it: a write of
    /// the record with [`WriteFlags::CURRENT`] next replaces it without a search.
    pub(super) fn load_row_at(&mut self, row_id: u64) -> Result<RowRecord, StoreError> {
        let cursor = kept_cursor(self.txn, &self.tables.rows, &mut self.rows_cursor, self.dir)?;
        let found: Option<Vec<u8>> = cursor
            .set(&row_id.to_ne_bytes())
            .map_err(|e| StoreError::mdbx(self.dir, "read a row", e))?;
        let bytes =
            found.ok_or_else(|| StoreError::corrupt(self.dir, "row (key without record)"))?;
        stored_row::decode(self.codec, &bytes).map_err(|c| StoreError::corrupt(self.dir, c.what))
    }

    pub(super) fn load_row(&self, row_id: u64) -> Result<RowRecord, StoreError> {
        let bytes: Vec<u8> = self
            .txn
            .get(&self.tables.rows, row_id.to_ne_bytes())
            .map_err(self.mdbx("read a row"))?
            .ok_or_else(|| StoreError::corrupt(self.dir, "row (key without record)"))?;
        stored_row::decode(self.codec, &bytes).map_err(|c| StoreError::corrupt(self.dir, c.what))
    }

    fn forget_row(&self, key: &[u8], row_id: u64) -> Result<(), StoreError> {
        self.txn
            .del(&self.tables.rows, row_id.to_ne_bytes(), None)
            .map_err(self.mdbx("remove a row"))?;
        self.txn
            .del(&self.tables.row_keys, key, None)
            .map_err(self.mdbx("remove a row key"))?;
        Ok(())
    }
}

/// The cursor a transaction keeps in `slot`, opened on `table` at its first use.
fn kept_cursor<'c, 't>(
    txn: Txn<'t, '_, RW>,
    table: &Table<'t>,
    slot: &'c mut Option<Cursor<'t, RW>>,
    dir: &Path,
) -> Result<&'c mut Cursor<'t, RW>, StoreError> {
    let cursor = match slot.take() {
        Some(cursor) => cursor,
        None => txn
            .cursor(table)
            .map_err(|e| StoreError::mdbx(dir, "open a cursor", e))?,
    };
    Ok(slot.insert(cursor))
}

/// Where a written row's outputs section comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outputs<'p> {
    /// Found among the puts, encoded and packed by the writer.
    Encode,
    /// Packed ahead from exactly the puts (`indices`: per put, its output); a merge,
    /// which may keep old outputs, encodes its own.
    Packed { indices: &'p [u8], bytes: &'p [u8] },
}

/// How a row is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowWrite {
    /// Inserted or updated: a PUT in each of its buckets.
    Upsert,
    /// Known not to be stored yet (the snapshot into an empty store).
    Insert,
    /// Found by a re-copy: a PUT only where its output changed.
    Merge,
}

/// A merge keeps a row's old outputs only while they are this few (more fall back to a
/// fresh record, every bucket getting a PUT).
const KEPT_OUTPUTS_MAX: usize = 64;

impl RowRecord {
    /// The index of `put`'s output, added if new (outputs are stored once per row).
    fn output_index(&mut self, put: &RowPut<'_>) -> Option<u8> {
        let position = self.outputs.iter().position(|o| {
            o.object_type == put.object_type && o.object_id == put.object_id && o.data == put.data
        });
        let index = position.unwrap_or_else(|| {
            self.outputs.push(Output {
                object_type: put.object_type.to_owned(),
                object_id: put.object_id.to_owned(),
                data: put.data.to_owned(),
            });
            self.outputs.len() - 1
        });
        u8::try_from(index).ok()
    }

    pub(super) fn output(&self, membership: &Membership) -> &Output {
        // Decoding guarantees the index is in range.
        &self.outputs[usize::from(membership.output)]
    }

    fn membership_of(
        &self,
        bucket_id: u32,
        object_type: &str,
        object_id: &str,
    ) -> Option<&Membership> {
        self.memberships.iter().find(|m| {
            let o = self.output(m);
            m.bucket_id == bucket_id && o.object_type == object_type && o.object_id == object_id
        })
    }

    /// The membership in bucket `bucket_id` that shows exactly `put`'s output, if any.
    pub(super) fn membership_showing(
        &self,
        bucket_id: u32,
        put: &RowPut<'_>,
    ) -> Option<&Membership> {
        self.membership_of(bucket_id, put.object_type, put.object_id)
            .filter(|m| self.output(m).data == put.data)
    }
}
