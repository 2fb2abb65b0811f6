//! Bootstrap progress counters, shared with the status publisher.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Counters the pipeline advances and the engine reads for `status()`.
#[derive(Debug, Default)]
pub struct Progress {
    rows: AtomicU64,
    /// The planner's estimate of the rows to copy (0: unknown).
    rows_estimated: AtomicU64,

    tables_done: AtomicU64,
    copy_started: Mutex<Option<Instant>>,
}

impl Progress {
    /// Rows written to the store.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// The planner's estimate of the rows to copy, taken when the copy began (0: unknown,
    /// e.g. tables never analyzed).
    pub fn rows_estimated(&self) -> u64 {
        self.rows_estimated.load(Ordering::Relaxed)
    }

    /// Tables fully copied.
    pub fn tables_done(&self) -> u64 {
        self.tables_done.load(Ordering::Relaxed)
    }

    /// Time since the copy began (zero before).
    pub fn copy_elapsed(&self) -> Duration {
        self.copy_started
            .lock()
            .map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// True once the current attempt started copying.
    pub fn copying(&self) -> bool {
        self.copy_started.lock().is_some()
    }

    /// Zeroes the counters for a new attempt.
    pub(super) fn reset(&self) {
        self.rows.store(0, Ordering::Relaxed);
        self.rows_estimated.store(0, Ordering::Relaxed);

        self.tables_done.store(0, Ordering::Relaxed);
        *self.copy_started.lock() = None;
    }

    pub(super) fn start_copy(&self) {
        *self.copy_started.lock() = Some(Instant::now());
    }

    pub(super) fn set_rows_estimated(&self, n: u64) {
        self.rows_estimated.store(n, Ordering::Relaxed);
    }

    pub(super) fn add_rows(&self, n: u64) {
        self.rows.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn table_done(&self) {
        self.tables_done.fetch_add(1, Ordering::Relaxed);
    }
}
