//! One `/sync/stream` connection as a state machine over the store, independent of the
//! transport: the HTTP handler calls [`SyncSession::checkpoint`] for each new store
//! checkpoint (or write-checkpoint change) and [`SyncSession::next_line`] until it returns
//! `None`, encoding and flushing each line. Nothing here holds a read transaction between
//! calls; each call is one or two short reads.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::checkpoint_state::{Announced, CheckpointState, RequestLimits};
use super::error::SyncError;
use super::lines::{CheckpointDiffLine, CheckpointLine, SyncLine};
use super::paging::{Budgets, Download};
use super::request::{BucketPosition, KeptRequest};
use rules::{RequestContext, SyncRules};
use store::{Forks, Placement, ReadTxn, Store, StoreError};

/// How long a session's first checkpoint waits for the store to reach a client's
/// position in a bucket it announces (see [`SyncSession::checkpoint`]).
pub const CATCH_UP_HOLD: Duration = Duration::from_secs(30);

/// The server side of one sync connection.
#[derive(Debug)]
pub struct SyncSession {
    rules: Arc<SyncRules>,
    /// The request without its client parameters and subscriptions, which `kept` holds
    /// as text for the session's life and gives back for each resolution.
    context: RequestContext,
    kept: KeptRequest,
    budgets: Budgets,
    /// What resolving the request may take (`PSYNC_S2305` past it).
    limits: RequestLimits,
    /// The client's `after` positions, until the first checkpoint claims them.
    requested: HashMap<String, u64>,
    /// Per bucket of the current set: the last op id sent (or held by the client).
    positions: HashMap<String, u64>,
    /// What the last checkpoint-type line said; `None` before the first one.
    announced: Option<Announced>,
    /// The data download of the latest announced checkpoint (boxed: an idle stream, the
    /// common case, keeps only the pointer).
    download: Option<Box<Download>>,
    /// Until when the first checkpoint waits for the store to reach the client's
    /// positions.
    hold_until: Instant,
    /// Buckets whose client copy came from another history: their first `data` line
    /// starts with a CLEAR. Kept until that line is handed out, across checkpoints.
    resets: HashSet<String>,
    /// The current download spans few op ids ([`Self::download_is_small`]).
    small_download: bool,
}

/// A download whose buckets span at most this many op ids past the client's positions
/// in all is small: recent ops, a page or two of reads from memory.
const SMALL_DOWNLOAD_OPS: u64 = 256;
/// A set of at most this many buckets resolves and reads its accumulators in a few
/// microseconds.
const SMALL_BUCKET_SET: usize = 64;

impl SyncSession {
    /// A session for a request resolved with `rules`, starting from the client's
    /// positions. A name listed twice keeps its last position.
    pub fn new(
        rules: Arc<SyncRules>,
        mut context: RequestContext,
        positions: &[BucketPosition],
    ) -> Self {
        let kept = KeptRequest::keep(&mut context);
        Self {
            rules,
            context,
            kept,
            budgets: Budgets::default(),
            limits: RequestLimits::default(),
            requested: positions
                .iter()
                .map(|p| (p.name.clone(), p.after))
                .collect(),
            positions: HashMap::new(),
            announced: None,
            download: None,
            hold_until: Instant::now() + CATCH_UP_HOLD,
            resets: HashSet::new(),
            small_download: false,
        }
    }

    /// Replaces how long the first checkpoint waits for the store to reach the client's
    /// positions ([`CATCH_UP_HOLD`]; tests shorten it).
    pub fn with_catch_up_hold(mut self, hold: Duration) -> Self {
        self.hold_until = Instant::now() + hold;
        self
    }

    /// True while no checkpoint was announced yet (the first one may be held).
    pub fn is_unannounced(&self) -> bool {
        self.announced.is_none()
    }

    /// Resolves the next checkpoints with `rules` (a new generation's). The buckets
    /// announced so far stay the reference for the next `checkpoint_diff`, which then
    /// removes every bucket the new rules no longer produce; an unfinished download of
    /// the old generation is dropped with its checkpoint.
    pub fn switch_rules(&mut self, rules: Arc<SyncRules>) {
        self.rules = rules;
        self.download = None;
    }

    /// Limits what resolving the request may take (`api.parameters`).
    pub fn with_limits(mut self, limits: RequestLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Replaces the paging limits (tests use small ones to force paging).
    pub fn with_budgets(mut self, budgets: Budgets) -> Self {
        self.budgets = budgets;
        self
    }

    /// Reads the store's current checkpoint and returns the line announcing it: a full
    /// `checkpoint` the first time, then a `checkpoint_diff`, or `None` when neither the
    /// bucket set, any bucket's checksum/count/priority, nor `write_checkpoint` changed
    /// (then an unfinished download simply continues).
    ///
    /// A returned line supersedes the download of the previous checkpoint: its completion
    /// is never sent, and the new download continues from the positions already reached.
    ///
    /// A client position is placed against the store's history ([`store::Forks`]). One
    /// above the checkpoint within reach of a peer of the same history further along (a
    /// client that moved from a peer: bucket names carry the history id) holds the first
    /// checkpoint (`None`) until the store reaches it, for at most [`CATCH_UP_HOLD`] from
    /// the request, so the client is never announced an older checkpoint. A position the
    /// store never gave out (from a peer whose history forked away, or still ahead when
    /// the hold ends) is not trusted: the bucket is downloaded from 0 behind a CLEAR that
    /// empties the client's copy first, so its checksum holds without a mismatch.
    pub fn checkpoint(
        &mut self,
        store: &Store,
        write_checkpoint: Option<u64>,
    ) -> Result<Option<SyncLine>, SyncError> {
        self.checkpoint_with(store, |_| Ok((write_checkpoint, ())))
            .map(|(line, ())| line)
    }

    /// [`Self::checkpoint`] whose `write_checkpoint` is decided by `decide` in the same
    /// read (from the connection's write-checkpoint record), which also returns what else
    /// the caller needs from it: one read transaction per checkpoint instead of two. A
    /// small download (a change or two) reads its first batch in that read too, so a
    /// change reaches a stream in one read transaction.
    pub fn checkpoint_with<T>(
        &mut self,
        store: &Store,
        decide: impl FnOnce(&ReadTxn<'_, '_>) -> Result<(Option<u64>, T), StoreError>,
    ) -> Result<(Option<SyncLine>, T), SyncError> {
        let first = self.announced.is_none();
        let context = self.kept.context(&self.context);
        store.read(|view| {
            let forks = if first {
                view.forks()?
            } else {
                Forks::default()
            };
            let (write_checkpoint, decided) = decide(view)?;
            let state = match CheckpointState::read(view, &self.rules, &context, self.limits) {
                Ok(state) => state,
                Err(e) => return Ok(Err(e)),
            };
            let line = self.announce(state, &forks, write_checkpoint);
            // Only a download this line starts: an earlier one goes on as it was.
            if line.is_some() && self.download_is_small() {
                if let Some(download) = self.download.as_mut() {
                    download.fetch_batch_in(view, &self.positions, self.budgets)?;
                }
            }
            Ok(Ok((line, decided)))
        })?
    }

    /// The line announcing `state` (see [`Self::checkpoint`]), the download that follows it.
    fn announce(
        &mut self,
        state: CheckpointState,
        forks: &Forks,
        write_checkpoint: Option<u64>,
    ) -> Option<SyncLine> {
        let line = match &self.announced {
            None => {
                let place = |name: &String| {
                    self.requested
                        .get(name)
                        .map(|&after| forks.place(after, state.op_id))
                };
                let ahead = state
                    .buckets
                    .iter()
                    .any(|b| place(&b.announced.bucket) == Some(Placement::Ahead));
                if ahead && Instant::now() < self.hold_until {
                    return None;
                }
                for b in &state.buckets {
                    let name = &b.announced.bucket;
                    let after = match place(name) {
                        Some(Placement::Own) => self.requested[name],
                        Some(Placement::Ahead | Placement::Foreign) => {
                            self.resets.insert(name.clone());
                            0
                        }
                        None => 0,
                    };
                    self.positions.insert(name.clone(), after);
                }
                // Freed, not cleared: a client that came with many buckets would keep
                // their table's room for the stream's life.
                self.requested = HashMap::new();
                SyncLine::Checkpoint(CheckpointLine {
                    last_op_id: state.op_id,
                    write_checkpoint,
                    buckets: state.buckets.iter().map(|b| b.announced.clone()).collect(),
                    streams: state.streams.clone(),
                })
            }
            Some(announced) => {
                let (updated, removed) = announced.diff(&state);
                if updated.is_empty()
                    && removed.is_empty()
                    && write_checkpoint == announced.write_checkpoint
                {
                    return None;
                }
                for name in &removed {
                    // A bucket that comes back later starts again from 0 (the client
                    // deleted it, and what it held of it).
                    self.positions.remove(name);
                    self.resets.remove(name);
                }
                for b in &state.buckets {
                    self.positions
                        .entry(b.announced.bucket.clone())
                        .or_insert(0);
                }
                SyncLine::CheckpointDiff(CheckpointDiffLine {
                    last_op_id: state.op_id,
                    write_checkpoint,
                    updated_buckets: updated,
                    removed_buckets: removed,
                })
            }
        };
        // Every bucket with ops after its position: changed buckets and unfinished
        // downloads of earlier checkpoints alike.
        let to_fetch: Vec<(String, u8)> = state
            .buckets
            .iter()
            .filter(|b| {
                self.resets.contains(&b.announced.bucket)
                    || b.last_op
                        > self
                            .positions
                            .get(&b.announced.bucket)
                            .copied()
                            .unwrap_or(0)
            })
            .map(|b| (b.announced.bucket.clone(), b.announced.priority))
            .collect();
        let span: u64 = state
            .buckets
            .iter()
            .map(|b| {
                let at = self
                    .positions
                    .get(&b.announced.bucket)
                    .copied()
                    .unwrap_or(0);
                b.last_op.saturating_sub(at)
            })
            .sum();
        self.small_download = self.resets.is_empty() && span <= SMALL_DOWNLOAD_OPS;
        self.download = Some(Box::new(
            Download::new(state.op_id, to_fetch).with_resets(self.resets.clone()),
        ));
        self.announced = Some(Announced::new(&state, write_checkpoint));
        Some(line)
    }

    /// The next `data` or completion line of the current checkpoint; `None` when it is
    /// fully sent (or invalidated: then the next checkpoint continues the download). Each
    /// call that needs data reads one batch in one short read transaction.
    pub fn next_line(&mut self, store: &Store) -> Result<Option<SyncLine>, SyncError> {
        let Some(download) = self.download.as_mut() else {
            return Ok(None);
        };
        let line = download.next_line(store, &mut self.positions, self.budgets)?;
        if download.is_done() {
            self.download = None;
        }
        if let Some(SyncLine::Data(data)) = &line {
            // Its first line carried the CLEAR.
            self.resets.remove(&data.bucket);
        }
        // A completion moves the completed buckets to the checkpoint, as the client does
        // when it validates them, so both sides agree on every bucket's position.
        let completed = match &line {
            Some(SyncLine::CheckpointComplete { last_op_id }) => Some((*last_op_id, u8::MAX)),
            Some(SyncLine::PartialCheckpointComplete {
                last_op_id,
                priority,
            }) => Some((*last_op_id, *priority)),
            _ => None,
        };
        if let (Some((last_op_id, up_to)), Some(announced)) = (completed, &self.announced) {
            for (name, position) in self.positions.iter_mut() {
                if announced
                    .buckets
                    .get(name)
                    .is_some_and(|b| b.priority <= up_to)
                {
                    *position = last_op_id;
                }
            }
        }
        Ok(line)
    }

    /// True while the current checkpoint still has lines to send.
    pub fn is_downloading(&self) -> bool {
        self.download.is_some()
    }

    /// True while the current download is small: its buckets span few op ids past the
    /// positions (recent ops, a change or two), so its reads are short and from memory.
    pub fn download_is_small(&self) -> bool {
        self.download.is_some() && self.small_download
    }

    /// True when the next [`Self::checkpoint`] is cheap: a checkpoint was announced
    /// already (the first one may be held and reads the history's forks) and its bucket
    /// set is small.
    pub fn checkpoint_is_small(&self) -> bool {
        self.announced
            .as_ref()
            .is_some_and(|a| a.buckets.len() <= SMALL_BUCKET_SET)
    }

    /// True when the current checkpoint was invalidated by a newer change seen while
    /// paging (its completion will not be sent).
    pub fn is_invalidated(&self) -> bool {
        self.download
            .as_deref()
            .is_some_and(Download::is_invalidated)
    }

    /// The `last_op_id` of the last checkpoint-type line.
    pub fn last_op_id(&self) -> Option<u64> {
        self.announced.as_ref().map(|a| a.last_op_id)
    }

    /// The names of the buckets in the set of the last checkpoint-type line.
    pub fn announced_buckets(&self) -> impl Iterator<Item = &str> + Clone {
        self.announced.iter().flat_map(|a| a.buckets.names())
    }

    /// Buckets in the set of the last checkpoint-type line.
    pub fn bucket_count(&self) -> usize {
        self.announced.as_ref().map_or(0, |a| a.buckets.len())
    }

    /// The position reached in `bucket` (the `after` of its next data line).
    pub fn position(&self, bucket: &str) -> Option<u64> {
        self.positions.get(bucket).copied()
    }
}
