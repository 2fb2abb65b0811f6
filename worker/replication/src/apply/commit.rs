//! Committing the applier's store transactions and publishing them: source transactions
//! applied in one store commit (a few small ones that are queued may share it), then the
//! checkpoint published to clients and the primary told the WAL is flushed — or, while a
//! re-copy holds the store's writes, nothing published until its merge is written, and
//! then everything since at once.

use std::time::Instant;

use super::{Applier, COMPACT_AFTER_OPS, GROUP_ROWS};
use crate::change::Change;
use crate::error::{stream_error, ReplicationError};
use crate::handoff::ChangeReceiver;
use crate::progress::RecopyProgress;
use crate::table::StreamTable;
use store::{Checkpoint, Store};

impl Applier {
    /// Applies the transaction just begun and any queued ones after it in one commit.
    /// Returns a change read ahead that belongs to the next round.
    pub(super) fn apply_group(
        &mut self,
        input: &mut ChangeReceiver,
        first_commit_lsn: u64,
    ) -> Result<Option<Change>, ReplicationError> {
        use std::sync::atomic::Ordering::Relaxed;
        let durable_lsn = self.applied.lsn;
        let mut sweep = std::mem::take(&mut self.sweep);
        let mut tables = std::mem::take(&mut self.tables);
        let mut merges = std::mem::take(&mut self.merges);
        let mut commit_lsn = first_commit_lsn;
        let this = &*self;
        let ((held, commit_times, changes, marked), checkpoint) =
            self.store.write_with(durable_lsn, |w| {
                let mut changes = 0u64;
                // When each transaction's Commit arrived.
                let mut commit_times: Vec<Instant> = Vec::new();
                let mut marked = false;
                loop {
                    if marked {
                        // The previous transaction's compactions, before this one's changes.
                        w.compact_marked()?;
                    }
                    loop {
                        let change = input.blocking_recv().ok_or_else(|| {
                            stream_error("the replication stream ended inside a transaction".into())
                        })?;
                        match change {
                            Change::Commit { end_lsn, received } => {
                                // Decided per source transaction, whatever the grouping.
                                marked = w.compact_due(COMPACT_AFTER_OPS)?;
                                w.set_lsn(end_lsn);
                                commit_times.push(received);
                                break;
                            }
                            Change::Begin { .. } | Change::Advance { .. } => {
                                return Err(stream_error(
                                    "the replication stream nested a transaction".into(),
                                ))
                            }
                            mut change => {
                                changes += this.apply(
                                    w,
                                    &mut tables,
                                    &mut merges,
                                    commit_lsn,
                                    &mut change,
                                )?;
                                input.spent(change);
                                this.progress.uncommitted.store(changes, Relaxed);
                            }
                        }
                    }
                    // More transactions join while the commit would come too soon
                    // after the last one (`GROUP_WINDOW`).
                    let next = match this.published_at {
                        Some(at) if changes < GROUP_ROWS => {
                            input.recv_until(at + this.group_window)
                        }
                        _ => input.try_recv(),
                    };
                    let held = match next {
                        Some(Change::Begin { commit_lsn: next })
                            if changes < GROUP_ROWS && next >= durable_lsn =>
                        {
                            commit_lsn = next;
                            continue;
                        }
                        other => other,
                    };
                    sweep.run(w, durable_lsn, &this.progress)?;
                    return Ok((held, commit_times, changes, marked));
                }
            })?;
        self.sweep = sweep;
        self.tables = tables;
        self.merges = merges;
        self.progress.uncommitted.store(0, Relaxed);
        self.progress
            .transactions
            .fetch_add(commit_times.len() as u64, Relaxed);
        self.progress.transaction_commits.fetch_add(1, Relaxed);
        self.progress.changes.fetch_add(changes, Relaxed);
        self.publish(checkpoint)?;
        for received in commit_times {
            self.progress.publish_latency.observe(received.elapsed());
        }
        if marked {
            // Clients have the transactions; the compactions they made due follow in a
            // write of their own (the store runs them first in every write).
            let ((), checkpoint) = self.store.write(checkpoint.lsn, |_| Ok(()))?;
            self.publish(checkpoint)?;
        }
        Ok(held)
    }

    /// After a write: clients may see it, and the primary may recycle the WAL — unless
    /// the store holds writes for a re-copy that is not merged yet. The write that merges
    /// the last such re-copy releases them: clients see every transaction applied since
    /// the hold began, and the re-copied tables' new outputs, in one checkpoint.
    pub(super) fn publish(&mut self, written: Checkpoint) -> Result<(), ReplicationError> {
        self.applied = written;
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
