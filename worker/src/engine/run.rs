//! The engine thread: runtime, store, HTTP server, replication, and the wait for the stop
//! signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{EngineConfig, EngineError};
use crate::admin;
use crate::auth::Authenticator;
use crate::http::{self, HttpState, SyncService};
use crate::replication::{
    bootstrap, follow_slot, BootstrapIntent, BootstrapOutcome, Progress, ReplicationError,
    SourcePlan, StreamContext, StreamProgress,
};
use crate::rules::{BucketVersion, SyncRules};
use crate::source::{format_lsn, PrimaryHead};
use crate::status::{unix_now, ErrorReport, Phase, ReplicationStatus, StatusCell, StoreStatus};
use crate::store::{Checkpoint, Store};

/// How often the engine's loop proves it is alive (liveness probe) and refreshes sizes.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long replication gets to finish its current transaction when the engine stops.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Backoff between attempts after an error that may pass (network, restarting primary).
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

pub(super) fn run(
    config: EngineConfig,
    status: Arc<StatusCell>,
    stop: watch::Receiver<bool>,
) -> Result<(), EngineError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.runtime_threads.max(1))
        .thread_name("psm-engine-rt")
        .enable_all()
        .build()
        .map_err(EngineError::Thread)?;
    let result = runtime.block_on(serve(config, status.clone(), stop));
    runtime.shutdown_timeout(Duration::from_millis(200));
    match &result {
        Ok(()) => status.update(|s| {
            s.phase = Phase::Stopped;
            s.ready = false;
        }),
        Err(e) => status.fail(
            Phase::Failed,
            ErrorReport::new(e.to_string(), e.needs_operator()),
        ),
    }
    result
}

async fn serve(
    config: EngineConfig,
    status: Arc<StatusCell>,
    mut host_stop: watch::Receiver<bool>,
) -> Result<(), EngineError> {
    // `halt` stops the HTTP server, the sync streams and replication: on the host's stop
    // signal, and when the engine ends on an error of its own.
    let (halt, mut stop) = watch::channel(false);
    let forward = {
        let halt = halt.clone();
        tokio::spawn(async move {
            let _ = host_stop.wait_for(|s| *s).await;
            halt.send_replace(true);
        })
    };
    let result = run_engine(config, status, &mut stop, &halt).await;
    halt.send_replace(true);
    forward.abort();
    result
}

async fn run_engine(
    config: EngineConfig,
    status: Arc<StatusCell>,
    stop: &mut watch::Receiver<bool>,
    halt: &watch::Sender<bool>,
) -> Result<(), EngineError> {
    status.update(|s| {
        s.phase = Phase::OpeningStorage;
        s.ready = false;
        s.engine_starts += 1;
        s.started_at = Some(unix_now());
        s.storage_dir = Some(config.storage_dir.display().to_string());
        s.config_file = Some(config.service.path.display().to_string());
        s.config_ignored = config.service.ignored.clone();
        s.listen.clear();
        s.admin_socket = None;
        s.store = None;
        s.replication = None;
        s.last_error = None;
    });
    let dir = config.storage_dir.clone();
    let store = Arc::new(
        tokio::task::spawn_blocking(move || Store::open(&dir))
            .await
            .map_err(|e| EngineError::Thread(std::io::Error::other(e)))??,
    );
    // Bucket names carry the generation of the stored data; a store built after a reset
    // gets the next one (spec §7.6), so clients drop the old buckets cleanly.
    let generation = match store.read(|view| Ok(BootstrapIntent::load(view)))?? {
        Some(intent) => intent.generation,
        None => crate::store::next_generation(store.dir())?,
    };
    let rules = Arc::new(SyncRules::parse_with_version(
        &config.service.rules.content,
        BucketVersion::Versioned(generation),
    )?);
    tracing::info!(
        dir = %store.dir().display(),
        store_id = %store.identity().store_id,
        created = store.was_created(),
        "storage open"
    );
    status.update(|s| s.store = Some(store_status(&store)));

    let initial = store.read(|view| view.checkpoint())?;
    let (published, checkpoints) = watch::channel::<Checkpoint>(initial);
    let auth = Authenticator::new(&config.service.client_auth)?;
    let sync = Arc::new(SyncService::new(
        status.clone(),
        store.clone(),
        rules.clone(),
        auth,
        checkpoints.clone(),
        PrimaryHead::new(config.service.source.clone()),
        stop.clone(),
    ));
    let listeners = http::bind(&config.listen_addresses, config.service.port)
        .await
        .map_err(|(address, source)| EngineError::Listen { address, source })?;
    let listen: Vec<String> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .collect();
    let open_files = http::raise_open_files_limit();
    tracing::info!(addresses = %listen.join(","), open_files, "HTTP server listening");
    let progress = Arc::new(Progress::default());
    let stream_progress = Arc::new(StreamProgress::default());
    let admin = start_admin(&config, &sync, &status, stop);
    let server = tokio::spawn(http::serve(
        listeners,
        HttpState {
            status: status.clone(),
            sync,
            stream_progress: stream_progress.clone(),
            snapshot_progress: progress.clone(),
        },
        stop.clone(),
    ));
    status.touch();
    let plan = SourcePlan {
        connection: config.service.source.clone(),
        slot: config.slot_name.clone(),
    };
    status.update(|s| {
        s.listen = listen;
        s.phase = Phase::Validating;
        s.replication = Some(ReplicationStatus {
            slot: plan.slot.clone(),
            tables_total: rules.tables().len() as u64,
            ..ReplicationStatus::default()
        });
    });

    let context = StreamContext {
        rules,
        store: store.clone(),
        published,
        progress: stream_progress.clone(),
    };
    let mut replication = tokio::spawn(replicate(
        plan,
        context,
        progress.clone(),
        status.clone(),
        stop.clone(),
    ));
    let mut replicating = true;
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    let outcome = loop {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => break Ok(()),
                                    done = &mut replication, if replicating => {
                // Replication finished its work for now; keep serving until stopped.
                replicating = false;
                match done {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => break Err(EngineError::Replication(e)),
                    Err(e) => break Err(EngineError::Thread(std::io::Error::other(e))),
                }
            }
            _ = heartbeat.tick() => {
                status.touch();
                status.update(|s| {
                    s.store = Some(store_status(&store));
                                        if s.phase == Phase::Validating && progress.copying() {
                        s.phase = Phase::Snapshotting;
                    }
                    if s.phase == Phase::Streaming {
                        if let Some(r) = s.replication.as_mut() {
                            let checkpoint = *checkpoints.borrow();
                            r.applied_lsn = Some(format_lsn(checkpoint.lsn));
                            r.last_op_id = checkpoint.op_id;
                            r.transactions = stream_progress.transactions.load(std::sync::atomic::Ordering::Relaxed);
                            r.changes = stream_progress.changes.load(std::sync::atomic::Ordering::Relaxed);
                            r.retained_wal_bytes = stream_progress.retained_wal_bytes.load(std::sync::atomic::Ordering::Relaxed);
                            let head = stream_progress.primary_head_lsn.load(std::sync::atomic::Ordering::Relaxed);
                            r.primary_lsn = (head > 0).then(|| format_lsn(head));
                            r.lag_bytes = head.saturating_sub(checkpoint.lsn);
                        }
                    }
                    if s.phase == Phase::Snapshotting {
                        if let Some(r) = s.replication.as_mut() {
                            let seconds = progress.copy_elapsed().as_secs_f64();
                            r.rows = progress.rows();
                            r.tables_done = progress.tables_done();
                            r.snapshot_seconds = seconds;
                            r.rows_per_second = if seconds > 0.0 { r.rows as f64 / seconds } else { 0.0 };
                        }
                    }
                });
            }
        }
    };
    status.update(|s| {
        s.phase = Phase::Stopping;
        s.ready = false;
    });
    if replicating
        && tokio::time::timeout(STOP_GRACE, &mut replication)
            .await
            .is_err()
    {
        replication.abort();
        let _ = replication.await;
    }
    // Ends the server (and every stream) also when the engine failed.
    halt.send_replace(true);
    let _ = server.await;
    if let Some(admin) = admin {
        let _ = admin.await;
    }
    status.update(|s| s.admin_socket = None);
    // The bootstrap's threads hold the store; they are joined when its task is dropped.
    drop(store);
    tracing::info!("engine stopped");
    outcome
}

/// Starts the admin socket beside the HTTP server. A socket that cannot be served does
/// not stop the engine: the SQL support functions then say so, and the log tells why.
fn start_admin(
    config: &EngineConfig,
    sync: &Arc<SyncService>,
    status: &StatusCell,
    stop: &watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let path = config.admin_socket.clone()?;
    match admin::bind(&path) {
        Ok(listener) => {
            status.update(|s| s.admin_socket = Some(path.display().to_string()));
            Some(tokio::spawn(admin::serve(
                listener,
                path,
                sync.clone(),
                stop.clone(),
            )))
        }
        Err(e) => {
            tracing::warn!(
                "{e}; the SQL functions buckets(), user_buckets() and streams() will not work"
            );
            None
        }
    }
}

fn store_status(store: &Store) -> StoreStatus {
    StoreStatus {
        identity: store.identity().clone(),
        file_bytes: store.file_bytes(),
        used_bytes: store.used_bytes(),
    }
}

/// Bootstraps (retrying errors that may pass), then reports readiness.
async fn replicate(
    plan: SourcePlan,
    context: StreamContext,
    progress: Arc<Progress>,
    status: Arc<StatusCell>,
    stop: watch::Receiver<bool>,
) -> Result<(), ReplicationError> {
    let store = context.store.clone();
    let mut backoff = RETRY_MIN;
    loop {
        status.update(|s| s.phase = Phase::Validating);
        let attempt = bootstrap(
            &plan,
            context.rules.clone(),
            store.clone(),
            progress.clone(),
        );
        let mut stopped = stop.clone();
        let outcome = tokio::select! {
            outcome = attempt => outcome,
            // Dropping the bootstrap joins its threads; an interrupted one starts over.
            _ = stopped.wait_for(|s| *s) => return Ok(()),
        };
        match outcome {
            Ok(outcome) => {
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
                let seconds = progress.copy_elapsed().as_secs_f64();
                let stored = store_status(&store);
                status.update(|s| {
                    s.phase = Phase::Ready;
                    s.ready = true;
                    s.store = Some(stored);
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
                // Streams start from the completed snapshot's checkpoint.
                context
                    .published
                    .send_replace(store.read(|view| view.checkpoint())?);
                return stream(&plan, &context, &status, stop).await;
            }
            Err(e) if e.needs_operator() || e.needs_restart() => return Err(e),
            Err(e) => {
                tracing::warn!("{e}; retrying in {backoff:?}");
                status.update(|s| {
                    s.phase = Phase::Validating;
                    s.last_error = Some(ErrorReport::new(e.to_string(), false));
                });
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
    status: &StatusCell,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ReplicationError> {
    let mut backoff = RETRY_MIN;
    loop {
        status.update(|s| s.phase = Phase::Streaming);
        let started = std::time::Instant::now();
        match follow_slot(plan, context, stop.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if e.needs_operator() || e.needs_restart() => return Err(e),
            Err(e) => {
                if started.elapsed() > RETRY_MAX {
                    backoff = RETRY_MIN;
                }
                tracing::warn!("{e}; reconnecting in {backoff:?}");
                status.update(|s| s.last_error = Some(ErrorReport::new(e.to_string(), false)));
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => return Ok(()),
                }
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}
