//! The request side of parameter lookups: the entries stored under one key in the
//! `lookups` table at the read transaction's checkpoint, so a sync request sees exactly the
//! parameter rows committed with the checkpoint it is served. Keys and outputs are the
//! bytes the writer was given ([`super::LookupPut`]); the store does not interpret them.

use super::reader::ReadTxn;
use super::StoreError;

/// Bytes of the row id in front of each lookup dup value (see `writer::lookups::lookup_value`).
const ROW_ID_BYTES: usize = 8;

impl ReadTxn<'_, '_> {
    /// The encoded outputs stored under the encoded `key`, one per source row, in row-id
    /// order.
    pub fn lookup_rows(&self, key: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let mdbx = |action| move |e| StoreError::mdbx(self.dir, action, e);
        let mut cursor = self
            .txn
            .cursor(&self.tables.lookups)
            .map_err(mdbx("open a cursor"))?;
        let mut rows = Vec::new();
        let mut next: Option<Vec<u8>> = cursor.set(key).map_err(mdbx("seek a lookup"))?;
        while let Some(value) = next {
            let outputs = value
                .get(ROW_ID_BYTES..)
                .ok_or_else(|| StoreError::corrupt(self.dir, "lookup entry"))?;
            rows.push(outputs.to_vec());
            next = cursor
                .next_dup::<(), Vec<u8>>()
                .map_err(mdbx("read lookups"))?
                .map(|(_, v)| v);
        }
        Ok(rows)
    }
}
