//! The applier: one thread that turns decoded source changes into store writes.
//!
//! Each source transaction is applied in one MDBX write transaction (a few small ones
//! that are already queued may share it), committed durably with the transaction's end
//! LSN, then published as a checkpoint, and only then acknowledged to the primary as
//! flushed. A transaction whose commit LSN is below the stored LSN was applied before a
//! restart and is skipped, so redelivery is harmless. A huge transaction stays one MDBX
//! transaction: libmdbx spills its dirty pages and the writer writes its ops out in
//! slices, so memory stays bounded.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::borrow::Cow;

use pg_walstream::SharedLsnFeedback;
use tokio::sync::watch;

use super::expiry::Sweep;
use super::handoff::ChangeReceiver;
use super::intent::{BootstrapIntent, IntentTable};
use super::merge::{Merge, RebuildProgress, RecopyProgress};
use super::prepare::PreparedRow;
use super::recopy::{Handover, RecopyEvent};
use super::toast::stash_for;
use super::ReplicationError;
use crate::store_input::StoreInput;
use metrics::{Histogram, PendingCommits};
use rules::{
    PgType, RowEvaluation, RulesError, SlotBinding, SourceColumn, SourceRow, SyncRules, TablePlan,
};
use smallvec::SmallVec;
use source::{ColumnMeta, Tuple, Value};
use store::{identity_key, Checkpoint, Stash, Store, WriteTxn};

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
/// A bucket is CLEAR-compacted once this many of its ops became superseded or REMOVEs.
const COMPACT_AFTER_OPS: u64 = 1024;

/// A decoded source change, addressed to a table by its index in the applier's list.
#[derive(Debug)]
pub(super) enum Change {
    /// A source transaction starts; `commit_lsn` is where it commits.
    Begin {
        commit_lsn: u64,
    },
    /// Row changes carry their tuples with values in the table's column order, and the
    /// new row evaluated and packed when the stream's task could (`prepare`).
    Insert {
        table: usize,
        new: Tuple,
        prepared: Option<Box<PreparedRow>>,
    },
    Update {
        table: usize,
        /// Boxed: most updates have none (their key did not change), and a change is moved
        /// several times on its way to the store.
        old: Option<Box<Tuple>>,
        new: Tuple,
        prepared: Option<Box<PreparedRow>>,
    },
    Delete {
        table: usize,
        old: Tuple,
    },
    Truncate {
        tables: Vec<usize>,
    },
    /// From here on the table's rows come with these columns (a Relation message that
    /// added, dropped, renamed or retyped columns). `recopy`: a column the rules read
    /// changed, so the table's rows are copied again (see `merge`).
    Relation {
        table: usize,
        oid: u32,
        /// The replica identity columns, in key order.
        identity: Vec<String>,
        columns: Vec<ColumnMeta>,
        recopy: bool,
        /// The replica identity changed: the one the stored rows are keyed by.
        rekey_from: Vec<String>,
        /// Why the table is copied again (empty without `recopy`).
        why: String,
    },
    /// The table is gone from the primary under its name (renamed, dropped, or out of the
    /// publication): its rows leave the buckets; a table published under its name again
    /// comes as a `Relation` with `recopy`.
    Gone {
        table: usize,
    },
    /// A table's re-copy, between transactions (see `recopy`).
    Recopy(RecopyEvent),
    /// The transaction ends; the store commits with `end_lsn`. `received` is when the
    /// Commit message arrived from the primary.
    Commit {
        end_lsn: u64,
        received: Instant,
    },
    /// Every source transaction that commits below `lsn` was delivered (a logical message
    /// outside any transaction): the checkpoint's LSN may move up with no new ops.
    Advance {
        lsn: u64,
        /// The message was a write-checkpoint request made on any replica of the primary
        /// (`WriteCheckpointNote`): recorded here too.
        write_checkpoint: Option<WriteCheckpointNote>,
    },
}

/// A write-checkpoint request as the replica that answered it announces it to every
/// replica of the primary: a logical message (prefix `powersync`) with the content
/// `write-checkpoint <record key> <LSN> [<id>]` (the id when it is not the LSN: a
/// checkpoint request's). The record key is the SHA-256 of the user and client ids
/// (`service::write_checkpoint::record_key`), never the ids themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteCheckpointNote {
    /// The stage-record key (`write_checkpoint/` and 64 hex digits).
    pub key: String,
    /// The LSN asked for, at most the message's own LSN: a forged message can only
    /// make a request wait for what is already applied when it is.
    pub lsn: u64,
    /// The id reported once `lsn` is reached.
    pub id: u64,
}

impl WriteCheckpointNote {
    /// The note a message's `content` at `message_lsn` carries; `None` for any other
    /// message, or a key that is not a write-checkpoint record's.
    pub fn parse(content: &[u8], message_lsn: u64) -> Option<Self> {
        let text = std::str::from_utf8(content).ok()?;
        let mut words = text.strip_prefix("write-checkpoint ")?.split(' ');
        let (key, lsn) = (words.next()?, words.next()?.parse::<u64>().ok()?);
        let id = match words.next() {
            Some(id) => id.parse::<u64>().ok()?,
            None => lsn,
        };
        let digest = key.strip_prefix(store::WRITE_CHECKPOINT_PREFIX)?;
        let valid = words.next().is_none()
            && digest.len() == 64
            && digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        valid.then(|| Self {
            key: key.to_owned(),
            lsn: lsn.min(message_lsn),
            id,
        })
    }

    /// Records it in `w`'s transaction unless a request of the same key with this id or
    /// a later one, for this LSN or a later one, is stored already.
    fn record(&self, w: &store::WriteTxn<'_, '_>) -> Result<(), store::StoreError> {
        let stored = w
            .stage_record(&self.key)?
            .and_then(|v| store::WriteCheckpointRecord::decode(&v));
        if stored.is_some_and(|s| s.id >= self.id && s.lsn >= self.lsn) {
            return Ok(());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (lsn, id) = stored.map_or((self.lsn, self.id), |s| {
            (s.lsn.max(self.lsn), s.id.max(self.id))
        });
        w.put_stage_record(
            &self.key,
            &store::WriteCheckpointRecord::encode_with_id(lsn, now, id),
        )
    }
}

impl Change {
    /// True for the changes of rows (what `StreamProgress::received` counts).
    pub(super) fn is_row_change(&self) -> bool {
        matches!(
            self,
            Self::Insert { .. } | Self::Update { .. } | Self::Delete { .. } | Self::Truncate { .. }
        )
    }
}

/// Counters the engine shows in `status()`.
#[derive(Debug, Default)]
pub struct StreamProgress {
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

/// A table as the stream applies it.
#[derive(Debug, Clone)]
pub(super) struct StreamTable {
    pub store_id: u32,
    /// OID on the primary.
    pub oid: u32,
    /// Replica identity column names (as the snapshot saw them).
    pub identity_names: Vec<String>,
    pub schema: String,
    pub name: String,
    /// The columns rows come with now (the snapshot's, then each Relation message's).
    pub columns: Vec<ColumnMeta>,
    types: Vec<PgType>,
    /// Indices (into `columns`) of the replica identity, in key order.
    identity: Vec<usize>,
    /// Per column: whether the rules read it (a value of a column they do not read
    /// cannot change their output).
    reads: Vec<bool>,
    /// The rules' plan for the table bound to `columns`, made once per shape (`None`:
    /// the rules ignore the table).
    plan: Option<Arc<BoundPlan>>,
    /// Gone from the primary under its name (see [`IntentTable::gone`]).
    pub gone: bool,
}

/// A table's plan with its column slots bound to one column layout: a row is evaluated
/// without matching names per row.
#[derive(Debug)]
struct BoundPlan {
    plan: TablePlan,
    binding: SlotBinding,
}

impl StreamTable {
    /// The table from the bootstrap record; `None` when the record predates column
    /// tracking or names an identity column the table lacks.
    pub fn from_intent(table: &IntentTable, rules: &SyncRules) -> Option<Self> {
        if table.columns.is_empty() || table.identity.is_empty() || table.oid == 0 {
            return None;
        }
        Self {
            store_id: table.id,
            oid: table.oid,
            identity_names: table.identity.clone(),
            schema: table.schema.clone(),
            name: table.name.clone(),
            columns: Vec::new(),
            types: Vec::new(),
            identity: Vec::new(),
            reads: Vec::new(),
            plan: None,
            gone: table.gone,
        }
        .with_columns(table.columns.clone(), rules)
    }

    /// This table with rows of `columns`; `None` when a replica identity column is not
    /// among them.
    pub fn with_columns(&self, columns: Vec<ColumnMeta>, rules: &SyncRules) -> Option<Self> {
        let identity = self
            .identity_names
            .iter()
            .map(|name| columns.iter().position(|c| &c.name == name))
            .collect::<Option<Vec<usize>>>()?;
        let types = columns
            .iter()
            .map(|c| PgType {
                oid: c.type_oid,
                element: c.element_oid.or(PgType::from_oid(c.type_oid).element),
            })
            .collect();
        let plan = rules.plan_for(&self.schema, &self.name);
        let reads = columns
            .iter()
            .map(|c| plan.is_some_and(|p| p.reads_column(&c.name)))
            .collect();
        let plan = plan.map(|plan| {
            Arc::new(BoundPlan {
                binding: plan.bind(columns.iter().map(|c| c.name.as_str())),
                plan: plan.clone(),
            })
        });
        Some(Self {
            columns,
            types,
            identity,
            reads,
            plan,
            ..self.clone()
        })
    }

    /// Evaluates a row of this shape with the rules it was shaped by; `value(i)`: the
    /// value of column `i`, its text checked as UTF-8.
    pub fn evaluate<'v>(
        &self,
        value: impl Fn(usize) -> Option<&'v str>,
    ) -> Result<RowEvaluation, RulesError> {
        let Some(bound) = &self.plan else {
            return Ok(RowEvaluation::default());
        };
        let columns: SmallVec<[SourceColumn<'_>; 16]> = self
            .columns
            .iter()
            .zip(&self.types)
            .enumerate()
            .map(|(i, (c, t))| SourceColumn {
                name: &c.name,
                pg_type: *t,
                value: value(i),
            })
            .collect();
        let row = SourceRow {
            schema: &self.schema,
            table: &self.name,
            columns: &columns,
        };
        bound.plan.evaluate_bound(&bound.binding, &row)
    }

    /// Indices (into `columns`) of the replica identity, in key order.
    pub fn identity_columns(&self) -> &[usize] {
        &self.identity
    }

    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// The table as the source names it.
    pub fn source(&self) -> source::SourceTable {
        source::SourceTable {
            schema: self.schema.clone(),
            name: self.name.clone(),
        }
    }
}

/// Everything the applier thread owns.
pub(super) struct Applier {
    pub store: Arc<Store>,
    pub rules: Arc<SyncRules>,
    pub tables: Vec<StreamTable>,
    /// The last durable checkpoint.
    pub durable: Checkpoint,
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
}

impl Applier {
    /// Applies changes until the input closes (the stream ended; an open transaction is
    /// abandoned and will be redelivered) or an error.
    pub fn run(mut self, mut input: ChangeReceiver) -> Result<(), ReplicationError> {
        let mut held = None;
        loop {
            let next = match held.take() {
                Some(change) => change,
                None => match input.blocking_recv() {
                    Some(change) => change,
                    None => return Ok(()),
                },
            };
            match next {
                Change::Advance {
                    lsn,
                    write_checkpoint,
                } if lsn > self.durable.lsn => {
                    let reached = self.durable.lsn;
                    let ((), checkpoint) = self.store.write(lsn, |w| {
                        if let Some(note) = &write_checkpoint {
                            note.record(w)?;
                        }
                        self.sweep.run(w, reached, &self.progress)
                    })?;
                    self.publish(checkpoint);
                }
                Change::Advance { .. } => {}
                Change::Begin { commit_lsn } if commit_lsn < self.durable.lsn => {
                    skip_transaction(&mut input)?;
                    self.progress.pending.published(self.durable.lsn);
                }
                Change::Begin { commit_lsn } => held = self.apply_group(&mut input, commit_lsn)?,
                mut relation @ (Change::Relation { .. } | Change::Gone { .. }) => {
                    let lsn = self.durable.lsn;
                    let mut tables = std::mem::take(&mut self.tables);
                    let mut merges = std::mem::take(&mut self.merges);
                    let written = self.store.write_with(lsn, |w| {
                        self.apply(w, &mut tables, &mut merges, lsn, &mut relation)
                    });
                    (self.tables, self.merges) = (tables, merges);
                    self.publish(written?.1);
                }
                Change::Recopy(event) => self.merge(event)?,
                other => {
                    return Err(stream_error(format!(
                        "the replication stream sent {other:?} outside a transaction"
                    )))
                }
            }
        }
    }

    /// Applies the transaction just begun and any queued ones after it in one commit.
    /// Returns a change read ahead that belongs to the next round.
    fn apply_group(
        &mut self,
        input: &mut ChangeReceiver,
        first_commit_lsn: u64,
    ) -> Result<Option<Change>, ReplicationError> {
        use std::sync::atomic::Ordering::Relaxed;
        let durable_lsn = self.durable.lsn;
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
        self.publish(checkpoint);
        for received in commit_times {
            self.progress.publish_latency.observe(received.elapsed());
        }
        if marked {
            // Clients have the transactions; the compactions they made due follow in a
            // write of their own (the store runs them first in every write).
            let ((), checkpoint) = self.store.write(checkpoint.lsn, |_| Ok(()))?;
            self.publish(checkpoint);
        }
        Ok(held)
    }

    /// After a durable commit: clients may see it, and the primary may recycle the WAL.
    fn publish(&mut self, checkpoint: Checkpoint) {
        let ops = ops_between(&self.store, self.durable.op_id, checkpoint.op_id);
        self.progress
            .ops
            .fetch_add(ops, std::sync::atomic::Ordering::Relaxed);
        self.durable = checkpoint;
        // Counted before the checkpoint is sent: whoever wakes on it reads this commit's
        // (a deploy waits for its re-copies so).
        self.progress.recopying.store(
            self.merges.len() as u64,
            std::sync::atomic::Ordering::Release,
        );
        self.published.send_replace(checkpoint);
        self.published_at = Some(Instant::now());
        self.feedback.update_flushed_lsn(checkpoint.lsn);
        self.feedback.update_applied_lsn(checkpoint.lsn);
        self.progress.pending.published(checkpoint.lsn);
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

    /// Applies one change of the transaction committing at `commit_lsn`; returns the rows
    /// it touched. A table being re-copied has its changed rows noted (see `merge`).
    /// The change is left to be dropped by the caller (the stream's thread, which made its
    /// buffers: `handoff`).
    fn apply(
        &self,
        w: &mut WriteTxn<'_, '_>,
        tables: &mut [StreamTable],
        merges: &mut HashMap<usize, Merge>,
        commit_lsn: u64,
        change: &mut Change,
    ) -> Result<u64, ReplicationError> {
        let touch = |merges: &mut HashMap<usize, Merge>, index: usize, identity: &[u8]| {
            if let Some(merge) = merges.get_mut(&index) {
                merge.touch(identity, commit_lsn);
            }
        };
        match change {
            Change::Insert {
                table: index,
                new,
                prepared,
            } => {
                let index = *index;
                let table = table_at(tables, index)?;
                let identity = match prepared {
                    Some(prepared) => write_prepared(w, table, prepared)?,
                    None => {
                        let values = values_of(table, new);
                        let filled: Vec<Option<&[u8]>> =
                            values.iter().map(|v| v.as_deref()).collect();
                        self.write_row(w, table, &filled, false)?
                    }
                };
                touch(merges, index, &identity);
                Ok(1)
            }
            Change::Update {
                table: index,
                old,
                new,
                prepared,
            } => {
                let index = *index;
                let table = table_at(tables, index)?;
                let rekey_from = merges.get(&index).map_or(&[][..], |m| m.rekey_from());
                let (old_identity, new_identity) = self.update(
                    w,
                    table,
                    old.as_deref(),
                    new,
                    prepared.as_deref_mut(),
                    rekey_from,
                )?;
                touch(merges, index, &old_identity);
                if let Some(new_identity) = new_identity {
                    touch(merges, index, &new_identity);
                }
                Ok(1)
            }
            Change::Delete { table: index, old } => {
                let index = *index;
                let table = table_at(tables, index)?;
                let values = values_of(table, old);
                let identity = identity_of(table, &values);
                let rekey_from = merges.get(&index).map_or(&[][..], |m| m.rekey_from());
                carry_over(w, table, rekey_from, &[&values], &identity)?;
                w.delete_row(table.store_id, &identity)?;
                touch(merges, index, &identity);
                Ok(1)
            }
            Change::Truncate { tables: truncated } => {
                let mut rows = 0;
                for &mut index in truncated {
                    rows += w.truncate_table(table_at(tables, index)?.store_id)?;
                    if let Some(merge) = merges.get_mut(&index) {
                        merge.truncate(commit_lsn);
                    }
                }
                Ok(rows)
            }
            Change::Relation {
                table: index,
                oid,
                identity,
                columns,
                recopy,
                rekey_from,
                why,
            } => {
                let (index, oid, recopy) = (*index, *oid, *recopy);
                let (identity, columns) = (std::mem::take(identity), std::mem::take(columns));
                let (rekey_from, why) = (std::mem::take(rekey_from), std::mem::take(why));
                rebind(tables, index, oid, identity, columns, &self.rules)?;
                if recopy {
                    // Any re-copy in progress read the old columns: it starts over (rows
                    // not yet moved to their new keys are still under the old ones).
                    let rekey_from = match merges.remove(&index) {
                        Some(running) if rekey_from.is_empty() => running.rekey_from().to_vec(),
                        _ => rekey_from,
                    };
                    let table = table_at(tables, index)?;
                    BootstrapIntent::update_table(w, table.store_id, |t| {
                        t.columns = table.columns.clone();
                        t.identity = table.identity_names.clone();
                        t.oid = table.oid;
                        t.recopy = true;
                        t.rekey_from = rekey_from.clone();
                        t.gone = false;
                    })?;
                    merges.insert(
                        index,
                        Merge::rekeying(rekey_from, why, self.store.file_bytes()),
                    );
                }
                Ok(0)
            }
            Change::Gone { table: index } => {
                let index = *index;
                merges.remove(&index);
                let table = table_at(tables, index)?;
                // When the grace period ended is this replica's own (see `forks`).
                w.diverge();
                let removed = w.truncate_table(table.store_id)?;
                w.converge();
                BootstrapIntent::update_table(w, table.store_id, |t| {
                    t.gone = true;
                    t.recopy = false;
                    t.rekey_from.clear();
                })?;
                tracing::info!(
                    table = %table.qualified(),
                    rows = removed,
                    "the table's rows left the buckets"
                );
                if let Some(table) = tables.get_mut(index) {
                    table.gone = true;
                }
                Ok(removed)
            }
            Change::Begin { .. }
            | Change::Commit { .. }
            | Change::Advance { .. }
            | Change::Recopy(_) => Ok(0),
        }
    }

    /// Merges an event of a table's re-copy, between transactions: each in a store commit
    /// of its own, published as a checkpoint (clients see the rows whose output changed).
    fn merge(&mut self, event: RecopyEvent) -> Result<(), ReplicationError> {
        if matches!(event, RecopyEvent::Rows { .. }) {
            // Its room is free once it is here (merged now, or of a re-copy started over).
            self.handover.merged();
        }
        let index = event.table();
        let Some(mut merge) = self.merges.remove(&index) else {
            return Ok(()); // a re-copy that was started over
        };
        let lsn = self.durable.lsn;
        let result = match event {
            RecopyEvent::Started {
                consistent_point,
                columns,
                ..
            } => {
                let table = table_at(&self.tables, index)?;
                let shape = table.with_columns(columns, &self.rules).ok_or_else(|| {
                    ReplicationError::Stream {
                        code: "PSM_R2002",
                        message: format!(
                            "table {} lost a replica identity column ({}) on the primary; \
                             nothing of the new shape was applied: run SELECT \
                             powersync_mdbx.reset()",
                            table.qualified(),
                            table.identity_names.join(", ")
                        ),
                        operator: true,
                    }
                })?;
                merge.start(consistent_point, shape);
                Ok(None)
            }
            RecopyEvent::Rows {
                rows, unchanged, ..
            } => self
                .store
                .write_with(lsn, |w| merge.rows(w, rows, unchanged))
                .map(|((), checkpoint)| Some(checkpoint)),
            RecopyEvent::Done { .. } => {
                let written = self.store.write_with(lsn, |w| {
                    let merged = merge.finish(w)?;
                    if let Some(shape) = merge.shape() {
                        let columns = shape.columns.clone();
                        BootstrapIntent::update_table(w, shape.store_id, |t| {
                            t.columns = columns;
                            t.recopy = false;
                            t.rekey_from.clear();
                        })?;
                    }
                    Ok::<_, ReplicationError>(merged)
                });
                let (merged, checkpoint) = written?;
                let table = table_at(&self.tables, index)?;
                tracing::info!(
                    table = %table.qualified(),
                    rows = merged.rows,
                    written = merged.written,
                    deleted = merged.deleted,
                    "the table's re-copy is merged: clients got ops only for rows whose output changed"
                );
                self.publish(checkpoint);
                return Ok(());
            }
        };
        self.merges.insert(index, merge);
        if let Some(checkpoint) = result? {
            self.publish(checkpoint);
        }
        Ok(())
    }

    /// Applies an update; returns the row's old identity and its new one when it changed.
    fn update(
        &self,
        w: &mut WriteTxn<'_, '_>,
        table: &StreamTable,
        old: Option<&Tuple>,
        new: &Tuple,
        prepared: Option<&mut PreparedRow>,
        rekey_from: &[String],
    ) -> Result<(Vec<u8>, Option<Vec<u8>>), ReplicationError> {
        let prepared = match (old, prepared) {
            // The key did not change (no old tuple) and the new tuple was complete: the
            // prepared row's identity is the row's, nothing is filled in, and outside a
            // re-keying re-copy nothing is carried over (most rows of a bulk UPDATE).
            (None, Some(prepared)) if rekey_from.is_empty() => {
                return Ok((write_prepared(w, table, prepared)?, None));
            }
            (_, prepared) => prepared,
        };
        let old_values = old.map(|old| values_of(table, old));
        let mut values = values_of(table, new);
        let old_identity = old_identity_of(table, old_values.as_deref(), &values)?;
        let tuples: Vec<&[Presence]> = old_values
            .as_deref()
            .into_iter()
            .chain([&values[..]])
            .collect();
        carry_over(w, table, rekey_from, &tuples, &old_identity)?;
        let used_stash = fill_unchanged(table, old_values.as_deref(), &mut values, || {
            Ok(w.stash(table.store_id, &old_identity)?.unwrap_or_default())
        })?;
        let new_identity = identity_of(table, &values);
        if new_identity != old_identity {
            w.rekey_row(table.store_id, &old_identity, &new_identity)?;
        }
        match prepared {
            // Prepared from a complete new tuple: nothing was filled in above.
            Some(prepared) => {
                write_prepared(w, table, prepared)?;
            }
            None => {
                let filled: Vec<Option<&[u8]>> = values.iter().map(|v| v.as_deref()).collect();
                self.write_row(w, table, &filled, used_stash)?;
            }
        }
        let changed = (new_identity != old_identity).then_some(new_identity);
        Ok((old_identity, changed))
    }

    /// Evaluates a complete row and stores it under its identity, which it returns.
    fn write_row(
        &self,
        w: &mut WriteTxn<'_, '_>,
        table: &StreamTable,
        values: &[Option<&[u8]>],
        used_stash: bool,
    ) -> Result<Vec<u8>, ReplicationError> {
        let row = evaluate_row(table, values, used_stash)?;
        let input = StoreInput::of(&row.eval);
        w.upsert_row_stashed(
            table.store_id,
            &row.identity,
            &input.memberships,
            &input.lookup_puts(),
            row.stash,
        )?;
        Ok(row.identity)
    }
}

/// Stores a row the stream's task evaluated and packed (`prepare`) under its identity,
/// which it returns (taken out of it, as its stash; the rest is dropped with the change).
fn write_prepared(
    w: &mut WriteTxn<'_, '_>,
    table: &StreamTable,
    prepared: &mut PreparedRow,
) -> Result<Vec<u8>, ReplicationError> {
    let PreparedRow { row, packed } = prepared;
    let input = StoreInput::of(&row.eval);
    w.upsert_row_packed(
        table.store_id,
        &row.identity,
        &input.memberships,
        &input.lookup_puts(),
        std::mem::take(&mut row.stash),
        packed,
    )?;
    Ok(std::mem::take(&mut row.identity))
}

/// During a re-copy after the replica identity changed (the stored rows keyed by
/// `rekey_from`): moves the row a change addresses from its old key to `target` (the key
/// the change looks it up by), taking the old identity's values from the first of
/// `tuples` that holds them all; nothing when none does (the re-copy moves or removes the
/// row).
fn carry_over(
    w: &mut WriteTxn<'_, '_>,
    table: &StreamTable,
    rekey_from: &[String],
    tuples: &[&[Presence]],
    target: &[u8],
) -> Result<(), ReplicationError> {
    let Some(columns) = super::merge::key_columns(table, rekey_from) else {
        return Ok(());
    };
    let previous = tuples.iter().find_map(|values| {
        columns
            .iter()
            .map(|&i| {
                values
                    .get(i)
                    .filter(|v| v.is_known())
                    .map(Presence::as_deref)
            })
            .collect::<Option<Vec<Option<&[u8]>>>>()
    });
    if let Some(previous) = previous.map(identity_key) {
        if previous != target {
            w.rekey_row(table.store_id, &previous, target)?;
        }
    }
    Ok(())
}

/// Rows of `tables[index]` come with `columns` (from the table with OID `oid`: another one
/// when the table was dropped and created again) from here on (the decoder's and the
/// applier's copies of the tables both follow Relation changes through it).
pub(super) fn rebind(
    tables: &mut [StreamTable],
    index: usize,
    oid: u32,
    identity: Vec<String>,
    columns: Vec<ColumnMeta>,
    rules: &SyncRules,
) -> Result<(), ReplicationError> {
    let table = table_at(tables, index)?;
    let renamed = StreamTable {
        identity_names: identity,
        ..table.clone()
    };
    let mut rebound = renamed.with_columns(columns, rules).ok_or_else(|| {
        stream_error(format!(
            "a Relation message of {} left out a replica identity column",
            table.qualified()
        ))
    })?;
    rebound.oid = oid;
    rebound.gone = false;
    tables[index] = rebound;
    Ok(())
}

/// [`rebind`] with what a [`Change::Relation`] carries (other changes bind nothing).
pub(super) fn rebind_to(
    tables: &mut [StreamTable],
    change: &Change,
    rules: &SyncRules,
) -> Result<(), ReplicationError> {
    match change {
        Change::Relation {
            table,
            oid,
            identity,
            columns,
            ..
        } => rebind(
            tables,
            *table,
            *oid,
            identity.clone(),
            columns.clone(),
            rules,
        ),
        _ => Ok(()),
    }
}

pub(super) fn table_at(
    tables: &[StreamTable],
    index: usize,
) -> Result<&StreamTable, ReplicationError> {
    tables
        .get(index)
        .ok_or_else(|| stream_error(format!("a change for unknown table #{index}")))
}

/// The key an update addresses: from the old tuple when the key changed (or the table is
/// REPLICA IDENTITY FULL), else from the new one, which must then carry every key column.
pub(super) fn old_identity_of(
    table: &StreamTable,
    old_values: Option<&[Presence]>,
    values: &[Presence],
) -> Result<Vec<u8>, ReplicationError> {
    let new_identity_known = table
        .identity
        .iter()
        .all(|&i| values.get(i).is_some_and(Presence::is_known));
    match old_values {
        Some(old) => Ok(identity_of(table, old)),
        None if new_identity_known => Ok(identity_of(table, values)),
        None => Err(toast_error(table, "a replica identity column")),
    }
}

/// Replaces the update's unchanged TOAST values: from the FULL old tuple, else from the
/// values kept with the stored row (`stored`, read only when needed). Returns whether a
/// kept value was used.
pub(super) fn fill_unchanged<'t>(
    table: &StreamTable,
    old_values: Option<&[Presence<'t>]>,
    values: &mut [Presence<'t>],
    stored: impl FnOnce() -> Result<Stash, ReplicationError>,
) -> Result<bool, ReplicationError> {
    if !values.iter().any(|v| matches!(v, Presence::Unchanged)) {
        return Ok(false);
    }
    let stash = stored()?;
    let mut used_stash = false;
    for (i, (value, column)) in values.iter_mut().zip(&table.columns).enumerate() {
        if !matches!(value, Presence::Unchanged) {
            continue;
        }
        let from_old = old_values
            .and_then(|o| o.get(i))
            .filter(|v| v.is_known())
            .cloned();
        *value = match from_old {
            Some(v) => v,
            None => {
                let kept = stash
                    .iter()
                    .find(|(name, _)| name == &column.name)
                    .map(|(_, v)| Presence::Value(Cow::Owned(v.clone())));
                match kept {
                    Some(value) => {
                        used_stash = true;
                        value
                    }
                    // Not kept (renamed since, say): the rules do not read it, so its
                    // value cannot change what they produce.
                    None if !table.reads.get(i).copied().unwrap_or(true) => Presence::Null,
                    None => return Err(toast_error(table, &column.name)),
                }
            }
        };
    }
    Ok(used_stash)
}

/// A complete row as the store takes it.
#[derive(Debug)]
pub(super) struct EvaluatedRow {
    pub identity: Vec<u8>,
    /// A re-copy after the replica identity changed: the key the row may be stored under.
    pub previous: Option<Vec<u8>>,
    pub eval: RowEvaluation,
    pub stash: Stash,
}

/// Evaluates a complete row (values in the table's column order) with the rules the
/// table was shaped by: its identity, bucket memberships and lookups, and the values kept
/// for later TOAST updates.
pub(super) fn evaluate_row(
    table: &StreamTable,
    values: &[Option<&[u8]>],
    used_stash: bool,
) -> Result<EvaluatedRow, ReplicationError> {
    let texts = values
        .iter()
        .zip(&table.columns)
        .map(|(v, c)| {
            // simdutf8 checks mostly-ASCII text several times faster than `std`.
            v.map(simdutf8::basic::from_utf8)
                .transpose()
                .map_err(|_| RulesError::Row {
                    table: table.qualified(),
                    column: c.name.clone(),
                    message: "value is not valid UTF-8".into(),
                })
        })
        .collect::<Result<SmallVec<[Option<&str>; 16]>, RulesError>>()?;
    let eval = table.evaluate(|i| texts.get(i).copied().flatten())?;
    let value = |i: usize| values.get(i).copied().flatten();
    Ok(EvaluatedRow {
        identity: identity_key(table.identity.iter().map(|&i| value(i))),
        previous: None,
        eval,
        stash: stash_for(&table.columns, value, used_stash),
    })
}

/// One column of a decoded tuple.
#[derive(Debug, Clone)]
pub(super) enum Presence<'t> {
    Null,
    Value(Cow<'t, [u8]>),
    /// pgoutput's "unchanged TOAST value" (the column is absent from the tuple).
    Unchanged,
}

impl Presence<'_> {
    fn is_known(&self) -> bool {
        !matches!(self, Self::Unchanged)
    }

    pub(super) fn as_deref(&self) -> Option<&[u8]> {
        match self {
            Self::Value(b) => Some(b),
            Self::Null | Self::Unchanged => None,
        }
    }
}

/// A tuple's values (already in the table's column order, see the stream's decoder).
pub(super) fn values_of<'t>(table: &StreamTable, tuple: &'t Tuple) -> Vec<Presence<'t>> {
    (0..table.columns.len())
        .map(|i| match tuple.get(i) {
            Value::Null => Presence::Null,
            Value::Unchanged => Presence::Unchanged,
            Value::Bytes(b) => Presence::Value(Cow::Borrowed(b)),
        })
        .collect()
}

pub(super) fn identity_of(table: &StreamTable, values: &[Presence]) -> Vec<u8> {
    identity_key(
        table
            .identity
            .iter()
            .map(|&i| values.get(i).and_then(Presence::as_deref)),
    )
}

/// Drops the changes of a transaction that is already in the store.
fn skip_transaction(input: &mut ChangeReceiver) -> Result<(), ReplicationError> {
    loop {
        match input.blocking_recv() {
            Some(Change::Commit { .. }) => return Ok(()),
            Some(_) => {}
            None => return Ok(()),
        }
    }
}

/// A transient problem of the replication stream (`PSM_R2010`): reconnect and retry.
pub(super) fn stream_error(message: String) -> ReplicationError {
    ReplicationError::Stream {
        code: "PSM_R2010",
        message,
        operator: false,
    }
}

fn toast_error(table: &StreamTable, column: &str) -> ReplicationError {
    ReplicationError::Stream {
        code: "PSM_R2003",
        message: format!(
            "an update of {} left column \"{column}\" out as an unchanged TOAST value, and the \
             store does not hold it; nothing was applied. Set ALTER TABLE {} REPLICA IDENTITY FULL \
             and run SELECT powersync_mdbx.reset(), and please report this",
            table.qualified(),
            table.qualified()
        ),
        operator: true,
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
