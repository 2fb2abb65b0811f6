//! Opening the environment again in place after a failed write (`Store::reopen`), so the
//! engine can write again without closing what reads the store: the `Store` stays, and
//! the streams holding it read on once the environment is open again (they wait only for
//! the close and the open). A failed commit or sync poisons the store (`PSM_S1007`):
//! libmdbx's pages in memory may then differ from what the file holds, and only an open
//! of the file decides what is durable.

use std::sync::atomic::Ordering;

use super::env::Env;
use super::error::FreeSpace;
use super::{environment_options, map_write, Opened, Store, StoreError};

/// Free bytes the store's file system must have before [`Store::reopen`] closes it:
/// libmdbx grows the file in steps of 16 MiB, and a store closed on a full disk might not
/// open again (its lock file needs space too), which would end the reads as well.
pub const ROOM_TO_REOPEN: u64 = 32 << 20;

impl Store {
    /// True when the store's file system has [`ROOM_TO_REOPEN`] free (or its space cannot
    /// be read).
    pub fn has_room_to_reopen(&self) -> bool {
        FreeSpace::of(&self.dir)
            .bytes()
            .is_none_or(|free| free >= ROOM_TO_REOPEN)
    }

    /// Closes the environment and opens it again, writing the way it did (through the map,
    /// unless that space cannot be reserved now: then with file writes), and clears the
    /// poison of a failed write. Writes held at the time (`held`) are dropped, never
    /// published. Waits for the reads and the write in progress; reads started meanwhile
    /// wait for the open. An open that fails leaves the store refusing reads and writes
    /// (`PSM_S1007`) until a later call succeeds.
    pub fn reopen(&self) -> Result<(), StoreError> {
        let _closed = self.gate.close();
        let mut opened = self.opened.write();
        let map = opened.as_ref().is_some_and(|o| o.env.is_map());
        // libmdbx opens an environment once per process: the old one closes first (with
        // any held transaction, which aborts).
        *opened = None;
        self.held.store(false, Ordering::Release);
        let reopened = if map {
            open(self, true).or_else(|e| {
                tracing::warn!("{e}; the store goes on writing its pages with file writes");
                open(self, false)
            })
        } else {
            open(self, false)
        }?;
        *opened = Some(reopened);
        self.poisoned.store(false, Ordering::Release);
        tracing::info!(dir = %self.dir.display(), "the store is open again");
        Ok(())
    }
}

/// The store's environment opened again, through its map or with file writes.
fn open(store: &Store, map: bool) -> Result<Opened, StoreError> {
    let env = Env::open(&store.dir, environment_options(), map)
        .map_err(|e| StoreError::at_open(&store.dir, e))?;
    if map {
        // As at the switch: the file's space past its last page, given back as libmdbx
        // opened it with a writable map, is taken again.
        map_write::reserve(&store.dir)
            .map_err(|e| StoreError::io(&store.dir, "reserve the data file's space", e))?;
    }
    Opened::with(env, &store.dir)
}
