//! The write side: one read-write transaction applies row changes as ops and commits
//! them together with the bucket accumulators, the counters and the checkpoint.
//!
//! Superseding happens at write time: when a row's membership in a bucket is replaced
//! (a new PUT) or ended (a REMOVE), its previous PUT becomes a MOVE whose target is the
//! new op. PUT records therefore always point at a row's current data, which each row
//! record stores once however many buckets it is in.

use std::collections::HashMap;
use std::path::Path;

use libmdbx::{NoWriteMap, Transaction, WriteFlags, RW};

use super::checksum::remove_checksum;
use super::codec::fixed;
use super::compress::{Packer, RecordCodec, TRAINING_SAMPLES};
use super::op::{BucketState, OpKind, StoredOp};
use super::op_blocks::{self, block_error, BlockCursor};
use super::record::{subkey, LookupRef, Membership, Output, RowRecord, Tombstone};
use super::stored_row;
use super::tables::{row_key, Tables};
use super::{Checkpoint, StoreError};

const KEY_COUNTERS: &[u8] = b"counters";
pub(super) const KEY_CHECKPOINT: &[u8] = b"checkpoint";
/// Metadata that belongs to the replicated data (cleared with it), as opposed to the
/// store's identity. Engine stages keep their own records under `stage.` keys.
pub(super) const DATA_META_KEYS: &[&[u8]] = &[
    KEY_COUNTERS,
    KEY_CHECKPOINT,
    KEY_DICTIONARY,
    b"stage.bootstrap",
];
/// The LZ4 dictionary row records are compressed against.
const KEY_DICTIONARY: &[u8] = b"dictionary";

/// The record codec stored in `db`: with its dictionary, or raw.
pub(super) fn load_codec(
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

/// One bucket membership a row produces: the bucket and the output it shows there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPut<'a> {
    /// Bucket name.
    pub bucket: &'a str,
    /// Output table name.
    pub object_type: &'a str,
    /// Row id text.
    pub object_id: &'a str,
    /// The exact data JSON.
    pub data: &'a str,
    /// PUT checksum.
    pub checksum: u32,
}

/// One parameter-lookup entry a row produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupPut<'a> {
    /// Encoded lookup key.
    pub key: &'a [u8],
    /// Encoded outputs.
    pub outputs: &'a [u8],
}

/// Id allocators, persisted with every commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counters {
    pub next_op: u64,
    pub next_row: u64,
    pub next_bucket: u32,
}

impl Counters {
    const INITIAL: Self = Self {
        next_op: 1,
        next_row: 1,
        next_bucket: 1,
    };

    fn encode(&self) -> [u8; 20] {
        let mut out = [0u8; 20];
        out[..8].copy_from_slice(&self.next_op.to_le_bytes());
        out[8..16].copy_from_slice(&self.next_row.to_le_bytes());
        out[16..20].copy_from_slice(&self.next_bucket.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        const W: &str = "counters";
        Some(Self {
            next_op: u64::from_le_bytes(fixed(bytes, 0, W).ok()?),
            next_row: u64::from_le_bytes(fixed(bytes, 8, W).ok()?),
            next_bucket: u32::from_le_bytes(fixed(bytes, 16, W).ok()?),
        })
    }
}

/// An open write. Build it with [`super::Store::write`].
pub struct WriteTxn<'t, 'db> {
    txn: &'t Transaction<'db, RW, NoWriteMap>,
    tables: &'t Tables<'t>,
    dir: &'t Path,
    counters: Counters,
    /// Hashed with foldhash: looked up for every op, SipHash cost more than the lookup.
    dirty: foldhash::HashMap<String, BucketState>,
    new_names: Vec<(u32, String)>,
    codec: &'t RecordCodec,
    packer: Packer<'t>,
    /// Encoded records kept to train the dictionary (while there is none).
    samples: Vec<Vec<u8>>,
    /// Ops appended in this transaction, per bucket id, in op order; written to each
    /// bucket's blocks when the transaction finishes.
    pending: foldhash::HashMap<u32, Vec<StoredOp>>,
    /// Ops in `pending`; past [`PENDING_OPS_LIMIT`] they are written out early so a
    /// transaction of millions of changes does not hold them all in memory.
    pending_ops: usize,
    /// The LSN to commit with, when the changes decided it ([`Self::set_lsn`]).
    lsn: Option<u64>,
    /// Per bucket id: ops this transaction made compactable (superseded PUTs, REMOVEs).
    compactable: HashMap<u32, u64>,
    /// The largest key in `row_keys` once read ([`Self::claim_row`]), empty when there
    /// is none (no row key is empty); `None` until then and after any write there that
    /// did not go through `claim_row`.
    row_keys_end: Option<Vec<u8>>,
}

/// Ops folded into one CLEAR per compaction step (bounds the memory of one step).
const CLEAR_BATCH: usize = 100_000;

/// Buffered ops per transaction before they are written out (24 bytes each).
const PENDING_OPS_LIMIT: usize = 65_536;

/// Source values a row keeps for later "unchanged TOAST" updates: `(column, text)`.
pub type Stash = Vec<(String, Vec<u8>)>;

impl<'t, 'db> WriteTxn<'t, 'db> {
    pub(super) fn begin(
        txn: &'t Transaction<'db, RW, NoWriteMap>,
        tables: &'t Tables<'t>,
        dir: &'t Path,
        codec: &'t RecordCodec,
    ) -> Result<Self, StoreError> {
        let counters = match txn
            .get::<Vec<u8>>(&tables.meta, KEY_COUNTERS)
            .map_err(|e| StoreError::mdbx(dir, "read counters", e))?
        {
            None => Counters::INITIAL,
            Some(bytes) => {
                Counters::decode(&bytes).ok_or_else(|| StoreError::corrupt(dir, "counters"))?
            }
        };
        Ok(Self {
            txn,
            tables,
            dir,
            counters,
            dirty: foldhash::HashMap::default(),
            new_names: Vec::new(),
            codec,
            packer: codec.packer(),
            samples: Vec::new(),
            pending: foldhash::HashMap::default(),
            pending_ops: 0,
            lsn: None,
            compactable: HashMap::new(),
            row_keys_end: None,
        })
    }

    fn mdbx(&self, action: &'static str) -> impl Fn(libmdbx::Error) -> StoreError + '_ {
        move |e| StoreError::mdbx(self.dir, action, e)
    }

    /// Applies an inserted or updated source row: a PUT in every bucket of `puts`,
    /// a REMOVE in every bucket it left, and its lookup entries replaced.
    pub fn upsert_row(
        &mut self,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
    ) -> Result<(), StoreError> {
        self.apply_row(table_id, identity, puts, lookups, Stash::new(), false)
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
        self.apply_row(table_id, identity, puts, lookups, stash, false)
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

    /// Per bucket id, the ops this transaction made compactable so far (and resets the
    /// tally): the writer's caller decides when a bucket is worth compacting.
    pub fn take_compactable(&mut self) -> HashMap<u32, u64> {
        std::mem::take(&mut self.compactable)
    }

    /// CLEAR compaction (spec §4.5): the longest prefix of a bucket's ops made only of
    /// REMOVE, MOVE and CLEAR ops becomes one CLEAR with the largest op id, the sum of
    /// their checksums and the largest target. Checksums are unchanged; the count drops.
    /// A client behind the prefix receives the CLEAR, drops the bucket's rows and gets
    /// the live ones from the PUTs after it. Returns the number of ops removed.
    pub fn compact_bucket(&mut self, bucket_id: u32) -> Result<u64, StoreError> {
        self.write_pending()?;
        let mut prefix = Vec::new();
        {
            let mut blocks = BlockCursor::seek(self.txn, &self.tables.ops, bucket_id, 0)
                .map_err(|e| block_error(self.dir, "find a bucket's ops", e))?;
            'blocks: while let Some(block) = blocks
                .next_block()
                .map_err(|e| block_error(self.dir, "read ops", e))?
            {
                for op in block.ops {
                    if op.kind == OpKind::Put || prefix.len() == CLEAR_BATCH {
                        break 'blocks;
                    }
                    prefix.push(op);
                }
            }
        }
        if prefix.len() < 2 {
            return Ok(0);
        }
        let mut clear = StoredOp {
            op_id: 0,
            kind: OpKind::Clear,
            output: 0,
            checksum: 0,
            reference: 0,
        };
        for op in &prefix {
            clear.op_id = clear.op_id.max(op.op_id);
            clear.checksum = clear.checksum.wrapping_add(op.checksum);
            let target = match op.kind {
                OpKind::Remove => op.op_id,
                _ => op.reference,
            };
            clear.reference = clear.reference.max(target);
            if op.kind == OpKind::Remove {
                self.txn
                    .del(&self.tables.tombstones, op.op_id.to_ne_bytes(), None)
                    .map_err(self.mdbx("remove a tombstone"))?;
            }
        }
        op_blocks::replace_prefix(self.txn, &self.tables.ops, bucket_id, prefix.len(), clear)
            .map_err(|e| block_error(self.dir, "compact ops", e))?;
        let name = self.bucket_name(bucket_id)?;
        let state = self.bucket(&name)?;
        let removed = prefix.len() as u64 - 1;
        state.count = state.count.saturating_sub(removed);
        Ok(removed)
    }

    /// Commit with checkpoint LSN `lsn` instead of the one the write was started with
    /// (a streamed transaction learns its end LSN at its commit message).
    pub fn set_lsn(&mut self, lsn: u64) {
        self.lsn = Some(lsn);
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
        self.apply_row(table_id, identity, puts, lookups, Stash::new(), true)
    }

    pub(super) fn apply_row(
        &mut self,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
        stash: Stash,
        known_new: bool,
    ) -> Result<(), StoreError> {
        self.flush_if_full()?;
        let key = row_key(table_id, identity);
        if known_new && self.claim_row(&key)?.is_none() {
            return self.apply_row(table_id, identity, puts, lookups, stash, false);
        }
        let existing = if known_new { None } else { self.row_id(&key)? };
        let (row_id, old) = match existing {
            Some(row_id) => (row_id, Some(self.load_row(row_id)?)),
            None if known_new => (self.counters.next_row - 1, None),
            None => {
                let row_id = self.counters.next_row;
                self.counters.next_row += 1;
                (row_id, None)
            }
        };
        let mut record = RowRecord {
            table_id,
            stash,
            ..RowRecord::default()
        };
        for put in puts {
            let output = record.output_index(put).ok_or_else(|| {
                StoreError::corrupt(self.dir, "a row with more than 255 distinct outputs")
            })?;
            let membership = self.put_op(put.bucket, output, put.checksum, row_id)?;
            if let Some(previous) = old.as_ref().and_then(|old| {
                old.membership_of(membership.bucket_id, put.object_type, put.object_id)
            }) {
                self.supersede(membership.bucket_id, previous.op_id, membership.op_id)?;
            }
            record.memberships.push(membership);
        }
        if let Some(old) = &old {
            for gone in old.memberships.iter().filter(|m| {
                let o = old.output(m);
                record
                    .membership_of(m.bucket_id, &o.object_type, &o.object_id)
                    .is_none()
            }) {
                self.remove_membership(old, gone, row_id)?;
            }
            for stale in &old.lookups {
                if !lookups.iter().any(|l| {
                    l.key == stale.key.as_slice() && lookup_value(row_id, l.outputs) == stale.value
                }) {
                    self.txn
                        .del(&self.tables.lookups, &stale.key, Some(&stale.value))
                        .map_err(self.mdbx("remove a lookup"))?;
                }
            }
        }
        for lookup in lookups {
            let value = lookup_value(row_id, lookup.outputs);
            let known = old.as_ref().is_some_and(|o| {
                o.lookups
                    .iter()
                    .any(|l| l.key == lookup.key && l.value == value)
            });
            if !known {
                self.txn
                    .put(&self.tables.lookups, lookup.key, &value, WriteFlags::UPSERT)
                    .map_err(self.mdbx("write a lookup"))?;
            }
            record.lookups.push(LookupRef {
                key: lookup.key.to_vec(),
                value,
            });
        }
        if record.memberships.is_empty() && record.lookups.is_empty() {
            // The row feeds nothing now: forget it (its REMOVEs were written above).
            if existing.is_some() || known_new {
                self.forget_row(&key, row_id)?;
            }
            return Ok(());
        }
        // New rows get increasing ids: appending skips the search for their place.
        let flags = if known_new {
            WriteFlags::APPEND
        } else {
            WriteFlags::UPSERT
        };
        self.store_record(row_id, &record, flags)?;
        if existing.is_none() && !known_new {
            self.row_keys_end = None;
            self.txn
                .put(
                    &self.tables.row_keys,
                    &key,
                    row_id.to_le_bytes(),
                    WriteFlags::UPSERT,
                )
                .map_err(self.mdbx("write a row key"))?;
        }
        Ok(())
    }

    /// Encodes, compresses and writes a row record.
    fn store_record(
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
    pub(super) fn store_packed(
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
        self.txn
            .put(&self.tables.rows, row_id.to_ne_bytes(), stored, flags)
            .map_err(self.mdbx("write a row"))
    }

    /// An outputs section packed with this transaction's codec.
    pub(super) fn pack_outputs(&mut self, raw: &[u8]) -> Vec<u8> {
        self.packer.pack(raw)
    }

    /// Raw packed outputs compressed with this transaction's dictionary; `None` when
    /// they are compressed already or there is no dictionary yet.
    pub(super) fn repack(&mut self, packed: &[u8]) -> Option<Vec<u8>> {
        if !self.packer.compresses() {
            return None;
        }
        let raw = RecordCodec::raw_part(packed)?;
        Some(self.packer.pack(raw))
    }

    /// The raw outputs section of packed outputs.
    pub(super) fn unpack_outputs<'b>(
        &self,
        packed: &'b [u8],
    ) -> Result<std::borrow::Cow<'b, [u8]>, StoreError> {
        self.codec
            .unpack(packed)
            .map_err(|c| StoreError::corrupt(self.dir, c.what))
    }

    pub(super) fn corrupt(&self, what: &'static str) -> StoreError {
        StoreError::corrupt(self.dir, what)
    }

    /// Writes the buffered ops out once there are many.
    pub(super) fn flush_if_full(&mut self) -> Result<(), StoreError> {
        if self.pending_ops >= PENDING_OPS_LIMIT {
            self.write_pending()?;
        }
        Ok(())
    }

    /// Claims `key` for a new row and returns its row id; `None` when the key is taken
    /// (identical rows of a REPLICA IDENTITY FULL table: the caller turns the insert into
    /// an update of that row, as pgoutput would).
    pub(super) fn claim_row(&mut self, key: &[u8]) -> Result<Option<u64>, StoreError> {
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

    /// Appends a PUT of row `row_id` (showing `output`) to bucket `name`.
    pub(super) fn put_op(
        &mut self,
        name: &str,
        output: u8,
        checksum: u32,
        row_id: u64,
    ) -> Result<Membership, StoreError> {
        let (bucket_id, op_id) = self.append(name, OpKind::Put, output, checksum, row_id)?;
        Ok(Membership {
            bucket_id,
            op_id,
            output,
        })
    }

    /// Writes the lookup entries of a new row.
    pub(super) fn put_new_lookups(
        &mut self,
        row_id: u64,
        lookups: &[LookupPut<'_>],
    ) -> Result<Vec<LookupRef>, StoreError> {
        let mut written = Vec::with_capacity(lookups.len());
        for lookup in lookups {
            let value = lookup_value(row_id, lookup.outputs);
            self.txn
                .put(&self.tables.lookups, lookup.key, &value, WriteFlags::UPSERT)
                .map_err(self.mdbx("write a lookup"))?;
            written.push(LookupRef {
                key: lookup.key.to_vec(),
                value,
            });
        }
        Ok(written)
    }

    /// Applies a deleted source row: a REMOVE in each of its buckets, lookups dropped.
    /// Returns false when the row was not stored (a redelivered delete).
    pub fn delete_row(&mut self, table_id: u32, identity: &[u8]) -> Result<bool, StoreError> {
        if self.pending_ops >= PENDING_OPS_LIMIT {
            self.write_pending()?;
        }
        let key = row_key(table_id, identity);
        let Some(row_id) = self.row_id(&key)? else {
            return Ok(false);
        };
        let old = self.load_row(row_id)?;
        for membership in &old.memberships {
            self.remove_membership(&old, membership, row_id)?;
        }
        for lookup in &old.lookups {
            self.txn
                .del(&self.tables.lookups, &lookup.key, Some(&lookup.value))
                .map_err(self.mdbx("remove a lookup"))?;
        }
        self.forget_row(&key, row_id)?;
        Ok(true)
    }

    /// Writes an engine stage's record (`key` is one of the `stage.` keys).
    pub fn put_stage_record(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let key = format!("stage.{key}");
        self.txn
            .put(&self.tables.meta, key.as_bytes(), value, WriteFlags::UPSERT)
            .map_err(self.mdbx("write a stage record"))
    }

    /// Persists accumulators, counters and the checkpoint `(last op id, lsn)`.
    /// Also returns a dictionary trained in this transaction (stored with it), for the
    /// store to compress with from the next transaction on.
    pub(super) fn finish(mut self, lsn: u64) -> Result<(Checkpoint, Option<Vec<u8>>), StoreError> {
        let lsn = self.lsn.unwrap_or(lsn);
        self.write_pending()?;
        for (name, state) in &self.dirty {
            self.txn
                .put(
                    &self.tables.buckets,
                    name.as_bytes(),
                    state.encode(),
                    WriteFlags::UPSERT,
                )
                .map_err(self.mdbx("write a bucket"))?;
        }
        for (id, name) in &self.new_names {
            self.txn
                .put(
                    &self.tables.bucket_names,
                    id.to_ne_bytes(),
                    name.as_bytes(),
                    WriteFlags::UPSERT,
                )
                .map_err(self.mdbx("write a bucket name"))?;
        }
        self.txn
            .put(
                &self.tables.meta,
                KEY_COUNTERS,
                self.counters.encode(),
                WriteFlags::UPSERT,
            )
            .map_err(self.mdbx("write counters"))?;
        let checkpoint = Checkpoint {
            op_id: self.counters.next_op - 1,
            lsn,
        };
        self.txn
            .put(
                &self.tables.meta,
                KEY_CHECKPOINT,
                checkpoint.encode(),
                WriteFlags::UPSERT,
            )
            .map_err(self.mdbx("write the checkpoint"))?;
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
        Ok((checkpoint, trained))
    }

    /// Writes the buffered ops (op ids only grow, so they append to each bucket's last
    /// block). Each libmdbx call writes at most one block, so a transaction of millions of
    /// changes can spill dirty pages between calls.
    fn write_pending(&mut self) -> Result<(), StoreError> {
        for (bucket_id, ops) in self.pending.drain() {
            op_blocks::append(self.txn, &self.tables.ops, bucket_id, &ops)
                .map_err(|e| block_error(self.dir, "append ops", e))?;
        }
        self.pending_ops = 0;
        Ok(())
    }

    fn row_id(&self, key: &[u8]) -> Result<Option<u64>, StoreError> {
        let value: Option<Vec<u8>> = self
            .txn
            .get(&self.tables.row_keys, key)
            .map_err(self.mdbx("read a row key"))?;
        value
            .map(|v| {
                fixed::<8>(&v, 0, "row key")
                    .map(u64::from_le_bytes)
                    .map_err(|_| StoreError::corrupt(self.dir, "row key"))
            })
            .transpose()
    }

    fn load_row(&self, row_id: u64) -> Result<RowRecord, StoreError> {
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

    /// The accumulators of `name` in this transaction, created (with a new id) on first
    /// use.
    fn bucket(&mut self, name: &str) -> Result<&mut BucketState, StoreError> {
        if self.dirty.contains_key(name) {
            return self
                .dirty
                .get_mut(name)
                .ok_or_else(|| StoreError::corrupt(self.dir, "bucket state"));
        }
        let stored: Option<Vec<u8>> = self
            .txn
            .get(&self.tables.buckets, name.as_bytes())
            .map_err(self.mdbx("read a bucket"))?;
        let state = match stored {
            Some(bytes) => {
                BucketState::decode(&bytes).map_err(|c| StoreError::corrupt(self.dir, c.what))?
            }
            None => {
                let id = self.counters.next_bucket;
                self.counters.next_bucket = id
                    .checked_add(1)
                    .ok_or_else(|| StoreError::corrupt(self.dir, "bucket id space exhausted"))?;
                self.new_names.push((id, name.to_owned()));
                BucketState {
                    id,
                    ..BucketState::default()
                }
            }
        };
        Ok(self.dirty.entry(name.to_owned()).or_insert(state))
    }

    fn bucket_name(&self, id: u32) -> Result<String, StoreError> {
        if let Some((_, name)) = self.new_names.iter().find(|(i, _)| *i == id) {
            return Ok(name.clone());
        }
        let name: Vec<u8> = self
            .txn
            .get(&self.tables.bucket_names, id.to_ne_bytes())
            .map_err(self.mdbx("read a bucket name"))?
            .ok_or_else(|| StoreError::corrupt(self.dir, "bucket name"))?;
        String::from_utf8(name).map_err(|_| StoreError::corrupt(self.dir, "bucket name"))
    }

    /// Appends an op with the next op id to bucket `name` and updates its accumulators.
    /// Returns the bucket's id and the op id.
    fn append(
        &mut self,
        name: &str,
        kind: OpKind,
        output: u8,
        checksum: u32,
        reference: u64,
    ) -> Result<(u32, u64), StoreError> {
        let op_id = self.counters.next_op;
        // One lookup for a bucket this transaction has seen (every op but its first).
        let bucket = match self.dirty.get_mut(name) {
            Some(state) => state,
            None => self.bucket(name)?,
        };
        bucket.add(op_id, checksum);
        let bucket_id = bucket.id;
        self.counters.next_op += 1;
        let op = StoredOp {
            op_id,
            kind,
            output,
            checksum,
            reference,
        };
        self.pending.entry(bucket_id).or_default().push(op);
        self.pending_ops += 1;
        Ok((bucket_id, op_id))
    }

    /// Turns op `op_id` of a bucket into a MOVE that points at `target`.
    fn supersede(&mut self, bucket_id: u32, op_id: u64, target: u64) -> Result<(), StoreError> {
        *self.compactable.entry(bucket_id).or_default() += 1;
        if let Some(ops) = self.pending.get_mut(&bucket_id) {
            if let Ok(i) = ops.binary_search_by_key(&op_id, |op| op.op_id) {
                if let Some(op) = ops.get_mut(i) {
                    *op = StoredOp {
                        kind: OpKind::Move,
                        output: 0,
                        reference: target,
                        ..*op
                    };
                    return Ok(());
                }
            }
        }
        let moved = |old: StoredOp| StoredOp {
            kind: OpKind::Move,
            output: 0,
            reference: target,
            ..old
        };
        op_blocks::rewrite(self.txn, &self.tables.ops, bucket_id, op_id, moved)
            .map_err(|e| block_error(self.dir, "supersede an op", e))?
            .ok_or_else(|| StoreError::corrupt(self.dir, "superseded op missing"))
    }

    fn remove_membership(
        &mut self,
        old: &RowRecord,
        membership: &Membership,
        row_id: u64,
    ) -> Result<(), StoreError> {
        let output = old.output(membership);
        let tombstone = Tombstone {
            object_type: output.object_type.clone(),
            object_id: output.object_id.clone(),
            subkey: subkey(old.table_id, row_id),
        };
        let name = self.bucket_name(membership.bucket_id)?;
        let checksum = remove_checksum(&tombstone.subkey);
        let (_, op_id) = self.append(&name, OpKind::Remove, 0, checksum, row_id)?;
        *self.compactable.entry(membership.bucket_id).or_default() += 1;
        self.txn
            .put(
                &self.tables.tombstones,
                op_id.to_ne_bytes(),
                tombstone.encode(),
                WriteFlags::UPSERT,
            )
            .map_err(self.mdbx("write a tombstone"))?;
        self.supersede(membership.bucket_id, membership.op_id, op_id)
    }
}

/// A lookup dup value: the row id (so each row's entry is distinct) then the outputs.
fn lookup_value(row_id: u64, outputs: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(8 + outputs.len());
    value.extend_from_slice(&row_id.to_be_bytes());
    value.extend_from_slice(outputs);
    value
}

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

    fn output(&self, membership: &Membership) -> &Output {
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
}
