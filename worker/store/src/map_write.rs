//! What writing through a map needs from the file system: a write into a mapped page
//! whose block the file system cannot allocate is not an error a call returns but
//! `SIGBUS`, which ends the process. So the store writes through the map only on file
//! systems where the data file's blocks can be reserved ahead (`fallocate`), and reserves
//! them whenever the environment opens (libmdbx grows the file with `posix_fallocate`,
//! whose `ENOSPC` then fails the growing write transaction like any full disk).

use std::os::fd::AsRawFd;
use std::path::Path;

/// `statfs` magic numbers of the file systems whose reserved blocks a later write into
/// the map is guaranteed (no copy-on-write, `fallocate` honoured): ext4 (also ext2/3),
/// XFS. Not tmpfs, where libmdbx's growth ignores `fallocate`'s `ENOSPC`, nor
/// copy-on-write file systems (btrfs, ZFS) or overlays, where a reserved block may still
/// need space when written.
const RESERVABLE: [i64; 2] = [0xEF53, 0x5846_5342];

/// True when the file system holding `dir` is one the store writes through a map on.
pub(crate) fn reservable(dir: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `path` is NUL-terminated; `fs` is written by the call before it is read.
    let rc = unsafe { libc::statfs(path.as_ptr(), fs.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: the call succeeded and filled it.
    let kind: i64 = unsafe { fs.assume_init() }.f_type;
    RESERVABLE.contains(&kind)
}

/// Allocates every block of the store's data file (its size unchanged): a page libmdbx
/// later writes through the map has its block already.
pub(crate) fn reserve(dir: &Path) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(crate::dir::DATA_FILE))?;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    // SAFETY: a plain system call on an open descriptor.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the kernel cache the data file in single pages, in two steps: [`drop_from_cache`]
/// drops its cached pages (the environment is closed, so none is mapped; its last commit
/// was synced, so all are clean), and [`read_back`] reads the file again without
/// readahead, which caches what it reads in 4 KiB pages. Only the first needs the
/// environment closed: the second, as long as the file is large, runs after it is open
/// again, while reads go on (the writer that dirties pages starts after it).
/// A file written in long runs (the snapshot) sits in the page cache in large folios, and a
/// store page written through the map dirties its whole folio: every durable commit would
/// then write back up to a folio of megabytes per page it changed (2,000 transactions per
/// second lagged 55 ms median, 95 ms p99, against 6 and 8 ms after this, one run each).
/// Reading the file back in the background while the store already wrote through the map,
/// opened without readahead, lagged 151 ms median in the one run it got: not kept.
pub(crate) fn drop_from_cache(dir: &Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::File::open(dir.join(crate::dir::DATA_FILE))?;
    file.sync_data()?;
    let fd = file.as_raw_fd();
    for advice in [libc::POSIX_FADV_DONTNEED, libc::POSIX_FADV_RANDOM] {
        // SAFETY: advice on an open descriptor; reads through it then skip readahead.
        let rc = unsafe { libc::posix_fadvise(fd, 0, 0, advice) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
    }
    Ok(file)
}

/// Reads `file` (from [`drop_from_cache`], without readahead) to its end.
pub(crate) fn read_back(mut file: std::fs::File, dir: &Path) -> std::io::Result<()> {
    use std::io::Read;
    #[cfg(test)]
    tests::before_read_back(dir);
    let _ = dir;
    let mut buffer = vec![0u8; 1 << 20];
    while file.read(&mut buffer)? > 0 {}
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    /// A hook the store's tests set to pause a switch of the store in `PathBuf` at its
    /// read-back.
    type Hook = (PathBuf, Box<dyn Fn() + Send>);
    pub(crate) static BEFORE_READ_BACK: Mutex<Option<Hook>> = Mutex::new(None);

    pub(super) fn before_read_back(dir: &Path) {
        let hook = BEFORE_READ_BACK.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, pause)) = hook.as_ref().filter(|(d, _)| d == dir) {
            pause();
        }
    }
}
