//! The bucket set a request would get now, for support questions
//! (`powersync_mdbx.user_buckets()`): the same resolution and accumulator read a
//! `/sync/stream` connection does for its checkpoint line, without a connection.

use super::checkpoint_state::{CheckpointState, RequestLimits};
use super::error::SyncError;
use rules::{RequestContext, SyncRules};
use store::Store;

/// One bucket of the request's set, as the checkpoint line would announce it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectedBucket {
    /// Full bucket name.
    pub name: String,
    /// Effective priority.
    pub priority: u8,
    /// The definition or stream it comes from.
    pub source: String,
    /// Ops in the bucket at the checkpoint.
    pub count: u64,
    /// Sum of op checksums mod 2^32.
    pub checksum: u32,
    /// Largest op id in the bucket (0 for a bucket without ops).
    pub last_op: u64,
}

/// What a request resolves to at the store's current checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestBuckets {
    /// The checkpoint's op id.
    pub op_id: u64,
    /// The bucket set, in resolution order.
    pub buckets: Vec<InspectedBucket>,
    /// Per-subscription problems (`checkpoint.streams[].errors`): stream name, message.
    pub errors: Vec<(String, String)>,
}

/// Resolves `ctx` with `rules` within `limits` at the store's current checkpoint, in one
/// read.
pub fn request_buckets(
    store: &Store,
    rules: &SyncRules,
    ctx: &RequestContext,
    limits: RequestLimits,
) -> Result<RequestBuckets, SyncError> {
    let state = store.read(|view| Ok(CheckpointState::read(view, rules, ctx, limits)))??;
    let errors = state
        .streams
        .iter()
        .flat_map(|s| s.errors.iter().map(|e| (s.name.clone(), e.message.clone())))
        .collect();
    let buckets = state
        .buckets
        .into_iter()
        .map(|b| InspectedBucket {
            name: b.announced.bucket,
            priority: b.announced.priority,
            source: b.source,
            count: b.announced.count,
            checksum: b.announced.checksum,
            last_op: b.last_op,
        })
        .collect();
    Ok(RequestBuckets {
        op_id: state.op_id,
        buckets,
        errors,
    })
}
