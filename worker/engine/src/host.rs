//! What a host process does around the engine: load the configuration, start the engine,
//! restart it on a changed configuration, reset its storage, and decide what an engine
//! failure means. The background worker drives it from its latch loop; tests drive it
//! directly, so the same code runs in both.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Engine, EngineConfig, EngineError, EngineHandle};
use config::{ConfigError, ServiceConfig};
use reset::Reset;
pub use reset::{ResetError, SlotLeft, RELEASE_TIMEOUT};
use status::{ErrorReport, Phase, StatusCell};

/// While waiting for the operator, the host quietly retries this often (a fixed file or a
/// freed port recovers without a reload).
const RETRY_EVERY: Duration = Duration::from_secs(30);
/// How long a stopping engine gets before the host gives up on joining it.
pub const STOP_TIMEOUT: Duration = Duration::from_millis(900);
/// After an engine failure a restart may fix (a failed commit, a panic), the engine starts
/// again after this, doubled for each failure in a row, up to [`RESTART_BACKOFF_MAX`]: a
/// fault that repeats (a full disk, a damaged file) is retried ever more slowly instead
/// of in a tight loop, and one that clears (space freed) is recovered from by itself.
pub const RESTART_BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two starts after failures.
pub const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// An engine that ran this long before failing starts the count of failures again.
pub(crate) const HEALTHY_RUN: Duration = Duration::from_secs(300);

/// The host's settings (the extension reads them from GUCs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSettings {
    /// The service configuration file.
    pub config_file: Option<PathBuf>,
    /// Where the store lives.
    pub storage_dir: PathBuf,
    /// Hosts to listen on.
    pub listen_addresses: Vec<String>,
    /// Threads of the engine's runtime.
    pub runtime_threads: usize,
    /// The replication slot this sync replica owns.
    pub slot_name: String,
    /// Where the engine serves its admin socket, if anywhere.
    pub admin_socket: Option<PathBuf>,
    /// `powersync_mdbx.peer_secret_file`: the file holding the fleet's secret.
    pub peer_secret_file: Option<PathBuf>,
    /// `powersync_mdbx.peer_secret` is set: refused, since members of
    /// `pg_read_all_settings` can read any setting (the secret belongs in the file).
    pub peer_secret_in_setting: bool,
    /// `powersync_mdbx.seed_from`, as set.
    pub seed_from: Option<String>,
    /// `powersync_mdbx.peer_loopback`: store copies on the sync port for peers on this host.
    pub peer_loopback: bool,
    /// `powersync_mdbx.peer_listen` (`host:port`), as set.
    pub peer_listen: Option<String>,
    /// `powersync_mdbx.peer_tls_cert_file`, `_key_file`, `_ca_file`.
    pub peer_tls: config::PeerTlsFiles,
    /// `powersync_mdbx.in_rotation`: false takes the replica out of rotation (readiness
    /// fails, sync connections are refused and end). Applied by a reload as it is, without
    /// starting the engine again.
    pub in_rotation: bool,
}

/// What the host loop should do after a [`Host::tick`].
#[derive(Debug, PartialEq, Eq)]
pub enum Tick {
    /// Keep looping.
    Continue,
    /// Exit the process with this code so the supervisor (postmaster) restarts it (only
    /// when engine threads would not stop: a new process is the only way to be rid of
    /// them).
    Exit(i32),
}

/// Wraps the spawning of engine threads (the extension blocks all signals around it).
pub type SpawnGuard = fn(&mut dyn FnMut());

/// The engine's host.
pub struct Host {
    settings: HostSettings,
    status: Arc<StatusCell>,
    guard: SpawnGuard,
    engine: Option<EngineHandle>,
    running_config: Option<EngineConfig>,
    retry_at: Option<Instant>,
    last_error: Option<String>,
    /// Set when engine threads would not stop: only a new process is sure to be rid of
    /// them, so the next tick exits.
    exit_requested: bool,
    /// Engine failures in a row that a restart may fix (see [`RESTART_BACKOFF_FIRST`]).
    failures: u32,
    /// When the running engine was started.
    started_at: Option<Instant>,
    /// The reset in progress.
    reset: Option<Reset>,
    /// What the last reset did, until taken.
    reset_result: Option<serde_json::Value>,
    /// The bound of a reset's network work.
    release_timeout: Duration,
}

impl Host {
    /// A host that has not started anything yet.
    pub fn new(settings: HostSettings, status: Arc<StatusCell>, guard: SpawnGuard) -> Self {
        status.update(|s| {
            s.config_file = settings
                .config_file
                .as_ref()
                .map(|p| p.display().to_string());
            s.storage_dir = Some(settings.storage_dir.display().to_string());
        });
        status.set_in_rotation(settings.in_rotation);
        Self {
            settings,
            status,
            guard,
            engine: None,
            running_config: None,
            retry_at: None,
            last_error: None,
            exit_requested: false,
            failures: 0,
            started_at: None,
            reset: None,
            reset_result: None,
            release_timeout: RELEASE_TIMEOUT,
        }
    }

    /// Puts the replica in rotation or takes it out, without starting the engine again.
    fn set_in_rotation(&mut self, in_rotation: bool) {
        if in_rotation != self.settings.in_rotation {
            tracing::info!(
                "{}",
                if in_rotation {
                    "the replica is in rotation again: readiness passes, sync connections are \
                     accepted"
                } else {
                    "the replica is out of rotation (powersync_mdbx.in_rotation = off): \
                     readiness fails, sync connections are refused and open streams end"
                }
            );
        }
        self.settings.in_rotation = in_rotation;
        self.status.set_in_rotation(in_rotation);
    }

    /// The status this host publishes.
    pub fn status(&self) -> &Arc<StatusCell> {
        &self.status
    }

    /// Loads the configuration and starts the engine, or records why it cannot.
    pub fn start(&mut self) {
        match self.load() {
            Ok(config) => self.start_engine(config),
            Err(e) => self.wait_for_operator(Phase::ConfigError, &EngineError::Config(e)),
        }
    }

    /// Applies new settings (after SIGHUP, or `powersync_mdbx.reload()`). Changed sync
    /// rules alone are handed to the running engine, which deploys them inside the served
    /// store or in a new generation beside it, and switches over when they have caught up;
    /// other changes restart the engine (which deploys changed rules the same way). Returns
    /// what it did.
    pub fn reload(&mut self, settings: HostSettings) -> serde_json::Value {
        // The operator acted: a fault seen before starts a fresh count.
        self.failures = 0;
        self.set_in_rotation(settings.in_rotation);
        if self.reset.is_some() {
            // The engine starts with them once the reset has finished.
            self.settings = settings;
            return reload_result("after_reset", None);
        }
        let changed_settings = settings != self.settings;
        self.settings = settings;
        self.status.update(|s| {
            s.config_file = self
                .settings
                .config_file
                .as_ref()
                .map(|p| p.display().to_string());
        });
        let config = match self.load() {
            Ok(config) => config,
            Err(e) => {
                let message = e.to_string();
                if self.engine.is_some() {
                    // Keep serving with the configuration that works; show the problem.
                    let report = ErrorReport::new(message.clone(), true);
                    self.log_once(&report.message);
                    self.status.update(|s| s.last_error = Some(report));
                } else {
                    self.wait_for_operator(Phase::ConfigError, &EngineError::Config(e));
                }
                return reload_result("invalid_config", Some(message));
            }
        };
        let running = self.engine.as_ref().and(self.running_config.as_ref());
        // A secret rotated in its file changes nothing in the settings themselves.
        let changed_settings = changed_settings
            || running.is_some_and(|r| r.fleet.peer_secret != config.fleet.peer_secret);
        if running.is_some_and(|r| !changed_settings && r.service == config.service) {
            tracing::info!("configuration reloaded, nothing changed");
            // Handed over again: a deploy of these rules that failed tries again.
            if let Some(engine) = &self.engine {
                engine.deploy_rules(&config.service.rules.content);
            }
            return reload_result("unchanged", None);
        }
        // Rules and keys are checked before anything changes: a broken file keeps the
        // running configuration serving, as a broken YAML file does.
        if let Some(Err(e)) = running.map(|_| preflight(&config)) {
            let report = ErrorReport::new(e.clone(), true);
            self.log_once(&report.message);
            self.status.update(|s| s.last_error = Some(report));
            return reload_result("invalid_rules_or_keys", Some(e));
        }
        let rules_only = !changed_settings
            && running.is_some_and(|r| same_apart_from_rules(&r.service, &config.service))
            && self.status.snapshot().ready;
        if let (true, Some(engine)) = (rules_only, &self.engine) {
            tracing::info!("sync rules changed; deploying them beside the served ones");
            engine.deploy_rules(&config.service.rules.content);
            self.status.update(|s| s.last_error = None);
            self.last_error = None;
            self.running_config = Some(config);
            return reload_result("deploying_rules", None);
        }
        tracing::info!("configuration changed, restarting the engine");
        self.stop_engine();
        self.start_engine(config);
        reload_result("engine_restarted", None)
    }

    /// Checks the engine; call it from the host loop. An engine that failed in a way a
    /// restart may fix is started again after a growing delay; [`Tick::Exit`] only when
    /// engine threads would not stop.
    pub fn tick(&mut self) -> Tick {
        if self.exit_requested {
            return Tick::Exit(1);
        }
        self.poll_reset();
        if self.reset.is_some() {
            return Tick::Continue;
        }
        if let Some(result) = self.engine.as_ref().and_then(EngineHandle::finished) {
            self.engine = None;
            self.running_config = None;
            match result {
                Ok(()) => {}
                Err(e) if e.needs_operator() => self.wait_for_operator(Phase::Failed, &e),
                Err(e) => self.restart_later(&e),
            }
        }
        if self.engine.is_none() && self.retry_at.is_some_and(|at| Instant::now() >= at) {
            self.start();
        }
        Tick::Continue
    }

    /// Starts `powersync_mdbx.reset()`: stops the engine, checks that every store is
    /// ours, and starts dropping their slots on a thread of its own. [`Self::tick`]
    /// carries it on; once it removed the stores (or refused), the engine starts again
    /// and [`Self::take_reset_result`] returns what it did. Without `force`, a slot that
    /// could not be dropped leaves everything in place; with it, the stores go and the
    /// result names the slots left. A reset already running is not started twice.
    pub fn start_reset(&mut self, force: bool) {
        if self.reset.is_some() {
            return;
        }
        tracing::info!(force, "reset requested");
        self.failures = 0;
        self.retry_at = None;
        let was_running = self.engine.is_some();
        if !self.stop_engine() {
            // Removing the store under engine threads that still run could lose the
            // reset's effect or their writes: restart the process and let the operator
            // call reset() again.
            self.exit_requested = true;
            self.reset_result = Some(serde_json::json!({
                "reset": false,
                "error": "the engine did not stop in time; nothing was removed and the worker \
                          process restarts: run SELECT powersync_mdbx.reset() again once \
                          status() shows it running",
                "engine_was_running": was_running,
            }));
            return;
        }
        self.status.update(|s| {
            s.phase = Phase::Resetting;
            s.ready = false;
        });
        let mut reset = Reset::survey(
            &self.settings.storage_dir,
            &self.settings.slot_name,
            force,
            was_running,
            self.guard,
        );
        if reset.needs_primary() {
            match self.load() {
                Ok(config) => {
                    reset.release(config.service.source, self.release_timeout, self.guard)
                }
                Err(e) => reset.cannot_release(&format!(
                    "the configuration cannot be loaded, so the primary cannot be reached: {e}"
                )),
            }
        }
        self.reset = Some(reset);
        self.poll_reset();
    }

    /// True while a reset waits for its slots to be released.
    pub fn resetting(&self) -> bool {
        self.reset.is_some()
    }

    /// The result of the last reset, once it has finished (taken once).
    pub fn take_reset_result(&mut self) -> Option<serde_json::Value> {
        self.reset_result.take()
    }

    /// Sets the bound of a reset's network work (tests shorten it; see
    /// [`RELEASE_TIMEOUT`]).
    pub fn set_release_timeout(&mut self, timeout: Duration) {
        self.release_timeout = timeout;
    }

    /// Finishes the reset in progress once its slots are answered for.
    fn poll_reset(&mut self) {
        if !self.reset.as_mut().is_some_and(Reset::poll) {
            return;
        }
        let Some(reset) = self.reset.take() else {
            return;
        };
        let mut report = reset.finish();
        self.start();
        report["engine_restarted"] = self.engine.is_some().into();
        self.reset_result = Some(report);
    }

    /// Stops the engine for good (process exit). Returns false if its threads did not end
    /// within [`STOP_TIMEOUT`].
    pub fn shutdown(&mut self) -> bool {
        if let Some(reset) = self.reset.take() {
            self.reset_result = Some(reset.interrupted());
        }
        let joined = self.stop_engine();
        self.status.update(|s| {
            s.phase = Phase::Stopped;
            s.ready = false;
        });
        joined
    }

    fn load(&self) -> Result<EngineConfig, ConfigError> {
        let path = self
            .settings
            .config_file
            .as_ref()
            .ok_or(ConfigError::NotConfigured)?;
        let service = ServiceConfig::load(path)?;
        Ok(EngineConfig {
            service,
            storage_dir: self.settings.storage_dir.clone(),
            listen_addresses: self.settings.listen_addresses.clone(),
            runtime_threads: self.settings.runtime_threads,
            slot_name: self.settings.slot_name.clone(),
            admin_socket: self.settings.admin_socket.clone(),
            http_limits: None,
            write_checkpoint_max_age: None,
            fleet: self.fleet()?,
        })
    }

    /// The fleet settings, checked: a secret long enough, a peer this build can seed
    /// from, and a secret to prove to it; a peer listener with its secret, certificate and
    /// key.
    fn fleet(&self) -> Result<crate::Fleet, ConfigError> {
        let setting = |message: String| ConfigError::Setting { message };
        let peer_secret = self.peer_secret().map_err(setting)?;
        let seed_from = match &self.settings.seed_from {
            None => None,
            Some(url) => {
                if peer_secret.is_none() {
                    return Err(setting(format!(
                        "powersync_mdbx.seed_from is {url} but powersync_mdbx.peer_secret_file is not set: set it to a file holding the peer's secret"
                    )));
                }
                Some(config::SeedPeer::parse(url).map_err(setting)?)
            }
        };
        let tls = &self.settings.peer_tls;
        if let Some(listen) = &self.settings.peer_listen {
            if peer_secret.is_none() {
                return Err(setting(format!(
                    "powersync_mdbx.peer_listen is {listen} but powersync_mdbx.peer_secret_file \
                     is not set: set it to a file holding the fleet's secret"
                )));
            }
            if tls.cert_file.is_none() || tls.key_file.is_none() {
                return Err(setting(format!(
                    "powersync_mdbx.peer_listen is {listen}: set powersync_mdbx.peer_tls_cert_file \
                     and powersync_mdbx.peer_tls_key_file to this replica's certificate and key \
                     (PEM), the peer listener serves only TLS"
                )));
            }
            if listen
                .rsplit_once(':')
                .is_none_or(|(_, p)| p.parse::<u16>().is_err())
            {
                return Err(setting(format!(
                    "powersync_mdbx.peer_listen is {listen}, not <address>:<port> (e.g. \
                     0.0.0.0:8443)"
                )));
            }
        }
        Ok(crate::Fleet {
            peer_secret,
            seed_from,
            peer_loopback: self.settings.peer_loopback,
            peer_listen: self.settings.peer_listen.clone(),
            tls: tls.clone(),
        })
    }

    /// The fleet's secret, read from its file and checked; the setting that would show
    /// it to `pg_read_all_settings` is refused.
    fn peer_secret(&self) -> Result<Option<config::PeerSecret>, String> {
        if self.settings.peer_secret_in_setting {
            return Err("powersync_mdbx.peer_secret is set, and members of \
                 pg_read_all_settings (and pg_monitor) can read every setting: remove it from \
                 postgresql.conf (and ALTER SYSTEM RESET powersync_mdbx.peer_secret), write the \
                 secret into a file only the PostgreSQL server's user can read (mode 0600) and \
                 set powersync_mdbx.peer_secret_file to its path"
                .to_owned());
        }
        let Some(path) = &self.settings.peer_secret_file else {
            return Ok(None);
        };
        let secret = config::PeerSecret::from_file(path)?;
        secret.check()?;
        Ok(Some(secret))
    }

    fn start_engine(&mut self, config: EngineConfig) {
        self.retry_at = None;
        if !config.service.ignored.is_empty() {
            tracing::info!(keys = %config.service.ignored.join(", "), "configuration keys not used by powersync_mdbx");
        }
        let mut started = None;
        let status = self.status.clone();
        let engine_config = config.clone();
        (self.guard)(&mut || {
            started = Some(Engine::start(engine_config.clone(), status.clone()));
        });
        match started {
            Some(Ok(handle)) => {
                self.engine = Some(handle);
                self.started_at = Some(Instant::now());
                self.running_config = Some(config);
                self.last_error = None;
            }
            Some(Err(e)) => self.wait_for_operator(Phase::Failed, &e),
            None => {}
        }
    }

    fn stop_engine(&mut self) -> bool {
        self.running_config = None;
        match self.engine.take() {
            Some(engine) => {
                let joined = engine.shutdown(STOP_TIMEOUT);
                if !joined {
                    tracing::warn!("engine threads did not stop within {STOP_TIMEOUT:?}");
                }
                joined
            }
            None => true,
        }
    }

    /// After a failure a restart may fix: report it and start the engine again after
    /// the backoff.
    fn restart_later(&mut self, error: &EngineError) {
        if self.started_at.is_some_and(|t| t.elapsed() >= HEALTHY_RUN) {
            self.failures = 0;
        }
        self.started_at = None;
        self.failures = self.failures.saturating_add(1);
        let delay = restart_backoff(self.failures);
        let message = format!(
            "{error}; the engine starts again in {} s (failure {} in a row; the wait \
             doubles up to {} s while the fault repeats)",
            delay.as_secs(),
            self.failures,
            RESTART_BACKOFF_MAX.as_secs()
        );
        tracing::error!("{message}");
        self.status
            .fail(Phase::Failed, ErrorReport::new(message, false));
        self.retry_at = Some(Instant::now() + delay);
    }

    fn wait_for_operator(&mut self, phase: Phase, error: &EngineError) {
        let report = ErrorReport::new(error.to_string(), true);
        self.log_once(&report.message);
        self.status.fail(phase, report);
        self.retry_at = Some(Instant::now() + RETRY_EVERY);
    }

    /// Logs an operator-facing error once, not on every quiet retry.
    fn log_once(&mut self, message: &str) {
        if self.last_error.as_deref() != Some(message) {
            tracing::error!(
                "{message}; waiting for the configuration to be fixed (reload) or a reset"
            );
            self.last_error = Some(message.to_owned());
        }
    }
}

/// The wait before start number `failures + 1` after `failures` failures in a row.
pub(crate) fn restart_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    RESTART_BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(RESTART_BACKOFF_MAX)
}

/// What a new configuration must pass before it replaces the running one: the sync
/// rules compile and the client keys load (the checks the engine makes first when it
/// starts).
fn preflight(config: &EngineConfig) -> Result<(), String> {
    rules::SyncRules::parse(&config.service.rules.content)
        .map_err(|e| EngineError::from(e).to_string())?;
    auth::Authenticator::new(&config.service.client_auth)
        .map_err(|e| EngineError::from(e).to_string())?;
    Ok(())
}

/// True when `a` and `b` differ at most in their sync rules.
fn same_apart_from_rules(a: &ServiceConfig, b: &ServiceConfig) -> bool {
    let mut b = b.clone();
    b.rules = a.rules.clone();
    *a == b
}

/// What `reload()` reports.
fn reload_result(outcome: &str, error: Option<String>) -> serde_json::Value {
    serde_json::json!({ "reloaded": error.is_none(), "outcome": outcome, "error": error })
}

mod reset;
#[cfg(test)]
mod tests;
