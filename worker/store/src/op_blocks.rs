//! The `ops` table: each bucket's ops in blocks of consecutive 24-byte records, keyed by
//! `(bucket id, the block's last op id)`, both big-endian.
//!
//! A full block ([`BLOCK_OPS`] ops) fills one 4 KiB libmdbx large page exactly, and the
//! leaf pages hold only 12-byte keys and page numbers, so blocks of different buckets can
//! be inserted anywhere without half-empty pages. Appending a bucket's ops is one put per
//! block instead of one per op (libmdbx descends the tree for every duplicate it adds),
//! and one seek finds the block holding the first op after any position.

use std::borrow::Cow;
use std::path::Path;

use libmdbx::{Cursor, Table, TransactionKind, WriteFlags, RW};

use crate::env::Txn;

use super::codec::Corrupt;
use super::op::{StoredOp, OP_BYTES};
use super::StoreError;

/// The store's page size (set when a store is created).
pub(super) const PAGE_BYTES: usize = 4096;
/// libmdbx's page header: what a large page holds besides the value.
const PAGE_HEADER_BYTES: usize = 20;
/// Ops per full block: 169, 4,056 bytes, one large page.
pub(super) const BLOCK_OPS: usize = (PAGE_BYTES - PAGE_HEADER_BYTES) / OP_BYTES;

const WHAT: &str = "op block";

/// The key of a block: bucket id and last op id, big-endian, so keys sort by bucket, then
/// op.
pub(super) fn block_key(bucket_id: u32, last_op: u64) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&bucket_id.to_be_bytes());
    key[4..].copy_from_slice(&last_op.to_be_bytes());
    key
}

/// The bucket id of a block key.
fn key_bucket(key: &[u8]) -> Result<u32, Corrupt> {
    super::codec::fixed::<4>(key, 0, WHAT).map(u32::from_be_bytes)
}

/// The ops of a block, in op order.
fn decode_block(bytes: &[u8]) -> Result<Vec<StoredOp>, Corrupt> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(OP_BYTES) {
        return Err(Corrupt { what: WHAT });
    }
    bytes.chunks_exact(OP_BYTES).map(StoredOp::decode).collect()
}

/// A stored block, checked: its ops ascend and the last is the one its key names (a seek
/// relies on both).
fn stored_block(key: &[u8], value: &[u8]) -> Result<Block, Corrupt> {
    let key = super::codec::fixed::<12>(key, 0, WHAT)?;
    let ops = decode_block(value)?;
    let last = ops.last().map(|op| op.op_id.to_be_bytes());
    if last.as_ref().map(<[u8; 8]>::as_slice) != key.get(4..)
        || ops.windows(2).any(|w| w[0].op_id >= w[1].op_id)
    {
        return Err(Corrupt { what: WHAT });
    }
    Ok(Block { key, ops })
}

fn encode_block(ops: &[StoredOp]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ops.len() * OP_BYTES);
    for op in ops {
        out.extend_from_slice(&op.encode());
    }
    out
}

/// A libmdbx failure or a damaged block.
#[derive(Debug)]
pub(super) enum BlockError {
    Mdbx(libmdbx::Error),
    Corrupt(Corrupt),
}

impl From<libmdbx::Error> for BlockError {
    fn from(e: libmdbx::Error) -> Self {
        Self::Mdbx(e)
    }
}

impl From<Corrupt> for BlockError {
    fn from(c: Corrupt) -> Self {
        Self::Corrupt(c)
    }
}

/// The store error for a failed block operation.
pub(super) fn block_error(dir: &Path, action: &'static str, e: BlockError) -> StoreError {
    match e {
        BlockError::Mdbx(e) => StoreError::mdbx(dir, action, e),
        BlockError::Corrupt(c) => StoreError::corrupt(dir, c.what),
    }
}

/// A key and value as libmdbx returns them (borrowed from the map where it can).
type Entry<'txn> = (Cow<'txn, [u8]>, Cow<'txn, [u8]>);

/// One block as found: its key and its ops.
pub(super) struct Block {
    pub key: [u8; 12],
    pub ops: Vec<StoredOp>,
}

/// Reads a bucket's blocks in op order, starting at the block that holds the first op
/// with an id at or above `from`.
pub(super) struct BlockCursor<'txn, K: TransactionKind> {
    cursor: Cursor<'txn, K>,
    bucket_id: u32,
    next: Option<Entry<'txn>>,
}

impl<'txn, K: TransactionKind> BlockCursor<'txn, K> {
    pub fn seek(
        txn: Txn<'txn, '_, K>,
        table: &Table<'txn>,
        bucket_id: u32,
        from: u64,
    ) -> Result<Self, BlockError> {
        let mut cursor = txn.cursor(table)?;
        let next = cursor.set_range(&block_key(bucket_id, from))?;
        Ok(Self {
            cursor,
            bucket_id,
            next,
        })
    }

    /// The next block of the bucket, `None` after its last.
    pub fn next_block(&mut self) -> Result<Option<Block>, BlockError> {
        let Some((key, value)) = self.next.take() else {
            return Ok(None);
        };
        if key_bucket(&key)? != self.bucket_id {
            return Ok(None);
        }
        let block = stored_block(&key, &value)?;
        self.next = self.cursor.next()?;
        Ok(Some(block))
    }
}

/// Appends `ops` (ascending, above every op of the bucket) to a bucket: the bucket's last
/// block is filled up first, then full blocks follow.
pub(super) fn append(
    txn: Txn<'_, '_, RW>,
    table: &Table<'_>,
    bucket_id: u32,
    ops: &[StoredOp],
) -> Result<(), BlockError> {
    let Some(first) = ops.first() else {
        return Ok(());
    };
    let mut merged: Vec<StoredOp>;
    let mut ops = ops;
    if let Some(tail) = last_block(txn, table, bucket_id)? {
        let last_op = tail.ops.last().map_or(0, |op| op.op_id);
        if last_op >= first.op_id {
            return Err(Corrupt {
                what: "op block (an appended op is not above the bucket's last)",
            }
            .into());
        }
        if tail.ops.len() < BLOCK_OPS {
            txn.del(table, tail.key, None)?;
            merged = tail.ops;
            merged.extend_from_slice(ops);
            ops = &merged;
        }
    }
    for block in ops.chunks(BLOCK_OPS) {
        let last = block.last().map_or(0, |op| op.op_id);
        txn.put(
            table,
            block_key(bucket_id, last),
            encode_block(block),
            WriteFlags::NO_OVERWRITE,
        )?;
    }
    Ok(())
}

/// The bucket's last block.
fn last_block(
    txn: Txn<'_, '_, RW>,
    table: &Table<'_>,
    bucket_id: u32,
) -> Result<Option<Block>, BlockError> {
    let mut cursor = txn.cursor(table)?;
    // No op id is u64::MAX: the largest key up to this one is the bucket's last block, if
    // the bucket has any.
    let entry: Option<Entry<'_>> = cursor.set_upperbound(&block_key(bucket_id, u64::MAX))?;
    let Some((key, value)) = entry else {
        return Ok(None);
    };
    if key_bucket(&key)? != bucket_id {
        return Ok(None);
    }
    Ok(Some(stored_block(&key, &value)?))
}

/// Replaces ops of a bucket: for each `(op id, argument)` of `changes` (ascending op
/// ids) the op becomes `with(old, argument)` (same op id). Each block holding any of them
/// is read and put once, whatever the number of its ops replaced (a bulk update supersedes
/// a whole block's ops one row after another). `None` when the bucket lacks one of the
/// ops (those before it may have been replaced).
pub(super) fn rewrite(
    txn: Txn<'_, '_, RW>,
    table: &Table<'_>,
    bucket_id: u32,
    changes: &[(u64, u64)],
    with: impl Fn(StoredOp, u64) -> StoredOp,
) -> Result<Option<()>, BlockError> {
    let mut next = 0;
    while let Some(&(first, _)) = changes.get(next) {
        let mut cursor = txn.cursor(table)?;
        // The first block whose last op is at or above `first`: the one holding it, if any.
        let entry: Option<Entry<'_>> = cursor.set_range(&block_key(bucket_id, first))?;
        let Some((key, value)) = entry else {
            return Ok(None);
        };
        if key_bucket(&key)? != bucket_id {
            return Ok(None);
        }
        let key = super::codec::fixed::<12>(&key, 0, WHAT)?;
        let last = u64::from_be_bytes(super::codec::fixed::<8>(&key, 4, WHAT)?);
        let mut bytes = value.into_owned();
        let (records, rest) = bytes.as_chunks_mut::<OP_BYTES>();
        if records.is_empty() || !rest.is_empty() {
            return Err(Corrupt { what: WHAT }.into());
        }
        while let Some(&(op_id, argument)) = changes.get(next).filter(|(id, _)| *id <= last) {
            let Ok(i) = records.binary_search_by_key(&op_id, record_op_id) else {
                return Ok(None);
            };
            let Some(record) = records.get_mut(i) else {
                return Ok(None);
            };
            let new = with(StoredOp::decode(record.as_slice())?, argument);
            debug_assert_eq!(new.op_id, op_id);
            *record = new.encode();
            next += 1;
        }
        txn.put(table, key, bytes, WriteFlags::UPSERT)?;
    }
    Ok(Some(()))
}

/// The op id an encoded op starts with (big-endian, so records sort by it).
fn record_op_id(record: &[u8; OP_BYTES]) -> u64 {
    let mut id = [0u8; 8];
    id.copy_from_slice(&record[..8]);
    u64::from_be_bytes(id)
}

/// Replaces the bucket's first `count` ops with `first` (an op id at least that of the
/// last one replaced and below every op kept). Blocks wholly replaced are deleted; the
/// block holding the boundary keeps its other ops after `first`.
pub(super) fn replace_prefix(
    txn: Txn<'_, '_, RW>,
    table: &Table<'_>,
    bucket_id: u32,
    count: usize,
    first: StoredOp,
) -> Result<(), BlockError> {
    let mut replaced = Vec::new();
    let mut rest = Vec::new();
    {
        let mut blocks = BlockCursor::seek(txn, table, bucket_id, 0)?;
        let mut left = count;
        while left > 0 {
            let Some(block) = blocks.next_block()? else {
                return Err(Corrupt {
                    what: "op block (a compacted prefix is longer than the bucket)",
                }
                .into());
            };
            if block.ops.len() > left {
                rest = block.ops[left..].to_vec();
                left = 0;
            } else {
                left -= block.ops.len();
            }
            replaced.push(block.key);
        }
    }
    for key in &replaced {
        txn.del(table, key, None)?;
    }
    let mut block = Vec::with_capacity(1 + rest.len());
    block.push(first);
    block.extend(rest);
    let last = block.last().map_or(first.op_id, |op| op.op_id);
    txn.put(
        table,
        block_key(bucket_id, last),
        encode_block(&block),
        WriteFlags::NO_OVERWRITE,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use libmdbx::{Database, DatabaseOptions, NoWriteMap, PageSize, TableFlags};

    use super::super::op::OpKind;
    use super::*;

    fn put(op_id: u64) -> StoredOp {
        StoredOp {
            op_id,
            kind: OpKind::Put,
            output: 0,
            checksum: op_id as u32,
            reference: op_id * 10,
        }
    }

    fn open(dir: &Path) -> Database<NoWriteMap> {
        let options = DatabaseOptions {
            max_tables: Some(2),
            page_size: Some(PageSize::Set(PAGE_BYTES)),
            ..Default::default()
        };
        Database::open_with_options(dir, options).unwrap()
    }

    /// Every op of bucket `bucket_id` after `after`, read block by block.
    fn read_after(db: &Database<NoWriteMap>, bucket_id: u32, after: u64) -> Vec<StoredOp> {
        let txn = db.begin_ro_txn().unwrap();
        let table = txn.open_table(Some("ops")).unwrap();
        let mut blocks = BlockCursor::seek((&txn).into(), &table, bucket_id, after + 1).unwrap();
        let mut out = Vec::new();
        while let Some(block) = blocks.next_block().unwrap() {
            out.extend(block.ops.into_iter().filter(|op| op.op_id > after));
        }
        out
    }

    #[test]
    fn appends_fill_blocks_and_every_position_seeks_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        // Two buckets interleaved, appended in uneven runs across transactions.
        let mut next = 1u64;
        let mut expected: [Vec<StoredOp>; 2] = [Vec::new(), Vec::new()];
        for run in 0..40u64 {
            let txn = db.begin_rw_txn().unwrap();
            let table = txn.create_table(Some("ops"), TableFlags::empty()).unwrap();
            for bucket in 0..2u32 {
                let ops: Vec<StoredOp> = (0..(run * 7 + u64::from(bucket) * 13) % 50 + 1)
                    .map(|i| put(next + i))
                    .collect();
                next += ops.len() as u64;
                append((&txn).into(), &table, bucket + 1, &ops).unwrap();
                expected[bucket as usize].extend(ops);
            }
            txn.commit().unwrap();
        }
        for bucket in 0..2u32 {
            let all = &expected[bucket as usize];
            assert!(all.len() > 3 * BLOCK_OPS);
            for (i, op) in all.iter().enumerate() {
                assert_eq!(read_after(&db, bucket + 1, op.op_id - 1), all[i..]);
            }
            assert!(read_after(&db, bucket + 1, next).is_empty());
        }
        // Every block but each bucket's last is full, and a full block is one large page.
        let txn = db.begin_ro_txn().unwrap();
        let table = txn.open_table(Some("ops")).unwrap();
        let stat = txn.table_stat(&table).unwrap();
        let blocks: usize = expected
            .iter()
            .map(|ops| ops.len().div_ceil(BLOCK_OPS))
            .sum();
        let full: usize = expected.iter().map(|ops| ops.len() / BLOCK_OPS).sum();
        assert_eq!(stat.entries(), blocks);
        assert!(stat.overflow_pages() <= blocks && stat.overflow_pages() >= full);
        assert!(stat.leaf_pages() <= 2);
    }

    #[test]
    fn a_block_whose_key_or_order_is_wrong_does_not_decode() {
        let ops = [put(5), put(9)];
        let value = encode_block(&ops);
        assert_eq!(stored_block(&block_key(1, 9), &value).unwrap().ops, ops);
        assert!(stored_block(&block_key(1, 8), &value).is_err());
        assert!(stored_block(&block_key(1, 9), &value[..OP_BYTES + 1]).is_err());
        assert!(stored_block(&block_key(1, 9), &[]).is_err());
        let backwards = encode_block(&[put(9), put(5)]);
        assert!(stored_block(&block_key(1, 5), &backwards).is_err());
    }

    #[test]
    fn rewrites_and_prefix_replacement_keep_the_other_ops() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        let txn = db.begin_rw_txn().unwrap();
        let table = txn.create_table(Some("ops"), TableFlags::empty()).unwrap();
        let mut all: Vec<StoredOp> = (1..=500).map(put).collect();
        append((&txn).into(), &table, 7, &all).unwrap();
        // Ops in the first three blocks become MOVEs (each block put once); a missing op
        // is reported.
        let moved = |op: StoredOp, target: u64| StoredOp {
            kind: OpKind::Move,
            reference: target,
            ..op
        };
        let changes: Vec<(u64, u64)> = [20, 21, 169, 170, 171, 400]
            .into_iter()
            .map(|id| (id, 900 + id))
            .collect();
        assert!(rewrite((&txn).into(), &table, 7, &changes, moved)
            .unwrap()
            .is_some());
        for &(id, target) in &changes {
            let i = usize::try_from(id).unwrap() - 1;
            all[i] = moved(all[i], target);
        }
        assert!(rewrite((&txn).into(), &table, 7, &[(501, 1)], moved)
            .unwrap()
            .is_none());
        assert!(
            rewrite((&txn).into(), &table, 7, &[(30, 1), (501, 1)], moved)
                .unwrap()
                .is_none()
        );
        all[29] = moved(all[29], 1);
        assert!(rewrite((&txn).into(), &table, 8, &[(20, 1)], moved)
            .unwrap()
            .is_none());
        // An op below the bucket's last is refused.
        assert!(append((&txn).into(), &table, 7, &[put(400)]).is_err());
        // The first 200 ops (past the first block's end) become one CLEAR.
        let clear = StoredOp {
            op_id: 200,
            kind: OpKind::Clear,
            output: 0,
            checksum: 1,
            reference: 999,
        };
        replace_prefix((&txn).into(), &table, 7, 200, clear).unwrap();
        txn.commit().unwrap();
        let mut want = vec![clear];
        want.extend_from_slice(&all[200..]);
        assert_eq!(read_after(&db, 7, 0), want);
        assert_eq!(read_after(&db, 7, 200), all[200..]);
        assert_eq!(read_after(&db, 7, 199), want);
    }
}
