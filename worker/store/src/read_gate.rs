//! Lets a close of the environment (a reopen after a failed write, the switch to writing
//! through the map) through overlapping reads. Reads take the environment's lock
//! recursively, since a write's closure may read while a close waits; such reads ignore a
//! waiting writer, so with many streams reading in turn the close waited forever (measured:
//! three readers of 1,000-op pages kept a reopen out for minutes). While a close waits, new
//! reads wait at this gate instead; a thread already holding the environment passes.

use std::cell::Cell;
use std::ops::Deref;

use parking_lot::{Condvar, MappedRwLockReadGuard, Mutex};

use super::Opened;

thread_local! {
    /// Guards of the environment this thread holds (of any store).
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// Where new reads wait while the environment is closed or about to be.
#[derive(Default)]
pub(crate) struct ReadGate {
    closing: Mutex<bool>,
    opened: Condvar,
}

impl ReadGate {
    /// Waits while a close is under way, unless this thread already holds the environment.
    pub(crate) fn pass(&self) {
        if HELD.get() > 0 {
            return;
        }
        let mut closing = self.closing.lock();
        while *closing {
            self.opened.wait(&mut closing);
        }
    }

    /// Shuts the gate until the returned value is dropped.
    pub(crate) fn close(&self) -> Closed<'_> {
        *self.closing.lock() = true;
        Closed(self)
    }
}

/// The gate shut; dropping it lets the waiting reads in.
pub(crate) struct Closed<'a>(&'a ReadGate);

impl Drop for Closed<'_> {
    fn drop(&mut self) {
        *self.0.closing.lock() = false;
        self.0.opened.notify_all();
    }
}

/// The open environment, read: counted as held by this thread while it lives.
pub(crate) struct OpenedRead<'a> {
    guard: MappedRwLockReadGuard<'a, Opened>,
}

impl<'a> OpenedRead<'a> {
    pub(crate) fn new(guard: MappedRwLockReadGuard<'a, Opened>) -> Self {
        HELD.set(HELD.get() + 1);
        Self { guard }
    }
}

impl Drop for OpenedRead<'_> {
    fn drop(&mut self) {
        HELD.set(HELD.get() - 1);
    }
}

impl Deref for OpenedRead<'_> {
    type Target = Opened;

    fn deref(&self) -> &Opened {
        &self.guard
    }
}
