//! What the sync endpoints share: the store, the rules, the authenticator, the checkpoint
//! channel, the primary (for write checkpoints) and the limits.

use std::sync::Arc;

use hyper::header::{self, HeaderMap};
use tokio::sync::{watch, Semaphore};

use super::error::ApiError;
use super::registry::StreamRegistry;
use crate::auth::{AuthError, AuthenticatedUser, Authenticator};
use crate::metrics::{LabelCounts, StatusCounts};
use crate::rules::SyncRules;
use crate::source::PrimaryHead;
use crate::status::StatusCell;
use crate::store::{Checkpoint, Store};

/// Open `/sync/stream` connections at most; more are answered 429 with `Retry-After`.
pub const MAX_STREAMS: usize = 20_000;
/// Store reads running at once for all streams (each one batch of at most 1,000 ops).
pub const MAX_CONCURRENT_READS: usize = 8;

/// The sync side of the HTTP server.
pub struct SyncService {
    /// Engine status (readiness).
    pub status: Arc<StatusCell>,
    /// The bucket store.
    pub store: Arc<Store>,
    /// The compiled rules.
    pub rules: Arc<SyncRules>,
    /// Verifies client tokens.
    pub auth: Authenticator,
    /// Durable checkpoints as replication publishes them.
    pub checkpoints: watch::Receiver<Checkpoint>,
    /// The primary's WAL head, for write checkpoints.
    pub head: PrimaryHead,
    /// Turns true when the engine stops: streams end.
    pub shutdown: watch::Receiver<bool>,
    /// Open streams.
    pub streams: Arc<Semaphore>,
    /// Concurrent store reads.
    pub reads: Semaphore,
    /// `/sync/stream` answers by HTTP status.
    pub sync_responses: StatusCounts,
    /// Refused tokens (both sync endpoints) by error code.
    pub auth_failures: LabelCounts,
    /// The open streams, for `powersync_mdbx.streams()`.
    pub registry: Arc<StreamRegistry>,
}

impl SyncService {
    /// A service with the default limits.
    pub fn new(
        status: Arc<StatusCell>,
        store: Arc<Store>,
        rules: Arc<SyncRules>,
        auth: Authenticator,
        checkpoints: watch::Receiver<Checkpoint>,
        head: PrimaryHead,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            status,
            store,
            rules,
            auth,
            checkpoints,
            head,
            shutdown,
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
            reads: Semaphore::new(MAX_CONCURRENT_READS),
            sync_responses: StatusCounts::default(),
            auth_failures: LabelCounts::new(AuthError::CODES),
            registry: Arc::default(),
        }
    }

    /// Streams open now (their permits are held until the stream's task ends).
    pub fn open_streams(&self) -> usize {
        MAX_STREAMS.saturating_sub(self.streams.available_permits())
    }

    /// Verifies the request's `Authorization` header; counts refusals by code.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<AuthenticatedUser, ApiError> {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        self.auth
            .authenticate(authorization, std::time::SystemTime::now())
            .await
            .map_err(|e| {
                self.auth_failures.add(e.code());
                ApiError::from(e)
            })
    }
}
