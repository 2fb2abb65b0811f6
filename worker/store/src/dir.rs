//! The storage directory: the names of its entries (store files, the generation counter,
//! `active`, generation subdirectories), created private, and refused when it holds
//! anything else. `layout` decides which store serves from them.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::StoreError;

/// The libmdbx data file.
pub(super) const DATA_FILE: &str = "mdbx.dat";
/// The files a store consists of; nothing else may live in the directory (but the
/// generation file and its temporary twin).
pub const STORE_FILES: &[&str] = &[DATA_FILE, "mdbx.lck"];
/// The bucket generation for the next store built here; survives a reset, which removes
/// only [`STORE_FILES`].
const GENERATION_FILE: &str = "generation";
const GENERATION_TMP: &str = "generation.tmp";

/// Where a copy of a peer's store is received before it replaces the store's file
/// (`transfer`); left behind only by a crash during a copy, and removed by the next one.
pub(super) const INCOMING_DIR: &str = "incoming";

/// Names the serving store's subdirectory; absent while the directory's own store serves.
pub(super) const ACTIVE_FILE: &str = "active";
pub(super) const ACTIVE_TMP: &str = "active.tmp";

/// True for the name of a generation subdirectory (`g` and digits).
pub(super) fn is_generation_dir_name(name: &str) -> bool {
    name.strip_prefix('g')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Creates `dir` (0700) if absent, otherwise checks it is private, owned by this user and
/// holds only store files (and the layout's own entries: the generation and active files,
/// generation subdirectories). Returns true when it holds no store yet.
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
        let layout_entry = name == GENERATION_FILE
            || name == GENERATION_TMP
            || name == ACTIVE_FILE
            || name == ACTIVE_TMP
            || name == INCOMING_DIR
            || (is_generation_dir_name(&name) && entry.path().is_dir());
        if !STORE_FILES.contains(&name.as_str()) && !layout_entry {
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

/// The generation number a new store in `dir` takes: 1 until the first reset (each reset
/// and each deploy in a new generation advance it; `docs/storage.md`).
pub fn next_generation(dir: &Path) -> Result<u64, StoreError> {
    let path = dir.join(GENERATION_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|g| *g >= 1)
            .ok_or_else(|| StoreError::corrupt(&path, "generation file (one number)")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(1),
        Err(e) => Err(StoreError::io(&path, "read it", e)),
    }
}

/// After a reset: the next store in `dir` builds its data with the generation after the
/// one just removed (which was [`next_generation`] when it was built), so clients see new
/// bucket names and drop the old buckets instead of comparing positions and checksums
/// across the reset. Written to a temporary file, synced and renamed. Returns the new
/// generation.
pub fn advance_generation(dir: &Path) -> Result<u64, StoreError> {
    let next = next_generation(dir).unwrap_or(1) + 1;
    set_next_generation(dir, next)?;
    Ok(next)
}

/// Records `next` as the generation the next store in `dir` builds with (a deploy takes
/// the generation after the serving one, so a later reset counts on from there).
pub fn set_next_generation(dir: &Path, next: u64) -> Result<(), StoreError> {
    replace_file(dir, GENERATION_FILE, GENERATION_TMP, &format!("{next}\n"))
}

/// Replaces `dir/name` with `text` durably: written to `dir/tmp` (mode 0600), synced,
/// renamed over `name`, and the directory synced.
pub(super) fn replace_file(
    dir: &Path,
    name: &str,
    tmp: &str,
    text: &str,
) -> Result<(), StoreError> {
    use std::io::Write;
    let tmp = dir.join(tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| StoreError::io(&tmp, "create it", e))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| StoreError::io(&tmp, "write it", e))?;
    let path = dir.join(name);
    std::fs::rename(&tmp, &path).map_err(|e| StoreError::io(&path, "replace it", e))?;
    sync_dir(dir)
}

/// Makes renames and removals in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(dir, "sync it", e))
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
    let incoming = dir.join(INCOMING_DIR);
    match std::fs::remove_dir_all(&incoming) {
        Ok(()) => removed.push(INCOMING_DIR.to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::io(&incoming, "remove it", e)),
    }
    Ok(removed)
}
