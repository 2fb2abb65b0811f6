//! Bucket state: a bucket's accumulators and id, the ops appended to it, a PUT
//! superseded by a MOVE, and a row's membership ended by a REMOVE.

use libmdbx::WriteFlags;

use super::txn::WriteTxn;
use crate::checksum::remove_checksum;
use crate::long_keys::{is_hashed, stored_key};
use crate::op::{BucketState, OpKind, StoredOp};
use crate::op_blocks::{self, block_error};
use crate::record::{subkey, Membership, RowRecord, Tombstone};
use crate::StoreError;

impl WriteTxn<'_, '_> {
    /// Appends a PUT of row `row_id` (showing `output`) to bucket `name`.
    pub(crate) fn put_op(
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

    /// The accumulators of `name` in this transaction, created (with a new id) on first
    /// use.
    pub(super) fn bucket(&mut self, name: &str) -> Result<&mut BucketState, StoreError> {
        if self.dirty.contains_key(name) {
            return self
                .dirty
                .get_mut(name)
                .ok_or_else(|| StoreError::corrupt(self.dir, "bucket state"));
        }
        let key = stored_key(name.as_bytes());
        let stored: Option<Vec<u8>> = self
            .txn
            .get(&self.tables.buckets, &key)
            .map_err(self.mdbx("read a bucket"))?;
        let state = match stored {
            Some(bytes) => {
                let state = BucketState::decode(&bytes)
                    .map_err(|c| StoreError::corrupt(self.dir, c.what))?;
                if is_hashed(&key) && self.bucket_name(state.id)? != name {
                    return Err(StoreError::key_collision(self.dir, name));
                }
                state
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
        self.dirty_names.insert(state.id, name.to_owned());
        Ok(self.dirty.entry(name.to_owned()).or_insert(state))
    }

    pub(super) fn bucket_name(&self, id: u32) -> Result<String, StoreError> {
        // Every bucket this transaction wrote to (a REMOVE's bucket mostly is one).
        if let Some(name) = self.dirty_names.get(&id) {
            return Ok(name.clone());
        }
        crate::tables::bucket_name(self.txn, self.tables, self.dir, id)
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
        if self.diverging {
            self.fork_history()?;
        }
        let op_id = self.counters.next_op;
        // One lookup for a bucket this transaction has seen (every op but its first).
        let bucket = match self.dirty.get_mut(name) {
            Some(state) => state,
            None => self.bucket(name)?,
        };
        bucket.add(op_id, checksum);
        let bucket_id = bucket.id;
        self.buffer_op(
            bucket_id,
            StoredOp {
                op_id,
                kind,
                output,
                checksum,
                reference,
            },
        );
        Ok((bucket_id, op_id))
    }

    /// Appends a REMOVE of row `row_id` to the bucket with id `bucket_id` (a row's record
    /// names its buckets by id). Returns the op id.
    fn append_remove(
        &mut self,
        bucket_id: u32,
        checksum: u32,
        row_id: u64,
    ) -> Result<u64, StoreError> {
        let written = self.dirty_names.get(&bucket_id).filter(|_| !self.diverging);
        let Some(bucket) = written.and_then(|name| self.dirty.get_mut(name.as_str())) else {
            // Not written in this transaction yet (or forking first): found by its name.
            let name = self.bucket_name(bucket_id)?;
            return Ok(self.append(&name, OpKind::Remove, 0, checksum, row_id)?.1);
        };
        let op_id = self.counters.next_op;
        bucket.add(op_id, checksum);
        let remove = StoredOp {
            op_id,
            kind: OpKind::Remove,
            output: 0,
            checksum,
            reference: row_id,
        };
        self.buffer_op(bucket_id, remove);
        Ok(op_id)
    }

    /// Buffers `op` (the next op id) for bucket `bucket_id`, whose accumulators count it.
    fn buffer_op(&mut self, bucket_id: u32, op: StoredOp) {
        self.counters.next_op += 1;
        self.pending.entry(bucket_id).or_default().push(op);
        self.pending_ops += 1;
    }

    /// Turns op `op_id` of a bucket into a MOVE that points at `target`.
    pub(super) fn supersede(
        &mut self,
        bucket_id: u32,
        op_id: u64,
        target: u64,
    ) -> Result<(), StoreError> {
        *self.compactable.entry(bucket_id).or_default() += 1;
        // Buffered ops are this transaction's, above every op of earlier ones: those (all
        // of a bulk change's) skip the search.
        let buffered = self
            .pending
            .get_mut(&bucket_id)
            .filter(|ops| ops.first().is_some_and(|first| first.op_id <= op_id));
        if let Some(ops) = buffered {
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
        // An op already in its block: rewritten with the others of its block when the
        // buffered ops are written out.
        self.superseded
            .entry(bucket_id)
            .or_default()
            .push((op_id, target));
        self.pending_ops += 1;
        Ok(())
    }

    /// Turns the superseded ops noted by [`Self::supersede`] into MOVEs, one put per block.
    pub(super) fn write_superseded(&mut self) -> Result<(), StoreError> {
        let moved = |old: StoredOp, target: u64| StoredOp {
            kind: OpKind::Move,
            output: 0,
            reference: target,
            ..old
        };
        let mut superseded = std::mem::take(&mut self.superseded);
        for (bucket_id, moves) in &mut superseded {
            // Stable: an op superseded twice ends with its last target.
            moves.sort_by_key(|&(op_id, _)| op_id);
            op_blocks::rewrite(self.txn, &self.tables.ops, *bucket_id, moves, moved)
                .map_err(|e| block_error(self.dir, "supersede ops", e))?
                .ok_or_else(|| StoreError::corrupt(self.dir, "superseded op missing"))?;
            moves.clear();
        }
        // The emptied lists keep their room for the next ones.
        self.superseded = superseded;
        Ok(())
    }

    /// Ends row `row_id`'s `memberships` (of its record `old`): a REMOVE in each bucket,
    /// with its tombstone, and the PUT it ends superseded. The REMOVEs of one row share its
    /// subkey and so their checksum.
    pub(super) fn remove_memberships<'m>(
        &mut self,
        old: &RowRecord,
        memberships: impl IntoIterator<Item = &'m Membership>,
        row_id: u64,
    ) -> Result<(), StoreError> {
        // Made once a membership ends (an update usually ends none).
        let mut subkey_and_checksum: Option<(String, u32)> = None;
        // The tombstone of the output last removed: a row mostly shows one output in all
        // its buckets, whose REMOVEs then store the same bytes.
        let mut tombstone: Option<(u8, Vec<u8>)> = None;
        for membership in memberships {
            let (subkey, checksum) = subkey_and_checksum.get_or_insert_with(|| {
                let subkey = subkey(old.table_id, row_id);
                let checksum = remove_checksum(&subkey);
                (subkey, checksum)
            });
            let checksum = *checksum;
            let bytes = match tombstone.take() {
                Some((output, bytes)) if output == membership.output => bytes,
                _ => {
                    let output = old.output(membership);
                    Tombstone::encode_parts(&output.object_type, &output.object_id, subkey)
                }
            };
            let op_id = self.append_remove(membership.bucket_id, checksum, row_id)?;
            *self.compactable.entry(membership.bucket_id).or_default() += 1;
            self.put_tombstone(op_id, &bytes)?;
            tombstone = Some((membership.output, bytes));
            self.supersede(membership.bucket_id, membership.op_id, op_id)?;
        }
        Ok(())
    }

    /// Writes the tombstone of REMOVE `op_id`: past the table's end, as op ids only grow, so
    /// it is appended without a search (placed by one if it is not).
    pub(crate) fn put_tombstone(&mut self, op_id: u64, tombstone: &[u8]) -> Result<(), StoreError> {
        let (table, key) = (&self.tables.tombstones, op_id.to_ne_bytes());
        match self.txn.put(table, key, tombstone, WriteFlags::APPEND) {
            Err(libmdbx::Error::KeyMismatch) => {
                self.txn.put(table, key, tombstone, WriteFlags::UPSERT)
            }
            done => done,
        }
        .map_err(self.mdbx("write a tombstone"))
    }
}
