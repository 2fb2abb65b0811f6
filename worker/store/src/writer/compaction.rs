//! CLEAR compaction: a bucket's leading REMOVE, MOVE and CLEAR ops folded into one CLEAR.

use super::txn::WriteTxn;
use crate::op::{OpKind, StoredOp};
use crate::op_blocks::{self, block_error, BlockCursor};
use crate::StoreError;

/// Most ops one compaction step reads and folds (bounds the memory of one step); a longer
/// prefix is folded in several steps, each starting from the CLEAR of the one before.
const CLEAR_BATCH: usize = 100_000;

/// Meta key of the buckets a source transaction's end made due for compaction, not yet
/// compacted: u32 bucket ids, little endian.
const KEY_COMPACTION_DUE: &[u8] = b"compaction_due";

impl WriteTxn<'_, '_> {
    /// Settles the compaction debt at the end of one source transaction: adds the ops it
    /// made compactable (superseded PUTs, REMOVEs) to each bucket's debt, and marks the
    /// buckets that owe `after_ops` or more as due. Their CLEAR compaction runs before
    /// anything else is written ([`Self::compact_marked`]: at the start of every write,
    /// and between source transactions grouped in one), so it sees exactly the ops of the
    /// transactions up to this one, as if it ran here, and a transaction is committed
    /// (and published) before the compaction it made due. The debt and the marks are
    /// stored with the ops, so when a
    /// bucket is compacted depends only on the source transactions applied, never on how
    /// they were grouped into commits or on restarts. Returns whether a bucket was marked.
    pub fn compact_due(&mut self, after_ops: u64) -> Result<bool, StoreError> {
        let mut made: Vec<(u32, u64)> = std::mem::take(&mut self.compactable).into_iter().collect();
        made.sort_unstable();
        let mut due = self.marked()?;
        let already = due.len();
        for (bucket_id, ops) in made {
            let key = bucket_id.to_ne_bytes();
            let stored: Option<Vec<u8>> = self
                .txn
                .get(&self.tables.compaction_debt, key)
                .map_err(self.mdbx("read a compaction debt"))?;
            let owed = match stored {
                None => 0,
                Some(bytes) => u64::from_le_bytes(
                    bytes
                        .try_into()
                        .map_err(|_| self.corrupt("compaction debt"))?,
                ),
            } + ops;
            if owed >= after_ops {
                // `made` holds each bucket once; only earlier marks can repeat it.
                if !due[..already].contains(&bucket_id) {
                    due.push(bucket_id);
                }
                match self.txn.del(&self.tables.compaction_debt, key, None) {
                    Ok(_) | Err(libmdbx::Error::NotFound) => {}
                    Err(e) => return Err(self.mdbx("clear a compaction debt")(e)),
                }
            } else {
                self.txn
                    .put(
                        &self.tables.compaction_debt,
                        key,
                        owed.to_le_bytes(),
                        libmdbx::WriteFlags::UPSERT,
                    )
                    .map_err(self.mdbx("write a compaction debt"))?;
            }
        }
        if due.len() > already {
            let bytes: Vec<u8> = due.iter().flat_map(|id| id.to_le_bytes()).collect();
            self.txn
                .put(
                    &self.tables.meta,
                    KEY_COMPACTION_DUE,
                    bytes,
                    libmdbx::WriteFlags::UPSERT,
                )
                .map_err(self.mdbx("mark buckets due for compaction"))?;
        }
        Ok(!due.is_empty())
    }

    /// CLEAR-compacts the buckets [`Self::compact_due`] marked, in the order marked, and
    /// clears the marks. Returns the number of ops removed.
    pub fn compact_marked(&mut self) -> Result<u64, StoreError> {
        let due = self.marked()?;
        if due.is_empty() {
            return Ok(0);
        }
        let mut removed = 0;
        for bucket_id in due {
            removed += self.compact_bucket(bucket_id)?;
        }
        self.txn
            .del(&self.tables.meta, KEY_COMPACTION_DUE, None)
            .map_err(self.mdbx("clear the buckets due for compaction"))?;
        Ok(removed)
    }

    /// The buckets marked due for compaction.
    fn marked(&self) -> Result<Vec<u32>, StoreError> {
        let stored: Option<Vec<u8>> = self
            .txn
            .get(&self.tables.meta, KEY_COMPACTION_DUE)
            .map_err(self.mdbx("read the buckets due for compaction"))?;
        let Some(bytes) = stored else {
            return Ok(Vec::new());
        };
        if !bytes.len().is_multiple_of(4) {
            return Err(self.corrupt("buckets due for compaction"));
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// CLEAR compaction (`docs/spec/protocol.md` §4.5): the longest prefix of a bucket's ops made
    /// only of REMOVE, MOVE and CLEAR ops becomes one CLEAR with the largest op id, the sum of
    /// their checksums and the largest target. Checksums are unchanged; the count drops. A client
    /// behind the prefix receives the CLEAR, drops the bucket's rows and gets the live ones from
    /// the PUTs after it. Returns the number of ops removed.
    pub fn compact_bucket(&mut self, bucket_id: u32) -> Result<u64, StoreError> {
        self.write_pending()?;
        let mut removed = 0;
        loop {
            let (folded, whole) = self.compact_step(bucket_id)?;
            removed += folded;
            if whole {
                return Ok(removed);
            }
        }
    }

    /// Folds up to [`CLEAR_BATCH`] ops of the bucket's prefix into one CLEAR. Returns the
    /// ops removed and whether the prefix ended within the step (a PUT or the bucket's
    /// end was reached), so nothing is left to fold.
    fn compact_step(&mut self, bucket_id: u32) -> Result<(u64, bool), StoreError> {
        let mut prefix = Vec::new();
        let mut whole = true;
        {
            let mut blocks = BlockCursor::seek(self.txn, &self.tables.ops, bucket_id, 0)
                .map_err(|e| block_error(self.dir, "find a bucket's ops", e))?;
            'blocks: while let Some(block) = blocks
                .next_block()
                .map_err(|e| block_error(self.dir, "read ops", e))?
            {
                for op in block.ops {
                    if op.kind == OpKind::Put {
                        break 'blocks;
                    }
                    if prefix.len() == CLEAR_BATCH {
                        whole = false;
                        break 'blocks;
                    }
                    prefix.push(op);
                }
            }
        }
        if prefix.len() < 2 {
            return Ok((0, true));
        }
        let mut clear = StoredOp {
            op_id: 0,
            kind: OpKind::Clear,
            output: 0,
            checksum: 0,
            reference: 0,
        };
        // The REMOVEs' tombstones, in op id order: one cursor finds each near the last.
        let mut tombstones = self
            .txn
            .cursor(&self.tables.tombstones)
            .map_err(self.mdbx("open a cursor"))?;
        for op in &prefix {
            clear.op_id = clear.op_id.max(op.op_id);
            clear.checksum = clear.checksum.wrapping_add(op.checksum);
            let target = match op.kind {
                OpKind::Remove => op.op_id,
                _ => op.reference,
            };
            clear.reference = clear.reference.max(target);
            if op.kind == OpKind::Remove {
                let found: Option<()> = tombstones
                    .set(&op.op_id.to_ne_bytes())
                    .map_err(self.mdbx("find a tombstone"))?;
                if found.is_some() {
                    tombstones
                        .del(libmdbx::WriteFlags::empty())
                        .map_err(self.mdbx("remove a tombstone"))?;
                }
            }
        }
        drop(tombstones);
        op_blocks::replace_prefix(self.txn, &self.tables.ops, bucket_id, prefix.len(), clear)
            .map_err(|e| block_error(self.dir, "compact ops", e))?;
        let name = self.bucket_name(bucket_id)?;
        let state = self.bucket(&name)?;
        let removed = prefix.len() as u64 - 1;
        state.count = state.count.saturating_sub(removed);
        Ok((removed, whole))
    }
}
