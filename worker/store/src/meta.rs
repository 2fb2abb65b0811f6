//! The `meta` table: the store's format and identity, written when it is created.

use std::path::Path;

use libmdbx::{Database, NoWriteMap, TableFlags, WriteFlags};

use super::tables::{META as META_TABLE, TABLES};
use super::StoreError;

/// The on-disk format this build reads and writes. A change of layout changes it.
pub const FORMAT: &str = "powersync_mdbx/store/5";

const KEY_FORMAT: &[u8] = b"format";
const KEY_STORE_ID: &[u8] = b"store_id";
const KEY_CREATED_AT: &[u8] = b"created_at";
/// The history id bucket names derive from (16 hex digits): written when a store is
/// created (its op ids start a history), absent in stores built before names were derived.
pub(super) const KEY_HISTORY: &[u8] = b"history";

/// The history id stored as `value`, if it is one.
pub(super) fn parse_history(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value)
        .ok()
        .filter(|s| s.len() == 16)
        .and_then(|s| u64::from_str_radix(s, 16).ok())
}

/// Who this store is: shown in `status()`, and later tied to the replication slot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StoreIdentity {
    /// The on-disk format.
    pub format: String,
    /// Random id chosen when the store was created.
    pub store_id: String,
    /// Unix seconds when the store was created.
    pub created_at: u64,
}

/// Reads the identity, or writes a new one into an empty environment.
/// Returns the identity and whether it was just created.
pub(super) fn load_or_init(
    db: &Database<NoWriteMap>,
    dir: &Path,
    fresh: bool,
) -> Result<(StoreIdentity, bool), StoreError> {
    let mdbx = |action| move |e| StoreError::mdbx(dir, action, e);
    if !fresh {
        let txn = db.begin_ro_txn().map_err(mdbx("begin a read"))?;
        let table = match txn.open_table(Some(META_TABLE)) {
            Ok(table) => table,
            Err(libmdbx::Error::NotFound) => {
                return Err(StoreError::Foreign {
                    path: dir.to_owned(),
                    found: "an MDBX environment without powersync_mdbx metadata".into(),
                })
            }
            Err(e) => return Err(mdbx("open the meta table")(e)),
        };
        let get = |key: &[u8]| -> Result<Option<String>, StoreError> {
            let value: Option<Vec<u8>> = txn.get(&table, key).map_err(mdbx("read meta"))?;
            Ok(value.map(|v| String::from_utf8_lossy(&v).into_owned()))
        };
        let format = get(KEY_FORMAT)?.unwrap_or_default();
        if format != FORMAT {
            return Err(StoreError::Incompatible {
                path: dir.to_owned(),
                found: format,
                expected: FORMAT,
            });
        }
        let identity = StoreIdentity {
            format,
            store_id: get(KEY_STORE_ID)?.unwrap_or_default(),
            created_at: get(KEY_CREATED_AT)?
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        };
        drop(txn);
        // Tables added since the format was fixed (`compaction_debt`) start empty.
        let txn = db.begin_rw_txn().map_err(mdbx("begin a write"))?;
        for (name, flags) in TABLES {
            txn.create_table(Some(name), *flags)
                .map_err(mdbx("create a table"))?;
        }
        txn.commit().map_err(mdbx("commit the tables"))?;
        return Ok((identity, false));
    }
    let identity = StoreIdentity {
        format: FORMAT.to_owned(),
        store_id: random_id()
            .map_err(|e| StoreError::io(Path::new("/dev/urandom"), "read it", e))?,
        created_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let txn = db.begin_rw_txn().map_err(mdbx("begin a write"))?;
    for (name, flags) in TABLES {
        txn.create_table(Some(name), *flags)
            .map_err(mdbx("create a table"))?;
    }
    let table = txn
        .create_table(Some(META_TABLE), TableFlags::default())
        .map_err(mdbx("open the meta table"))?;
    let created_at = identity.created_at.to_string();
    let history = random_id()
        .map_err(|e| StoreError::io(Path::new("/dev/urandom"), "read it", e))?[..16]
        .to_owned();
    for (key, value) in [
        (KEY_FORMAT, identity.format.as_bytes()),
        (KEY_STORE_ID, identity.store_id.as_bytes()),
        (KEY_CREATED_AT, created_at.as_bytes()),
        (KEY_HISTORY, history.as_bytes()),
    ] {
        txn.put(&table, key, value, WriteFlags::UPSERT)
            .map_err(mdbx("write meta"))?;
    }
    txn.commit().map_err(mdbx("commit the new store"))?;
    Ok((identity, true))
}

/// A random u64 from the kernel.
pub(super) fn random_u64() -> std::io::Result<u64> {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

fn random_id() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The prefix of every powersync_mdbx store format (`FORMAT` is one of them).
const FORMAT_PREFIX: &str = "powersync_mdbx/store/";

/// A stage record (`stage.<key>` in the meta table) of a store of any powersync_mdbx
/// format, read without opening it as a store: `reset()` needs the slot a store of an
/// older format owns. `None` when there is no such store or record.
pub fn stage_record_of_any_format(dir: &Path, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let mdbx = |action| move |e| StoreError::mdbx(dir, action, e);
    let db = open_read_only(dir).map_err(mdbx("open"))?;
    let txn = db.begin_ro_txn().map_err(mdbx("begin a read"))?;
    let table = match txn.open_table(Some(META_TABLE)) {
        Ok(table) => table,
        Err(libmdbx::Error::NotFound) => return Ok(None),
        Err(e) => return Err(mdbx("open the meta table")(e)),
    };
    let format: Option<Vec<u8>> = txn.get(&table, KEY_FORMAT).map_err(mdbx("read meta"))?;
    if !format.is_some_and(|f| f.starts_with(FORMAT_PREFIX.as_bytes())) {
        return Ok(None);
    }
    txn.get(&table, format!("stage.{key}").as_bytes())
        .map_err(mdbx("read a stage record"))
}

fn open_read_only(dir: &Path) -> Result<Database<NoWriteMap>, libmdbx::Error> {
    let options = libmdbx::DatabaseOptions {
        max_tables: Some(64),
        mode: libmdbx::Mode::ReadOnly,
        ..Default::default()
    };
    Database::<NoWriteMap>::open_with_options(dir, options)
}

/// What the data file of a store directory is. `reset()` removes only its own stores:
/// a directory whose data file is anything but [`DataFile::Ours`] keeps all it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataFile {
    /// The directory holds no data file.
    Absent,
    /// A powersync_mdbx store (of any format).
    Ours {
        /// The format it records.
        format: String,
        /// The stage record asked for: absent, or why it cannot be read.
        record: Result<Option<Vec<u8>>, String>,
    },
    /// Not shown to be a powersync_mdbx store: an MDBX environment without this
    /// project's metadata, a file libmdbx cannot open (another program's, damaged), or
    /// one that cannot be read.
    NotOurs {
        /// Which of these, for the operator.
        reason: String,
    },
}

/// Reads what the data file in `dir` is, read-only and without opening it as a store
/// (any powersync_mdbx format is ours), with its stage record `key` when it is ours.
///
/// libmdbx may start a thread here: call it from a thread with all signals blocked.
pub fn inspect_data_file(dir: &Path, key: &str) -> DataFile {
    let not_ours = |reason: String| DataFile::NotOurs { reason };
    let path = dir.join(super::dir::DATA_FILE);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return DataFile::Absent,
        Err(e) => return not_ours(format!("it cannot be inspected: {e}")),
        Ok(meta) if !meta.is_file() => {
            return not_ours("it is not a regular file".into());
        }
        Ok(_) => {}
    }
    // libmdbx creates the lock file to open even a file it then refuses: one that the
    // inspection created beside a file that is not ours is taken away again.
    let lock = dir.join(super::dir::STORE_FILES[1]);
    let lock_existed = lock.exists();
    let found = inspect_environment(dir, key);
    if matches!(found, DataFile::NotOurs { .. }) && !lock_existed {
        let _ = std::fs::remove_file(&lock);
    }
    found
}

fn inspect_environment(dir: &Path, key: &str) -> DataFile {
    let not_ours = |reason: String| DataFile::NotOurs { reason };
    let db = match open_read_only(dir) {
        Ok(db) => db,
        Err(e) => return not_ours(format!("libmdbx cannot open it: {e}")),
    };
    let read = || -> Result<DataFile, libmdbx::Error> {
        let txn = db.begin_ro_txn()?;
        let table = match txn.open_table(Some(META_TABLE)) {
            Ok(table) => table,
            Err(libmdbx::Error::NotFound) => {
                return Ok(not_ours(
                    "an MDBX environment without powersync_mdbx metadata".into(),
                ))
            }
            Err(e) => return Err(e),
        };
        let format: Option<Vec<u8>> = txn.get(&table, KEY_FORMAT)?;
        let format = match format {
            Some(f) if f.starts_with(FORMAT_PREFIX.as_bytes()) => {
                String::from_utf8_lossy(&f).into_owned()
            }
            _ => {
                return Ok(not_ours(
                    "an MDBX environment whose metadata names no powersync_mdbx format".into(),
                ))
            }
        };
        let record = txn
            .get::<Vec<u8>>(&table, format!("stage.{key}").as_bytes())
            .map_err(|e| e.to_string());
        Ok(DataFile::Ours { format, record })
    };
    read().unwrap_or_else(|e| not_ours(format!("libmdbx cannot read it: {e}")))
}
