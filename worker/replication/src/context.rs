//! What a stream run works with besides the plan (shared by the stream and a rebuild from
//! a new slot): the rules, the store, where checkpoints are published, the counters, and
//! the stream's timings.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::liveness::Liveness;
use crate::progress::StreamProgress;
use rules::SyncRules;
use store::{Checkpoint, Store};

/// Everything a stream run needs besides the plan.
#[derive(Clone)]
pub struct StreamContext {
    /// The compiled rules.
    pub rules: Arc<SyncRules>,
    /// The store.
    pub store: Arc<Store>,
    /// Where durable checkpoints are published.
    pub published: watch::Sender<Checkpoint>,
    /// Counters for `status()`.
    pub progress: Arc<StreamProgress>,
    /// When a silent stream is checked and given up.
    pub liveness: Liveness,
    /// Write-checkpoint requests older than this are removed once reached
    /// ([`crate::WRITE_CHECKPOINT_MAX_AGE`] by default).
    pub write_checkpoint_max_age: std::time::Duration,
    /// How long the rows of a covered table missing under its name stay served
    /// ([`GONE_AFTER`] by default).
    pub gone_after: Duration,
    /// How long after a store commit the next one waits for more source transactions
    /// ([`GROUP_WINDOW`](crate::GROUP_WINDOW) by default).
    pub group_window: Duration,
}

/// How long the rows of a covered table missing from the primary under its name (renamed,
/// dropped, out of the publication) stay served before they leave the buckets.
pub const GONE_AFTER: Duration = Duration::from_secs(30);
