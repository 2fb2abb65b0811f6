//! Publishing the applier's store commits (`group` makes them): the checkpoint published to
//! clients and the primary told the WAL is flushed — or, while a re-copy holds the store's
//! writes, nothing published until its merge is written, and then everything since at once.

use std::time::Instant;

use super::Applier;
use crate::error::ReplicationError;
use crate::progress::RecopyProgress;
use crate::table::StreamTable;
use store::{Checkpoint, Store};

impl Applier {
    /// After a write: clients may see it, and the primary may recycle the WAL — unless
    /// the store holds writes for a re-copy that is not merged yet. The write that merges
    /// the last such re-copy releases them: clients see every transaction applied since
    /// the hold began, and the re-copied tables' new outputs, in one checkpoint.
    pub(super) fn publish(&mut self, written: Checkpoint) -> Result<(), ReplicationError> {
        self.applied = written;
        self.passing = self.passing.filter(|&lsn| lsn > written.lsn);
        // Counted before the checkpoint is sent: whoever wakes on it reads this commit's
        // (a deploy waits for its re-copies so).
        self.show_recopies();
        if self.store.is_held() {
            if self.merges.values().any(crate::merge::Merge::holds) {
                return Ok(());
            }
            let released = self.store.release()?.unwrap_or(written);
            tracing::info!(
                lsn = %source::format_lsn(released.lsn),
                "the re-copied tables' new outputs and the transactions applied meanwhile \
                 are published in one checkpoint"
            );
            self.applied = released;
        }
        let checkpoint = self.applied;
        let ops = ops_between(&self.store, self.visible.op_id, checkpoint.op_id);
        self.progress
            .ops
            .fetch_add(ops, std::sync::atomic::Ordering::Relaxed);
        self.visible = checkpoint;
        self.published.send_replace(checkpoint);
        self.published_at = Some(Instant::now());
        self.feedback.update_flushed_lsn(checkpoint.lsn);
        self.feedback.update_applied_lsn(checkpoint.lsn);
        self.progress.pending.published(checkpoint.lsn);
        Ok(())
    }

    /// The re-copies in progress and the tables gone, for `status()` and a deploy.
    fn show_recopies(&self) {
        self.progress.recopying.store(
            self.merges.len() as u64,
            std::sync::atomic::Ordering::Release,
        );
        self.progress.tables_gone.store(
            self.tables.iter().filter(|t| t.gone).count() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        let mut shown = self.progress.recopies.lock();
        if !self.merges.is_empty() || !shown.is_empty() {
            let file_bytes = self.store.file_bytes();
            let mut now: Vec<RecopyProgress> = self
                .merges
                .iter()
                .map(|(&index, merge)| {
                    let table = self.tables.get(index).map(StreamTable::qualified);
                    merge.progress(table.unwrap_or_default(), file_bytes)
                })
                .collect();
            now.sort_by(|a, b| a.table.cmp(&b.table));
            *shown = now;
        }
    }
}

/// Ops given out between two checkpoints' op ids (a fork of the history skips ids:
/// `store::forks`).
fn ops_between(store: &Store, from: u64, to: u64) -> u64 {
    if to.saturating_sub(from) < store::forks::MIN_JUMP {
        return to.saturating_sub(from);
    }
    store
        .read(|view| view.forks())
        .map_or(0, |forks| forks.given_out(from, to))
}
