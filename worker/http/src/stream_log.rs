//! What one sync stream logs, in the official service's names: `checkpoint_complete` with
//! what it sent since the last one and where its time went (`ms`: `checkpoint`,
//! `bucket_data`, `sending`, `total`), and at its end `Sync stream complete` with its
//! totals, `stream_ms` and `close_reason`; and the end's outcome in
//! `powersync_sync_connections_total` (`docs/metrics.md`).
//!
//! A stream's first `checkpoint_complete` (its initial sync) is logged at INFO, as are
//! checkpoints that took a second or more or sent 10,000 ops or more; the others at DEBUG,
//! so that a commit that reaches 10,000 streams does not write 10,000 lines to the server
//! log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use service::SyncService;

/// A checkpoint logged at INFO when it took this long or more.
const SLOW_CHECKPOINT: Duration = Duration::from_secs(1);
/// A checkpoint logged at INFO when it sent this many ops or more.
const LARGE_CHECKPOINT_OPS: u64 = 10_000;

/// Why a stream ended, in the official log's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// The client went away (the response was dropped before its end).
    Client,
    /// The service ended it: the token expired, the replica left rotation.
    Service,
    /// The engine is stopping.
    Shutdown,
    /// It failed (a store read, an encoding).
    Error,
}

impl CloseReason {
    /// The official `close_reason`.
    fn text(self) -> &'static str {
        match self {
            Self::Client => "client closing stream",
            Self::Service => "service closing stream",
            Self::Shutdown => "process shutdown",
            Self::Error => "stream error",
        }
    }

    /// The `outcome` label of `powersync_sync_connections_total`.
    pub(crate) fn outcome(self) -> &'static str {
        match self {
            Self::Client => "client_closed",
            Self::Service => "service_closed",
            Self::Shutdown => "shutdown",
            Self::Error => "error",
        }
    }
}

/// The checkpoint being sent: since when, and its time so far by kind.
#[derive(Default)]
struct CheckpointTrace {
    started: Option<Instant>,
    checkpoint: Duration,
    bucket_data: Duration,
    sending: Duration,
}

/// One stream's counts and timings.
pub(crate) struct StreamLog {
    started: Instant,
    user: Arc<str>,
    encoding: Option<&'static str>,
    ops: u64,
    synced_bytes: u64,
    sent_bytes: u64,
    /// `ops` and `synced_bytes` at the last checkpoint logged.
    logged: (u64, u64),
    checkpoints_completed: u64,
    trace: CheckpointTrace,
    /// When the last chunk was handed to the transport (the client's turn since).
    handed_out: Option<Instant>,
    reason: Option<CloseReason>,
}

impl StreamLog {
    /// The log of a stream of `user`'s, compressed with `encoding` (`None`: not).
    pub(crate) fn new(user: Arc<str>, encoding: Option<&'static str>) -> Self {
        Self {
            started: Instant::now(),
            user,
            encoding,
            ops: 0,
            synced_bytes: 0,
            sent_bytes: 0,
            logged: (0, 0),
            checkpoints_completed: 0,
            trace: CheckpointTrace::default(),
            handed_out: None,
            reason: None,
        }
    }

    /// `synced` bytes of lines, `sent` after compression, `ops` bucket ops among them.
    pub(crate) fn sent(&mut self, ops: u64, synced: usize, sent: usize) {
        self.ops += ops;
        self.synced_bytes += synced as u64;
        self.sent_bytes += sent as u64;
    }

    /// A checkpoint line, begun at `started`, was made: its time runs until its
    /// `checkpoint_complete` (a checkpoint not completed is replaced).
    pub(crate) fn checkpoint_started(&mut self, started: Instant) {
        self.trace = CheckpointTrace {
            started: Some(started),
            checkpoint: started.elapsed(),
            ..CheckpointTrace::default()
        };
    }

    /// Time spent reading and encoding bucket data.
    pub(crate) fn add_bucket_data_time(&mut self, took: Duration) {
        self.trace.bucket_data += took;
    }

    /// The transport takes a chunk: the time since the last one was handed out was the
    /// client's (or the network's).
    pub(crate) fn chunk_asked(&mut self) {
        if let (Some(out), Some(_)) = (self.handed_out.take(), self.trace.started) {
            self.trace.sending += out.elapsed();
        }
    }

    /// A chunk was handed to the transport.
    pub(crate) fn chunk_handed_out(&mut self) {
        self.handed_out = Some(Instant::now());
    }

    /// The checkpoint `op_id` was sent whole (`checkpoint_complete`).
    pub(crate) fn checkpoint_complete(&mut self, op_id: u64) {
        let Some(started) = self.trace.started.take() else {
            return;
        };
        let total = started.elapsed();
        let (ops, bytes) = (self.ops - self.logged.0, self.synced_bytes - self.logged.1);
        self.logged = (self.ops, self.synced_bytes);
        self.checkpoints_completed += 1;
        let ms = |d: Duration| d.as_millis() as u64;
        let other = total
            .saturating_sub(self.trace.checkpoint)
            .saturating_sub(self.trace.bucket_data)
            .saturating_sub(self.trace.sending);
        macro_rules! complete {
            ($level:ident) => {
                tracing::$level!(
                    checkpoint = op_id,
                    user_id = %self.user,
                    operations_synced = ops,
                    data_synced_bytes = bytes,
                    ms.checkpoint = ms(self.trace.checkpoint),
                    ms.bucket_data = ms(self.trace.bucket_data),
                    ms.sending = ms(self.trace.sending),
                    ms.other = ms(other),
                    ms.total = ms(total),
                    "checkpoint_complete: {op_id}"
                )
            };
        }
        if self.checkpoints_completed == 1
            || total >= SLOW_CHECKPOINT
            || ops >= LARGE_CHECKPOINT_OPS
        {
            complete!(info);
        } else {
            complete!(debug);
        }
    }

    /// The stream ends for `reason` (the first reason given is kept).
    pub(crate) fn closing(&mut self, reason: CloseReason) {
        self.reason.get_or_insert(reason);
    }

    /// The stream is gone: `Sync stream complete` and its outcome counted.
    pub(crate) fn finish(&self, service: &SyncService) {
        let reason = self.reason.unwrap_or(CloseReason::Client);
        service.connection_outcomes.add(reason.outcome());
        tracing::info!(
            user_id = %self.user,
            operations_synced = self.ops,
            data_synced_bytes = self.synced_bytes,
            data_sent_bytes = self.sent_bytes,
            encoding = self.encoding.unwrap_or("none"),
            stream_ms = self.started.elapsed().as_millis() as u64,
            close_reason = reason.text(),
            "Sync stream complete"
        );
    }
}
