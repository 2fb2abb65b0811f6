//! The engine thread: runtime, store, HTTP server, and the wait for the stop signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{EngineConfig, EngineError};
use crate::http::{self, HttpState};
use crate::status::{unix_now, Phase, StatusCell, StoreStatus};
use crate::store::Store;

/// How often the engine's loop proves it is alive (liveness probe) and refreshes sizes.
const HEARTBEAT: Duration = Duration::from_secs(1);

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
            crate::status::ErrorReport::new(e.to_string(), e.needs_operator()),
        ),
    }
    result
}

async fn serve(
    config: EngineConfig,
    status: Arc<StatusCell>,
    mut stop: watch::Receiver<bool>,
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
        s.store = None;
    });
    let dir = config.storage_dir.clone();
    let store = tokio::task::spawn_blocking(move || Store::open(&dir))
        .await
        .map_err(|e| EngineError::Thread(std::io::Error::other(e)))??;
    tracing::info!(
        dir = %store.dir().display(),
        store_id = %store.identity().store_id,
        created = store.was_created(),
        "storage open"
    );
    let store_status = |store: &Store| StoreStatus {
        identity: store.identity().clone(),
        file_bytes: store.file_bytes(),
    };
    status.update(|s| s.store = Some(store_status(&store)));

    let listeners = http::bind(&config.listen_addresses, config.service.port)
        .await
        .map_err(|(address, source)| EngineError::Listen { address, source })?;
    let listen: Vec<String> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .collect();
    tracing::info!(addresses = %listen.join(","), "HTTP server listening");
    let server = tokio::spawn(http::serve(
        listeners,
        HttpState {
            status: status.clone(),
        },
        stop.clone(),
    ));

    status.touch();
    status.update(|s| {
        s.listen = listen;
        s.phase = Phase::Serving;
        s.ready = true;
        s.last_error = None;
    });
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    loop {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => break,
            _ = heartbeat.tick() => {
                status.touch();
                let bytes = store.file_bytes();
                if status.snapshot().store.as_ref().is_some_and(|s| s.file_bytes != bytes) {
                    status.update(|s| s.store = Some(store_status(&store)));
                }
            }
        }
    }
    status.update(|s| {
        s.phase = Phase::Stopping;
        s.ready = false;
    });
    let _ = server.await;
    drop(store);
    tracing::info!("engine stopped");
    Ok(())
}
