//! What re-copying a table needs from the writer: whether a row is stored exactly as a
//! new evaluation produces it (then it costs clients nothing), replacing only the values
//! kept with a row, and the stored rows of a table the copy did not hold.

use std::borrow::Cow;

use libmdbx::WriteFlags;

use super::puts::{LookupPut, RowPut, Stash};
use super::txn::WriteTxn;
use crate::long_keys::{is_hashed, stored_key};
use crate::op::BucketState;
use crate::record::RowRecord;
use crate::tables::row_key;
use crate::StoreError;

/// How a row compares with what the store holds for its identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredAs {
    /// Stored with exactly these outputs in these buckets, these lookups and this stash
    /// (or not stored, and it produces nothing).
    Same,
    /// Same outputs and lookups; only the kept values differ.
    SameButStash,
    /// Anything else: the row must be written.
    Different,
}

impl WriteTxn<'_, '_> {
    /// Compares a row's evaluation with its stored record; with the stored row's id.
    pub fn stored_as(
        &mut self,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
        stash: &Stash,
    ) -> Result<(StoredAs, Option<u64>), StoreError> {
        let key = row_key(table_id, identity);
        let stored = match self.row_id_at(&key)? {
            Some(row_id) => Some((row_id, self.load_row_at(row_id)?)),
            None => None,
        };
        let verdict = compare_stored(stored.as_ref(), puts, lookups, stash, |name| {
            self.existing_bucket_id(name)
        })?;
        Ok((verdict, stored.map(|(row_id, _)| row_id)))
    }

    /// Replaces the values kept with a stored row (no op is written). Returns false when
    /// no row has `identity`.
    pub fn restash_row(
        &mut self,
        table_id: u32,
        identity: &[u8],
        stash: Stash,
    ) -> Result<bool, StoreError> {
        let key = row_key(table_id, identity);
        let Some(row_id) = self.row_id_at(&key)? else {
            return Ok(false);
        };
        let mut record = self.load_row_at(row_id)?;
        record.stash = stash;
        // Where the read left the rows cursor.
        self.store_record(row_id, &record, WriteFlags::CURRENT)?;
        Ok(true)
    }

    /// The identities of table `table_id`'s stored rows whose row id `held` does not
    /// hold, in key order (one pass over the table's keys, no record read).
    pub fn table_rows_not_held(
        &self,
        table_id: u32,
        held: impl Fn(u64) -> bool,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let prefix = table_id.to_be_bytes();
        let mut cursor = self
            .txn
            .cursor(&self.tables.row_keys)
            .map_err(self.mdbx("open a cursor"))?;
        let mut missing = Vec::new();
        let mut next: Option<(Cow<'_, [u8]>, [u8; 8])> = cursor
            .set_range(&prefix)
            .map_err(self.mdbx("seek row keys"))?;
        while let Some((key, row_id)) = next {
            if !key.starts_with(&prefix) {
                break;
            }
            if !held(u64::from_le_bytes(row_id)) {
                missing.push(key[prefix.len()..].to_vec());
            }
            next = cursor.next().map_err(self.mdbx("read row keys"))?;
        }
        Ok(missing)
    }

    /// The id of bucket `name` when it exists (in the store or this transaction).
    pub(super) fn existing_bucket_id(&mut self, name: &str) -> Result<Option<u32>, StoreError> {
        if let Some(state) = self.dirty.get(name) {
            return Ok(Some(state.id));
        }
        if let Some(&id) = self.known_buckets.get(name) {
            return Ok(Some(id));
        }
        let key = stored_key(name.as_bytes());
        let stored: Option<Vec<u8>> = self
            .txn
            .get(&self.tables.buckets, &key)
            .map_err(self.mdbx("read a bucket"))?;
        let Some(bytes) = stored else {
            return Ok(None);
        };
        let state = BucketState::decode(&bytes).map_err(|c| self.corrupt(c.what))?;
        // A hashed long name is this bucket only if its full name matches.
        if is_hashed(&key) && self.bucket_name(state.id)? != name {
            return Ok(None);
        }
        self.known_buckets.insert(name.to_owned(), state.id);
        Ok(Some(state.id))
    }
}

/// How a row evaluated as `puts`, `lookups` and `stash` compares with `stored` (its row id
/// and record, `None` when not stored); `bucket_id` finds an existing bucket's id.
pub(crate) fn compare_stored(
    stored: Option<&(u64, RowRecord)>,
    puts: &[RowPut<'_>],
    lookups: &[LookupPut<'_>],
    stash: &Stash,
    mut bucket_id: impl FnMut(&str) -> Result<Option<u32>, StoreError>,
) -> Result<StoredAs, StoreError> {
    let Some((row_id, old)) = stored else {
        return Ok(if puts.is_empty() && lookups.is_empty() {
            StoredAs::Same
        } else {
            StoredAs::Different
        });
    };
    if old.memberships.len() != puts.len() || old.lookups.len() != lookups.len() {
        return Ok(StoredAs::Different);
    }
    for put in puts {
        let Some(bucket_id) = bucket_id(put.bucket)? else {
            return Ok(StoredAs::Different);
        };
        if old.membership_showing(bucket_id, put).is_none() {
            return Ok(StoredAs::Different);
        }
    }
    for lookup in lookups {
        let value = super::lookups::lookup_value(*row_id, lookup.outputs);
        if !old
            .lookups
            .iter()
            .any(|l| l.key == lookup.key && l.value == value)
        {
            return Ok(StoredAs::Different);
        }
    }
    Ok(if &old.stash == stash {
        StoredAs::Same
    } else {
        StoredAs::SameButStash
    })
}
