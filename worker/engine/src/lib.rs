//! The engine's one entry point: an [`EngineConfig`] in, an [`EngineHandle`] out.
//!
//! `Engine::start` creates one thread, which builds the tokio runtime and opens the store;
//! every other thread (tokio workers, libmdbx's own) descends from it. The caller decides
//! the signal mask: the background worker starts the engine with all signals blocked, so
//! no engine thread ever runs a PostgreSQL signal handler.
#![warn(missing_docs)]

mod deploy;
mod error;
mod generation;
pub mod host;
pub mod idle_release;
mod ingest;
pub mod logging;
mod own_runtime;
mod run;
mod seeding;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

use config::ServiceConfig;
use status::StatusCell;

pub use config::{PeerSecret, PeerTlsFiles};
pub use error::EngineError;

/// What the engine runs with: the service file plus the host's overrides.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The validated configuration file.
    pub service: ServiceConfig,
    /// Where the MDBX store lives.
    pub storage_dir: PathBuf,
    /// Hosts to listen on (`*` for all); the port comes from the service file.
    pub listen_addresses: Vec<String>,
    /// Threads of the tokio runtime.
    pub runtime_threads: usize,
    /// The replication slot this sync replica owns on the primary.
    pub slot_name: String,
    /// Where to serve the admin socket (`None`: no admin socket).
    pub admin_socket: Option<PathBuf>,
    /// The HTTP server's limits (`None`: derived from the descriptors the process may
    /// hold, [`http::HttpLimits::for_open_files`]).
    pub http_limits: Option<http::HttpLimits>,
    /// How long write-checkpoint requests are kept (`None`:
    /// [`replication::WRITE_CHECKPOINT_MAX_AGE`]; tests shorten it).
    pub write_checkpoint_max_age: Option<std::time::Duration>,
    /// The replica's place in a fleet of replicas.
    pub fleet: Fleet,
}

/// The settings a fleet of replicas shares (`docs/operations.md`, "A fleet of replicas").
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    /// The secret in `powersync_mdbx.peer_secret_file`: with it, this replica serves copies of its store to
    /// peers (`GET /peer/store`) and proves itself to the peer it seeds from.
    pub peer_secret: Option<config::PeerSecret>,
    /// `powersync_mdbx.seed_from`: the peer an empty store is copied from instead of a
    /// snapshot.
    pub seed_from: Option<config::SeedPeer>,
    /// `powersync_mdbx.peer_loopback`: the sync port serves store copies to peers on this
    /// host (in clear).
    pub peer_loopback: bool,
    /// `powersync_mdbx.peer_listen`: where peers copy the store over TLS (`host:port`).
    pub peer_listen: Option<String>,
    /// The certificate and key of the peer listener, the CAs a seeding replica trusts.
    pub tls: config::PeerTlsFiles,
}

/// A running engine. Dropping it without [`shutdown`](Self::shutdown) stops it too.
pub struct EngineHandle {
    status: Arc<StatusCell>,
    rules: watch::Sender<Arc<str>>,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    outcome: Arc<Mutex<Option<Result<(), EngineError>>>>,
}

/// Starts engines.
pub struct Engine;

impl Engine {
    /// Starts the engine on its own thread. Progress and errors appear in `status`;
    /// [`EngineHandle::finished`] tells when it ended by itself.
    pub fn start(
        config: EngineConfig,
        status: Arc<StatusCell>,
    ) -> Result<EngineHandle, EngineError> {
        let (stop, stop_rx) = watch::channel(false);
        let (rules, rules_rx) =
            watch::channel::<Arc<str>>(Arc::from(config.service.rules.content.as_str()));
        let outcome = Arc::new(Mutex::new(None));
        let thread = std::thread::Builder::new()
            .name("psm-engine".into())
            .spawn({
                let status = status.clone();
                let outcome = outcome.clone();
                move || {
                    let result = run::run(config, status.clone(), rules_rx, stop_rx);
                    // Errors for the operator are logged once by the host, with what it
                    // waits for; the others end the worker, so this is their record.
                    if let Err(e) = &result {
                        if !e.needs_operator() {
                            tracing::error!("{e}");
                        }
                    }
                    *outcome.lock() = Some(result);
                }
            })
            .map_err(EngineError::Thread)?;
        Ok(EngineHandle {
            status,
            rules,
            stop,
            thread: Some(thread),
            outcome,
        })
    }
}

impl EngineHandle {
    /// The status the engine updates.
    pub fn status(&self) -> &Arc<StatusCell> {
        &self.status
    }

    /// Hands the engine the configured rules text (after a reload). Rules that differ
    /// from the served ones are deployed inside the served store when they can be (the
    /// tables they read differently copied again), else built into a new generation beside
    /// it, and switched to once caught up (`status().deploy` shows the progress); the served rules abandon a
    /// deploy in progress; the rules of a failed deploy try again.
    pub fn deploy_rules(&self, text: &str) {
        self.rules.send_replace(Arc::from(text));
    }

    /// `Some` once the engine thread has ended by itself: its result.
    pub fn finished(&self) -> Option<Result<(), EngineError>> {
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            Some(
                self.outcome
                    .lock()
                    .take()
                    .unwrap_or(Err(EngineError::Panicked)),
            )
        } else {
            None
        }
    }

    /// Asks the engine to stop and waits up to `timeout` for its threads to end.
    /// Returns false when the engine thread did not end in time (it is then detached).
    pub fn shutdown(mut self, timeout: Duration) -> bool {
        self.stop_and_join(timeout)
    }

    fn stop_and_join(&mut self, timeout: Duration) -> bool {
        let _ = self.stop.send(true);
        let Some(thread) = self.thread.take() else {
            return true;
        };
        let deadline = Instant::now() + timeout;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        thread.join().is_ok()
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop_and_join(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests;
