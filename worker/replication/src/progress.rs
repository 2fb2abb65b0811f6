//! Progress counters the engine reads for `status()`: the bootstrap's, the stream's, and
//! those of a re-copy and of a rebuild from a new slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics::{Histogram, PendingCommits};
use parking_lot::Mutex;

/// When replication last heard from the primary, Unix milliseconds (0: not yet): a
/// message of the stream, rows of a copy, the primary's word that its walsender hears
/// this worker. The engine shows the source stalled when it is old (`status()`,
/// the readiness probe).
#[derive(Debug, Default)]
pub struct SourceHeard(AtomicU64);

impl SourceHeard {
    /// Heard from the primary now.
    pub fn now(&self) {
        self.0.fetch_max(unix_ms(), Ordering::Relaxed);
    }

    /// Unix milliseconds of the last word from the primary; 0 before the first.
    pub fn at_ms(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Counters the pipeline advances and the engine reads for `status()`.
#[derive(Debug, Default)]
pub struct Progress {
    /// When the bootstrap last heard from the primary (its answers, its copy's rows).
    pub heard: SourceHeard,
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

/// Counters the engine shows in `status()`.
#[derive(Debug, Default)]
pub struct StreamProgress {
    /// When the stream (or a rebuild it waits for) last heard from the primary.
    pub heard: SourceHeard,
    /// Source transactions applied since the stream started.
    pub transactions: std::sync::atomic::AtomicU64,
    /// Store commits that applied source transactions since the stream started (small
    /// transactions arriving together share one).
    pub transaction_commits: std::sync::atomic::AtomicU64,
    /// Row changes applied since the stream started.
    pub changes: std::sync::atomic::AtomicU64,
    /// Row changes received from the primary since the stream started, those of
    /// transactions skipped as already applied included. Unlike the applied LSN it moves
    /// inside a large source transaction.
    pub received: std::sync::atomic::AtomicU64,
    /// Row changes written into the open store transaction and not committed yet: a large
    /// source transaction counts up here until its commit; 0 between transactions.
    pub uncommitted: std::sync::atomic::AtomicU64,
    /// WAL the primary keeps for the slot (`pg_current_wal_lsn() - restart_lsn`), bytes,
    /// as of the last slot check (every 10 s while streaming).
    pub retained_wal_bytes: std::sync::atomic::AtomicU64,
    /// The primary's `pg_current_wal_lsn()` at the last slot check; 0 before the first.
    pub primary_head_lsn: std::sync::atomic::AtomicU64,
    /// Bucket ops the applier committed (op id advance per commit, CLEARs included).
    pub ops: std::sync::atomic::AtomicU64,
    /// From the arrival of a transaction's Commit message to its checkpoint's publish.
    pub publish_latency: Histogram,
    /// Transactions received and not published yet (for the lag in seconds).
    pub pending: PendingCommits,
    /// Write-checkpoint requests the applier removed as old (`expiry`).
    pub write_checkpoints_expired: std::sync::atomic::AtomicU64,
    /// Tables being copied again now (their columns changed in a way the rules see).
    pub recopying: std::sync::atomic::AtomicU64,
    /// Tables the rules read that are gone from the primary under their name (their rows
    /// left the buckets).
    pub tables_gone: std::sync::atomic::AtomicU64,
    /// Tables the rules read that are missing under their name and still served (gone
    /// after [`crate::GONE_AFTER`]).
    pub tables_missing: std::sync::atomic::AtomicU64,
    /// The re-copies in progress, as of the last published checkpoint.
    pub recopies: parking_lot::Mutex<Vec<RecopyProgress>>,
    /// The rebuild from a new slot in progress (`rebuilding`).
    pub rebuild: parking_lot::Mutex<Option<RebuildProgress>>,
    /// The slot was lost and the store is being rebuilt from a new one: what it serves is
    /// stale until the rebuild ends.
    pub rebuilding: std::sync::atomic::AtomicBool,
    /// The last rebuild that completed since the stream started: why, when, how long.
    pub last_rebuild: parking_lot::Mutex<Option<RebuildDone>>,
}

impl StreamProgress {
    /// What moves while the stream works, also inside one large source transaction:
    /// changes received, changes applied, uncommitted changes, transactions applied.
    pub fn activity(&self) -> [u64; 4] {
        use std::sync::atomic::Ordering::Relaxed;
        [
            self.received.load(Relaxed),
            self.changes.load(Relaxed),
            self.uncommitted.load(Relaxed),
            self.transactions.load(Relaxed),
        ]
    }
}

/// A re-copy as `status()` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecopyProgress {
    /// The table (`schema.name`).
    pub table: String,
    /// Why it is copied again.
    pub why: String,
    /// Unix seconds of its start.
    pub started_at: u64,
    /// Copied rows merged so far.
    pub rows_merged: u64,
    /// Of those, rows written because their output changed.
    pub rows_written: u64,
    /// How much the store's file grew since it started, bytes.
    pub extra_file_bytes: u64,
}

/// A rebuild from a new slot that completed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebuildDone {
    /// What happened to the old slot.
    pub why: String,
    /// Unix seconds of its end.
    pub finished_at: u64,
    /// How long it took, milliseconds.
    pub millis: u64,
    /// Rows copied from the new slot's snapshot.
    pub rows: u64,
}

/// A rebuild from a new slot as `status()` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RebuildProgress {
    /// What happened to the old slot.
    pub why: String,
    /// Unix seconds of its start.
    pub started_at: u64,
    /// Tables the rules read.
    pub tables_total: u64,
    /// Tables copied and merged.
    pub tables_done: u64,
    /// Copied rows merged so far.
    pub rows_merged: u64,
    /// The planner's estimate of the rows to copy (0: unknown).
    pub rows_estimated: u64,
    /// Of those, rows written because their output changed.
    pub rows_written: u64,
    /// How much the store's file grew since it started, bytes.
    pub extra_file_bytes: u64,
}
