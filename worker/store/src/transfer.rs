//! A store copied to another sync replica of the same primary (seeding a fleet member from
//! a peer, `docs/storage.md` "Copying a store to a peer"): the peer's data file as one read
//! transaction sees it, written by libmdbx itself (`mdbx_txn_copy2fd`, page for page, into
//! a pipe) and framed on a byte stream; the receiver writes it to a file of its own
//! beside its store, gives it its own identity and records there, and renames it over its
//! store's file while that is closed. The copy keeps op ids, checksums, compaction debt and
//! the history id, so both stores name buckets alike and continue one history; the
//! receiver keeps its own identity (format, store id, creation time).
//!
//! The stream: the magic, the format (length-prefixed), then frames of the file: a tag
//! ([`DATA`] with that many bytes, [`ZEROS`] for that many zero bytes, the tail libmdbx pads
//! a copy with), a u32 LE length; then [`END`], the file's length (u64 LE) and the SHA-256
//! of every frame before it (tags, lengths and bytes). The receiver computes the same
//! digest over what it received and installs nothing unless they match: a byte changed on
//! the way (below TLS, or over loopback where there is none) is refused, not installed.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use libmdbx::WriteFlags;
use sha2::{Digest, Sha256};

use super::dir::{sync_dir, DATA_FILE, INCOMING_DIR};
use super::meta::FORMAT;
use super::tables::{Tables, META};
use super::{Checkpoint, Store, StoreError};

/// The first bytes of a copy.
const MAGIC: &[u8; 8] = b"PSMFILE2";
/// Frame tags.
const DATA: u8 = 1;
const ZEROS: u8 = 2;
const END: u8 = 0xFF;
/// Meta keys that name the store itself: the receiver keeps its own.
const OWN_META_KEYS: &[&[u8]] = &[b"format", b"store_id", b"created_at"];
/// Bytes of the file per frame (what one read of the pipe returns at most).
const FRAME_BYTES: usize = 1 << 20;
/// Received bytes after which the kernel is asked to start writing them out, so the
/// final sync finds most of the copy on disk already.
const WRITEBACK_BYTES: u64 = 32 << 20;

/// The meta records of a copy, by key, as they will be installed (`stage.<key>` for an
/// engine stage's record).
pub type CopiedMeta = BTreeMap<Vec<u8>, Vec<u8>>;

/// The receiver's records of [`OWN_META_KEYS`], by key.
type OwnMeta = Vec<(&'static [u8], Vec<u8>)>;

impl Store {
    /// Writes this store's data file, as one read transaction sees it, to `out` (see the
    /// module documentation) and returns the checkpoint the copy holds. libmdbx copies the
    /// pages into a pipe (with `sendfile`) on this thread while a second one frames them
    /// onto `out`. The writer goes on meanwhile; the read transaction keeps the pages it
    /// sees, so the file grows by what is written while a slow reader takes the copy. A
    /// reader that goes away closes the pipe: the copy ends with `EPIPE` (the process
    /// ignores `SIGPIPE`, as PostgreSQL's background workers and Rust programs do).
    pub fn export_copy(&self, out: &mut (dyn Write + Send)) -> Result<Checkpoint, StoreError> {
        let io = |e| StoreError::io(&self.dir, "send a copy of the store", e);
        let _read = self.reads.start();
        let opened = self.opened()?;
        let owned = opened
            .env
            .begin_ro_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a read", e))?;
        let txn = owned.borrow();
        let checkpoint = {
            let tables = Tables::open(txn, &self.dir)?;
            let codec = self.codec.read().clone();
            super::ReadTxn::new(txn, &tables, &self.dir, &codec).checkpoint()?
        };
        out.write_all(MAGIC).map_err(io)?;
        out.write_all(&(FORMAT.len() as u32).to_le_bytes())
            .map_err(io)?;
        out.write_all(FORMAT.as_bytes()).map_err(io)?;
        let (pipe_out, pipe_in) = pipe().map_err(io)?;
        let (copied, framed) = std::thread::scope(|scope| {
            let framing = scope.spawn(|| frame_file(File::from(pipe_out), &mut *out));
            // SAFETY: `txn` is a live read transaction of this environment, used by no
            // other thread meanwhile; the descriptor is open for writing until the drop.
            let rc = unsafe {
                mdbx_sys::mdbx_txn_copy2fd(
                    txn.txn().0,
                    pipe_in.as_raw_fd(),
                    mdbx_sys::MDBX_CP_DONT_FLUSH,
                )
            };
            // The framing thread reads to the end of the pipe.
            drop(pipe_in);
            let framed = framing
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the framing thread panicked")));
            (rc, framed)
        });
        // The framing's error says more: a reader that went away made the copy fail too.
        let (total, digest) = framed.map_err(io)?;
        if copied != 0 {
            // No end mark: the receiver refuses the copy as cut short.
            return Err(StoreError::mdbx(
                &self.dir,
                "copy the data file",
                libmdbx::Error::from_err_code(copied),
            ));
        }
        // The end mark only once libmdbx has copied the whole file.
        out.write_all(&[END]).map_err(io)?;
        out.write_all(&total.to_le_bytes()).map_err(io)?;
        out.write_all(&digest).map_err(io)?;
        out.flush().map_err(io)?;
        Ok(checkpoint)
    }

    /// Replaces this store, which must hold no data, with a copy written by
    /// [`Self::export_copy`], and closes it; open the directory again to use the copy.
    /// The copy is written to a file in [`INCOMING_DIR`], opened there, given this
    /// store's identity and the meta records `finish` makes of the copy's (the peer's
    /// bootstrap record among them, under `stage.bootstrap`), synced, and renamed over this
    /// store's file. A copy that fails midway leaves this store as it was (the incoming
    /// directory is removed now, or by the next install or reset).
    pub fn install_copy<E: From<StoreError>>(
        self,
        input: &mut dyn Read,
        finish: impl FnOnce(&mut CopiedMeta) -> Result<(), E>,
    ) -> Result<Checkpoint, E> {
        self.refuse_unless_empty()?;
        let own = self.own_meta()?;
        let dir = self.dir.clone();
        let mut frames = Frames { input, dir: &dir };
        frames.header()?;
        // Closed while the copy takes its place.
        drop(self);
        let incoming = dir.join(INCOMING_DIR);
        let installed = receive(&mut frames, &incoming)
            .map_err(E::from)
            .and_then(|()| adopt(&incoming, own, finish))
            .and_then(|checkpoint| {
                swap_in(&dir, &incoming)?;
                Ok(checkpoint)
            });
        if installed.is_err() {
            let _ = std::fs::remove_dir_all(&incoming);
        }
        installed
    }

    /// A copy is installed only where no data is (a fresh store, or one just cleared).
    fn refuse_unless_empty(&self) -> Result<(), StoreError> {
        let sizes = self.table_sizes()?;
        let holds_data = sizes
            .iter()
            .any(|(name, entries, _)| *name != META && *entries > 0);
        let checkpoint = self.read(|view| view.checkpoint())?;
        if holds_data || checkpoint != Checkpoint::default() {
            return Err(bad_copy(
                &self.dir,
                "this store already holds data; a copy is installed only into an empty one",
            ));
        }
        Ok(())
    }

    /// The meta records naming this store ([`OWN_META_KEYS`]), which a copy keeps.
    fn own_meta(&self) -> Result<OwnMeta, StoreError> {
        let opened = self.opened()?;
        let owned = opened
            .env
            .begin_ro_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a read", e))?;
        let txn = owned.borrow();
        let tables = Tables::open(txn, &self.dir)?;
        let mut own = Vec::new();
        for key in OWN_META_KEYS {
            let value: Option<Vec<u8>> = txn
                .get(&tables.meta, key)
                .map_err(|e| StoreError::mdbx(&self.dir, "read meta", e))?;
            if let Some(value) = value {
                own.push((*key, value));
            }
        }
        Ok(own)
    }
}

/// A pipe (both ends close on exec): the read end, the write end.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by nothing else.
    let ends = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Fewer, larger reads than the default 64 KiB allow; a hint the kernel may refuse.
    // SAFETY: a valid descriptor.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, FRAME_BYTES as libc::c_int) };
    Ok(ends)
}

/// Frames what libmdbx writes into the pipe until it closes; returns the bytes framed and
/// the SHA-256 of the frames. The end mark is the caller's, once libmdbx reports the copy
/// complete.
fn frame_file(mut pipe: File, out: &mut (dyn Write + Send)) -> std::io::Result<(u64, [u8; 32])> {
    let mut buffer = vec![0u8; FRAME_BYTES];
    let mut total = 0u64;
    let mut digest = Sha256::new();
    loop {
        let n = match pipe.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let chunk = &buffer[..n];
        let zeros = chunk.iter().all(|&b| b == 0);
        let head = frame_head(if zeros { ZEROS } else { DATA }, n);
        digest.update(head);
        out.write_all(&head)?;
        if !zeros {
            digest.update(chunk);
            out.write_all(chunk)?;
        }
        total += n as u64;
    }
    Ok((total, digest.finalize().into()))
}

/// A frame's tag and its length (u32 LE).
fn frame_head(tag: u8, len: usize) -> [u8; 5] {
    let mut head = [tag, 0, 0, 0, 0];
    head[1..].copy_from_slice(&(len as u32).to_le_bytes());
    head
}

/// Writes the copy's file into `incoming` (created afresh, mode 0700).
fn receive(frames: &mut Frames<'_>, incoming: &Path) -> Result<(), StoreError> {
    match std::fs::remove_dir_all(incoming) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::io(incoming, "remove an earlier copy", e)),
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(incoming)
        .map_err(|e| StoreError::io(incoming, "create it", e))?;
    let path = incoming.join(DATA_FILE);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| StoreError::io(&path, "create it", e))?;
    let write = |e| StoreError::io(&path, "write the copy", e);
    let mut buffer = vec![0u8; FRAME_BYTES];
    let (mut written, mut flushed) = (0u64, 0u64);
    let mut digest = Sha256::new();
    loop {
        let mut tag = [0u8; 1];
        frames.exact(&mut tag)?;
        match tag[0] {
            END => {
                let mut total = [0u8; 8];
                frames.exact(&mut total)?;
                let mut sent = [0u8; 32];
                frames.exact(&mut sent)?;
                // Frames are written by this code alone: a length that does not add up is a
                // copy damaged on the way, as a wrong digest is.
                if u64::from_le_bytes(total) != written || digest.finalize().as_slice() != sent {
                    return Err(StoreError::DamagedCopy {
                        path: frames.dir.to_owned(),
                    });
                }
                break;
            }
            DATA | ZEROS => {
                let len = frames.len()?;
                digest.update(frame_head(tag[0], len));
                if tag[0] == DATA {
                    frames.exact(&mut buffer[..len])?;
                    digest.update(&buffer[..len]);
                    file.write_all(&buffer[..len]).map_err(write)?;
                } else {
                    // A hole: the file's length is set at the end.
                    file.seek_relative(len as i64).map_err(write)?;
                }
                written += len as u64;
            }
            _ => return Err(damaged(frames.dir)),
        }
        if written - flushed >= WRITEBACK_BYTES {
            start_writeback(&file, flushed, written - flushed);
            flushed = written;
        }
    }
    file.set_len(written).map_err(write)
}

/// Opens the copy in `incoming`, gives it this store's identity and the meta records
/// `finish` makes, and makes it durable. Returns its checkpoint.
fn adopt<E: From<StoreError>>(
    incoming: &Path,
    own: OwnMeta,
    finish: impl FnOnce(&mut CopiedMeta) -> Result<(), E>,
) -> Result<Checkpoint, E> {
    let copy = Store::open(incoming)?;
    let checkpoint = copy.read(|view| view.checkpoint())?;
    let dir = incoming;
    let mdbx = |action| move |e| StoreError::mdbx(dir, action, e);
    let opened = copy.opened()?;
    let owned = opened.env.begin_rw_txn().map_err(mdbx("begin a write"))?;
    {
        let txn = owned.borrow();
        let tables = Tables::open(txn, dir)?;
        let mut meta = CopiedMeta::new();
        {
            let mut cursor = txn.cursor(&tables.meta).map_err(mdbx("open a cursor"))?;
            for item in cursor.iter::<Cow<'_, [u8]>, Cow<'_, [u8]>>() {
                let (key, value) = item.map_err(mdbx("read meta"))?;
                if !OWN_META_KEYS.contains(&key.as_ref()) {
                    meta.insert(key.into_owned(), value.into_owned());
                }
            }
        }
        let before: Vec<Vec<u8>> = meta.keys().cloned().collect();
        finish(&mut meta)?;
        for key in before.iter().filter(|k| !meta.contains_key(*k)) {
            txn.del(&tables.meta, key, None)
                .map_err(mdbx("install the copied metadata"))?;
        }
        let own = own.iter().map(|(k, v)| (k.to_vec(), v));
        for (key, value) in meta.iter().map(|(k, v)| (k.clone(), v)).chain(own) {
            txn.put(&tables.meta, &key, value, WriteFlags::UPSERT)
                .map_err(mdbx("install the copied metadata"))?;
        }
    }
    owned.commit().map_err(mdbx("commit the copied metadata"))?;
    drop(opened);
    copy.sync()?;
    Ok(checkpoint)
}

/// Renames the copy's file over the store's in `dir` (closed) and removes `incoming`.
fn swap_in(dir: &Path, incoming: &Path) -> Result<(), StoreError> {
    let from = incoming.join(DATA_FILE);
    let to = dir.join(DATA_FILE);
    std::fs::rename(&from, &to).map_err(|e| StoreError::io(&to, "replace it with the copy", e))?;
    sync_dir(dir)?;
    std::fs::remove_dir_all(incoming).map_err(|e| StoreError::io(incoming, "remove it", e))?;
    sync_dir(dir)
}

/// Asks the kernel to start writing `len` bytes of `file` from `offset` out without
/// waiting for them. Only a hint: failures are ignored.
fn start_writeback(file: &File, offset: u64, len: u64) {
    // SAFETY: a valid descriptor and a range of it.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

/// A copy whose frames do not add up: changed on the way.
fn damaged(dir: &Path) -> StoreError {
    StoreError::DamagedCopy {
        path: dir.to_owned(),
    }
}

fn bad_copy(dir: &Path, problem: &str) -> StoreError {
    StoreError::BadCopy {
        path: dir.to_owned(),
        problem: problem.to_owned(),
        cut_short: false,
    }
}

/// Reads a copy's frames.
struct Frames<'a> {
    input: &'a mut dyn Read,
    dir: &'a Path,
}

impl Frames<'_> {
    /// The magic and the format: a copy of a store this build reads.
    fn header(&mut self) -> Result<(), StoreError> {
        let mut magic = [0u8; 8];
        self.exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(bad_copy(
                self.dir,
                "it does not start like a store copy of this build: run the same build on \
                 both replicas",
            ));
        }
        let len = self.len()?;
        let mut format = vec![0u8; len];
        self.exact(&mut format)?;
        if format != FORMAT.as_bytes() {
            let found = String::from_utf8_lossy(&format).into_owned();
            return Err(bad_copy(
                self.dir,
                &format!(
                    "the peer's store is of format `{found}`, this build reads `{FORMAT}`: run \
                     the same build on both"
                ),
            ));
        }
        Ok(())
    }

    fn exact(&mut self, buf: &mut [u8]) -> Result<(), StoreError> {
        self.input.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                StoreError::BadCopy {
                    path: self.dir.to_owned(),
                    problem: "it ended before its last frame (the peer or the connection \
                              stopped)"
                        .into(),
                    cut_short: true,
                }
            } else {
                StoreError::io(self.dir, "receive a copy of a store", e)
            }
        })
    }

    /// A u32 LE length, at most [`FRAME_BYTES`] (a longer one is a damaged copy, refused
    /// before anything is allocated for it).
    fn len(&mut self) -> Result<usize, StoreError> {
        let mut len = [0u8; 4];
        self.exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > FRAME_BYTES {
            return Err(damaged(self.dir));
        }
        Ok(len)
    }
}
