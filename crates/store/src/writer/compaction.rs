//! CLEAR compaction: a bucket's leading REMOVE, MOVE and CLEAR ops folded into one CLEAR.

use super::WriteTxn;
use crate::op::{OpKind, StoredOp};
use crate::op_blocks::{self, block_error, BlockCursor};
use crate::StoreError;

/// Ops folded into one CLEAR per compaction step (bounds the memory of one step).
const CLEAR_BATCH: usize = 100_000;

impl WriteTxn<'_, '_> {
    /// Settles the compaction debt at the end of one source transaction: adds the ops it
    /// made compactable (superseded PUTs, REMOVEs) to each bucket's debt and
    /// CLEAR-compacts the buckets that owe `after_ops` or more. The debt is stored with
    /// the ops, so when a bucket is compacted depends only on the source transactions
    /// applied, never on how they were grouped into commits or on restarts.
    pub fn compact_due(&mut self, after_ops: u64) -> Result<(), StoreError> {
        let mut made: Vec<(u32, u64)> = std::mem::take(&mut self.compactable).into_iter().collect();
        made.sort_unstable();
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
                self.compact_bucket(bucket_id)?;
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
        Ok(())
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
        Ok(removed)
    }
}
