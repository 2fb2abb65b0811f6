//! The write transaction's life: begin, counters, buffered ops, finish, and the meta
//! records it keeps (counters, checkpoint, dictionary key).

use std::path::Path;

use libmdbx::{WriteFlags, RW};

use crate::env::Txn;

use crate::changes::Changes;
use crate::checkpoint::Checkpoint;
use crate::codec::fixed;
use crate::compress::{Packer, RecordCodec};
use crate::error::StoreError;
use crate::forks::{Fork, Forks, KEY_FORKS};
use crate::long_keys::stored_key;
use crate::op::{BucketState, StoredOp};
use crate::op_blocks::{self, block_error};
use crate::tables::Tables;

const KEY_COUNTERS: &[u8] = b"counters";
pub(crate) const KEY_CHECKPOINT: &[u8] = b"checkpoint";
/// Metadata that belongs to the replicated data (cleared with it), as opposed to the
/// store's identity. Engine stages keep their own records under `stage.` keys.
pub(crate) const DATA_META_KEYS: &[&[u8]] = &[
    KEY_COUNTERS,
    KEY_CHECKPOINT,
    KEY_DICTIONARY,
    b"stage.bootstrap",
];
/// The LZ4 dictionary row records are compressed against.
pub(super) const KEY_DICTIONARY: &[u8] = b"dictionary";

/// Id allocators, persisted with every commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
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

/// An open write. Build it with [`crate::Store::write`].
pub struct WriteTxn<'t, 'db> {
    pub(super) txn: Txn<'t, 'db, RW>,
    pub(super) tables: &'t Tables<'t>,
    pub(super) dir: &'t Path,
    pub(super) counters: Counters,
    /// Hashed with foldhash: looked up for every op, SipHash cost more than the lookup.
    pub(super) dirty: foldhash::HashMap<String, BucketState>,
    /// The names of the buckets in `dirty`, by id.
    pub(super) dirty_names: foldhash::HashMap<u32, String>,
    pub(super) new_names: Vec<(u32, String)>,
    pub(super) codec: &'t RecordCodec,
    pub(super) packer: Packer<'t>,
    /// Encoded records kept to train the dictionary (while there is none).
    pub(super) samples: Vec<Vec<u8>>,
    /// Ops appended in this transaction, per bucket id, in op order; written to each
    /// bucket's blocks when the transaction finishes.
    pub(super) pending: foldhash::HashMap<u32, Vec<StoredOp>>,
    /// Ops of earlier transactions superseded in this one, per bucket id: `(op id, the
    /// op superseding it)`, made MOVEs in their blocks when the pending ops are written.
    pub(super) superseded: foldhash::HashMap<u32, Vec<(u64, u64)>>,
    /// Ops in `pending` and `superseded`; past [`PENDING_OPS_LIMIT`] they are written out
    /// early so a transaction of millions of changes does not hold them all in memory.
    pub(super) pending_ops: usize,
    /// The LSN to commit with, when the changes decided it ([`Self::set_lsn`]).
    pub(super) lsn: Option<u64>,
    /// Per bucket id: ops this transaction made compactable (superseded PUTs, REMOVEs).
    pub(super) compactable: foldhash::HashMap<u32, u64>,
    /// The largest key in `row_keys` once read ([`Self::claim_row`]), empty when there
    /// is none (no row key is empty); `None` until then and after any write there that
    /// did not go through `claim_row`.
    pub(super) row_keys_end: Option<Vec<u8>>,
    /// A cursor on `rows`, opened once: an updated row's record is read through it and
    /// rewritten where it stands, without a second search ([`Self::load_row_at`]).
    pub(super) rows_cursor: Option<libmdbx::Cursor<'t, RW>>,
    /// A cursor on `row_keys`, opened once: a changed row's key is found through it, and a
    /// deleted row's removed where it stands ([`Self::row_id_at`]).
    pub(super) row_keys_cursor: Option<libmdbx::Cursor<'t, RW>>,
    /// Ids of stored buckets looked up by name in this transaction (`recopy`).
    pub(super) known_buckets: foldhash::HashMap<String, u32>,
    /// The store forks before the next op this transaction appends ([`Self::diverge`]).
    pub(super) diverging: bool,
    /// This transaction forked the history.
    pub(super) forked: bool,
    /// What this transaction changed besides bucket accumulators (`dirty`), for the
    /// sync service's wakeups: a lookup written or removed, stage records written.
    pub(super) lookups_changed: std::cell::Cell<bool>,
    pub(super) stage_keys: std::cell::RefCell<std::collections::HashSet<String>>,
    /// The store keeps this transaction open for the writes after it ([`Self::hold_open`]).
    pub(super) hold_open: bool,
}

/// What a finished write leaves for the store to do once it is committed.
pub(crate) struct Finished {
    pub checkpoint: Checkpoint,
    /// A dictionary trained in the transaction, to compress with from the next one on.
    pub trained: Option<Vec<u8>>,
    /// What it changed ([`crate::Store::take_changes`]).
    pub changes: Changes,
    /// Kept open, not committed ([`WriteTxn::hold_open`]).
    pub hold_open: bool,
}

/// Buffered ops per transaction before they are written out (24 bytes each).
const PENDING_OPS_LIMIT: usize = 65_536;

impl<'t, 'db> WriteTxn<'t, 'db> {
    pub(crate) fn begin(
        txn: Txn<'t, 'db, RW>,
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
            dirty_names: foldhash::HashMap::default(),
            new_names: Vec::new(),
            codec,
            packer: codec.packer(),
            samples: Vec::new(),
            pending: foldhash::HashMap::default(),
            superseded: foldhash::HashMap::default(),
            pending_ops: 0,
            lsn: None,
            compactable: foldhash::HashMap::default(),
            row_keys_end: None,
            rows_cursor: None,
            row_keys_cursor: None,
            known_buckets: foldhash::HashMap::default(),
            diverging: false,
            forked: false,
            lookups_changed: std::cell::Cell::new(false),
            stage_keys: std::cell::RefCell::default(),
            hold_open: false,
        })
    }

    pub(super) fn mdbx(&self, action: &'static str) -> impl Fn(libmdbx::Error) -> StoreError + '_ {
        move |e| StoreError::mdbx(self.dir, action, e)
    }

    pub(crate) fn corrupt(&self, what: &'static str) -> StoreError {
        StoreError::corrupt(self.dir, what)
    }

    /// Commit with checkpoint LSN `lsn` instead of the one the write was started with
    /// (a streamed transaction learns its end LSN at its commit message).
    pub fn set_lsn(&mut self, lsn: u64) {
        self.lsn = Some(lsn);
    }

    /// The store's directory (for error messages).
    pub fn dir(&self) -> &Path {
        self.dir
    }

    /// Reads an engine stage's record as this transaction sees it.
    pub fn stage_record(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = format!("stage.{key}");
        self.txn
            .get(&self.tables.meta, key.as_bytes())
            .map_err(self.mdbx("read a stage record"))
    }

    /// Keeps this write open instead of committing it: it and the writes after it go into
    /// one transaction that clients see only when [`crate::Store::release`] commits it
    /// (`held`). Inside held writes already, nothing changes.
    pub fn hold_open(&mut self) {
        self.hold_open = true;
    }

    /// Writes an engine stage's record (`key` is one of the `stage.` keys).
    pub fn put_stage_record(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.stage_keys.borrow_mut().insert(key.to_owned());
        let key = format!("stage.{key}");
        self.txn
            .put(&self.tables.meta, key.as_bytes(), value, WriteFlags::UPSERT)
            .map_err(self.mdbx("write a stage record"))
    }

    /// Removes an engine stage's record (nothing when there is none).
    pub fn delete_stage_record(&self, key: &str) -> Result<(), StoreError> {
        self.stage_keys.borrow_mut().insert(key.to_owned());
        let key = format!("stage.{key}");
        self.txn
            .del(&self.tables.meta, key.as_bytes(), None)
            .map(|_| ())
            .map_err(self.mdbx("remove a stage record"))
    }

    /// Marks what this write appends from here on as decided by this replica alone (a
    /// re-copy's merge, a table gone after its grace period, a rebuild's merge): before
    /// its first op, the store's op ids leave the history it shares with its peers
    /// ([`crate::forks`]). Until [`Self::converge`]; appending no op meanwhile leaves the
    /// history as it was.
    pub fn diverge(&mut self) {
        self.diverging = true;
    }

    /// Ends what [`Self::diverge`] began: later ops of this write follow the source.
    pub fn converge(&mut self) {
        self.diverging = false;
    }

    /// True once this transaction forked the history (an event of several writes forks
    /// once: later writes of it need not [`Self::diverge`] again).
    pub fn has_forked(&self) -> bool {
        self.forked
    }

    /// Forks the history now, whether or not ops follow (a rules deploy: every op after it
    /// depends on when this replica deployed). Returns the fork.
    pub fn fork_history(&mut self) -> Result<Fork, StoreError> {
        self.diverging = false;
        let mut forks = match self
            .txn
            .get::<Vec<u8>>(&self.tables.meta, KEY_FORKS)
            .map_err(self.mdbx("read the forks"))?
        {
            None => Forks::default(),
            Some(bytes) => Forks::decode(&bytes, self.dir)?,
        };
        let random = crate::meta::random_u64()
            .map_err(|e| StoreError::io(Path::new("/dev/urandom"), "read it", e))?;
        let fork = forks.add(self.counters.next_op - 1, random);
        self.txn
            .put(
                &self.tables.meta,
                KEY_FORKS,
                forks.encode(),
                WriteFlags::UPSERT,
            )
            .map_err(self.mdbx("write the forks"))?;
        self.counters.next_op = fork.resumed_at + 1;
        self.forked = true;
        tracing::info!(
            left_at = fork.left_at,
            resumed_at = fork.resumed_at,
            "op ids leave the history shared with peers: a write of this replica alone"
        );
        Ok(fork)
    }

    /// Writes the buffered ops out once there are many.
    pub(crate) fn flush_if_full(&mut self) -> Result<(), StoreError> {
        if self.pending_ops >= PENDING_OPS_LIMIT {
            self.write_pending()?;
        }
        Ok(())
    }

    /// Writes the buffered ops (op ids only grow, so they append to each bucket's last
    /// block) and the superseded ones. Each libmdbx call writes at most one block, so a
    /// transaction of millions of changes can spill dirty pages between calls.
    pub(super) fn write_pending(&mut self) -> Result<(), StoreError> {
        for (bucket_id, ops) in self.pending.drain() {
            op_blocks::append(self.txn, &self.tables.ops, bucket_id, &ops)
                .map_err(|e| block_error(self.dir, "append ops", e))?;
        }
        self.write_superseded()?;
        self.pending_ops = 0;
        Ok(())
    }

    /// Notes that a parameter lookup was written or removed.
    pub(crate) fn lookups_changed(&self) {
        self.lookups_changed.set(true);
    }

    /// Persists accumulators, counters and the checkpoint `(last op id, lsn)`.
    /// Also returns a dictionary trained in this transaction (stored with it), for the
    /// store to compress with from the next transaction on, and what it changed.
    pub(crate) fn finish(mut self, lsn: u64) -> Result<Finished, StoreError> {
        let lsn = self.lsn.unwrap_or(lsn);
        self.write_pending()?;
        for (name, state) in &self.dirty {
            self.txn
                .put(
                    &self.tables.buckets,
                    stored_key(name.as_bytes()),
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
        let trained = self.store_trained_dictionary()?;
        let changes = if self.forked {
            Changes::everything()
        } else {
            Changes {
                buckets: std::mem::take(&mut self.dirty).into_keys().collect(),
                lookups: self.lookups_changed.get(),
                stage_keys: self.stage_keys.take(),
                everything: false,
            }
        };
        Ok(Finished {
            checkpoint,
            trained,
            changes,
            hold_open: self.hold_open,
        })
    }
}
