//! The engine thread: runtime, store, HTTP server, replication, and the wait for the stop
//! signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use std::sync::atomic::Ordering::Relaxed;

use super::deploy::{GenerationEvent, Generations};
use super::generation::{store_status, Generation};
use super::idle_release::BLOCKING_THREAD_KEEP_ALIVE;
use super::ingest::Ingest;
use super::seeding::{seed_unless_complete, SeedTarget};
use super::{EngineConfig, EngineError};
use auth::Authenticator;
use config::ConfigError;
use http::HttpState;
use service::{AdminApi, ReprocessRequest, RequestLimits, StreamLimits, SyncService};
use source::{format_lsn, PrimaryHead};
use status::{
    unix_now, ErrorReport, IngestStatus, Phase, ReplicationStatus, ServedCheckpoint, StatusCell,
};

/// How often the engine's loop proves it is alive (liveness probe) and refreshes sizes.
const HEARTBEAT: Duration = Duration::from_secs(1);

pub(super) fn run(
    config: EngineConfig,
    status: Arc<StatusCell>,
    rules: watch::Receiver<Arc<str>>,
    stop: watch::Receiver<bool>,
) -> Result<(), EngineError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.runtime_threads.max(1))
        .thread_name("psm-engine-rt")
        .thread_keep_alive(BLOCKING_THREAD_KEEP_ALIVE)
        .on_thread_park(crate::idle_release::on_park)
        .enable_all()
        .build()
        .map_err(EngineError::Thread)?;
    let result = runtime.block_on(serve(config, status.clone(), rules, stop));
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
    mut rules: watch::Receiver<Arc<str>>,
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
    let result = run_engine(config, status, &mut rules, &mut stop, &halt).await;
    halt.send_replace(true);
    forward.abort();
    result
}

async fn run_engine(
    config: EngineConfig,
    status: Arc<StatusCell>,
    rules: &mut watch::Receiver<Arc<str>>,
    stop: &mut watch::Receiver<bool>,
    halt: &watch::Sender<bool>,
) -> Result<(), EngineError> {
    let warnings = auth::weak_key_warnings(&config.service.client_auth.jwks_keys);
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    status.update(|s| {
        s.phase = Phase::OpeningStorage;
        s.ready = false;
        s.engine_starts += 1;
        s.started_at = Some(unix_now());
        s.storage_dir = Some(config.storage_dir.display().to_string());
        s.config_file = Some(config.service.path.display().to_string());
        s.config_ignored = config.service.ignored.clone();
        s.config_warnings = warnings.clone();
        s.listen.clear();
        s.admin_socket = None;
        s.store = None;
        s.replication = None;
        s.generation = None;
        s.rules_hash = None;
        s.deploy = None;
        s.last_error = None;
    });
    let configured: Arc<str> = rules.borrow_and_update().clone();
    if let (Some(peer), Some(secret)) = (&config.fleet.seed_from, &config.fleet.peer_secret) {
        let from = replication::SeedSource {
            peer: peer.clone(),
            secret: secret.clone(),
            ca_file: config.fleet.tls.ca_file.clone(),
        };
        let target = SeedTarget {
            root: &config.storage_dir,
            slot_base: &config.slot_name,
            connection: &config.service.source,
            rules_text: &configured,
        };
        if !seed_unless_complete(target, &from, &status, stop.clone()).await? {
            return Ok(());
        }
    }
    let mut generations = Generations::open(
        config.storage_dir.clone(),
        config.slot_name.clone(),
        config.service.source.clone(),
        &configured,
        status.clone(),
        config
            .write_checkpoint_max_age
            .unwrap_or(replication::WRITE_CHECKPOINT_MAX_AGE),
    )
    .await?;
    let result = serve_generations(&config, &status, &mut generations, rules, stop, halt).await;
    generations.stop().await;
    drop(generations);
    tracing::info!("engine stopped");
    result
}

async fn serve_generations(
    config: &EngineConfig,
    status: &Arc<StatusCell>,
    generations: &mut Generations,
    rules: &mut watch::Receiver<Arc<str>>,
    stop: &mut watch::Receiver<bool>,
    halt: &watch::Sender<bool>,
) -> Result<(), EngineError> {
    report_storage_open(status, &generations.active);
    let auth = Authenticator::new(&config.service.client_auth)?;
    let open_files = http::raise_open_files_limit();
    let http_limits = config
        .http_limits
        .unwrap_or_else(|| http::HttpLimits::for_open_files(open_files));
    let sync = Arc::new(
        SyncService::new(
            status.clone(),
            generations.active.served(),
            auth,
            PrimaryHead::new(config.service.source.clone()),
            stop.clone(),
            stream_limits(&config.service.api, &http_limits),
        )
        .map_err(EngineError::Thread)?,
    );
    let listeners = http::bind(&config.listen_addresses, config.service.port)
        .await
        .map_err(|(address, source)| EngineError::Listen { address, source })?;
    let listen: Vec<String> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .collect();
    tracing::info!(
        addresses = %listen.join(","),
        open_files,
        max_connections = http_limits.max_connections,
        max_streams = sync.limits.max_streams,
        "HTTP server listening"
    );
    let admin_socket = start_admin(config, &sync, status, stop);
    let (admin_api, mut reprocess) = AdminApi::new(
        config.service.api_tokens.clone(),
        status.clone(),
        config.service.source.clone(),
        sync.subscribe(),
    );
    let admin_api = Arc::new(admin_api);
    admin_api.set_configs(generations.configs());
    let state = HttpState {
        status: status.clone(),
        sync: sync.clone(),
        admin: admin_api.clone(),
        peer: config
            .fleet
            .peer_secret
            .as_ref()
            .map(|s| Arc::new(http::PeerGate::new(s.expose(), config.fleet.peer_loopback))),
    };
    let peers = start_peer_listener(&config.fleet, &state, stop).await?;
    let scrapes = start_metrics_listener(config, &state, stop).await?;
    let server = tokio::spawn(http::serve(listeners, state, stop.clone(), http_limits));
    status.touch();
    let tables_total = generations.active.rules.tables().len() as u64;
    // A complete store serves from here on, whatever its ingest does: before the primary
    // is reached (it may be down), and after ingest errors.
    let serving = generations.active.can_serve();
    status.update(|s| {
        s.listen = listen;
        s.phase = Phase::Validating;
        s.ready = serving;
        s.ingest = IngestStatus {
            running: true,
            ..IngestStatus::default()
        };
        s.replication = Some(ReplicationStatus {
            slot: generations.active.plan.slot.clone(),
            tables_total,
            ..ReplicationStatus::default()
        });
    });
    generations.active.start(status.clone());
    // The configured rules differ from the served ones: deploy them (a resumed build
    // is kept).
    generations
        .consider(rules.borrow_and_update().clone())
        .await;
    let admin = AdminLink {
        api: &admin_api,
        reprocess: &mut reprocess,
    };
    let outcome = follow_generations(status, generations, &sync, rules, stop, admin).await;
    status.update(|s| {
        s.phase = Phase::Stopping;
        s.ready = false;
    });
    generations.stop().await;
    // Ends the server (and every stream) also when the engine failed.
    halt.send_replace(true);
    let _ = server.await;
    for task in [peers, scrapes, admin_socket].into_iter().flatten() {
        let _ = task.await;
    }
    status.update(|s| s.admin_socket = None);
    outcome
}

/// The opened store of the served generation, logged and into `status()`.
fn report_storage_open(status: &StatusCell, active: &Generation) {
    let store = active.store.clone();
    tracing::info!(
        dir = %store.dir().display(),
        store_id = %store.identity().store_id,
        created = store.was_created(),
        generation = active.number,
        "storage open"
    );
    let (number, rules_hash) = (active.number, active.rules.content_hash_hex());
    let store = store_status(&store);
    status.update(|s| {
        s.store = Some(store);
        s.generation = Some(number);
        s.rules_hash = Some(rules_hash);
    });
}

/// Serves until stopped: the generations' events (a stopped stream, a finished build),
/// changed rules, and the heartbeat. Ends with the served generation's error, if any.
async fn follow_generations(
    status: &Arc<StatusCell>,
    generations: &mut Generations,
    sync: &Arc<SyncService>,
    rules: &mut watch::Receiver<Arc<str>>,
    stop: &mut watch::Receiver<bool>,
    admin: AdminLink<'_>,
) -> Result<(), EngineError> {
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    let mut snapshot_logged = std::time::Instant::now();
    let mut ingest = Ingest::default();
    loop {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return Ok(()),
            event = generations.next_event() => match event {
                // Replication finished its work for now; keep serving until stopped.
                GenerationEvent::ServedStopped(Ok(())) => {}
                // A complete store goes on serving; the ingest starts again by itself or
                // when the operator reloads.
                GenerationEvent::ServedStopped(Err(e)) => {
                    ingest.failed(e, &generations.active, status)?;
                }
                GenerationEvent::BuildReady(Ok(())) => generations.switch(sync).await,
                GenerationEvent::BuildReady(Err(e)) => generations.fail_build(&e),
                GenerationEvent::InPlaceReady => generations.finish_in_place(sync).await,
            },
            Some(request) = admin.reprocess.recv() => {
                let _ = request.reply.send(generations.reprocess().await);
            }
            () = ingest.due() => ingest.restart(&mut generations.active, status).await,
            changed = rules.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                // A reload: an ingest that waits for the operator starts again.
                ingest.operator_acted();
                // The rules of a failed build, handed over again, are tried again.
                let text = rules.borrow_and_update().clone();
                generations.consider(text).await;
            }
            _ = heartbeat.tick() => {
                status.touch();
                report_heartbeat(status, &generations.active);
                report_source(status, &generations.active);
                generations.report_progress();
                log_snapshot_progress(status, &mut snapshot_logged);
            }
        }
        // What it serves and deploys may have changed with any of these.
        admin.api.set_configs(generations.configs());
    }
}

/// The admin API as the engine's loop serves it: what it publishes to it, and the re-copy
/// requests it takes from it.
struct AdminLink<'a> {
    api: &'a AdminApi,
    reprocess: &'a mut tokio::sync::mpsc::Receiver<ReprocessRequest>,
}

/// When the served generation's replication last heard from the primary, and whether
/// that is longer ago than the connection's bound (`source_stalled`, which fails the
/// readiness probe), once per heartbeat.
fn report_source(status: &StatusCell, active: &Generation) {
    let heard_ms = active
        .progress
        .heard
        .at_ms()
        .max(active.stream_progress.heard.at_ms());
    let bound = active.plan.connection.bounds.stall_after;
    let silent = Duration::from_millis(status::unix_now_ms().saturating_sub(heard_ms));
    status.update(|s| {
        let replicating = matches!(
            s.phase,
            Phase::Snapshotting | Phase::Ready | Phase::Streaming
        );
        if let Some(r) = s.replication.as_mut() {
            r.source_heard_at = (heard_ms > 0).then_some(heard_ms / 1000);
            r.source_stalled = replicating && heard_ms > 0 && silent > bound;
        }
    });
}

/// The checkpoint served now, since when (kept from `before` while it is the same).
fn served_checkpoint(
    before: Option<ServedCheckpoint>,
    checkpoint: store::Checkpoint,
    now: u64,
) -> ServedCheckpoint {
    let lsn = format_lsn(checkpoint.lsn);
    let since = before
        .filter(|b| b.lsn == lsn && b.op_id == checkpoint.op_id)
        .map_or(now, |b| b.since);
    ServedCheckpoint {
        lsn,
        op_id: checkpoint.op_id,
        since,
        age_seconds: now.saturating_sub(since),
    }
}

/// The served generation's progress into `status()`, once per heartbeat.
fn report_heartbeat(status: &StatusCell, active: &Generation) {
    let (progress, stream_progress) = (&active.progress, &active.stream_progress);
    let checkpoint = active.checkpoint();
    // Read from the store before the status lock is taken: probes, `/metrics` and the
    // PostgreSQL main loop take it too, and must not wait on the store.
    let store = store_status(&active.store);
    let now = unix_now();
    status.update(|s| {
        s.store = Some(store);
        s.served = s
            .ready
            .then(|| served_checkpoint(s.served.take(), checkpoint, now));
        if s.phase == Phase::Validating && progress.copying() {
            s.phase = Phase::Snapshotting;
        }
        if s.phase == Phase::Streaming {
            if let Some(r) = s.replication.as_mut() {
                r.applied_lsn = Some(format_lsn(checkpoint.lsn));
                r.last_op_id = checkpoint.op_id;
                r.transactions = stream_progress.transactions.load(Relaxed);
                r.changes = stream_progress.changes.load(Relaxed);
                r.changes_received = stream_progress.received.load(Relaxed);
                r.uncommitted_changes = stream_progress.uncommitted.load(Relaxed);
                r.retained_wal_bytes = stream_progress.retained_wal_bytes.load(Relaxed);
                r.recopying = stream_progress.recopying.load(Relaxed);
                r.recopies = stream_progress
                    .recopies
                    .lock()
                    .iter()
                    .map(|p| status::RecopyStatus {
                        table: p.table.clone(),
                        reason: p.why.clone(),
                        started_at: p.started_at,
                        rows_merged: p.rows_merged,
                        rows_written: p.rows_written,
                        extra_file_bytes: p.extra_file_bytes,
                    })
                    .collect();
                r.rebuild = stream_progress.rebuild.lock().as_ref().map(|p| {
                    let seconds = unix_now().saturating_sub(p.started_at) as f64;
                    let rate = if seconds > 0.0 {
                        p.rows_merged as f64 / seconds
                    } else {
                        0.0
                    };
                    let (percent, eta_seconds) =
                        snapshot_estimate(p.rows_merged, p.rows_estimated, rate);
                    status::RebuildStatus {
                        reason: p.why.clone(),
                        started_at: p.started_at,
                        tables_total: p.tables_total,
                        tables_done: p.tables_done,
                        rows_merged: p.rows_merged,
                        rows_estimated: p.rows_estimated,
                        percent,
                        eta_seconds,
                        rows_written: p.rows_written,
                        extra_file_bytes: p.extra_file_bytes,
                    }
                });
                r.last_rebuild =
                    stream_progress
                        .last_rebuild
                        .lock()
                        .as_ref()
                        .map(|d| status::RebuildDone {
                            reason: d.why.clone(),
                            finished_at: d.finished_at,
                            seconds: d.millis as f64 / 1000.0,
                            rows: d.rows,
                        });
                r.tables_gone = stream_progress.tables_gone.load(Relaxed);
                r.tables_missing = stream_progress.tables_missing.load(Relaxed);
                r.rebuilding = stream_progress.rebuilding.load(Relaxed);
                let head = stream_progress.primary_head_lsn.load(Relaxed);
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
                r.rows_per_second = if seconds > 0.0 {
                    r.rows as f64 / seconds
                } else {
                    0.0
                };
                r.rows_estimated = progress.rows_estimated();
                (r.percent, r.eta_seconds) =
                    snapshot_estimate(r.rows, r.rows_estimated, r.rows_per_second);
            }
        }
    });
}

/// The share of `estimated` rows copied (at most 99.9 % while copying: the estimate is
/// the planner's) and the seconds left at `rate`; `None` without an estimate.
fn snapshot_estimate(rows: u64, estimated: u64, rate: f64) -> (Option<f64>, Option<f64>) {
    if estimated == 0 {
        return (None, None);
    }
    let percent = (rows as f64 * 100.0 / estimated as f64).min(99.9);
    let eta = (rate > 0.0).then(|| estimated.saturating_sub(rows) as f64 / rate);
    (
        Some((percent * 10.0).round() / 10.0),
        eta.map(|s| s.round()),
    )
}

/// Every [`SNAPSHOT_LOG_EVERY`] while snapshotting or rebuilding from a new slot, a log
/// line with its progress as `status()` shows it.
fn log_snapshot_progress(status: &StatusCell, last: &mut std::time::Instant) {
    if last.elapsed() < SNAPSHOT_LOG_EVERY {
        return;
    }
    let snapshot = status.snapshot();
    let Some(r) = snapshot.replication.as_ref() else {
        return;
    };
    let show =
        |v: Option<f64>, unit: &str| v.map_or_else(|| "?".to_owned(), |v| format!("{v}{unit}"));
    if let Some(b) = r.rebuild.as_ref().filter(|_| r.rebuilding) {
        *last = std::time::Instant::now();
        tracing::info!(
            tables = format!("{}/{}", b.tables_done, b.tables_total),
            rows = b.rows_merged,
            rows_estimated = b.rows_estimated,
            percent = show(b.percent, "%"),
            eta = show(b.eta_seconds, " s"),
            "rebuild progress"
        );
        return;
    }
    if snapshot.phase != Phase::Snapshotting {
        return;
    }
    *last = std::time::Instant::now();
    tracing::info!(
        tables = format!("{}/{}", r.tables_done, r.tables_total),
        rows = r.rows,
        rows_estimated = r.rows_estimated,
        percent = show(r.percent, "%"),
        eta = show(r.eta_seconds, " s"),
        rows_per_second = r.rows_per_second.round(),
        "snapshot progress"
    );
}

/// How often the snapshot's progress is logged.
const SNAPSHOT_LOG_EVERY: Duration = Duration::from_secs(5);

/// Starts the admin socket beside the HTTP server. A socket that cannot be served does
/// not stop the engine: the SQL support functions then say so, and the log tells why.
/// The peer listener (`powersync_mdbx.peer_listen`: `/peer/store` over TLS), when set.
async fn start_peer_listener(
    fleet: &crate::Fleet,
    state: &HttpState,
    stop: &watch::Receiver<bool>,
) -> Result<Option<tokio::task::JoinHandle<()>>, EngineError> {
    let (Some(address), Some(cert), Some(key)) = (
        &fleet.peer_listen,
        &fleet.tls.cert_file,
        &fleet.tls.key_file,
    ) else {
        return Ok(None);
    };
    let acceptor = http::peer_tls_acceptor(cert, key)
        .map_err(|message| EngineError::Config(ConfigError::Setting { message }))?;
    let listener = tokio::net::TcpListener::bind(address.as_str())
        .await
        .map_err(|source| EngineError::Listen {
            address: address.clone(),
            source,
        })?;
    tracing::info!(
        address = %listener.local_addr().map_or_else(|_| address.clone(), |a| a.to_string()),
        "peer listener (TLS) serving copies of the store"
    );
    Ok(Some(tokio::spawn(http::serve_peers(
        listener,
        acceptor,
        state.clone(),
        stop.clone(),
    ))))
}

/// `GET /metrics` alone on `telemetry.prometheus_port` of every listen address, when set.
async fn start_metrics_listener(
    config: &EngineConfig,
    state: &HttpState,
    stop: &watch::Receiver<bool>,
) -> Result<Option<tokio::task::JoinHandle<()>>, EngineError> {
    let Some(port) = config.service.prometheus_port else {
        return Ok(None);
    };
    let listeners = http::bind(&config.listen_addresses, port)
        .await
        .map_err(|(address, source)| EngineError::Listen { address, source })?;
    let addresses: Vec<String> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .collect();
    tracing::info!(addresses = %addresses.join(","), "metrics listening (telemetry.prometheus_port)");
    Ok(Some(tokio::spawn(http::serve_metrics(
        listeners,
        state.clone(),
        stop.clone(),
    ))))
}

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

/// The streams' limits: the file's `api.parameters` where set, never more streams than
/// connections.
fn stream_limits(api: &config::ApiLimits, http: &http::HttpLimits) -> StreamLimits {
    let defaults = StreamLimits::default();
    StreamLimits {
        max_streams: api
            .max_concurrent_connections
            .unwrap_or(defaults.max_streams)
            .min(http.max_connections),
        max_streams_per_user: api
            .max_concurrent_connections_per_user
            .unwrap_or(defaults.max_streams_per_user),
        request: RequestLimits {
            max_buckets: api
                .max_buckets_per_connection
                .unwrap_or(defaults.request.max_buckets),
            max_parameter_results: api
                .max_parameter_query_results
                .unwrap_or(defaults.request.max_parameter_results),
        },
    }
}

#[cfg(test)]
mod progress_tests {
    use super::snapshot_estimate;

    #[test]
    fn progress_is_a_share_of_the_estimate_and_an_eta_at_the_rate_so_far() {
        assert_eq!(snapshot_estimate(500, 0, 10.0), (None, None));
        assert_eq!(
            snapshot_estimate(250, 1_000, 50.0),
            (Some(25.0), Some(15.0))
        );
        // Past the planner's estimate: not 100 % before the copy completes.
        assert_eq!(
            snapshot_estimate(1_200, 1_000, 50.0),
            (Some(99.9), Some(0.0))
        );
        // No rate yet: a percent, no ETA.
        assert_eq!(snapshot_estimate(0, 1_000, 0.0), (Some(0.0), None));
    }
}
