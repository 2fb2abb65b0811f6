//! CLEAR compaction: a bucket's leading REMOVE, MOVE and CLEAR ops folded into one CLEAR.

use std::collections::HashMap;

use super::WriteTxn;
use crate::op::{OpKind, StoredOp};
use crate::op_blocks::{self, block_error, BlockCursor};
use crate::StoreError;

/// Ops folded into one CLEAR per compaction step (bounds the memory of one step).
const CLEAR_BATCH: usize = 100_000;

impl WriteTxn<'_, '_> {
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
}
