//! The data download of one checkpoint (`docs/spec/protocol.md` §5.3): buckets grouped by priority,
//! each group fetched in batches (one short read transaction each, a bounded number of ops across
//! the group's buckets in name order), batches cut into one-bucket chunks, one `data` line per
//! chunk, and a completion line after each group.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use super::error::SyncError;
use super::lines::{DataLine, SyncLine};
use store::{OpKind, OpRead, ReadTxn, Store, StoreError};

/// Paging limits. The op counts are the official service's; the byte bounds keep what
/// one stream holds small (`docs/operations.md` 4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// Most ops one batch (one read transaction) reads across a group's buckets.
    pub batch_ops: usize,
    /// A batch ends once its row data reaches this many bytes (a lower bound: one row can
    /// push it over). A stream holds one batch while its client is slow.
    pub batch_bytes: usize,
    /// Most ops in one `data` line.
    pub chunk_ops: usize,
    /// A `data` line closes once its row data reaches this many bytes (a lower bound: one
    /// row can push it over).
    pub chunk_bytes: usize,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            batch_ops: 1000,
            batch_bytes: 64 << 10,
            chunk_ops: 1000,
            chunk_bytes: 16 << 10,
        }
    }
}

/// Buckets of one priority still to fetch, in name order.
#[derive(Debug)]
struct Group {
    priority: u8,
    buckets: VecDeque<String>,
}

/// The download state of one checkpoint.
#[derive(Debug)]
pub(super) struct Download {
    checkpoint: u64,
    groups: VecDeque<Group>,
    queue: VecDeque<DataLine>,
    /// A page showed a MOVE/CLEAR whose target is above the checkpoint: the data reflects a newer
    /// state, so no completion line may be sent for this checkpoint (`docs/spec/protocol.md` §4.5).
    invalidated: bool,
    /// Buckets whose client copy is emptied first: their first page starts with a CLEAR.
    resets: HashSet<String>,
}

impl Download {
    /// A download of `buckets` (name, priority) up to `checkpoint`. With nothing to fetch
    /// it still completes the checkpoint.
    pub fn new(checkpoint: u64, buckets: impl IntoIterator<Item = (String, u8)>) -> Self {
        let mut by_priority: BTreeMap<u8, Vec<String>> = BTreeMap::new();
        for (name, priority) in buckets {
            by_priority.entry(priority).or_default().push(name);
        }
        let mut groups: VecDeque<Group> = by_priority
            .into_iter()
            .map(|(priority, mut names)| {
                names.sort();
                Group {
                    priority,
                    buckets: names.into(),
                }
            })
            .collect();
        if groups.is_empty() {
            groups.push_back(Group {
                priority: rules::DEFAULT_PRIORITY,
                buckets: VecDeque::new(),
            });
        }
        Self {
            checkpoint,
            groups,
            queue: VecDeque::new(),
            invalidated: false,
            resets: HashSet::new(),
        }
    }

    /// Downloads `resets` from 0 behind a CLEAR (checksum 0, op id 0) that empties what
    /// the client holds of them: its positions there came from another history. A bucket
    /// whose first op is a CLEAR (compacted) needs none.
    pub fn with_resets(mut self, resets: HashSet<String>) -> Self {
        self.resets = resets;
        self
    }

    /// True once every line (including the completion, when allowed) was produced.
    pub fn is_done(&self) -> bool {
        self.groups.is_empty() && self.queue.is_empty()
    }

    /// True when a newer change was seen and this checkpoint will not complete.
    pub fn is_invalidated(&self) -> bool {
        self.invalidated
    }

    /// The next line, `None` when the download is over. A `data` line advances its
    /// bucket's entry in `positions` as it is handed out.
    pub fn next_line(
        &mut self,
        store: &Store,
        positions: &mut HashMap<String, u64>,
        budgets: Budgets,
    ) -> Result<Option<SyncLine>, SyncError> {
        loop {
            if let Some(line) = self.queue.pop_front() {
                positions.insert(line.bucket.clone(), line.next_after);
                return Ok(Some(SyncLine::Data(line)));
            }
            let Some(group) = self.groups.front() else {
                return Ok(None);
            };
            if group.buckets.is_empty() {
                let priority = group.priority;
                self.groups.pop_front();
                if self.invalidated {
                    continue;
                }
                let last_op_id = self.checkpoint;
                return Ok(Some(if self.groups.is_empty() {
                    SyncLine::CheckpointComplete { last_op_id }
                } else {
                    SyncLine::PartialCheckpointComplete {
                        last_op_id,
                        priority,
                    }
                }));
            }
            self.fetch_batch(store, positions, budgets)?;
        }
    }

    /// Reads one batch of the current group in one read transaction and queues its
    /// chunks; buckets with nothing more up to the checkpoint leave the group.
    fn fetch_batch(
        &mut self,
        store: &Store,
        positions: &HashMap<String, u64>,
        budgets: Budgets,
    ) -> Result<(), SyncError> {
        Ok(store.read(|view| self.fetch_batch_in(view, positions, budgets))?)
    }

    /// [`Self::fetch_batch`] in the read `view` (the checkpoint's own, for a small
    /// download); lines queued already stay first.
    pub fn fetch_batch_in(
        &mut self,
        view: &ReadTxn<'_, '_>,
        positions: &HashMap<String, u64>,
        budgets: Budgets,
    ) -> Result<(), StoreError> {
        let checkpoint = self.checkpoint;
        let Some(group) = self.groups.front_mut() else {
            return Ok(());
        };
        let mut pages: Vec<(String, u64, Vec<OpRead>, bool)> = Vec::new();
        let mut max_target = 0;
        let mut budget = budgets.batch_ops.max(1);
        let mut bytes_left = budgets.batch_bytes.max(1);
        for name in &group.buckets {
            if budget == 0 || bytes_left == 0 {
                break;
            }
            let after = positions.get(name).copied().unwrap_or(0);
            let Some(state) = view.bucket(name)? else {
                pages.push((name.clone(), after, Vec::new(), false));
                continue;
            };
            let page = view.ops_within(state.id, after, checkpoint, budget, bytes_left)?;
            budget -= page.ops.len();
            bytes_left = bytes_left.saturating_sub(page.data_bytes);
            max_target = max_target.max(page.max_target);
            pages.push((name.clone(), after, page.ops, page.has_more));
        }
        if max_target > checkpoint {
            self.invalidated = true;
        }
        for (name, after, mut ops, has_more) in pages {
            if self.resets.remove(&name) && ops.first().is_none_or(|op| op.kind != OpKind::Clear) {
                ops.insert(
                    0,
                    OpRead {
                        op_id: 0,
                        kind: OpKind::Clear,
                        checksum: 0,
                        object: None,
                    },
                );
            }
            if !has_more {
                group.buckets.retain(|b| b != &name);
            }
            chunk(&name, after, ops, has_more, budgets, &mut self.queue);
        }
        Ok(())
    }
}

/// Cuts one bucket's page into `data` lines.
fn chunk(
    bucket: &str,
    mut after: u64,
    ops: Vec<OpRead>,
    more_after_page: bool,
    budgets: Budgets,
    queue: &mut VecDeque<DataLine>,
) {
    let total = ops.len();
    let mut current: Vec<OpRead> = Vec::new();
    let mut bytes = 0usize;
    for (i, op) in ops.into_iter().enumerate() {
        if op.kind == OpKind::Put {
            bytes += op.data_len();
        }
        current.push(op);
        let last = i + 1 == total;
        if last || current.len() >= budgets.chunk_ops.max(1) || bytes >= budgets.chunk_bytes {
            let next_after = current.last().map_or(after, |o| o.op_id);
            queue.push_back(DataLine {
                bucket: bucket.to_owned(),
                after,
                next_after,
                has_more: !last || more_after_page,
                ops: std::mem::take(&mut current),
            });
            after = next_after;
            bytes = 0;
        }
    }
}
