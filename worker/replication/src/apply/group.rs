//! Grouping the applier's input into store commits: a source transaction, or a logical
//! message of this service, and what is queued behind it — more source transactions,
//! more messages, positions other tools' messages passed — go into one MDBX write,
//! applied in their order and committed once. A write-checkpoint note or a sync point
//! therefore costs no durable commit of its own when others are queued beside it, and a
//! fleet's notes or many small transactions are bounded by the queue, not the fsync rate.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::{Applier, COMPACT_AFTER_OPS, GROUP_ROWS};
use crate::change::{Change, WriteCheckpointNote};
use crate::error::{stream_error, ReplicationError};
use crate::handoff::ChangeReceiver;
use crate::merge::Merge;
use crate::table::StreamTable;
use store::{StoreError, WriteTxn};

/// What one store commit of the applier collected.
struct Group {
    /// The LSN of the last store write: transactions that commit below it are skipped.
    started: u64,
    /// The LSN the write commits with: the last transaction's end or message's position.
    lsn: u64,
    /// Row changes applied.
    changes: u64,
    /// Messages that moved [`Self::lsn`].
    messages: u64,
    /// When each source transaction's Commit arrived.
    commit_times: Vec<Instant>,
    /// The last transaction made compactions due: they run before the next one's changes,
    /// or in a write of their own after the group (clients see the transaction first).
    marked: bool,
}

/// What follows a group's last member.
enum Joining {
    /// The next member.
    Joins(Change),
    /// The group ends, with the change read ahead for the next round, if any.
    Ends(Option<Change>),
}

impl Group {
    fn new(lsn: u64) -> Self {
        Self {
            started: lsn,
            lsn,
            changes: 0,
            messages: 0,
            commit_times: Vec::new(),
            marked: false,
        }
    }

    /// Rows, transactions and messages in it: it takes no more once this reaches
    /// [`GROUP_ROWS`].
    fn size(&self) -> u64 {
        self.changes + self.messages + self.commit_times.len() as u64
    }

    /// A message at `lsn`: the position moves there and the write-checkpoint note it
    /// carries is recorded — unless the group is past it already (a message delivered
    /// again after a restart), as a write of its own would not have moved back.
    fn pass(
        &mut self,
        w: &mut WriteTxn<'_, '_>,
        lsn: u64,
        note: Option<&WriteCheckpointNote>,
    ) -> Result<(), StoreError> {
        if lsn <= self.lsn {
            return Ok(());
        }
        if let Some(note) = note {
            note.record(w)?;
        }
        w.set_lsn(lsn);
        self.lsn = lsn;
        self.messages += 1;
        Ok(())
    }
}

impl Applier {
    /// Applies `first` (a transaction's Begin, or a message between transactions) and what
    /// is queued after it in one commit. Returns a change read ahead that belongs to the
    /// next round.
    pub(super) fn apply_group(
        &mut self,
        input: &mut ChangeReceiver,
        first: Change,
    ) -> Result<Option<Change>, ReplicationError> {
        let durable_lsn = self.applied.lsn;
        let mut sweep = std::mem::take(&mut self.sweep);
        let mut tables = std::mem::take(&mut self.tables);
        let mut merges = std::mem::take(&mut self.merges);
        let this = &*self;
        let written = self.store.write_with(durable_lsn, |w| {
            let mut group = Group::new(durable_lsn);
            let mut next = first;
            loop {
                match next {
                    Change::Begin { commit_lsn } => {
                        if group.marked {
                            // The previous transaction's compactions, before this one's changes.
                            w.compact_marked()?;
                        }
                        let parts = (&mut tables, &mut merges);
                        this.apply_transaction(w, input, parts, commit_lsn, &mut group)?;
                    }
                    Change::Advance {
                        lsn,
                        write_checkpoint,
                    } => group.pass(w, lsn, write_checkpoint.as_ref())?,
                    Change::Passed { lsn } => group.pass(w, lsn, None)?,
                    other => {
                        return Err(stream_error(format!(
                            "a store commit began with {other:?} (a bug)"
                        )))
                    }
                }
                match this.joining(input, &group) {
                    Joining::Joins(change) => next = change,
                    Joining::Ends(held) => {
                        sweep.run(w, durable_lsn, &this.progress)?;
                        return Ok((held, group));
                    }
                }
            }
        });
        (self.sweep, self.tables, self.merges) = (sweep, tables, merges);
        let ((held, group), checkpoint) = written?;
        self.progress.uncommitted.store(0, Relaxed);
        if !group.commit_times.is_empty() {
            self.progress
                .transactions
                .fetch_add(group.commit_times.len() as u64, Relaxed);
            self.progress.transaction_commits.fetch_add(1, Relaxed);
            self.progress.changes.fetch_add(group.changes, Relaxed);
        }
        self.publish(checkpoint)?;
        for received in group.commit_times {
            self.progress.publish_latency.observe(received.elapsed());
        }
        if group.marked {
            // Clients have the transactions; the compactions they made due follow in a
            // write of their own (the store runs them first in every write).
            let ((), checkpoint) = self.store.write(checkpoint.lsn, |_| Ok(()))?;
            self.publish(checkpoint)?;
        }
        Ok(held)
    }

    /// Applies the changes of the source transaction committing at `commit_lsn`, up to its
    /// Commit, into `w`.
    fn apply_transaction(
        &self,
        w: &mut WriteTxn<'_, '_>,
        input: &mut ChangeReceiver,
        (tables, merges): (&mut Vec<StreamTable>, &mut HashMap<usize, Merge>),
        commit_lsn: u64,
        group: &mut Group,
    ) -> Result<(), ReplicationError> {
        loop {
            let change = input.blocking_recv().ok_or_else(|| {
                stream_error("the replication stream ended inside a transaction".into())
            })?;
            match change {
                Change::Commit { end_lsn, received } => {
                    // Decided per source transaction, whatever the grouping.
                    group.marked = w.compact_due(COMPACT_AFTER_OPS)?;
                    w.set_lsn(end_lsn);
                    group.lsn = end_lsn;
                    group.commit_times.push(received);
                    return Ok(());
                }
                Change::Begin { .. } | Change::Advance { .. } | Change::Passed { .. } => {
                    return Err(stream_error(
                        "the replication stream nested a transaction".into(),
                    ))
                }
                mut change => {
                    group.changes += self.apply(w, tables, merges, commit_lsn, &mut change)?;
                    input.spent(change);
                    self.progress.uncommitted.store(group.changes, Relaxed);
                }
            }
        }
    }

    /// The next change that joins `group`: a transaction or a message queued behind it,
    /// while the group is smaller than [`GROUP_ROWS`] (waiting for one while the commit
    /// would follow the last within the group window, [`super::GROUP_WINDOW`]). Else the
    /// change read ahead, if any, for the next round.
    fn joining(&self, input: &mut ChangeReceiver, group: &Group) -> Joining {
        if group.size() >= GROUP_ROWS {
            return Joining::Ends(None);
        }
        let next = match self.published_at {
            Some(at) => input.recv_until(at + self.group_window),
            None => input.try_recv(),
        };
        match next {
            Some(Change::Begin { commit_lsn }) if commit_lsn >= group.started => {
                Joining::Joins(Change::Begin { commit_lsn })
            }
            Some(message @ (Change::Advance { .. } | Change::Passed { .. })) => {
                Joining::Joins(message)
            }
            other => Joining::Ends(other),
        }
    }
}
