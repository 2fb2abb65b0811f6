//! What the sync endpoints share: the generation they serve (store, rules, checkpoint
//! channel), the authenticator, the primary (for write checkpoints) and the limits.

use std::sync::Arc;

use tokio::sync::{watch, RwLock, Semaphore};

use crate::checkpoint_state::RequestLimits;
use crate::readers::Readers;
use crate::registry::StreamRegistry;
use crate::user_rate::UserRate;
use crate::write_checkpoint::RECORD_PREFIX;
use auth::{AuthError, AuthenticatedUser, Authenticator};
use metrics::{LabelCounts, StatusCounts};
use replication::{Progress, StreamProgress};
use rules::SyncRules;
use source::PrimaryHead;
use status::StatusCell;
use store::{Checkpoint, Store, StoreError};

/// Open sync streams at most when nothing else limits them (the engine derives the real
/// cap from the descriptors the process may hold); more are answered 429 with
/// `Retry-After`.
pub const MAX_STREAMS: usize = 20_000;

/// Sync streams one user may hold at once by default: far more than one user's devices
/// and tabs, far fewer than would starve the others.
pub const MAX_STREAMS_PER_USER: usize = 1_000;

/// The limits every stream is served under (`docs/operations.md`, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Sync streams open at once; more are refused with 429.
    pub max_streams: usize,
    /// Sync streams one user (token `sub`) may hold at once; more are refused with 429.
    pub max_streams_per_user: usize,
    /// What resolving one request may take.
    pub request: RequestLimits,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            max_streams: MAX_STREAMS,
            max_streams_per_user: MAX_STREAMS_PER_USER,
            request: RequestLimits::default(),
        }
    }
}
/// Store reads running at once for all streams (each one batch of at most 1,000 ops): the
/// threads of [`Readers`].
pub const MAX_CONCURRENT_READS: usize = 8;

/// One bucket generation as the endpoints serve it. A rules deploy replaces it as a
/// whole ([`SyncService::switch_to`]); open streams move over at their next checkpoint.
pub struct Served {
    /// The store's generation number (a reset and each deploy in a new generation advance
    /// it; bucket names carry a tag of the store's history instead, `docs/storage.md`).
    pub generation: u64,
    /// The bucket store.
    pub store: Arc<Store>,
    /// The compiled rules.
    pub rules: Arc<SyncRules>,
    /// Durable checkpoints as replication publishes them.
    pub checkpoints: watch::Receiver<Checkpoint>,
    /// Which streams each of them concerns (one per store).
    pub wakeups: Arc<crate::Wakeups>,
    /// The stream's counters (for `/metrics`).
    pub stream_progress: Arc<StreamProgress>,
    /// The snapshot's counters (for `/metrics`).
    pub snapshot_progress: Arc<Progress>,
}

/// The sync service every transport (HTTP, the admin socket) serves from.
pub struct SyncService {
    /// Engine status (readiness).
    pub status: Arc<StatusCell>,
    /// The generation served now.
    served: watch::Sender<Arc<Served>>,
    /// Held (shared) while a write-checkpoint request is recorded, and (exclusive) while
    /// the served generation changes, so no request is recorded into a store that is
    /// being left behind.
    recording: RwLock<()>,
    /// Verifies client tokens.
    pub auth: Authenticator,
    /// The primary's WAL head, for write checkpoints.
    pub head: PrimaryHead,
    /// Turns true when the engine stops: streams end.
    pub shutdown: watch::Receiver<bool>,
    /// The limits streams are served under.
    pub limits: StreamLimits,
    /// Open streams.
    pub streams: Arc<Semaphore>,
    /// The threads that run the streams' store reads.
    pub readers: Readers,
    /// `/sync/stream` answers by HTTP status.
    pub sync_responses: StatusCounts,
    /// Refused tokens (both sync endpoints) by error code.
    pub auth_failures: LabelCounts,
    /// Sync connections by how they ended ([`CONNECTION_OUTCOMES`]).
    pub connection_outcomes: LabelCounts,
    /// The open streams, for `powersync_mdbx.streams()`.
    pub registry: Arc<StreamRegistry>,
    /// Write-checkpoint requests per user ([`WRITE_CHECKPOINTS_PER_SECOND`]).
    pub write_checkpoint_rate: UserRate,
    /// Bucket ops sent in data lines, over every stream.
    pub ops_sent: std::sync::atomic::AtomicU64,
    /// Bytes of sync lines queued to clients before compression, over every stream.
    pub bytes_synced: std::sync::atomic::AtomicU64,
    /// Bytes queued to clients after compression (equal to `bytes_synced` for
    /// uncompressed streams), over every stream.
    pub bytes_sent: std::sync::atomic::AtomicU64,
}

/// How a sync connection (`/sync/stream`, or a WebSocket's stream) ended, the `outcome`
/// of `powersync_sync_connections_total`: the client went away, the service ended it
/// (token expiry, out of rotation), the engine stopped, it failed; or it was `refused`
/// (answered with an error instead of a stream).
pub const CONNECTION_OUTCOMES: &[&str] = &[
    "client_closed",
    "service_closed",
    "shutdown",
    "error",
    "refused",
];

/// Write-checkpoint requests one user may make per second, after a burst of
/// [`WRITE_CHECKPOINT_BURST`]: a client asks once per upload, far less often.
pub const WRITE_CHECKPOINTS_PER_SECOND: f64 = 10.0;
/// Write-checkpoint requests one user may make at once.
pub const WRITE_CHECKPOINT_BURST: f64 = 20.0;

impl SyncService {
    /// A service that serves `served` under `limits`.
    pub fn new(
        status: Arc<StatusCell>,
        served: Arc<Served>,
        auth: Authenticator,
        head: PrimaryHead,
        shutdown: watch::Receiver<bool>,
        limits: StreamLimits,
    ) -> std::io::Result<Self> {
        let readers = Readers::new(MAX_CONCURRENT_READS)?;
        Ok(Self {
            status,
            served: watch::Sender::new(served),
            recording: RwLock::new(()),
            auth,
            head,
            shutdown,
            limits,
            streams: Arc::new(Semaphore::new(limits.max_streams)),
            readers,
            sync_responses: StatusCounts::default(),
            auth_failures: LabelCounts::new(AuthError::CODES),
            connection_outcomes: LabelCounts::new(CONNECTION_OUTCOMES),
            registry: Arc::default(),
            write_checkpoint_rate: UserRate::new(
                WRITE_CHECKPOINTS_PER_SECOND,
                WRITE_CHECKPOINT_BURST,
            ),
            ops_sent: std::sync::atomic::AtomicU64::new(0),
            bytes_synced: std::sync::atomic::AtomicU64::new(0),
            bytes_sent: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The generation served now.
    pub fn current(&self) -> Arc<Served> {
        self.served.borrow().clone()
    }

    /// Follows the served generation (a stream moves to a new one when it changes).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Served>> {
        self.served.subscribe()
    }

    /// Records the write checkpoint `key` asked for at `lsn` (with `asked`, a checkpoint
    /// request's client-chosen id) in the served store; returns its id
    /// ([`crate::write_checkpoint::next_record`]).
    pub async fn record_write_checkpoint(
        &self,
        key: String,
        lsn: u64,
        asked: Option<u64>,
    ) -> Result<u64, StoreError> {
        let _recording = self.recording.read().await;
        let store = self.current().store.clone();
        let dir = store.dir().to_owned();
        on_blocking_thread(&dir, "record a write checkpoint", move || {
            store.update_stage_record(&key, |stored| {
                let (value, id) = crate::write_checkpoint::next_record(stored, lsn, asked);
                (Some(value), id)
            })
        })
        .await
    }

    /// Serves `next` from now on. The write-checkpoint requests recorded in the current
    /// store are carried over first (their ids are source LSNs, so they mean the same in
    /// every generation), so no client waits for an acknowledgement the new store lacks.
    pub async fn switch_to(&self, next: Arc<Served>) -> Result<(), StoreError> {
        let _recording = self.recording.write().await;
        let (from, to) = (self.current().store.clone(), next.store.clone());
        let dir = to.dir().to_owned();
        on_blocking_thread(&dir, "carry the write checkpoints over", move || {
            let records = from.read(|view| view.stage_records(RECORD_PREFIX))?;
            to.put_stage_records(&records)
        })
        .await?;
        self.served.send_replace(next);
        Ok(())
    }

    /// Streams open now (their permits are held until the stream ends).
    pub fn open_streams(&self) -> usize {
        self.limits
            .max_streams
            .saturating_sub(self.streams.available_permits())
    }

    /// Verifies a request's `Authorization` value (whatever the transport carried it in);
    /// counts refusals by code.
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
    ) -> Result<AuthenticatedUser, AuthError> {
        self.auth
            .authenticate(authorization, std::time::SystemTime::now())
            .await
            .inspect_err(|e| self.auth_failures.add(e.code()))
    }
}

/// Runs store work on a blocking thread; a panic there becomes an error about `dir`.
async fn on_blocking_thread<R: Send + 'static>(
    dir: &std::path::Path,
    action: &'static str,
    work: impl FnOnce() -> Result<R, StoreError> + Send + 'static,
) -> Result<R, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::io(dir, action, std::io::Error::other(e)))?
}
