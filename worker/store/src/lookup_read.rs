//! The request side of parameter lookups: the entries stored under one key in the
//! `lookups` table at the read transaction's checkpoint, so a sync request sees exactly the
//! parameter rows committed with the checkpoint it is served. Keys and outputs are the
//! bytes the writer was given ([`super::LookupPut`]); the store does not interpret them.

use super::long_keys::{stored_dup_key, ROW_ID_BYTES};
use super::reader::ReadTxn;
use super::StoreError;

impl ReadTxn<'_, '_> {
    /// The encoded outputs stored under the encoded `key`, one per source row, in row-id
    /// order.
    pub fn lookup_rows(&self, key: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.lookup_rows_up_to(key, usize::MAX)
    }

    /// Like [`Self::lookup_rows`], but reads no more than the first `most` rows: a caller
    /// that refuses a key past a limit asks for one row more than the limit, and the rest
    /// of a key with a million rows is never read.
    pub fn lookup_rows_up_to(&self, key: &[u8], most: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        let mdbx = |action| move |e| StoreError::mdbx(self.dir, action, e);
        let mut cursor = self
            .txn
            .cursor(&self.tables.lookups)
            .map_err(mdbx("open a cursor"))?;
        let mut rows = Vec::new();
        let stored = stored_dup_key(key);
        let mut next: Option<Vec<u8>> = cursor.set(&stored).map_err(mdbx("seek a lookup"))?;
        while let Some(value) = next.filter(|_| rows.len() < most) {
            if value.len() > ROW_ID_BYTES {
                rows.push(value.get(ROW_ID_BYTES..).unwrap_or_default().to_vec());
            } else if let Some(outputs) = self.lookup_outputs_of_row(&value, key)? {
                rows.push(outputs);
            }
            next = cursor
                .next_dup::<(), Vec<u8>>()
                .map_err(mdbx("read lookups"))?
                .map(|(_, v)| v);
        }
        Ok(rows)
    }

    /// The outputs of the lookup entry `key` of the row `row_id` names, from the row's
    /// record (for entries stored without them, `long_keys`); `None` when the row has no
    /// such entry (another key with the same hash).
    fn lookup_outputs_of_row(
        &self,
        row_id: &[u8],
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let row_id = <[u8; ROW_ID_BYTES]>::try_from(row_id)
            .map(u64::from_be_bytes)
            .map_err(|_| StoreError::corrupt(self.dir, "lookup entry"))?;
        let record = self.row_record(row_id)?;
        Ok(record
            .lookups
            .into_iter()
            .find(|l| l.key == key)
            .and_then(|l| l.value.get(ROW_ID_BYTES..).map(<[u8]>::to_vec)))
    }
}
