//! A store's data copied to another sync replica of the same primary (seeding a fleet
//! member from a peer, `docs/storage.md` "Copying a store to a peer"): every table as one
//! read transaction sees it, framed on a byte stream, and installed into an empty store
//! with appends. The copy keeps op ids, checksums, compaction debt and the history id, so
//! both stores name buckets alike and continue one history; the receiver keeps its own
//! identity (format, store id, creation time).
//!
//! The stream: the magic, the format (length-prefixed), then one frame per entry (the
//! table's index in [`TABLES`], then the key and the value, each length-prefixed) in each
//! table's key order, then [`END`] and the number of entries (u64 LE). Lengths are u32
//! LE; integer keys are copied as stored (native byte order: peers run on one architecture).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::atomic::Ordering;

use libmdbx::{TableFlags, WriteFlags};

use super::meta::FORMAT;
use super::tables::{Tables, META, TABLES};
use super::{Checkpoint, Store, StoreError};

/// The first bytes of a copy.
const MAGIC: &[u8; 8] = b"PSMCOPY1";
/// The frame that ends a copy.
const END: u8 = 0xFF;
/// Meta keys that name the store itself: the receiver keeps its own.
const OWN_META_KEYS: &[&[u8]] = &[b"format", b"store_id", b"created_at"];
/// Bytes of entries one install transaction writes before it commits (libmdbx keeps a
/// transaction's dirty pages in memory up to its limit, then spills them).
const INSTALL_COMMIT_BYTES: usize = 16 << 20;

/// libmdbx stores no longer key or value (`MDBX_MAXDATASIZE`): a longer length is a
/// damaged copy, refused before anything is allocated for it.
const MAX_ENTRY_BYTES: usize = 0x7fff_0000;

/// The meta records of a copy, by key, as they will be installed (`stage.<key>` for an
/// engine stage's record).
pub type CopiedMeta = BTreeMap<Vec<u8>, Vec<u8>>;

impl Store {
    /// Writes this store's data, as one read transaction sees it, to `out` (see the module
    /// documentation) and returns the checkpoint the copy holds. The writer goes on
    /// meanwhile; the read transaction keeps the pages it sees, so the file grows by what
    /// is written while a slow reader takes the copy.
    pub fn export_data(&self, out: &mut dyn Write) -> Result<Checkpoint, StoreError> {
        let io = |e| StoreError::io(&self.dir, "send a copy of the store", e);
        let _read = self.reads.start();
        let txn = self
            .db
            .begin_ro_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a read", e))?;
        let tables = Tables::open(&txn, &self.dir)?;
        let codec = self.codec.read().clone();
        let checkpoint = super::ReadTxn::new(&txn, &tables, &self.dir, &codec).checkpoint()?;
        out.write_all(MAGIC).map_err(io)?;
        out.write_all(&(FORMAT.len() as u32).to_le_bytes())
            .map_err(io)?;
        out.write_all(FORMAT.as_bytes()).map_err(io)?;
        let mut entries = 0u64;
        for (index, (name, _)) in TABLES.iter().enumerate() {
            let table = txn
                .open_table(Some(name))
                .map_err(|e| StoreError::mdbx(&self.dir, "open a table", e))?;
            let mut cursor = txn
                .cursor(&table)
                .map_err(|e| StoreError::mdbx(&self.dir, "open a cursor", e))?;
            for item in cursor.iter::<std::borrow::Cow<'_, [u8]>, std::borrow::Cow<'_, [u8]>>() {
                let (key, value) =
                    item.map_err(|e| StoreError::mdbx(&self.dir, "read a table", e))?;
                out.write_all(&[index as u8]).map_err(io)?;
                for bytes in [&key, &value] {
                    out.write_all(&(bytes.len() as u32).to_le_bytes())
                        .map_err(io)?;
                    out.write_all(bytes).map_err(io)?;
                }
                entries += 1;
            }
        }
        out.write_all(&[END]).map_err(io)?;
        out.write_all(&entries.to_le_bytes()).map_err(io)?;
        out.flush().map_err(io)?;
        Ok(checkpoint)
    }

    /// Installs a copy written by [`Self::export_data`] into this store, which must hold
    /// no data. `finish` sees the copy's meta records (the peer's bootstrap record among
    /// them, under `stage.bootstrap`) and may change them; they are written with the last
    /// transaction, which makes the copy durable. Until then the store holds no checkpoint
    /// and no stage record of the copy: an install that fails midway leaves entries that
    /// [`Self::clear_data`] removes, never a store that looks complete.
    pub fn import_data<E: From<StoreError>>(
        &self,
        input: &mut dyn Read,
        finish: impl FnOnce(&mut CopiedMeta) -> Result<(), E>,
    ) -> Result<Checkpoint, E> {
        self.refuse_unless_empty()?;
        let mut frames = Frames {
            input,
            dir: &self.dir,
        };
        let mut magic = [0u8; 8];
        frames.exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(self.bad_copy("it does not start like a store copy").into());
        }
        let format = frames.bytes()?;
        if format != FORMAT.as_bytes() {
            let found = String::from_utf8_lossy(&format).into_owned();
            return Err(self
                .bad_copy(&format!(
                    "the peer's store is of format `{found}`, this build reads `{FORMAT}`: run \
                     the same build on both"
                ))
                .into());
        }
        let mut meta = CopiedMeta::new();
        let mut entries = 0u64;
        let mut finish = Some(finish);
        // One key and one value at a time, in buffers reused for every entry.
        let (mut key, mut value) = (Vec::new(), Vec::new());
        loop {
            // One transaction per INSTALL_COMMIT_BYTES of entries; the last one also
            // writes the metadata.
            let txn = self.begin_install()?;
            let handles = TABLES
                .iter()
                .map(|(name, _)| txn.open_table(Some(name)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| StoreError::mdbx(&self.dir, "open a table", e))?;
            let mut written = 0usize;
            let ended = loop {
                let mut tag = [0u8; 1];
                frames.exact(&mut tag)?;
                if tag[0] == END {
                    let mut count = [0u8; 8];
                    frames.exact(&mut count)?;
                    if u64::from_le_bytes(count) != entries {
                        return Err(self.bad_copy("its entry count does not match").into());
                    }
                    break true;
                }
                let index = usize::from(tag[0]);
                let Some((name, flags)) = TABLES.get(index) else {
                    return Err(self
                        .bad_copy("it names a table this build does not have")
                        .into());
                };
                frames.bytes_into(&mut key)?;
                frames.bytes_into(&mut value)?;
                entries += 1;
                if *name == META {
                    if !OWN_META_KEYS.contains(&key.as_slice()) {
                        meta.insert(key.clone(), value.clone());
                    }
                    continue;
                }
                let append = if flags.contains(TableFlags::DUP_SORT) {
                    WriteFlags::APPEND | WriteFlags::APPEND_DUP
                } else {
                    WriteFlags::APPEND
                };
                txn.put(&handles[index], &key, &value, append)
                    .map_err(|e| match e {
                        libmdbx::Error::KeyMismatch | libmdbx::Error::KeyExist => {
                            self.bad_copy("its entries are out of order")
                        }
                        e => StoreError::mdbx(&self.dir, "install a copied entry", e),
                    })?;
                written += key.len() + value.len();
                if written >= INSTALL_COMMIT_BYTES {
                    break false;
                }
            };
            if ended {
                if let Some(finish) = finish.take() {
                    finish(&mut meta)?;
                }
                for (key, value) in &meta {
                    txn.put(&handles[0], key, value, WriteFlags::UPSERT)
                        .map_err(|e| {
                            StoreError::mdbx(&self.dir, "install the copied metadata", e)
                        })?;
                }
            }
            drop(handles);
            self.commit_install(txn)?;
            if ended {
                break;
            }
            self.start_writeback();
        }
        self.sync()?;
        *self.codec.write() =
            std::sync::Arc::new(super::writer::packing::load_codec(&self.db, &self.dir)?);
        Ok(self.read(|view| view.checkpoint())?)
    }

    /// A copy is installed only where no data is (a fresh store, or one just cleared).
    fn refuse_unless_empty(&self) -> Result<(), StoreError> {
        let sizes = self.table_sizes()?;
        let holds_data = sizes
            .iter()
            .any(|(name, entries, _)| *name != META && *entries > 0);
        let checkpoint = self.read(|view| view.checkpoint())?;
        if holds_data || checkpoint != Checkpoint::default() {
            return Err(self.bad_copy(
                "this store already holds data; a copy is installed only into an empty one",
            ));
        }
        Ok(())
    }

    fn begin_install(
        &self,
    ) -> Result<libmdbx::Transaction<'_, libmdbx::RW, libmdbx::NoWriteMap>, StoreError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::Poisoned {
                path: self.dir.clone(),
            });
        }
        self.db
            .begin_rw_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a write", e))
    }

    fn commit_install(
        &self,
        txn: libmdbx::Transaction<'_, libmdbx::RW, libmdbx::NoWriteMap>,
    ) -> Result<(), StoreError> {
        txn.commit().map(|_| ()).map_err(|e| {
            self.poisoned.store(true, Ordering::Release);
            StoreError::mdbx(&self.dir, "commit", e)
        })
    }

    /// Asks the kernel to start writing the data file's dirty pages out without waiting
    /// for them, so the final sync finds most of the copy on disk already instead of
    /// writing all of it at the end. Only a hint: failures are ignored.
    fn start_writeback(&self) {
        use std::os::fd::AsRawFd;
        let Ok(file) = std::fs::File::open(self.dir.join(super::dir::DATA_FILE)) else {
            return;
        };
        // SAFETY: a valid descriptor; offset 0 and length 0 mean the whole file.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }

    fn bad_copy(&self, problem: &str) -> StoreError {
        StoreError::BadCopy {
            path: self.dir.clone(),
            problem: problem.to_owned(),
            cut_short: false,
        }
    }
}

/// Reads a copy's frames.
struct Frames<'a> {
    input: &'a mut dyn Read,
    dir: &'a std::path::Path,
}

impl Frames<'_> {
    fn exact(&mut self, buf: &mut [u8]) -> Result<(), StoreError> {
        self.input.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                StoreError::BadCopy {
                    path: self.dir.to_owned(),
                    problem: "it ended before its last entry (the peer or the connection \
                              stopped)"
                        .into(),
                    cut_short: true,
                }
            } else {
                StoreError::io(self.dir, "receive a copy of a store", e)
            }
        })
    }

    /// A u32-length-prefixed byte string.
    fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        let mut out = Vec::new();
        self.bytes_into(&mut out)?;
        Ok(out)
    }

    /// [`Self::bytes`] into `out`, replacing what it held.
    fn bytes_into(&mut self, out: &mut Vec<u8>) -> Result<(), StoreError> {
        let mut len = [0u8; 4];
        self.exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_ENTRY_BYTES {
            return Err(StoreError::BadCopy {
                path: self.dir.to_owned(),
                problem: format!("it holds an entry of {len} bytes, more than a store holds"),
                cut_short: false,
            });
        }
        out.clear();
        out.resize(len, 0);
        self.exact(out)
    }
}
