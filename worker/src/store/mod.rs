//! The MDBX bucket store. Only the engine opens it; SQL functions never do.
//!
//! This stage holds the environment, its directory discipline and the store's identity
//! (format and id). Bucket tables arrive with the snapshot stage.

mod dir;
mod error;
mod meta;

use std::path::{Path, PathBuf};

use libmdbx::{Database, DatabaseOptions, Mode, NoWriteMap, ReadWriteOptions, SyncMode};

pub use dir::{remove_store_files, STORE_FILES};
pub use error::StoreError;
pub use meta::{StoreIdentity, FORMAT};

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

    /// The environment, for the stages that read and write it.
    pub fn database(&self) -> &Database<NoWriteMap> {
        &self.db
    }
}

#[cfg(test)]
mod tests;
