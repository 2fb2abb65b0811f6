//! Errors of the store. Directory and format problems need the operator; MDBX failures
//! poison the writer until the store is opened again (the engine does it in place, with
//! backoff, while serving goes on).

use std::path::PathBuf;

/// Why the store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The directory cannot be created or inspected.
    #[error(
        "PSM_S1001 storage directory {path}: cannot {action}: {source}; check that the \
             PostgreSQL server user owns the parent directory, or set \
             powersync_mdbx.storage_dir"
    )]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The directory holds files this engine did not write.
    #[error(
        "PSM_S1002 storage directory {path} holds content that is not a powersync_mdbx \
             store ({found}); point powersync_mdbx.storage_dir at an empty or new directory, \
             or move that content away"
    )]
    Foreign {
        /// The directory.
        path: PathBuf,
        /// What was found.
        found: String,
    },
    /// The directory is readable by others or owned by another user.
    #[error(
        "PSM_S1003 storage directory {path} {problem}; it holds replicated data and must \
             be private to the server user (chown it to that user, chmod 0700)"
    )]
    Permissions {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A powersync_mdbx store of another format version.
    #[error(
        "PSM_S1004 storage directory {path} holds a store of format `{found}`, this build \
             reads `{expected}`; run SELECT powersync_mdbx.reset() to rebuild it from the \
             primary, or run the matching build"
    )]
    Incompatible {
        /// The directory.
        path: PathBuf,
        /// Format written in the store.
        found: String,
        /// Format this build reads.
        expected: &'static str,
    },
    /// Stored bytes do not decode.
    #[error(
        "PSM_S1006 storage {path} is damaged ({what}); run SELECT powersync_mdbx.reset() \
             to rebuild it from the primary"
    )]
    Corrupt {
        /// The directory.
        path: PathBuf,
        /// Which record.
        what: &'static str,
    },
    /// Two bucket names too long to be keys share a SHA-256 hash (`long_keys`): never
    /// seen in practice; nothing is mixed up, the write or read stops.
    #[error(
        "PSM_S1008 storage {path}: the bucket name starting `{name_start}` shares its \
         SHA-256 hash with another; please report it (nothing of either bucket was mixed up)"
    )]
    KeyCollision {
        /// The directory.
        path: PathBuf,
        /// The first 80 characters of the name.
        name_start: String,
    },
    /// libmdbx refuses the data file as damaged (truncated, meta pages overwritten, not a
    /// libmdbx file): nothing is served from it.
    #[error(
        "PSM_S1009 storage {path}: the data file is damaged ({source}); nothing is served \
         from it, and reset() leaves it alone (it cannot show the file is a powersync_mdbx \
         store): move mdbx.dat and mdbx.lck out of that directory and drop the store's \
         replication slot on the primary by hand, then reload; or restore the directory \
         from a copy of a stopped replica"
    )]
    Damaged {
        /// The directory.
        path: PathBuf,
        /// libmdbx's verdict.
        source: libmdbx::Error,
    },
    /// A copy of a peer's store (seeding, `transfer`) cannot be installed; nothing of it
    /// is served.
    #[error(
        "PSM_S1010 storage {path}: the copy of the peer's store cannot be installed: {problem}"
    )]
    BadCopy {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// The copy ended early (the peer or the connection stopped): another try may do.
        cut_short: bool,
    },
    /// A copy of a peer's store arrived with other bytes than the peer sent: its SHA-256
    /// does not match the one sent with it. Nothing of it is installed; another copy may
    /// arrive whole.
    #[error(
        "PSM_S1011 storage {path}: the copy of the peer's store changed on the way (its \
         SHA-256 does not match the one the peer sent); nothing of it was installed"
    )]
    DamagedCopy {
        /// The directory.
        path: PathBuf,
    },
    /// A commit failed earlier, or opening the environment again did (then reads fail
    /// too); the store refuses writes until it is opened again.
    #[error(
        "PSM_S1007 storage {path}: an earlier commit, or opening the store again, failed \
             (see the log); writes are refused until the store is opened again, which the \
             engine does by itself with backoff"
    )]
    Poisoned {
        /// The directory.
        path: PathBuf,
    },
    /// libmdbx reported an error.
    #[error(
        "PSM_S1005 storage {path}: cannot {action}: {source} ({space}); if it repeats, \
         check the file system of the storage directory (free space, errors in the kernel \
         log)"
    )]
    Mdbx {
        /// The directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// libmdbx's error.
        source: libmdbx::Error,
        /// The file system's free space when it happened (a full disk shows as an I/O
        /// error from libmdbx).
        space: FreeSpace,
    },
}

impl StoreError {
    pub(crate) fn key_collision(path: &std::path::Path, name: &str) -> Self {
        Self::KeyCollision {
            path: path.to_owned(),
            name_start: name.chars().take(80).collect(),
        }
    }

    /// An error opening the environment (as [`Self::mdbx`]; a fatal libmdbx state at
    /// open also means a damaged file).
    pub(crate) fn at_open(path: &std::path::Path, source: libmdbx::Error) -> Self {
        match source {
            libmdbx::Error::Panic => Self::Damaged {
                path: path.to_owned(),
                source,
            },
            other => Self::mdbx(path, "open the environment", other),
        }
    }

    /// A libmdbx error while doing `action`: the ones that say the file is damaged
    /// (corrupted, a page missing, not a libmdbx file) are [`Self::Damaged`], for the
    /// operator; the others may pass with a restart.
    pub(crate) fn mdbx(
        path: &std::path::Path,
        action: &'static str,
        source: libmdbx::Error,
    ) -> Self {
        use libmdbx::Error as E;
        if matches!(
            source,
            E::Corrupted | E::Invalid | E::PageNotFound | E::VersionMismatch
        ) {
            return Self::Damaged {
                path: path.to_owned(),
                source,
            };
        }
        Self::Mdbx {
            path: path.to_owned(),
            action,
            source,
            space: FreeSpace::of(path),
        }
    }

    /// Stored bytes under `path` that do not decode (`what` names them).
    pub fn corrupt(path: &std::path::Path, what: &'static str) -> Self {
        Self::Corrupt {
            path: path.to_owned(),
            what,
        }
    }

    /// A failed file operation on `path`.
    pub fn io(path: &std::path::Path, action: &'static str, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            action,
            source,
        }
    }

    /// True when only the operator can fix it (restarting will not help).
    pub fn needs_operator(&self) -> bool {
        !matches!(self, Self::Mdbx { .. } | Self::Poisoned { .. })
    }
}

/// The free space of a file system, as an error message states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeSpace(Option<u64>);

impl FreeSpace {
    /// The space left to unprivileged writers on the file system holding `path`.
    pub fn of(path: &std::path::Path) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
            return Self(None);
        };
        // SAFETY: statvfs fills the struct it is given; all zeroes is a valid value of it.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid NUL-terminated path and a pointer to a local struct.
        if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
            return Self(None);
        }
        Self(Some(stat.f_bavail.saturating_mul(stat.f_frsize)))
    }

    /// The free bytes, when known.
    pub fn bytes(self) -> Option<u64> {
        self.0
    }
}

impl std::fmt::Display for FreeSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(bytes) => write!(f, "{} MiB free on its file system", bytes >> 20),
            None => f.write_str("free space unknown"),
        }
    }
}
