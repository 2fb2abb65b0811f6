//! Where the stores of a storage directory live: the first store in the directory itself,
//! a store built beside a serving one (a rules deploy) in a subdirectory `g<generation>`,
//! and the file `active` naming the subdirectory that serves once a deploy has switched
//! over. Without `active`, the directory's own store serves.

use std::path::{Path, PathBuf};

use super::dir::{self, is_generation_dir_name, ACTIVE_FILE, ACTIVE_TMP, DATA_FILE};
use super::StoreError;

/// The subdirectory a store of bucket `generation` is built in beside a serving one.
pub fn build_dir(root: &Path, generation: u64) -> PathBuf {
    root.join(format!("g{generation}"))
}

/// The directory of the serving store: the one `active` names, else `root` itself.
pub fn active_dir(root: &Path) -> Result<PathBuf, StoreError> {
    let path = root.join(ACTIVE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let name = text.trim();
            if is_generation_dir_name(name) {
                Ok(root.join(name))
            } else {
                Err(StoreError::corrupt(&path, "active file (a g<number> name)"))
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(root.to_owned()),
        Err(e) => Err(StoreError::io(&path, "read it", e)),
    }
}

/// Makes `dir` (a generation subdirectory of `root`) the serving store, durably: written
/// to a temporary file, synced, renamed, and the directory synced.
pub fn set_active(root: &Path, dir: &Path) -> Result<(), StoreError> {
    let name = dir
        .strip_prefix(root)
        .ok()
        .and_then(|p| p.to_str())
        .filter(|n| is_generation_dir_name(n))
        .ok_or_else(|| StoreError::corrupt(dir, "generation directory name"))?;
    dir::replace_file(root, ACTIVE_FILE, ACTIVE_TMP, &format!("{name}\n"))
}

/// Every store directory under `root` other than `active`: the directory's own store
/// (when it holds data) and the generation subdirectories. A fresh `root` has none.
pub fn other_stores(root: &Path, active: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut found = Vec::new();
    if root != active && root.join(DATA_FILE).exists() {
        found.push(root.to_owned());
    }
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(StoreError::io(root, "list it", e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(root, "list it", e))?;
        let name = entry.file_name();
        if is_generation_dir_name(&name.to_string_lossy()) && entry.path() != active {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}

/// Removes the store in `dir`: its files, and the directory itself when it is a
/// generation subdirectory of `root` that holds nothing else. Returns the paths removed
/// (relative to `root`).
pub fn remove_store(root: &Path, dir: &Path) -> Result<Vec<String>, StoreError> {
    let removed = dir::remove_store_files(dir)?;
    let prefix = dir
        .strip_prefix(root)
        .ok()
        .and_then(|p| p.to_str())
        .unwrap_or_default()
        .to_owned();
    let mut paths: Vec<String> = removed
        .iter()
        .map(|f| {
            if prefix.is_empty() {
                f.clone()
            } else {
                format!("{prefix}/{f}")
            }
        })
        .collect();
    if dir != root {
        match std::fs::remove_dir(dir) {
            Ok(()) => paths.push(format!("{prefix}/")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io(dir, "remove it", e)),
        }
    }
    if active_dir(root)? == dir {
        remove_active_file(root)?;
    }
    Ok(paths)
}

/// Forgets which subdirectory serves (after a reset removed every store).
pub fn remove_active_file(root: &Path) -> Result<(), StoreError> {
    let path = root.join(ACTIVE_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => dir::sync_dir(root),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io(&path, "remove it", e)),
    }
}
