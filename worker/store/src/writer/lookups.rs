//! Parameter lookups: the lookup entries a row writes, replaces and drops.

use libmdbx::WriteFlags;

use super::puts::LookupPut;
use super::txn::WriteTxn;
use crate::long_keys::stored_lookup;
use crate::record::{LookupRef, RowRecord};
use crate::StoreError;

impl WriteTxn<'_, '_> {
    /// Writes the lookup entries of a new row.
    pub(crate) fn put_new_lookups(
        &mut self,
        row_id: u64,
        lookups: &[LookupPut<'_>],
    ) -> Result<Vec<LookupRef>, StoreError> {
        self.replace_lookups(row_id, None, lookups)
    }

    /// Gives row `row_id` the lookup entries `lookups`: the entries of its `old` record
    /// that `lookups` no longer has are removed, the others written. Returns the row's
    /// entries.
    pub(super) fn replace_lookups(
        &mut self,
        row_id: u64,
        old: Option<&RowRecord>,
        lookups: &[LookupPut<'_>],
    ) -> Result<Vec<LookupRef>, StoreError> {
        if let Some(old) = old {
            for stale in &old.lookups {
                if !lookups.iter().any(|l| {
                    l.key == stale.key.as_slice() && lookup_value(row_id, l.outputs) == stale.value
                }) {
                    let (key, value) = stored_lookup(&stale.key, &stale.value);
                    self.lookups_changed();
                    self.txn
                        .del(&self.tables.lookups, &key, Some(value))
                        .map_err(self.mdbx("remove a lookup"))?;
                }
            }
        }
        let mut written = Vec::with_capacity(lookups.len());
        for lookup in lookups {
            let value = lookup_value(row_id, lookup.outputs);
            let known = old.is_some_and(|o| {
                o.lookups
                    .iter()
                    .any(|l| l.key == lookup.key && l.value == value)
            });
            if !known {
                self.lookups_changed();
                let (key, stored) = stored_lookup(lookup.key, &value);
                self.txn
                    .put(&self.tables.lookups, &key, stored, WriteFlags::UPSERT)
                    .map_err(self.mdbx("write a lookup"))?;
            }
            written.push(LookupRef {
                key: lookup.key.to_vec(),
                value,
            });
        }
        Ok(written)
    }

    /// Removes a row's lookup entries.
    pub(super) fn remove_lookups(&self, lookups: &[LookupRef]) -> Result<(), StoreError> {
        for lookup in lookups {
            self.lookups_changed();
            let (key, value) = stored_lookup(&lookup.key, &lookup.value);
            self.txn
                .del(&self.tables.lookups, &key, Some(value))
                .map_err(self.mdbx("remove a lookup"))?;
        }
        Ok(())
    }
}

/// A lookup dup value: the row id (so each row's entry is distinct) then the outputs.
pub(super) fn lookup_value(row_id: u64, outputs: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(8 + outputs.len());
    value.extend_from_slice(&row_id.to_be_bytes());
    value.extend_from_slice(outputs);
    value
}
