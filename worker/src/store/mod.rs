//! The MDBX bucket store. Only the engine opens it; SQL functions never do.
//!
//! This stage holds the environment, its directory discipline and the store's identity
//! (format and id). Bucket tables arrive with the snapshot stage.

mod codec;
mod dir;
mod error;
mod meta;
mod op;
mod reader;
mod record;
mod tables;
mod values;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use libmdbx::{Database, DatabaseOptions, Mode, NoWriteMap, ReadWriteOptions, SyncMode};

pub use dir::{remove_store_files, STORE_FILES};
pub use error::StoreError;
pub use meta::{StoreIdentity, FORMAT};
pub use op::{BucketState, OpKind};
pub use reader::{ObjectRead, OpRead, OpsPage, ReadTxn};
pub use values::{decode_values, encode_values, identity_key};
pub use writer::{LookupPut, RowPut, WriteTxn};

/// Named tables the environment reserves slots for.
const MAX_TABLES: u64 = 32;
/// Address space reserved for the map; disk is only used as data grows.
const MAX_MAP_BYTES: isize = 1 << 40;
/// File growth step.
const GROWTH_STEP: isize = 64 << 20;

/// Lowers libmdbx's own logging to warnings. libmdbx's fork handler logs a debug line in
/// every child of a process that loaded it (each PostgreSQL backend): call this once where
/// the library is loaded, before any fork.
pub fn quiet_library_logging() {
    // SAFETY: sets libmdbx's global log level; no logger pointer is dereferenced by us.
    unsafe {
        mdbx_sys::mdbx_setup_debug(mdbx_sys::MDBX_LOG_WARN, mdbx_sys::MDBX_DBG_DONTCHANGE, None);
    }
}

/// An open store. Dropping it closes the environment.
pub struct Store {
    db: Database<NoWriteMap>,
    dir: PathBuf,
    identity: StoreIdentity,
    created: bool,
    poisoned: AtomicBool,
}

/// A consistent point clients can sync to: every op up to `op_id` is committed, and the
/// source is applied up to `lsn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Checkpoint {
    /// Last op id committed.
    pub op_id: u64,
    /// Source LSN applied.
    pub lsn: u64,
}

impl Checkpoint {
    fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.op_id.to_le_bytes());
        out[8..].copy_from_slice(&self.lsn.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(Self {
            op_id: u64::from_le_bytes(codec::fixed(bytes, 0, "checkpoint").ok()?),
            lsn: u64::from_le_bytes(codec::fixed(bytes, 8, "checkpoint").ok()?),
        })
    }
}

impl Store {
    /// Opens the store in `dir`, creating the directory (mode 0700) and a fresh store when
    /// they do not exist. Refuses directories with foreign content, group/world access or
    /// another owner, and stores of another format.
    ///
    /// libmdbx starts a thread here: call it from a thread with all signals blocked.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let fresh = dir::prepare(dir)?;
        let options = DatabaseOptions {
            max_tables: Some(MAX_TABLES),
            mode: Mode::ReadWrite(ReadWriteOptions {
                sync_mode: SyncMode::Durable,
                max_size: Some(MAX_MAP_BYTES),
                growth_step: Some(GROWTH_STEP),
                ..Default::default()
            }),
            permissions: Some(0o600),
            ..Default::default()
        };
        let db = Database::<NoWriteMap>::open_with_options(dir, options)
            .map_err(|e| StoreError::mdbx(dir, "open the environment", e))?;
        let (identity, created) = meta::load_or_init(&db, dir, fresh)?;
        Ok(Self {
            db,
            dir: dir.to_owned(),
            identity,
            created,
            poisoned: AtomicBool::new(false),
        })
    }

    /// The directory the environment lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Format and id of this store.
    pub fn identity(&self) -> &StoreIdentity {
        &self.identity
    }

    /// True when this open created the store (empty storage at start).
    pub fn was_created(&self) -> bool {
        self.created
    }

    /// Bytes the data file occupies on disk.
    pub fn file_bytes(&self) -> u64 {
        std::fs::metadata(self.dir.join(dir::DATA_FILE)).map_or(0, |m| m.len())
    }

    /// Applies `changes` in one read-write transaction and commits it durably with the
    /// checkpoint `(last op id, lsn)`. An error from `changes` aborts the transaction; a
    /// failed commit poisons the store (every later write fails and the worker restarts).
    pub fn write<R>(
        &self,
        lsn: u64,
        changes: impl FnOnce(&mut WriteTxn<'_, '_>) -> Result<R, StoreError>,
    ) -> Result<(R, Checkpoint), StoreError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::Poisoned {
                path: self.dir.clone(),
            });
        }
        let txn = self
            .db
            .begin_rw_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a write", e))?;
        let (result, checkpoint) = {
            let tables = tables::Tables::open(&txn, &self.dir)?;
            let mut write = WriteTxn::begin(&txn, &tables, &self.dir)?;
            let result = changes(&mut write)?;
            (result, write.finish(lsn)?)
        };
        if let Err(e) = txn.commit() {
            self.poisoned.store(true, Ordering::Release);
            return Err(StoreError::mdbx(&self.dir, "commit", e));
        }
        Ok((result, checkpoint))
    }

    /// Empties every data table and the counters, checkpoint and bootstrap record, keeping
    /// the store's identity (an interrupted bootstrap starts over with this).
    pub fn clear_data(&self) -> Result<(), StoreError> {
        let txn = self
            .db
            .begin_rw_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a write", e))?;
        {
            let t = tables::Tables::open(&txn, &self.dir)?;
            for table in [
                &t.buckets,
                &t.bucket_names,
                &t.ops,
                &t.rows,
                &t.row_keys,
                &t.tombstones,
                &t.lookups,
            ] {
                txn.clear_table(table)
                    .map_err(|e| StoreError::mdbx(&self.dir, "clear a table", e))?;
            }
            for key in writer::DATA_META_KEYS {
                txn.del(&t.meta, key, None)
                    .map_err(|e| StoreError::mdbx(&self.dir, "clear metadata", e))?;
            }
        }
        txn.commit().map_err(|e| {
            self.poisoned.store(true, Ordering::Release);
            StoreError::mdbx(&self.dir, "commit", e)
        })?;
        Ok(())
    }

    /// Runs `read` in a short read-only transaction (a consistent view).
    pub fn read<R>(
        &self,
        read: impl FnOnce(&ReadTxn<'_, '_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let txn = self
            .db
            .begin_ro_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a read", e))?;
        let tables = tables::Tables::open(&txn, &self.dir)?;
        let view = ReadTxn::new(&txn, &tables, &self.dir);
        read(&view)
    }
}

#[cfg(test)]
mod tests;
