//! The read side: short read-only transactions that answer checkpoints, bucket
//! accumulators and pages of ops after a client's position.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use libmdbx::{Cursor, RO};

use crate::env::Txn;

use super::checkpoint::Checkpoint;
use super::compress::RecordCodec;
use super::error::StoreError;
use super::forks::{Forks, KEY_FORKS};
use super::long_keys::{is_hashed, stored_key};
use super::op::{BucketState, OpKind, StoredOp};
use super::op_blocks::{block_error, BlockCursor};
use super::record::{subkey, RowRecord, Tombstone};
use super::stored_row;
use super::tables::{row_id_of, row_key, Tables};
use super::writer::{compare_stored, LookupPut, RowPut, Stash, StoredAs, KEY_CHECKPOINT};

/// An op as a client receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRead {
    /// Global op id.
    pub op_id: u64,
    /// PUT, REMOVE, MOVE or CLEAR.
    pub kind: OpKind,
    /// The op's checksum.
    pub checksum: u32,
    /// PUT and REMOVE: what the op is about.
    pub object: Option<ObjectRead>,
}

impl OpRead {
    /// Bytes of row data it carries (a PUT's JSON; 0 for the rest).
    pub fn data_len(&self) -> usize {
        self.object
            .as_ref()
            .and_then(|o| o.data.as_ref())
            .map_or(0, String::len)
    }
}

/// The row side of a PUT or REMOVE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRead {
    /// Output table name.
    pub object_type: String,
    /// Row id text.
    pub object_id: String,
    /// The source row's subkey.
    pub subkey: String,
    /// PUT: the data JSON.
    pub data: Option<String>,
}

/// A page of a bucket's ops.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpsPage {
    /// Ops with `after < op_id ≤ until`, ascending.
    pub ops: Vec<OpRead>,
    /// More ops ≤ `until` follow.
    pub has_more: bool,
    /// The largest MOVE/CLEAR target among the ops, or the op id of a CLEAR right past
    /// `until` (a compaction since may have folded ops up to `until` into it): above the
    /// checkpoint being served, the page reflects changes newer than it, and that
    /// checkpoint must not complete.
    pub max_target: u64,
    /// Bytes of row data the ops carry (see [`OpRead::data_len`]).
    pub data_bytes: usize,
}

/// A read's cursors on row keys and row records, and the bucket ids looked up by name (a
/// bucket that does not exist yet is looked up again): see [`ReadTxn::stored_as`].
pub struct RowCursors<'t> {
    keys: Cursor<'t, RO>,
    rows: Cursor<'t, RO>,
    bucket_ids: HashMap<String, u32>,
}

/// An open read. Build it with [`super::Store::read`].
pub struct ReadTxn<'t, 'db> {
    pub(super) txn: Txn<'t, 'db, RO>,
    pub(super) tables: &'t Tables<'t>,
    pub(super) dir: &'t Path,
    codec: &'t RecordCodec,
}

impl<'t, 'db> ReadTxn<'t, 'db> {
    /// The error for bytes read from this store that do not decode (`what` names them).
    pub fn corrupt(&self, what: &'static str) -> StoreError {
        StoreError::corrupt(self.dir, what)
    }

    pub(super) fn new(
        txn: Txn<'t, 'db, RO>,
        tables: &'t Tables<'t>,
        dir: &'t Path,
        codec: &'t RecordCodec,
    ) -> Self {
        Self {
            txn,
            tables,
            dir,
            codec,
        }
    }

    /// The store's directory (for error messages).
    pub fn dir(&self) -> &Path {
        self.dir
    }

    fn mdbx(&self, action: &'static str) -> impl Fn(libmdbx::Error) -> StoreError + '_ {
        move |e| StoreError::mdbx(self.dir, action, e)
    }

    /// The last committed checkpoint (op id 0 and LSN 0 for an empty store).
    pub fn checkpoint(&self) -> Result<Checkpoint, StoreError> {
        let bytes: Option<Vec<u8>> = self
            .txn
            .get(&self.tables.meta, KEY_CHECKPOINT)
            .map_err(self.mdbx("read the checkpoint"))?;
        match bytes {
            None => Ok(Checkpoint::default()),
            Some(bytes) => Checkpoint::decode(&bytes)
                .ok_or_else(|| StoreError::corrupt(self.dir, "checkpoint")),
        }
    }

    /// The history id its bucket names derive from; `None` for a store built before names
    /// were derived (it keeps generation-numbered names).
    pub fn history(&self) -> Result<Option<u64>, StoreError> {
        let value: Option<Vec<u8>> = self
            .txn
            .get(&self.tables.meta, super::meta::KEY_HISTORY)
            .map_err(self.mdbx("read the history id"))?;
        match value {
            None => Ok(None),
            Some(v) => super::meta::parse_history(&v)
                .map(Some)
                .ok_or_else(|| StoreError::corrupt(self.dir, "history id")),
        }
    }

    /// Where the store's op ids left the history it shares with peers (oldest first).
    pub fn forks(&self) -> Result<Forks, StoreError> {
        let value: Option<Vec<u8>> = self
            .txn
            .get(&self.tables.meta, KEY_FORKS)
            .map_err(self.mdbx("read the forks"))?;
        value.map_or(Ok(Forks::default()), |v| Forks::decode(&v, self.dir))
    }

    /// An engine stage's record (see [`super::WriteTxn::put_stage_record`]).
    pub fn stage_record(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = format!("stage.{key}");
        self.txn
            .get(&self.tables.meta, key.as_bytes())
            .map_err(self.mdbx("read a stage record"))
    }

    /// Every stage record whose key starts with `prefix`, in key order (the meta table is
    /// small: a handful of records plus one per write-checkpoint key).
    pub fn stage_records(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let full = format!("stage.{prefix}");
        let mut cursor = self
            .txn
            .cursor(&self.tables.meta)
            .map_err(self.mdbx("open a cursor"))?;
        let mut out = Vec::new();
        for item in cursor.iter::<Vec<u8>, Vec<u8>>() {
            let (key, value) = item.map_err(self.mdbx("read stage records"))?;
            if let Some(rest) = key.strip_prefix(b"stage.".as_slice()) {
                if key.starts_with(full.as_bytes()) {
                    let key = String::from_utf8(rest.to_vec())
                        .map_err(|_| StoreError::corrupt(self.dir, "stage record key"))?;
                    out.push((key, value));
                }
            }
        }
        Ok(out)
    }

    /// A bucket's accumulators; `None` for a bucket that never had an op.
    pub fn bucket(&self, name: &str) -> Result<Option<BucketState>, StoreError> {
        let key = stored_key(name.as_bytes());
        let bytes: Option<Vec<u8>> = self
            .txn
            .get(&self.tables.buckets, &key)
            .map_err(self.mdbx("read a bucket"))?;
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let state =
            BucketState::decode(&bytes).map_err(|c| StoreError::corrupt(self.dir, c.what))?;
        if is_hashed(&key) && self.bucket_name(state.id)? != name {
            return Err(StoreError::key_collision(self.dir, name));
        }
        Ok(Some(state))
    }

    /// The name of bucket `id`.
    fn bucket_name(&self, id: u32) -> Result<String, StoreError> {
        super::tables::bucket_name(self.txn, self.tables, self.dir, id)
    }

    /// Cursors for [`Self::stored_as`], kept across its calls.
    pub fn row_cursors(&self) -> Result<RowCursors<'t>, StoreError> {
        let open = |table| self.txn.cursor(table).map_err(self.mdbx("open a cursor"));
        Ok(RowCursors {
            keys: open(&self.tables.row_keys)?,
            rows: open(&self.tables.rows)?,
            bucket_ids: HashMap::new(),
        })
    }

    /// [`super::WriteTxn::stored_as`] in a read: how a row's evaluation compares with its
    /// stored record. Through `cursors` ([`Self::row_cursors`]), rows compared in key
    /// order (a re-copy of a table clustered on its key) are found on the cursors' pages
    /// without a search from the root.
    pub fn stored_as(
        &self,
        cursors: &mut RowCursors<'t>,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
        stash: &Stash,
    ) -> Result<(StoredAs, Option<u64>), StoreError> {
        let key = row_key(table_id, identity);
        // Borrowed from the map: a read-only transaction's pages stay put.
        let row_id: Option<Cow<'t, [u8]>> = cursors
            .keys
            .set(&key)
            .map_err(self.mdbx("read a row key"))?;
        let stored = match row_id {
            Some(bytes) => {
                let row_id = row_id_of(&bytes).ok_or_else(|| self.corrupt("row key"))?;
                let record: Cow<'t, [u8]> = cursors
                    .rows
                    .set(&row_id.to_ne_bytes())
                    .map_err(self.mdbx("read a row"))?
                    .ok_or_else(|| self.corrupt("row (key without record)"))?;
                Some((row_id, self.decode_record(&record)?))
            }
            None => None,
        };
        let bucket_ids = &mut cursors.bucket_ids;
        let verdict = compare_stored(stored.as_ref(), puts, lookups, stash, |name| {
            if let Some(&id) = bucket_ids.get(name) {
                return Ok(Some(id));
            }
            let id = self.bucket(name)?.map(|state| state.id);
            if let Some(id) = id {
                bucket_ids.insert(name.to_owned(), id);
            }
            Ok(id)
        })?;
        Ok((verdict, stored.map(|(row_id, _)| row_id)))
    }

    /// The record of row `row_id`.
    pub(crate) fn row_record(&self, row_id: u64) -> Result<RowRecord, StoreError> {
        let bytes: Cow<'_, [u8]> = self
            .txn
            .get(&self.tables.rows, row_id.to_ne_bytes())
            .map_err(self.mdbx("read a row"))?
            .ok_or_else(|| StoreError::corrupt(self.dir, "row of a lookup entry"))?;
        self.decode_record(&bytes)
    }

    /// A stored row record decoded.
    fn decode_record(&self, bytes: &[u8]) -> Result<RowRecord, StoreError> {
        stored_row::decode(self.codec, bytes).map_err(|c| StoreError::corrupt(self.dir, c.what))
    }

    /// Every bucket that ever had an op: `(id, name)` in id order (for status, support
    /// functions and tests; a bucket with only REMOVEs left still counts).
    pub fn bucket_names(&self) -> Result<Vec<(u32, String)>, StoreError> {
        let mut cursor = self
            .txn
            .cursor(&self.tables.bucket_names)
            .map_err(self.mdbx("open a cursor"))?;
        let mut out = Vec::new();
        for item in cursor.iter::<Vec<u8>, Vec<u8>>() {
            let (id, name) = item.map_err(self.mdbx("read bucket names"))?;
            let id = super::codec::fixed::<4>(&id, 0, "bucket id")
                .map(u32::from_ne_bytes)
                .map_err(|c| StoreError::corrupt(self.dir, c.what))?;
            let name = String::from_utf8(name)
                .map_err(|_| StoreError::corrupt(self.dir, "bucket name"))?;
            out.push((id, name));
        }
        Ok(out)
    }

    /// Every bucket that ever had an op with its accumulators, in name order (for the
    /// `powersync_mdbx.buckets()` support function).
    pub fn bucket_states(&self) -> Result<Vec<(String, BucketState)>, StoreError> {
        let mut cursor = self
            .txn
            .cursor(&self.tables.buckets)
            .map_err(self.mdbx("open a cursor"))?;
        let mut out = Vec::new();
        let mut hashed = false;
        for item in cursor.iter::<Vec<u8>, Vec<u8>>() {
            let (key, state) = item.map_err(self.mdbx("read buckets"))?;
            let state =
                BucketState::decode(&state).map_err(|c| StoreError::corrupt(self.dir, c.what))?;
            let name = if is_hashed(&key) {
                hashed = true;
                self.bucket_name(state.id)?
            } else {
                String::from_utf8(key).map_err(|_| StoreError::corrupt(self.dir, "bucket name"))?
            };
            out.push((name, state));
        }
        if hashed {
            // Hashed keys sort apart from the names they stand for.
            out.sort_by(|a, b| a.0.cmp(&b.0));
        }
        Ok(out)
    }

    /// Up to `limit` ops of bucket `bucket_id` with `after < op_id ≤ until`.
    pub fn ops(
        &self,
        bucket_id: u32,
        after: u64,
        until: u64,
        limit: usize,
    ) -> Result<OpsPage, StoreError> {
        self.ops_within(bucket_id, after, until, limit, usize::MAX)
    }

    /// [`Self::ops`], also ending the page once its row data reaches `data_bytes` (the
    /// op that reaches it is included, so a page holds at least one op): a reader that
    /// holds a page while its client is slow holds a bounded amount of memory.
    pub fn ops_within(
        &self,
        bucket_id: u32,
        after: u64,
        until: u64,
        limit: usize,
        data_bytes: usize,
    ) -> Result<OpsPage, StoreError> {
        let mut page = OpsPage::default();
        if after >= until {
            return Ok(page);
        }
        let mut blocks = BlockCursor::seek(
            self.txn,
            &self.tables.ops,
            bucket_id,
            after.saturating_add(1),
        )
        .map_err(|e| block_error(self.dir, "seek ops", e))?;
        while let Some(block) = blocks
            .next_block()
            .map_err(|e| block_error(self.dir, "read ops", e))?
        {
            for op in block.ops.iter().filter(|op| op.op_id > after) {
                if op.op_id > until {
                    if op.kind == OpKind::Clear {
                        // A CLEAR leads its bucket: one past `until` may have folded ops
                        // up to `until` that a reader of an older checkpoint still needs
                        // (a compaction committed after that checkpoint was read).
                        page.max_target = page.max_target.max(op.op_id).max(op.reference);
                    }
                    return Ok(page);
                }
                if page.ops.len() == limit || page.data_bytes >= data_bytes {
                    page.has_more = true;
                    return Ok(page);
                }
                let read = self.resolve(op)?;
                page.data_bytes += read.data_len();
                page.ops.push(read);
                if matches!(op.kind, OpKind::Move | OpKind::Clear) {
                    page.max_target = page.max_target.max(op.reference);
                }
            }
        }
        Ok(page)
    }

    fn resolve(&self, op: &StoredOp) -> Result<OpRead, StoreError> {
        let object = match op.kind {
            OpKind::Put => {
                let bytes: Cow<'_, [u8]> = self
                    .txn
                    .get(&self.tables.rows, op.reference.to_ne_bytes())
                    .map_err(self.mdbx("read a row"))?
                    .ok_or_else(|| StoreError::corrupt(self.dir, "row of a PUT"))?;
                let (table_id, output) = stored_row::output(self.codec, &bytes, op.output)
                    .map_err(|c| StoreError::corrupt(self.dir, c.what))?;
                Some(ObjectRead {
                    object_type: output.object_type,
                    object_id: output.object_id,
                    subkey: subkey(table_id, op.reference),
                    data: Some(output.data),
                })
            }
            OpKind::Remove => {
                let bytes: Vec<u8> = self
                    .txn
                    .get(&self.tables.tombstones, op.op_id.to_ne_bytes())
                    .map_err(self.mdbx("read a tombstone"))?
                    .ok_or_else(|| StoreError::corrupt(self.dir, "tombstone of a REMOVE"))?;
                let t =
                    Tombstone::decode(&bytes).map_err(|c| StoreError::corrupt(self.dir, c.what))?;
                Some(ObjectRead {
                    object_type: t.object_type,
                    object_id: t.object_id,
                    subkey: t.subkey,
                    data: None,
                })
            }
            OpKind::Move | OpKind::Clear => None,
        };
        Ok(OpRead {
            op_id: op.op_id,
            kind: op.kind,
            checksum: op.checksum,
            object,
        })
    }
}
