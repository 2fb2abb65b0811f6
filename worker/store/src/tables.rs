//! The named tables of the environment and how each is keyed (see `docs/storage.md`).

use libmdbx::{Table, TableFlags, TransactionKind};

use crate::env::{Env, Txn};

use super::StoreError;

/// Table names and flags, created together with the store.
pub(super) const TABLES: &[(&str, TableFlags)] = &[
    (META, TableFlags::empty()),
    (BUCKETS, TableFlags::empty()),
    (BUCKET_NAMES, TableFlags::INTEGER_KEY),
    (OPS, TableFlags::empty()),
    (ROWS, TableFlags::INTEGER_KEY),
    (ROW_KEYS, TableFlags::empty()),
    (TOMBSTONES, TableFlags::INTEGER_KEY),
    (LOOKUPS, TableFlags::DUP_SORT),
    (COMPACTION_DEBT, TableFlags::INTEGER_KEY),
];

/// Store metadata: format, identity, counters, checkpoint.
pub(super) const META: &str = "meta";
/// Bucket name → accumulators ([`super::op::BucketState`]).
const BUCKETS: &str = "buckets";
/// Bucket id (u32) → name.
const BUCKET_NAMES: &str = "bucket_names";
/// Bucket id (u32 BE) + last op id (u64 BE) → a block of ops ([`super::op_blocks`]).
const OPS: &str = "ops";
/// Row id (u64) → row record.
const ROWS: &str = "rows";
/// Table id (u32 BE) + replica identity → row id.
const ROW_KEYS: &str = "row_keys";
/// REMOVE op id (u64) → tombstone.
const TOMBSTONES: &str = "tombstones";
/// Lookup key → row id (u64 BE) + lookup outputs, one dup per row.
const LOOKUPS: &str = "lookups";
/// Bucket id (u32) → ops made compactable since its last compaction (u64 LE).
const COMPACTION_DEBT: &str = "compaction_debt";

/// Handles of every table, valid for one transaction.
pub(super) struct Tables<'t> {
    pub meta: Table<'t>,
    pub buckets: Table<'t>,
    pub bucket_names: Table<'t>,
    pub ops: Table<'t>,
    pub rows: Table<'t>,
    pub row_keys: Table<'t>,
    pub tombstones: Table<'t>,
    pub lookups: Table<'t>,
    pub compaction_debt: Table<'t>,
}

impl Tables<'static> {
    /// Handles of every table valid for as long as the environment `db` is open, for its
    /// read transactions: opening nine tables by name in each read costs a name lookup
    /// and an allocation per table, and 10,000 streams make a read each per commit.
    ///
    /// The handles must not outlive `db`: the store keeps them beside it and lends them
    /// only to its own transactions.
    pub(crate) fn permanent(env: &Env, dir: &std::path::Path) -> Result<Self, StoreError> {
        let txn = env
            .begin_ro_txn()
            .map_err(|e| StoreError::mdbx(dir, "begin a read", e))?;
        // SAFETY: a table handle is the environment's table number, which libmdbx keeps
        // valid until the environment closes once the transaction that opened it
        // committed (below), and no table of the store is ever dropped. The store owns
        // `db` and lends these handles only to transactions of `db`, which borrow it.
        let tables = unsafe {
            std::mem::transmute::<Tables<'_>, Tables<'static>>(Tables::open(txn.borrow(), dir)?)
        };
        txn.commit()
            .map_err(|e| StoreError::mdbx(dir, "keep the tables open", e))?;
        Ok(tables)
    }
}

impl<'t> Tables<'t> {
    /// Opens every table in `txn`.
    pub(crate) fn open<'db: 't, K: TransactionKind>(
        txn: impl Into<Txn<'t, 'db, K>>,
        dir: &std::path::Path,
    ) -> Result<Self, StoreError> {
        let txn = txn.into();
        let open = |name: &str| {
            txn.open_table(Some(name))
                .map_err(|e| StoreError::mdbx(dir, "open a table", e))
        };
        Ok(Self {
            meta: open(META)?,
            buckets: open(BUCKETS)?,
            bucket_names: open(BUCKET_NAMES)?,
            ops: open(OPS)?,
            rows: open(ROWS)?,
            row_keys: open(ROW_KEYS)?,
            tombstones: open(TOMBSTONES)?,
            lookups: open(LOOKUPS)?,
            compaction_debt: open(COMPACTION_DEBT)?,
        })
    }
}

/// `row_keys` key: table id big-endian, then the identity bytes.
/// The row id a `row_keys` value holds; `None` when it is not one.
pub(super) fn row_id_of(value: &[u8]) -> Option<u64> {
    super::codec::fixed::<8>(value, 0, "row key")
        .ok()
        .map(u64::from_le_bytes)
}

/// A `row_keys` value read in place (no copy of it made): the row id it holds, `None` when
/// it holds none.
pub(crate) struct RowIdValue(pub Option<u64>);

impl libmdbx::Decodable<'_> for RowIdValue {
    fn decode(value: &[u8]) -> Result<Self, libmdbx::Error> {
        Ok(Self(row_id_of(value)))
    }
}

pub(super) fn row_key(table_id: u32, identity: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(4 + identity.len());
    key.extend_from_slice(&table_id.to_be_bytes());
    key.extend_from_slice(identity);
    key
}

/// The name of bucket `id`, as `bucket_names` holds it.
pub(super) fn bucket_name<K: TransactionKind>(
    txn: Txn<'_, '_, K>,
    tables: &Tables<'_>,
    dir: &std::path::Path,
    id: u32,
) -> Result<String, StoreError> {
    let name: Vec<u8> = txn
        .get(&tables.bucket_names, id.to_ne_bytes())
        .map_err(|e| StoreError::mdbx(dir, "read a bucket name", e))?
        .ok_or_else(|| StoreError::corrupt(dir, "bucket name"))?;
    String::from_utf8(name).map_err(|_| StoreError::corrupt(dir, "bucket name"))
}
