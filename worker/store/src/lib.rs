//! The MDBX bucket store. Only the engine opens it; SQL functions never do.
//!
//! It holds the environment and its directory discipline, the store's identity (format and
//! id), and the replicated data: ops in per-bucket blocks, row records, parameter lookups,
//! bucket accumulators and the checkpoint (`docs/storage.md`). One writer ([`WriteTxn`],
//! [`PreparedRow`] for the snapshot's evaluator threads), short readers ([`ReadTxn`]). Its
//! inputs are its own types: it knows nothing of the rules that produce them.
#![warn(missing_docs)]

mod changes;
mod checkpoint;
pub mod checksum;
mod codec;
mod compress;
mod dir;
mod env;
mod error;
pub mod forks;
mod held;
mod identity;
mod layout;
pub mod long_keys;
mod lookup_read;
mod map_write;
mod meta;
mod op;
mod op_blocks;
mod prepared;
mod read_gate;
mod reader;
mod record;
mod reopen;
mod stored_row;
mod tables;
mod transfer;
mod write_checkpoints;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use libmdbx::{DatabaseOptions, Mode, ReadWriteOptions, SyncMode};
use parking_lot::{RwLock, RwLockReadGuard};

use env::Env;

use metrics::ReadTracker;

pub use changes::Changes;
pub use checkpoint::Checkpoint;
pub use checksum::remove_checksum;
pub use dir::{
    advance_generation, next_generation, remove_store_files, set_next_generation, STORE_FILES,
};
pub use error::StoreError;
pub use forks::{Fork, Forks, Placement};
pub use identity::identity_key;
pub use layout::{
    active_dir, build_dir, other_stores, remove_active_file, remove_store, set_active,
};
pub use meta::{inspect_data_file, stage_record_of_any_format, DataFile, StoreIdentity, FORMAT};
pub use op::{BucketState, OpKind};
pub use prepared::{OutputPacker, PackedOutputs, PreparedRow, RowCodec, RowPacker};
pub use reader::{ObjectRead, OpRead, OpsPage, ReadTxn, RowCursors};
pub use reopen::ROOM_TO_REOPEN;
pub use transfer::CopiedMeta;
pub use write_checkpoints::{Expiry, ExpiryPass, WriteCheckpointRecord, WRITE_CHECKPOINT_PREFIX};
pub use writer::{LookupPut, RowPut, Stash, StoredAs, WriteTxn};

/// Named tables the environment reserves slots for.
const MAX_TABLES: u64 = 32;
/// Address space reserved for the map; disk is only used as data grows.
const MAX_MAP_BYTES: isize = 1 << 40;
/// File growth step: the file is at most this much larger than the pages in use (64 MiB
/// made a 30 MB store a 64 MiB file).
const GROWTH_STEP: isize = 16 << 20;
/// Dirty pages a write transaction with file writes keeps in memory before libmdbx spills
/// them to the file (32 MiB of 4 KiB pages): a snapshot batch stays within it. Half the
/// earlier 16,384 took 25–35 MiB off the peak of a 1 M-row UPDATE at about the same speed
/// (`docs/benchmark.md`, "Streaming"). Through the writable map (the stream, see
/// [`Store::write_through_map`]) nothing is spilled: dirty pages are the file's own.
const TXN_DIRTY_PAGES: u64 = 8192;

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
    /// `None` only when opening it again failed ([`Store::write_through_map`]).
    opened: RwLock<Option<Opened>>,
    /// Where new reads wait while a close of `opened` waits for the reads in progress.
    gate: read_gate::ReadGate,
    dir: PathBuf,
    identity: StoreIdentity,
    created: bool,
    poisoned: AtomicBool,
    /// Writes are held (`held`): mirrors whether [`Opened::gate`] holds a transaction.
    held: AtomicBool,
    /// How row records are packed; replaced once a dictionary is trained.
    codec: parking_lot::RwLock<std::sync::Arc<compress::RecordCodec>>,
    /// Read transactions open now and started so far (for `/metrics`).
    reads: ReadTracker,
    /// What the commits since the last [`Store::take_changes`] changed.
    changes: changes::ChangeLog,
    /// Flushes of commits to disk since the store was opened ([`Store::syncs`]).
    syncs: std::sync::atomic::AtomicU64,
}

/// The environment as it is open now.
struct Opened {
    /// Taken by every write for its length; holds the open transaction of a hold
    /// (`held`). Declared first: a held transaction borrows `env` and drops before it.
    gate: parking_lot::Mutex<Option<held::Held>>,
    /// The tables' handles for read transactions (valid while `env` is open).
    read_tables: tables::Tables<'static>,
    env: Env,
}

/// How the store's environment is opened (the mode of writing aside).
fn environment_options() -> DatabaseOptions {
    DatabaseOptions {
        max_tables: Some(MAX_TABLES),
        mode: Mode::ReadWrite(ReadWriteOptions {
            // Commits do not fsync by themselves; `write` syncs explicitly before it
            // returns, `write_unsynced` leaves that to the next durable write.
            sync_mode: SyncMode::SafeNoSync,
            max_size: Some(MAX_MAP_BYTES),
            growth_step: Some(GROWTH_STEP),
            // Give back space beyond the last used page (the file grows in steps
            // ahead of the pages written).
            shrink_threshold: Some(2 * GROWTH_STEP),
            ..Default::default()
        }),
        // New stores only (an existing store keeps its own): a full op block fills
        // one large page of this size.
        page_size: Some(libmdbx::PageSize::Set(op_blocks::PAGE_BYTES)),
        permissions: Some(0o600),
        txn_dp_limit: Some(TXN_DIRTY_PAGES),
        ..Default::default()
    }
}

impl Opened {
    fn with(env: Env, dir: &Path) -> Result<Self, StoreError> {
        Ok(Self {
            gate: parking_lot::Mutex::new(None),
            read_tables: tables::Tables::permanent(&env, dir)?,
            env,
        })
    }
}

impl Store {
    /// Opens the store in `dir`, creating the directory (mode 0700) and a fresh store when
    /// they do not exist. Refuses directories with foreign content, group/world access or
    /// another owner, and stores of another format. Its pages are written with file writes
    /// until [`Self::write_through_map`].
    ///
    /// libmdbx starts a thread here: call it from a thread with all signals blocked.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let fresh = dir::prepare(dir)?;
        let db =
            libmdbx::Database::<libmdbx::NoWriteMap>::open_with_options(dir, environment_options())
                .map_err(|e| StoreError::at_open(dir, e))?;
        let (identity, created) = meta::load_or_init(&db, dir, fresh)?;
        if created {
            db.sync(true)
                .map_err(|e| StoreError::mdbx(dir, "sync the new store", e))?;
        }
        let codec = writer::packing::load_codec(&db, dir)?;
        Ok(Self {
            opened: RwLock::new(Some(Opened::with(Env::Files(db), dir)?)),
            gate: read_gate::ReadGate::default(),
            dir: dir.to_owned(),
            identity,
            created,
            poisoned: AtomicBool::new(false),
            held: AtomicBool::new(false),
            codec: parking_lot::RwLock::new(std::sync::Arc::new(codec)),
            reads: ReadTracker::default(),
            changes: changes::ChangeLog::default(),
            syncs: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// From here on, write transactions change the mapped file's pages in place instead of
    /// writing them with file writes: a transaction larger than `TXN_DIRTY_PAGES` then has
    /// nothing to spill, and small commits make no `pwrite` calls. The engine switches when
    /// a store's stream starts, after its snapshot, which is faster with file writes
    /// (`docs/storage.md`, "Transactions and durability"). Returns whether the store now
    /// writes through the map: not on a file system where a write into the map could meet
    /// a full disk as `SIGBUS` ([`map_write::reservable`]), nor when the data file's space
    /// cannot be reserved now (checked before the environment closes). Waits for the reads
    /// and the write in progress; new ones wait until the environment is open again (the
    /// file's cached pages dropped meanwhile, [`map_write::drop_from_cache`]), not while
    /// the file is read back into the page cache after it ([`map_write::read_back`]: 0.2 s
    /// for a 270 MB file here; store size ÷ disk speed on a cold disk), which this call
    /// does before it returns, so the writer that calls it writes only after it.
    pub fn write_through_map(&self) -> Result<bool, StoreError> {
        let closed = self.gate.close();
        let mut opened = self.opened.write();
        if opened.as_ref().is_some_and(|o| o.env.is_map()) {
            return Ok(true);
        }
        if self.is_held() {
            // A held transaction borrows this environment: it stays open as it is.
            return Ok(false);
        }
        if !map_write::reservable(&self.dir) {
            return Ok(false);
        }
        // The space first, while the environment is still open: on a full disk the store
        // stays as it is (closed, it might not open again: its lock file needs space too).
        if let Err(e) = map_write::reserve(&self.dir) {
            tracing::warn!(
                dir = %self.dir.display(),
                "the store goes on writing its pages with file writes: reserving its data \
                 file's space for writes through the map failed: {e}"
            );
            return Ok(false);
        }
        // libmdbx opens an environment once per process: the old one closes first.
        *opened = None;
        let uncached = map_write::drop_from_cache(&self.dir).inspect_err(|e| {
            tracing::warn!(dir = %self.dir.display(), "dropping the store's file from the cache: {e}");
        });
        let reopened = Env::open(&self.dir, environment_options(), true)
            .map_err(|e| StoreError::at_open(&self.dir, e))
            .and_then(|env| {
                // libmdbx gave back the file's space past its last page as it opened it with
                // a writable map; taken again so that no write into the map finds none.
                map_write::reserve(&self.dir)
                    .map_err(|e| StoreError::io(&self.dir, "reserve the data file's space", e))?;
                Opened::with(env, &self.dir)
            });
        match reopened {
            Ok(map) => {
                *opened = Some(map);
                // Reads go on while the file is read back.
                drop(opened);
                drop(closed);
                if let Ok(file) = uncached {
                    if let Err(e) = map_write::read_back(file, &self.dir) {
                        tracing::warn!(dir = %self.dir.display(), "reading the store's file into the cache again: {e}");
                    }
                }
                Ok(true)
            }
            Err(e) => {
                tracing::warn!("{e}; the store goes on writing its pages with file writes");
                let files = Env::open(&self.dir, environment_options(), false)
                    .map_err(|e| StoreError::at_open(&self.dir, e))
                    .and_then(|env| Opened::with(env, &self.dir));
                match files {
                    Ok(files) => {
                        *opened = Some(files);
                        Ok(false)
                    }
                    Err(e) => {
                        self.poisoned.store(true, Ordering::Release);
                        Err(e)
                    }
                }
            }
        }
    }

    /// True when write transactions change the mapped file in place
    /// ([`Self::write_through_map`]).
    pub fn writes_through_map(&self) -> bool {
        self.opened
            .read_recursive()
            .as_ref()
            .is_some_and(|o| o.env.is_map())
    }

    /// The open environment; an error once opening it again failed.
    fn opened(&self) -> Result<read_gate::OpenedRead<'_>, StoreError> {
        // Recursive: a write's closure may read, and a switch waiting for the lock must
        // not block that read; other new reads wait at the gate while it waits.
        self.gate.pass();
        RwLockReadGuard::try_map(self.opened.read_recursive(), Option::as_ref)
            .map(read_gate::OpenedRead::new)
            .map_err(|_| StoreError::Poisoned {
                path: self.dir.clone(),
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

    /// Bytes of the data file in use (pages up to the last allocated one); the file itself
    /// grows in steps and may be larger.
    pub fn used_bytes(&self) -> u64 {
        let Ok(opened) = self.opened() else {
            return 0;
        };
        let page = opened.env.stat().map_or(0, |s| u64::from(s.page_size()));
        opened
            .env
            .info()
            .map_or(0, |i| (i.last_pgno() as u64 + 1) * page)
    }

    /// Forks of the store's history (`forks`), for status and metrics: 0 when the record
    /// cannot be read (the stream's own reads of it report that error).
    pub fn history_forks(&self) -> u64 {
        self.read(|view| view.forks())
            .map_or(0, |forks| forks.list().len() as u64)
    }

    /// Read transactions open now and started since the store opened.
    pub fn reads(&self) -> &ReadTracker {
        &self.reads
    }

    /// Per table: name, entries and bytes of its pages (for status and the benchmark).
    pub fn table_sizes(&self) -> Result<Vec<(&'static str, u64, u64)>, StoreError> {
        let _read = self.reads.start();
        let opened = self.opened()?;
        let owned = opened
            .env
            .begin_ro_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a read", e))?;
        let txn = owned.borrow();
        let mut out = Vec::new();
        for (name, _) in tables::TABLES {
            let table = txn
                .open_table(Some(name))
                .map_err(|e| StoreError::mdbx(&self.dir, "open a table", e))?;
            let stat = txn
                .table_stat(&table)
                .map_err(|e| StoreError::mdbx(&self.dir, "read table statistics", e))?;
            out.push((*name, stat.entries() as u64, stat.total_size()));
        }
        Ok(out)
    }

    /// Bytes the data file occupies on disk.
    pub fn file_bytes(&self) -> u64 {
        std::fs::metadata(self.dir.join(dir::DATA_FILE)).map_or(0, |m| m.len())
    }

    /// Applies `changes` in one read-write transaction and commits it durably with the
    /// checkpoint `(last op id, lsn)`. An error from `changes` aborts the transaction; a
    /// failed commit poisons the store (every later write fails until it is opened again).
    pub fn write<R>(
        &self,
        lsn: u64,
        changes: impl FnOnce(&mut WriteTxn<'_, '_>) -> Result<R, StoreError>,
    ) -> Result<(R, Checkpoint), StoreError> {
        self.write_with(lsn, changes)
    }

    /// [`write`](Self::write) for changes that can fail with errors of their own
    /// (evaluation, a closed source stream): any error aborts the transaction.
    pub fn write_with<R, E: From<StoreError>>(
        &self,
        lsn: u64,
        changes: impl FnOnce(&mut WriteTxn<'_, '_>) -> Result<R, E>,
    ) -> Result<(R, Checkpoint), E> {
        let (result, checkpoint, committed) = self.commit(lsn, changes)?;
        if committed {
            self.sync()?;
        }
        Ok((result, checkpoint))
    }

    /// Like [`write`](Self::write) but without waiting for the disk: a crash of the
    /// machine may lose this commit (never corrupt the store). For batches whose loss is
    /// harmless because a later durable write decides (the snapshot's batches, made
    /// durable by the commit that completes it).
    pub fn write_unsynced<R>(
        &self,
        lsn: u64,
        changes: impl FnOnce(&mut WriteTxn<'_, '_>) -> Result<R, StoreError>,
    ) -> Result<(R, Checkpoint), StoreError> {
        self.commit(lsn, changes)
            .map(|(result, checkpoint, _)| (result, checkpoint))
    }

    /// One read-write transaction: `changes`, then the accumulators, counters and
    /// checkpoint, then the commit (not synced); returns whether it committed (not when
    /// it went into a held write, or began one: `held`).
    fn commit<R, E: From<StoreError>>(
        &self,
        lsn: u64,
        changes: impl FnOnce(&mut WriteTxn<'_, '_>) -> Result<R, E>,
    ) -> Result<(R, Checkpoint, bool), E> {
        self.refuse_if_poisoned()?;
        let opened = self.opened()?;
        let mut gate = opened.gate.lock();
        if let Some(held) = gate.as_mut() {
            return match self.write_in(held.txn.borrow(), lsn, changes) {
                Ok((result, finished)) => {
                    self.use_trained(finished.trained);
                    held.checkpoint = finished.checkpoint;
                    held.changes.merge(finished.changes);
                    Ok((result, held.checkpoint, false))
                }
                Err(e) => {
                    // Part of a write cannot be taken back: the whole hold goes. The write's
                    // error is the one returned; failing to keep others' records is logged.
                    let records = self.abandon_held(gate.take());
                    drop(gate);
                    drop(opened);
                    if !records.is_empty() {
                        if let Err(lost) = self.put_stage_records(&records) {
                            tracing::error!(
                                "write-checkpoint requests made while writes were held are \
                                 lost: {lost}; those clients wait until they ask for another"
                            );
                        }
                    }
                    Err(e)
                }
            };
        }
        let txn = opened
            .env
            .begin_rw_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a write", e))?;
        let codec_before = self.codec.read().clone();
        let (result, finished) = self.write_in(txn.borrow(), lsn, changes)?;
        self.use_trained(finished.trained);
        if finished.hold_open {
            *gate = Some(held::Held::new(
                txn,
                finished.checkpoint,
                finished.changes,
                codec_before,
            ));
            self.held.store(true, Ordering::Release);
            return Ok((result, finished.checkpoint, false));
        }
        if let Err(e) = txn.commit() {
            self.poisoned.store(true, Ordering::Release);
            return Err(StoreError::mdbx(&self.dir, "commit", e).into());
        }
        self.changes.record(finished.changes);
        Ok((result, finished.checkpoint, true))
    }

    /// `changes` and what every write does after them, in `txn` (not committed).
    fn write_in<R, E: From<StoreError>>(
        &self,
        txn: env::Txn<'_, '_, libmdbx::RW>,
        lsn: u64,
        changes: impl FnOnce(&mut WriteTxn<'_, '_>) -> Result<R, E>,
    ) -> Result<(R, writer::Finished), E> {
        let codec = self.codec.read().clone();
        let tables = tables::Tables::open(txn, &self.dir)?;
        let mut write = WriteTxn::begin(txn, &tables, &self.dir, &codec)?;
        // Compactions an earlier write's source transaction made due come first.
        write.compact_marked()?;
        let result = changes(&mut write)?;
        Ok((result, write.finish(lsn)?))
    }

    /// Packs records with a dictionary a write trained, from the next write on.
    fn use_trained(&self, trained: Option<Vec<u8>>) {
        if let Some(dictionary) = trained {
            *self.codec.write() =
                std::sync::Arc::new(compress::RecordCodec::with_dictionary(&dictionary));
        }
    }

    /// An error once a commit failed (`PSM_S1007`).
    fn refuse_if_poisoned(&self) -> Result<(), StoreError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::Poisoned {
                path: self.dir.clone(),
            });
        }
        Ok(())
    }

    /// Flushes every commit to disk; failure poisons the store.
    fn sync(&self) -> Result<(), StoreError> {
        self.opened()?.env.sync(true).map_err(|e| {
            self.poisoned.store(true, Ordering::Release);
            StoreError::mdbx(&self.dir, "sync to disk", e)
        })?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Durable writes since the store was opened: each a flush to disk (a sync), what
    /// bounds a writer's rate on slow disks (for `/metrics`).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Empties every data table and the counters, checkpoint and bootstrap record, keeping
    /// the store's identity (an interrupted bootstrap starts over with this). Held writes
    /// are abandoned first.
    pub fn clear_data(&self) -> Result<(), StoreError> {
        let opened = self.opened()?;
        let mut gate = opened.gate.lock();
        drop(self.abandon_held(gate.take()));
        let owned = opened
            .env
            .begin_rw_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a write", e))?;
        {
            let txn = owned.borrow();
            let t = tables::Tables::open(txn, &self.dir)?;
            for table in [
                &t.buckets,
                &t.bucket_names,
                &t.ops,
                &t.rows,
                &t.row_keys,
                &t.tombstones,
                &t.lookups,
                &t.compaction_debt,
            ] {
                txn.clear_table(table)
                    .map_err(|e| StoreError::mdbx(&self.dir, "clear a table", e))?;
            }
            for key in writer::DATA_META_KEYS {
                txn.del(&t.meta, key, None)
                    .map_err(|e| StoreError::mdbx(&self.dir, "clear metadata", e))?;
            }
        }
        owned.commit().map_err(|e| {
            self.poisoned.store(true, Ordering::Release);
            StoreError::mdbx(&self.dir, "commit", e)
        })?;
        drop(gate);
        drop(opened);
        *self.codec.write() = std::sync::Arc::new(compress::RecordCodec::raw());
        self.changes.record(Changes::everything());
        self.sync()
    }

    /// What the commits since the last call changed (buckets, lookups, stage records),
    /// for the one consumer that wakes the streams concerned when a checkpoint is
    /// published. Recorded after each commit, so a reader that then looks sees it.
    pub fn take_changes(&self) -> Changes {
        self.changes.take()
    }

    /// Writes one engine stage's record durably in its own transaction, leaving the data,
    /// counters and checkpoint untouched (for records kept outside the replication
    /// stream, such as write-checkpoint requests). Waits for a running write to finish;
    /// while writes are held (`held`) it goes into them, and is visible and durable with
    /// them (written on its own if they are abandoned).
    pub fn put_stage_record(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.put_stage_records(&[(key.to_owned(), value.to_vec())])
    }

    /// [`Self::put_stage_record`] for several records in one transaction.
    pub fn put_stage_records(&self, records: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        self.write_stage_records(|_| Ok(((), records.to_vec())))
    }

    /// Reads stage record `key` and writes the value `update` makes of it (nothing when it
    /// gives `None`) in one transaction as [`Self::put_stage_record`] does, so that
    /// concurrent updates of one record never lose one another; returns what `update`
    /// returned besides.
    pub fn update_stage_record<R>(
        &self,
        key: &str,
        update: impl FnOnce(Option<&[u8]>) -> (Option<Vec<u8>>, R),
    ) -> Result<R, StoreError> {
        let stored_key = format!("stage.{key}");
        self.write_stage_records(|read| {
            let stored = read(&stored_key)?;
            let (value, result) = update(stored.as_deref());
            let records = value.map(|v| (key.to_owned(), v)).into_iter().collect();
            Ok((result, records))
        })
    }

    /// Writes the stage records `decide` returns (it may read stored meta records by key
    /// first) in a transaction of their own, or into the held writes.
    fn write_stage_records<R>(
        &self,
        decide: impl FnOnce(&StageRead<'_>) -> Result<(R, StageRecords), StoreError>,
    ) -> Result<R, StoreError> {
        self.refuse_if_poisoned()?;
        let opened = self.opened()?;
        let mut gate = opened.gate.lock();
        if let Some(held) = gate.as_mut() {
            let (result, records) = self.put_stage_records_in(held.txn.borrow(), decide)?;
            held.changes.merge(stage_changes(&records));
            held.stage_records.extend(records);
            return Ok(result);
        }
        let own = opened
            .env
            .begin_rw_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a write", e))?;
        let (result, records) = self.put_stage_records_in(own.borrow(), decide)?;
        if let Err(e) = own.commit() {
            self.poisoned.store(true, Ordering::Release);
            return Err(StoreError::mdbx(&self.dir, "commit", e));
        }
        drop(gate);
        self.changes.record(stage_changes(&records));
        self.sync()?;
        Ok(result)
    }

    /// The records `decide` returns, written into `txn` (not committed).
    fn put_stage_records_in<R>(
        &self,
        txn: env::Txn<'_, '_, libmdbx::RW>,
        decide: impl FnOnce(&StageRead<'_>) -> Result<(R, StageRecords), StoreError>,
    ) -> Result<(R, StageRecords), StoreError> {
        let tables = tables::Tables::open(txn, &self.dir)?;
        let read = |key: &str| {
            txn.get::<Vec<u8>>(&tables.meta, key.as_bytes())
                .map_err(|e| StoreError::mdbx(&self.dir, "read a stage record", e))
        };
        let (result, records) = decide(&read)?;
        for (key, value) in &records {
            txn.put(
                &tables.meta,
                format!("stage.{key}").as_bytes(),
                value,
                libmdbx::WriteFlags::UPSERT,
            )
            .map_err(|e| StoreError::mdbx(&self.dir, "write a stage record", e))?;
        }
        Ok((result, records))
    }

    /// Runs `read` in a short read-only transaction (a consistent view).
    pub fn read<R>(
        &self,
        read: impl FnOnce(&ReadTxn<'_, '_>) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        // Declared first, dropped last: the slot is freed after the transaction ends.
        let _read = self.reads.start();
        let opened = self.opened()?;
        let txn = opened
            .env
            .begin_ro_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a read", e))?;
        let codec = self.codec.read().clone();
        let view = ReadTxn::new(txn.borrow(), &opened.read_tables, &self.dir, &codec);
        read(&view)
    }
}

/// Stage records by key (without the `stage.` prefix) and value.
type StageRecords = Vec<(String, Vec<u8>)>;

/// Reads a meta record by its full key, inside a stage-record write.
type StageRead<'a> = dyn Fn(&str) -> Result<Option<Vec<u8>>, StoreError> + 'a;

/// What writing `records` changed, for the wakeups.
fn stage_changes(records: &StageRecords) -> Changes {
    Changes {
        stage_keys: records.iter().map(|(key, _)| key.clone()).collect(),
        ..Changes::default()
    }
}

#[cfg(test)]
mod tests;
