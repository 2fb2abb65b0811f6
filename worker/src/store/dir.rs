//! The storage directory: created private, and refused when it holds anything else.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::StoreError;

/// The libmdbx data file.
pub(super) const DATA_FILE: &str = "mdbx.dat";
/// The files a store consists of; nothing else may live in the directory.
pub const STORE_FILES: &[&str] = &[DATA_FILE, "mdbx.lck"];

/// Creates `dir` (0700) if absent, otherwise checks it is private, owned by this user and
/// holds only store files. Returns true when it holds no store yet.
pub(super) fn prepare(dir: &Path) -> Result<bool, StoreError> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(|e| StoreError::io(dir, "create it", e))?;
            return Ok(true);
        }
        Err(e) => return Err(StoreError::io(dir, "inspect it", e)),
        Ok(meta) if !meta.is_dir() => {
            return Err(StoreError::Foreign {
                path: dir.to_owned(),
                found: "a file, not a directory".into(),
            })
        }
        Ok(meta) => check_private(dir, &meta)?,
    }
    let mut foreign = Vec::new();
    let mut has_data = false;
    for entry in std::fs::read_dir(dir).map_err(|e| StoreError::io(dir, "list it", e))? {
        let entry = entry.map_err(|e| StoreError::io(dir, "list it", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        has_data |= name == DATA_FILE;
        if !STORE_FILES.contains(&name.as_str()) {
            foreign.push(name);
        }
    }
    if !foreign.is_empty() {
        foreign.sort();
        foreign.truncate(5);
        return Err(StoreError::Foreign {
            path: dir.to_owned(),
            found: format!("found {}", foreign.join(", ")),
        });
    }
    Ok(!has_data)
}

fn check_private(dir: &Path, meta: &std::fs::Metadata) -> Result<(), StoreError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(StoreError::Permissions {
            path: dir.to_owned(),
            problem: format!(
                "is owned by uid {}, not by the server user (uid {me})",
                meta.uid()
            ),
        });
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(StoreError::Permissions {
            path: dir.to_owned(),
            problem: format!("has group or world access (mode {mode:04o})"),
        });
    }
    Ok(())
}

/// Removes the store's own files from `dir` (never anything else), for a reset.
/// Returns the names removed.
pub fn remove_store_files(dir: &Path) -> Result<Vec<String>, StoreError> {
    let mut removed = Vec::new();
    for name in STORE_FILES {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => removed.push((*name).to_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io(&dir.join(name), "remove it", e)),
        }
    }
    Ok(removed)
}
