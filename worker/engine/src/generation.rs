//! One bucket generation: a store built with one rules text, the slot that feeds it, and
//! the replication (bootstrap, then the stream) that fills it. The engine serves one
//! generation; a rules deploy builds the next one beside it (`deploy.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::EngineError;
use config::SourceConnection;
use replication::{
    bootstrap_with, follow_slot, BootstrapIntent, BootstrapOutcome, Progress, ReplicationError,
    SourcePlan, Start, StreamContext, StreamProgress,
};
use rules::{BucketVersion, SyncRules};
use service::Served;
use source::format_lsn;
use status::{DeployPhase, ErrorReport, Phase, StatusCell, StoreStatus};
use store::{Checkpoint, Store};

/// Backoff between attempts after an error that may pass (network, restarting primary).
pub(super) const RETRY_MIN: Duration = Duration::from_secs(1);
pub(super) const RETRY_MAX: Duration = Duration::from_secs(30);

/// A store as found on disk: what it records about itself.
pub(super) struct OpenedStore {
    pub store: Arc<Store>,
    pub intent: Option<BootstrapIntent>,
    /// The rules text its data was built with, when recorded.
    pub rules_text: Option<String>,
    /// The history id its bucket names derive from (`None`: a store of an earlier build,
    /// whose names carry its generation).
    pub history: Option<u64>,
}

impl OpenedStore {
    /// Opens (or creates) the store in `dir` on a blocking thread.
    pub async fn open(dir: PathBuf) -> Result<Self, EngineError> {
        tokio::task::spawn_blocking(move || {
            let store = Arc::new(Store::open(&dir)?);
            let (intent, rules_text, history) = store.read(|view| {
                Ok((
                    BootstrapIntent::load(view),
                    BootstrapIntent::load_rules_text(view),
                    view.history()?,
                ))
            })?;
            Ok(Self {
                store,
                intent: intent?,
                rules_text: rules_text?,
                history,
            })
        })
        .await
        .map_err(|e| EngineError::Thread(std::io::Error::other(e)))?
    }

    /// True when its snapshot completed (it can serve).
    pub fn is_complete(&self) -> bool {
        self.intent
            .as_ref()
            .is_some_and(|i| i.state == replication::BootstrapState::Complete)
    }
}

/// The slot of the store in `dir`: the configured name for the storage directory's own
/// store, the name with `_g<generation>` for a store built beside it (slot names are at
/// most 63 bytes).
pub(super) fn slot_for(base: &str, root: &Path, dir: &Path, generation: u64) -> String {
    if dir == root {
        return base.to_owned();
    }
    let suffix = format!("_g{generation}");
    let keep = base.len().min(63 - suffix.len());
    let mut cut = keep;
    while !base.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", &base[..cut])
}

/// One generation and its replication.
pub(super) struct Generation {
    pub number: u64,
    pub store: Arc<Store>,
    pub rules: Arc<SyncRules>,
    /// What its stream evaluates when that is not `rules`: during a deploy inside its
    /// store, the served rules and the deployed ones together.
    pub stream_rules: Option<Arc<SyncRules>>,
    pub plan: SourcePlan,
    pub progress: Arc<Progress>,
    pub stream_progress: Arc<StreamProgress>,
    published: watch::Sender<Checkpoint>,
    checkpoints: watch::Receiver<Checkpoint>,
    /// Which of its streams a published checkpoint concerns (shared by every `Served` of
    /// it: one consumer of its store's changes).
    wakeups: Arc<service::Wakeups>,
    /// Turns true when the snapshot is complete and durable.
    snapshot_done: watch::Sender<bool>,
    /// Its store held a complete snapshot when it was opened.
    complete_at_open: bool,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Result<(), ReplicationError>>>,
    /// True while this generation is the served one (its replication then reports into
    /// the engine's own status fields, otherwise into the deploy's).
    serving: Arc<AtomicBool>,
    /// Write-checkpoint requests older than this are removed by its stream's applier.
    pub write_checkpoint_max_age: std::time::Duration,
}

impl Generation {
    /// A generation over `opened` (directory number `number`), compiled from `rules_text`,
    /// fed through `slot`. Its bucket names derive from its store's history id, and carry
    /// `number` in a store of an earlier build, which has none.
    pub fn new(
        opened: OpenedStore,
        number: u64,
        rules_text: &str,
        slot: String,
        connection: SourceConnection,
        serving: bool,
    ) -> Result<Self, EngineError> {
        let version = opened
            .history
            .map_or(BucketVersion::Versioned(number), BucketVersion::Derived);
        let rules = Arc::new(SyncRules::parse_with_version(rules_text, version)?);
        let complete_at_open = opened.is_complete();
        let store = opened.store;
        let initial = store.read(|view| view.checkpoint())?;
        let (published, checkpoints) = watch::channel(initial);
        let wakeups = service::Wakeups::new(&store, checkpoints.clone());
        Ok(Self {
            number,
            store,
            rules,
            stream_rules: None,
            plan: SourcePlan { connection, slot },
            progress: Arc::new(Progress::default()),
            stream_progress: Arc::new(StreamProgress::default()),
            published,
            checkpoints,
            wakeups,
            snapshot_done: watch::Sender::new(false),
            complete_at_open,
            stop: watch::Sender::new(false),
            task: None,
            serving: Arc::new(AtomicBool::new(serving)),
            write_checkpoint_max_age: replication::WRITE_CHECKPOINT_MAX_AGE,
        })
    }

    /// Its store's directory.
    pub fn dir(&self) -> &Path {
        self.store.dir()
    }

    /// What the HTTP endpoints serve of this generation.
    pub fn served(&self) -> Arc<Served> {
        Arc::new(Served {
            generation: self.number,
            store: self.store.clone(),
            rules: self.rules.clone(),
            checkpoints: self.checkpoints.clone(),
            wakeups: self.wakeups.clone(),
            stream_progress: self.stream_progress.clone(),
            snapshot_progress: self.progress.clone(),
        })
    }

    /// Its latest published checkpoint.
    pub fn checkpoint(&self) -> Checkpoint {
        *self.checkpoints.borrow()
    }

    /// Follows its published checkpoints.
    pub fn checkpoints(&self) -> watch::Receiver<Checkpoint> {
        self.checkpoints.clone()
    }

    /// Turns true once its snapshot is complete.
    pub fn snapshot_done(&self) -> watch::Receiver<bool> {
        self.snapshot_done.subscribe()
    }

    /// True when its store holds a complete snapshot (found so at open, or made since):
    /// it can serve whatever its replication does.
    pub fn can_serve(&self) -> bool {
        self.complete_at_open || *self.snapshot_done.borrow()
    }

    /// Makes it the served generation: its replication reports into the engine's status.
    pub fn serve(&self) {
        self.serving.store(true, Ordering::Release);
    }

    /// Starts its replication (bootstrap, then the stream) on the runtime.
    pub fn start(&mut self, status: Arc<StatusCell>) {
        self.stop.send_replace(false);
        let context = StreamContext {
            rules: self.stream_rules.as_ref().unwrap_or(&self.rules).clone(),
            store: self.store.clone(),
            published: self.published.clone(),
            progress: self.stream_progress.clone(),
            liveness: replication::Liveness::default(),
            write_checkpoint_max_age: self.write_checkpoint_max_age,
            gone_after: replication::GONE_AFTER,
            group_window: replication::GROUP_WINDOW,
        };
        let reporter = Reporter {
            status,
            serving: self.serving.clone(),
        };
        self.task = Some(tokio::spawn(replicate(
            self.plan.clone(),
            self.number,
            context,
            self.progress.clone(),
            reporter,
            self.snapshot_done.clone(),
            self.stop.subscribe(),
        )));
    }

    /// True while its replication task runs.
    pub fn is_replicating(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Waits for its replication to end by itself (pending forever when not running).
    pub async fn replication_ended(&mut self) -> Result<(), EngineError> {
        let Some(task) = self.task.as_mut() else {
            return std::future::pending().await;
        };
        let result = task.await;
        self.task = None;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(EngineError::Replication(e)),
            Err(e) => Err(EngineError::Thread(std::io::Error::other(e))),
        }
    }

    /// Stops its replication: the current source transaction gets `grace` to commit.
    pub async fn stop(&mut self, grace: Duration) {
        self.stop.send_replace(true);
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                task.abort();
                let _ = task.await;
            }
        }
    }
}

/// Where a generation's replication reports: the engine's status while it is served,
/// the deploy's entry while it is built.
struct Reporter {
    status: Arc<StatusCell>,
    serving: Arc<AtomicBool>,
}

impl Reporter {
    fn serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    fn validating(&self) {
        if self.serving() {
            self.status.update(|s| s.phase = Phase::Validating);
        } else {
            self.deploy(|d| d.phase = DeployPhase::Validating);
        }
    }

    fn streaming(&self) {
        if self.serving() {
            self.status.update(|s| s.phase = Phase::Streaming);
        }
    }

    fn retrying(&self, e: &ReplicationError, validating: bool) {
        let report = ErrorReport::new(e.to_string(), false);
        if self.serving() {
            self.status.update(|s| {
                if validating {
                    s.phase = Phase::Validating;
                }
                s.last_error = Some(report);
            });
        } else {
            self.deploy(|d| d.last_error = Some(report));
        }
    }

    fn snapshot_complete(&self, outcome: BootstrapOutcome, seconds: f64, store: StoreStatus) {
        let (consistent_point, rows) = match outcome {
            BootstrapOutcome::Copied {
                consistent_point,
                rows,
            }
            | BootstrapOutcome::AlreadyComplete {
                consistent_point,
                rows,
            } => (consistent_point, rows),
        };
        if !self.serving() {
            self.deploy(|d| {
                d.phase = DeployPhase::CatchingUp;
                d.rows = rows;
                d.tables_done = d.tables_total;
                d.file_bytes = store.file_bytes;
                d.last_error = None;
            });
            return;
        }
        self.status.update(|s| {
            s.phase = Phase::Ready;
            s.ready = true;
            s.store = Some(store);
            s.last_error = None;
            if let Some(r) = s.replication.as_mut() {
                r.consistent_point = Some(format_lsn(consistent_point));
                r.rows = rows;
                r.tables_done = r.tables_total;
                if matches!(outcome, BootstrapOutcome::Copied { .. }) {
                    r.snapshot_seconds = seconds;
                    r.rows_per_second = if seconds > 0.0 {
                        rows as f64 / seconds
                    } else {
                        0.0
                    };
                }
            }
        });
    }

    fn deploy(&self, change: impl FnOnce(&mut status::DeployStatus)) {
        self.status.update(|s| {
            if let Some(d) = s.deploy.as_mut() {
                change(d);
            }
        });
    }
}

/// The store as `status()` shows it.
pub(super) fn store_status(store: &Store) -> StoreStatus {
    StoreStatus {
        identity: store.identity().clone(),
        file_bytes: store.file_bytes(),
        used_bytes: store.used_bytes(),
        history_forks: store.history_forks(),
        writes_through_map: store.writes_through_map(),
    }
}

/// Bootstraps (retrying errors that may pass), then follows the slot.
async fn replicate(
    plan: SourcePlan,
    generation: u64,
    context: StreamContext,
    progress: Arc<Progress>,
    reporter: Reporter,
    snapshot_done: watch::Sender<bool>,
    stop: watch::Receiver<bool>,
) -> Result<(), ReplicationError> {
    let store = context.store.clone();
    let mut backoff = RETRY_MIN;
    loop {
        reporter.validating();
        let attempt = bootstrap_with(
            &plan,
            context.rules.clone(),
            store.clone(),
            progress.clone(),
            Start { generation },
        );
        let mut stopped = stop.clone();
        let outcome = tokio::select! {
            outcome = attempt => outcome,
            // Dropping the bootstrap joins its threads; an interrupted one starts over.
            _ = stopped.wait_for(|s| *s) => return Ok(()),
        };
        match outcome {
            Ok(outcome) => {
                let seconds = progress.copy_elapsed().as_secs_f64();
                reporter.snapshot_complete(outcome, seconds, store_status(&store));
                // Streams start from the completed snapshot's checkpoint.
                context
                    .published
                    .send_replace(store.read(|view| view.checkpoint())?);
                snapshot_done.send_replace(true);
                return stream(&plan, &context, &reporter, stop).await;
            }
            Err(e) if e.needs_operator() || e.needs_restart() => return Err(e),
            Err(e) => {
                tracing::warn!("{e}; retrying in {backoff:?}");
                reporter.retrying(&e, true);
                let mut stopped = stop.clone();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopped.wait_for(|s| *s) => return Ok(()),
                }
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Follows the slot until stopped, reconnecting with backoff after errors that may pass.
async fn stream(
    plan: &SourcePlan,
    context: &StreamContext,
    reporter: &Reporter,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ReplicationError> {
    write_through_map(&context.store).await?;
    let mut backoff = RETRY_MIN;
    loop {
        reporter.streaming();
        let started = std::time::Instant::now();
        match follow_slot_alone(plan, context, stop.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if e.needs_operator() || e.needs_restart() => return Err(e),
            Err(e) => {
                if started.elapsed() > RETRY_MAX {
                    backoff = RETRY_MIN;
                }
                tracing::warn!("{e}; reconnecting in {backoff:?}");
                reporter.retrying(&e, false);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => return Ok(()),
                }
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// [`follow_slot`] on a runtime of its own with one worker thread (`psm-stream`, see
/// `own_runtime`): the stream's reads, decoding and hand-offs to the applier stay on one
/// thread. A runtime that cannot be started is an error that may pass.
async fn follow_slot_alone(
    plan: &SourcePlan,
    context: &StreamContext,
    stop: watch::Receiver<bool>,
) -> Result<(), ReplicationError> {
    let (plan, context) = (plan.clone(), context.clone());
    let followed = crate::own_runtime::run("psm-stream", async move {
        follow_slot(&plan, &context, stop).await
    });
    followed.await.unwrap_or_else(|e| {
        Err(ReplicationError::Stream {
            code: "PSM_R2010",
            message: format!("cannot run the stream on a thread of its own: {e}; retrying"),
            operator: false,
        })
    })
}

/// The stream writes through the store's map (`Store::write_through_map`): its large
/// transactions spill nothing and its small ones make no file writes. The snapshot before
/// it wrote with file writes, which are faster for its long runs of new pages.
async fn write_through_map(store: &Arc<Store>) -> Result<(), ReplicationError> {
    let store = store.clone();
    let dir = store.dir().to_owned();
    let map = tokio::task::spawn_blocking(move || store.write_through_map())
        .await
        .map_err(|e| {
            let e = std::io::Error::other(e);
            store::StoreError::io(&dir, "open the store to write through its map", e)
        })??;
    if map {
        tracing::debug!(dir = %dir.display(), "the store writes through its map");
    } else {
        tracing::info!(
            dir = %dir.display(),
            "the store writes its pages with file writes: its file system is not ext4 or XFS, \
             or its space could not be reserved for writes through a map (a warning before \
             says why)"
        );
    }
    Ok(())
}
