//! The applier: one thread that turns decoded source changes into store writes.
//!
//! Each source transaction is applied in one MDBX write transaction (a few small ones that
//! are already queued may share it, and this service's logical messages between them:
//! `group`), committed durably with the transaction's end LSN, then published as a
//! checkpoint, and only then acknowledged to the primary as flushed. Other tools' logical
//! messages only move the position: it is stored with the next write, or at most
//! [`PASS_EVERY`] after the last one when nothing else comes, so they cost no durable
//! commit each and the slot still confirms them. While a table's re-copy changes what
//! clients see of it, the store holds the writes (`Store::hold`): they go into one MDBX
//! transaction, committed, published and acknowledged at once when the copy is merged
//! (`commit::publish`). A transaction whose commit LSN is below the stored LSN was applied
//! before a restart and is skipped, so redelivery is harmless. A huge transaction stays one
//! MDBX transaction: libmdbx spills its dirty pages and the writer writes its ops out in
//! slices, so memory stays bounded.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_walstream::SharedLsnFeedback;
use tokio::sync::watch;

use crate::change::Change;
use crate::error::{stream_error, ReplicationError};
use crate::expiry::Sweep;
use crate::handoff::ChangeReceiver;
use crate::merge::Merge;
use crate::progress::StreamProgress;
use crate::recopy::Handover;
use crate::table::StreamTable;
use rules::SyncRules;
use store::{Checkpoint, Store};

mod commit;
mod group;
mod merging;
mod rows;

/// Source transactions share one store commit while this few rows were applied in it.
const GROUP_ROWS: u64 = 4096;
/// A store commit that would follow the last one within this long waits that long for
/// more source transactions to join it ([`StreamContext::group_window`]): under many
/// small transactions a durable commit (its page writes and sync, most of a small
/// transaction's CPU) is shared instead of made per transaction, and none waits longer
/// than this for it; a transaction arriving after a quiet spell commits at once.
///
/// [`StreamContext::group_window`]: crate::StreamContext::group_window
pub const GROUP_WINDOW: Duration = Duration::from_millis(5);
/// A position only other tools' logical messages moved is stored (and confirmed to the
/// primary) this long after the last write at most, in a write of its own when nothing
/// else comes: a heartbeat emitted every millisecond costs one durable commit a second,
/// not a thousand. The slot's confirmed position lags it that much at most, and never
/// passes what the store holds (`PSM_R2007` checks that at every start).
const PASS_EVERY: Duration = Duration::from_secs(1);
/// A bucket is CLEAR-compacted once this many of its ops became superseded or REMOVEs.
const COMPACT_AFTER_OPS: u64 = 1024;

/// Everything the applier thread owns.
pub(super) struct Applier {
    pub store: Arc<Store>,
    pub rules: Arc<SyncRules>,
    pub tables: Vec<StreamTable>,
    /// The checkpoint of the last write: durable, unless the store holds writes.
    pub applied: Checkpoint,
    /// The last checkpoint published to clients (and acknowledged to the primary).
    pub visible: Checkpoint,
    pub published: watch::Sender<Checkpoint>,
    pub feedback: Arc<SharedLsnFeedback>,
    pub progress: Arc<StreamProgress>,
    /// The sweep of old write-checkpoint requests.
    pub sweep: Sweep,
    /// Re-copies in progress, by table index.
    pub merges: HashMap<usize, Merge>,
    /// Re-copy batches handed over and not merged yet.
    pub handover: Arc<Handover>,
    /// When the last durable write was published (`None` before the first).
    pub published_at: Option<Instant>,
    /// [`GROUP_WINDOW`] or a test's.
    pub group_window: Duration,
    /// Where other tools' logical messages moved the position beyond the last write (not
    /// stored yet: [`PASS_EVERY`]).
    pub passing: Option<u64>,
}

impl Applier {
    /// Applies changes until the input closes (the stream ended; an open transaction is
    /// abandoned and will be redelivered) or an error.
    pub fn run(mut self, mut input: ChangeReceiver) -> Result<(), ReplicationError> {
        if self.merges.values().any(Merge::holds) {
            // A re-copy a restart interrupted: clients see nothing new until it is merged.
            self.store.hold()?;
        }
        let mut held = None;
        loop {
            let next = match held.take() {
                Some(change) => change,
                None => match self.receive(&mut input) {
                    Some(change) => change,
                    None => return Ok(()),
                },
            };
            match next {
                message @ Change::Advance { lsn, .. } if lsn > self.applied.lsn => {
                    held = self.apply_group(&mut input, message)?;
                }
                Change::Advance { .. } => {}
                Change::Passed { lsn } => {
                    self.passing = Some(lsn).filter(|&lsn| lsn > self.applied.lsn);
                    let due = self
                        .published_at
                        .is_none_or(|at| at.elapsed() >= PASS_EVERY);
                    if self.passing.is_some() && due {
                        held = self.apply_group(&mut input, Change::Passed { lsn })?;
                    }
                }
                Change::Begin { commit_lsn } if commit_lsn < self.applied.lsn => {
                    // A table it starts following is followed still: the stream numbers
                    // the tables after it.
                    for added in skip_transaction(&mut input)? {
                        self.apply_between(added)?;
                    }
                    self.progress.pending.published(self.visible.lsn);
                }
                begin @ Change::Begin { .. } => held = self.apply_group(&mut input, begin)?,
                relation @ (Change::Relation { .. }
                | Change::Gone { .. }
                | Change::Added { .. }) => self.apply_between(relation)?,
                Change::Recopy(event) => self.merge(event)?,
                other => {
                    return Err(stream_error(format!(
                        "the replication stream sent {other:?} outside a transaction"
                    )))
                }
            }
        }
    }

    /// The next change; `None` once the input closed. While a position other tools'
    /// messages moved waits to be stored, waits until [`PASS_EVERY`] after the last write
    /// at most, and then returns that position as a change of its own.
    fn receive(&self, input: &mut ChangeReceiver) -> Option<Change> {
        let Some(lsn) = self.passing else {
            return input.blocking_recv();
        };
        let due = self
            .published_at
            .map_or_else(Instant::now, |at| at + PASS_EVERY);
        input
            .recv_until(due)
            .or_else(|| (Instant::now() >= due).then_some(Change::Passed { lsn }))
    }
}

impl Applier {
    /// Applies a change of a table's shape that came between transactions, in a store
    /// commit of its own.
    fn apply_between(&mut self, mut change: Change) -> Result<(), ReplicationError> {
        let lsn = self.applied.lsn;
        let mut tables = std::mem::take(&mut self.tables);
        let mut merges = std::mem::take(&mut self.merges);
        let written = self.store.write_with(lsn, |w| {
            self.apply(w, &mut tables, &mut merges, lsn, &mut change)
        });
        (self.tables, self.merges) = (tables, merges);
        self.publish(written?.1)
    }
}

impl Drop for Applier {
    /// Writes the store holds for a re-copy that did not end go: the store stays as the
    /// last checkpoint clients saw, and the next stream starts again from there.
    fn drop(&mut self) {
        if self.store.is_held() {
            if let Err(e) = self.store.abandon() {
                tracing::warn!("abandoning the held writes of a re-copy: {e}");
            }
        }
    }
}

/// Drops the changes of a transaction that is already in the store; returns the tables
/// the stream started following in it, to be added all the same (the stream numbers the
/// tables after them).
fn skip_transaction(input: &mut ChangeReceiver) -> Result<Vec<Change>, ReplicationError> {
    let mut added = Vec::new();
    loop {
        match input.blocking_recv() {
            Some(Change::Commit { .. }) | None => return Ok(added),
            Some(change @ Change::Added { .. }) => added.push(change),
            Some(_) => {}
        }
    }
}
