//! The served generation's ingest (its replication), supervised so that serving outlives
//! it (`docs/operations.md`, "Serving and ingest"). Once the served store holds a complete
//! snapshot, an ingest that ends on an error no longer ends the engine: the sync port goes
//! on serving the last durable checkpoint, open streams stay open, and the ingest starts
//! again by itself — after a store error (a full disk, a failed sync) with the store opened
//! again in place once its file system has room, after 1, 2, 4 … up to 60 s while the fault
//! repeats — or, for an error that needs the operator, when the operator reloads.

use std::sync::Arc;
use std::time::Instant;

use super::generation::Generation;
use super::host::{restart_backoff, HEALTHY_RUN, RESTART_BACKOFF_MAX};
use super::EngineError;
use status::{unix_now, ErrorReport, IngestStatus, Phase, StatusCell};

/// The supervision of the served generation's ingest.
#[derive(Debug, Default)]
pub(super) struct Ingest {
    /// Failures in a row that a new attempt may fix.
    failures: u32,
    /// When the last failure happened (a healthy run since starts the count again).
    failed_at: Option<Instant>,
    /// The next attempt, when one is planned.
    next_attempt: Option<Instant>,
    /// The last failure was the store's own: it is opened again before the next attempt.
    reopen_store: bool,
    /// The last failure needs the operator: no attempt before a reload.
    waiting_for_operator: bool,
    /// Times it started again.
    restarts: u32,
}

impl Ingest {
    /// The served generation's replication ended with `error`. With a store that cannot
    /// serve yet the engine ends (its host starts it again); otherwise serving goes on and
    /// the next attempt is planned, or left to the operator.
    pub fn failed(
        &mut self,
        error: EngineError,
        active: &Generation,
        status: &StatusCell,
    ) -> Result<(), EngineError> {
        if !active.can_serve() {
            return Err(error);
        }
        let now = Instant::now();
        if self
            .failed_at
            .is_some_and(|at| now.duration_since(at) > HEALTHY_RUN)
        {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        self.failed_at = Some(now);
        self.waiting_for_operator = error.needs_operator();
        self.reopen_store = matches!(&error, EngineError::Store(_))
            || matches!(&error, EngineError::Replication(e) if e.needs_restart());
        let message = if self.waiting_for_operator {
            self.next_attempt = None;
            format!(
                "{error}; ingest stopped, the last checkpoint is still served: fix the cause, \
                 then reload"
            )
        } else {
            let delay = restart_backoff(self.failures);
            self.next_attempt = Some(now + delay);
            format!(
                "{error}; ingest starts again in {} s (failure {} in a row; the wait doubles \
                 up to {} s while the fault repeats), the last checkpoint is still served",
                delay.as_secs(),
                self.failures,
                RESTART_BACKOFF_MAX.as_secs()
            )
        };
        tracing::warn!("{message}");
        let report = ErrorReport::new(message, self.waiting_for_operator);
        let ingest = self.status(Some(&report.message));
        status.update(|s| {
            s.phase = Phase::Failed;
            s.last_error = Some(report);
            s.ingest = ingest;
        });
        Ok(())
    }

    /// Resolves when the next attempt is due; pending while none is planned.
    pub async fn due(&self) {
        match self.next_attempt {
            Some(at) => tokio::time::sleep_until(at.into()).await,
            None => std::future::pending().await,
        }
    }

    /// The operator acted (a reload): an ingest that waits for them starts again now.
    pub fn operator_acted(&mut self) {
        if self.waiting_for_operator {
            self.waiting_for_operator = false;
            self.failures = 0;
            self.next_attempt = Some(Instant::now());
        }
    }

    /// Starts the served generation's ingest again: after a store error the store is
    /// opened again in place first, once its file system has room (else the attempt
    /// waits its turn again; the store keeps serving meanwhile).
    pub async fn restart(&mut self, active: &mut Generation, status: &Arc<StatusCell>) {
        self.next_attempt = None;
        if self.reopen_store {
            if let Err(why) = reopen(active).await {
                let delay = restart_backoff(self.failures.saturating_add(1));
                self.next_attempt = Some(Instant::now() + delay);
                tracing::warn!("{why}; trying again in {} s", delay.as_secs());
                let ingest = self.status(Some(&why));
                status.update(|s| s.ingest = ingest);
                return;
            }
            self.reopen_store = false;
        }
        tracing::info!("the served store's ingest starts again");
        self.restarts = self.restarts.saturating_add(1);
        let ingest = IngestStatus {
            running: true,
            failures: self.failures,
            restarts: self.restarts,
            ..IngestStatus::default()
        };
        status.update(|s| {
            s.phase = Phase::Validating;
            s.ingest = ingest;
        });
        active.start(status.clone());
    }

    /// What `status()` shows of a stopped ingest.
    fn status(&self, because: Option<&str>) -> IngestStatus {
        let now = Instant::now();
        IngestStatus {
            running: false,
            stopped_because: because.map(str::to_owned),
            waiting_for_operator: self.waiting_for_operator,
            failures: self.failures,
            next_attempt_at: self
                .next_attempt
                .map(|at| unix_now() + at.saturating_duration_since(now).as_secs()),
            restarts: self.restarts,
        }
    }
}

/// Opens the served store again in place (off the runtime's threads), once its file
/// system has room for it to grow.
async fn reopen(active: &Generation) -> Result<(), String> {
    let store = active.store.clone();
    if !store.has_room_to_reopen() {
        return Err(format!(
            "the store's file system has less than {} MiB free; the store stays open as it \
             is (serving) until it has",
            store::ROOM_TO_REOPEN >> 20
        ));
    }
    let dir = store.dir().display().to_string();
    tokio::task::spawn_blocking(move || store.reopen())
        .await
        .map_err(|e| format!("opening the store {dir} again failed: {e}"))?
        .map_err(|e| e.to_string())
}
