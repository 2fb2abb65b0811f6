//! What one checkpoint means for one connection: the request's bucket set resolved at the
//! store's checkpoint, each bucket's accumulators, and the `streams` list; and what the
//! connection has already announced, so later checkpoints become diffs.

use std::collections::HashMap;

use super::error::SyncError;
use super::lines::{BucketChecksum, StreamDescription, StreamError};
use crate::lookups::StoreLookups;
use rules::{BucketReason, RequestContext, Resolution, SourceKind, SyncRules};
use store::ReadTxn;

/// One bucket of the set at a checkpoint.
#[derive(Debug, Clone)]
pub(super) struct BucketAt {
    /// What the checkpoint line announces.
    pub announced: BucketChecksum,
    /// Largest op id in the bucket (≤ the checkpoint; 0 for a bucket without ops).
    pub last_op: u64,
    /// The definition or stream it comes from.
    pub source: String,
}

/// The request's state at one store checkpoint, read in one transaction.
/// What resolving one request may take (`api.parameters`); past either, the request's
/// bucket set is refused (`PSYNC_S2305`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Buckets the request may resolve to.
    pub max_buckets: usize,
    /// Rows its parameter queries may return, all lookups together.
    pub max_parameter_results: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_buckets: rules::DEFAULT_MAX_BUCKETS,
            max_parameter_results: DEFAULT_MAX_PARAMETER_RESULTS,
        }
    }
}

/// The official service's default for `max_parameter_query_results`.
pub const DEFAULT_MAX_PARAMETER_RESULTS: usize = 1_000;

#[derive(Debug, Clone)]
pub(super) struct CheckpointState {
    /// The store checkpoint's op id.
    pub op_id: u64,
    /// The bucket set, in resolution order.
    pub buckets: Vec<BucketAt>,
    /// `checkpoint.streams`.
    pub streams: Vec<StreamDescription>,
}

impl CheckpointState {
    /// Resolves the request within `limits` and reads the accumulators in `view` (one
    /// consistent read).
    pub fn read(
        view: &ReadTxn<'_, '_>,
        rules: &SyncRules,
        ctx: &RequestContext,
        limits: RequestLimits,
    ) -> Result<Self, SyncError> {
        let op_id = view.checkpoint()?.op_id;
        let lookups = StoreLookups::new(view, limits.max_parameter_results);
        let resolved = rules.resolve_request_with_limit(ctx, &lookups, limits.max_buckets);
        if let Some(failure) = lookups.take_failure() {
            return Err(failure.into());
        }
        let resolution = resolved.map_err(SyncError::Rules)?;
        let (streams, entry_of) = streams(rules, ctx, &resolution);
        let mut buckets = Vec::with_capacity(resolution.buckets.len());
        for b in resolution.buckets {
            // A bucket that never had an op is announced with checksum 0 and count 0.
            let state = view.bucket(&b.name)?.unwrap_or_default();
            let subscriptions = b
                .reasons
                .iter()
                .filter_map(|r| match r {
                    BucketReason::Default(i) => entry_of.get(i).map(|e| BucketReason::Default(*e)),
                    BucketReason::Subscription(j) => Some(BucketReason::Subscription(*j)),
                })
                .collect();
            buckets.push(BucketAt {
                announced: BucketChecksum {
                    bucket: b.name,
                    checksum: state.checksum,
                    count: state.count,
                    priority: b.priority,
                    subscriptions,
                },
                last_op: state.last_op,
                source: b.source,
            });
        }
        Ok(Self {
            op_id,
            buckets,
            streams,
        })
    }
}

/// `checkpoint.streams` as the service lists them: each default definition or stream
/// (when defaults are included), then each explicitly subscribed stream not listed yet,
/// and a stream entry for an unknown subscribed name so its error can be shown. Returns
/// the map from the rules' source index to the entry index (`{"default": i}` points into
/// this list).
fn streams(
    rules: &SyncRules,
    ctx: &RequestContext,
    resolution: &Resolution,
) -> (Vec<StreamDescription>, HashMap<usize, usize>) {
    let mut out: Vec<StreamDescription> = Vec::new();
    let mut entry_of: HashMap<usize, usize> = HashMap::new();
    let mut entry_by_name: HashMap<String, usize> = HashMap::new();
    let sources = rules.sources();
    if ctx.include_defaults {
        for (i, s) in sources.iter().enumerate().filter(|(_, s)| s.is_default) {
            entry_of.insert(i, out.len());
            entry_by_name.insert(s.name.clone(), out.len());
            out.push(StreamDescription {
                name: s.name.clone(),
                is_default: true,
                errors: Vec::new(),
            });
        }
    }
    for sub in &ctx.subscriptions {
        if entry_by_name.contains_key(&sub.stream) {
            continue;
        }
        let known = sources
            .iter()
            .position(|s| s.name == sub.stream && s.kind == SourceKind::Stream);
        if let Some(i) = known {
            entry_of.insert(i, out.len());
        }
        entry_by_name.insert(sub.stream.clone(), out.len());
        out.push(StreamDescription {
            name: sub.stream.clone(),
            is_default: known
                .and_then(|i| sources.get(i))
                .is_some_and(|s| s.is_default),
            errors: Vec::new(),
        });
    }
    for err in &resolution.errors {
        let entry = ctx
            .subscriptions
            .get(err.subscription)
            .and_then(|s| entry_by_name.get(&s.stream))
            .and_then(|&e| out.get_mut(e));
        if let Some(entry) = entry {
            entry.errors.push(StreamError {
                subscription: Some(err.subscription),
                message: err.message.clone(),
            });
        }
    }
    (out, entry_of)
}

/// What this connection last announced.
#[derive(Debug, Clone, Default)]
pub(super) struct Announced {
    /// The checkpoint of the last checkpoint-type line.
    pub last_op_id: u64,
    /// Its write checkpoint.
    pub write_checkpoint: Option<u64>,
    /// Its buckets.
    pub buckets: AnnouncedBuckets,
}

/// The buckets of a checkpoint-type line, sorted by name: a stream keeps them for its
/// life, and most hold a few, for which a sorted vector takes a fraction of a hash map's
/// memory (no table, no second copy of each name as its key).
#[derive(Debug, Clone, Default)]
pub(super) struct AnnouncedBuckets(Vec<BucketChecksum>);

impl AnnouncedBuckets {
    /// The bucket named `name`.
    pub fn get(&self, name: &str) -> Option<&BucketChecksum> {
        self.0
            .binary_search_by(|b| b.bucket.as_str().cmp(name))
            .ok()
            .and_then(|i| self.0.get(i))
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> + Clone {
        self.0.iter().map(|b| b.bucket.as_str())
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl Announced {
    /// Records `state` as announced.
    pub fn new(state: &CheckpointState, write_checkpoint: Option<u64>) -> Self {
        let mut buckets: Vec<BucketChecksum> =
            state.buckets.iter().map(|b| b.announced.clone()).collect();
        buckets.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        buckets.dedup_by(|a, b| a.bucket == b.bucket);
        Self {
            last_op_id: state.op_id,
            write_checkpoint,
            buckets: AnnouncedBuckets(buckets),
        }
    }

    /// Buckets that are new or changed in `state`, and buckets that left the set (sorted).
    pub fn diff(&self, state: &CheckpointState) -> (Vec<BucketChecksum>, Vec<String>) {
        let updated: Vec<BucketChecksum> = state
            .buckets
            .iter()
            .filter(|b| self.buckets.get(&b.announced.bucket) != Some(&b.announced))
            .map(|b| b.announced.clone())
            .collect();
        let removed: Vec<String> = self
            .buckets
            .names()
            .filter(|name| !state.buckets.iter().any(|b| b.announced.bucket == *name))
            .map(str::to_owned)
            .collect();
        (updated, removed)
    }
}
