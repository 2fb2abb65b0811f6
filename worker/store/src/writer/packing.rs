//! Row records packed with the transaction's codec, and the first ones kept as samples
//! to train the store's LZ4 dictionary.

use std::path::Path;

use libmdbx::{NoWriteMap, WriteFlags};

use super::txn::{WriteTxn, KEY_DICTIONARY};
use crate::compress::{RecordCodec, TRAINING_SAMPLES};
use crate::record::RowRecord;
use crate::stored_row;
use crate::tables::Tables;
use crate::StoreError;

/// The record codec stored in `db`: with its dictionary, or raw.
pub(crate) fn load_codec(
    db: &libmdbx::Database<NoWriteMap>,
    dir: &Path,
) -> Result<RecordCodec, StoreError> {
    let txn = db
        .begin_ro_txn()
        .map_err(|e| StoreError::mdbx(dir, "begin a read", e))?;
    let tables = Tables::open(&txn, dir)?;
    let dictionary: Option<Vec<u8>> = txn
        .get(&tables.meta, KEY_DICTIONARY)
        .map_err(|e| StoreError::mdbx(dir, "read the dictionary", e))?;
    Ok(dictionary.map_or_else(RecordCodec::raw, |d| RecordCodec::with_dictionary(&d)))
}

impl WriteTxn<'_, '_> {
    /// Encodes, compresses and writes a row record.
    pub(super) fn store_record(
        &mut self,
        row_id: u64,
        record: &RowRecord,
        flags: WriteFlags,
    ) -> Result<(), StoreError> {
        let packed = self.pack_outputs(&record.encode_outputs());
        self.store_packed(row_id, &record.encode_head(), &packed, flags)
    }

    /// Writes a row record from its head and its packed outputs (keeping the first
    /// records' outputs as samples for the dictionary).
    pub(crate) fn store_packed(
        &mut self,
        row_id: u64,
        head: &[u8],
        packed_outputs: &[u8],
        flags: WriteFlags,
    ) -> Result<(), StoreError> {
        if !self.codec.has_dictionary() && self.samples.len() < TRAINING_SAMPLES {
            let raw = self.unpack_outputs(packed_outputs)?;
            self.samples.push(raw.into_owned());
        }
        let stored = stored_row::join(head, packed_outputs);
        let key = row_id.to_ne_bytes();
        match self.rows_cursor.as_mut() {
            // Where `load_row_at` left the cursor; a cursor elsewhere refuses the key.
            Some(cursor) if flags == WriteFlags::CURRENT => cursor.put(&key, &stored, flags),
            _ => self.txn.put(&self.tables.rows, key, stored, flags),
        }
        .map_err(self.mdbx("write a row"))
    }

    /// An outputs section packed with this transaction's codec.
    fn pack_outputs(&mut self, raw: &[u8]) -> Vec<u8> {
        self.packer.pack(raw)
    }

    /// Outputs `codec` packed (on another thread) in this transaction's form; `None` when
    /// they are in it already. Another codec than this transaction's: the store trained
    /// its dictionary, or was replaced, since.
    pub(crate) fn repack_from(
        &mut self,
        codec: &RecordCodec,
        packed: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        if std::ptr::eq(codec, self.codec) {
            return Ok(self.repack(packed));
        }
        let raw = codec.unpack(packed).map_err(|c| self.corrupt(c.what))?;
        Ok(Some(self.pack_outputs(&raw)))
    }

    /// Raw packed outputs compressed with this transaction's dictionary; `None` when
    /// they are compressed already or there is no dictionary yet.
    pub(crate) fn repack(&mut self, packed: &[u8]) -> Option<Vec<u8>> {
        if !self.packer.compresses() {
            return None;
        }
        let raw = RecordCodec::raw_part(packed)?;
        Some(self.packer.pack(raw))
    }

    /// The raw outputs section of packed outputs.
    pub(crate) fn unpack_outputs<'b>(
        &self,
        packed: &'b [u8],
    ) -> Result<std::borrow::Cow<'b, [u8]>, StoreError> {
        self.codec
            .unpack(packed)
            .map_err(|c| StoreError::corrupt(self.dir, c.what))
    }

    /// Trains a dictionary on the samples once there are enough and the store has none
    /// yet, and stores it with this transaction. Returns it, for the store to compress
    /// with from the next transaction on.
    pub(super) fn store_trained_dictionary(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let mut trained = None;
        if self.samples.len() >= TRAINING_SAMPLES && !self.codec.has_dictionary() {
            if let Some(dictionary) = RecordCodec::train(&self.samples) {
                self.txn
                    .put(
                        &self.tables.meta,
                        KEY_DICTIONARY,
                        &dictionary,
                        WriteFlags::UPSERT,
                    )
                    .map_err(self.mdbx("write the dictionary"))?;
                trained = Some(dictionary);
            }
        }
        Ok(trained)
    }
}
