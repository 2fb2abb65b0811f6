//! The admin API the official `powersync` CLI calls on a self-hosted instance, without its
//! transport (`docs/operations.md`, "The admin API and the official CLI"): diagnostics,
//! the primary's schema, validating a sync config, and re-copying the served one. Its
//! answers have the official response shapes; the HTTP adapter wraps them in `{"data": …}`.
//!
//! Every answer that reads the primary does so live, within [`ADMIN_DEADLINE`]; what the
//! replica knows of itself comes from the status the probes read.

mod diagnostics;
mod error;
mod schema;
mod sync_rules_status;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::sync::{mpsc, oneshot, watch};

use config::{ApiTokens, SourceConnection};
use rules::SyncRules;
use status::StatusCell;

use crate::Served;

pub use error::AdminError;

/// How long one admin request may take to read the primary (connecting included).
pub const ADMIN_DEADLINE: Duration = Duration::from_secs(10);

/// How long a re-copy request waits for the engine to take it.
const REPROCESS_WAIT: Duration = Duration::from_secs(10);

/// A sync config the replica serves or is deploying.
#[derive(Clone)]
pub struct ConfigInUse {
    /// The compiled rules (their text is the config's content).
    pub rules: Arc<SyncRules>,
    /// The replication slot that feeds it.
    pub slot: String,
}

/// The served sync config and the one being deployed, as the engine last published them.
#[derive(Clone, Default)]
pub struct SyncConfigs {
    /// Served now (`None` before the first generation opened).
    pub active: Option<ConfigInUse>,
    /// Being built beside it or deployed inside its store.
    pub deploying: Option<ConfigInUse>,
}

/// A request to re-copy the served config as a deploy does; the engine answers with the
/// new build's slot, or why it cannot start one.
pub struct ReprocessRequest {
    /// Where the engine answers.
    pub reply: oneshot::Sender<Result<String, AdminError>>,
}

/// The admin API over one engine.
pub struct AdminApi {
    tokens: ApiTokens,
    status: Arc<StatusCell>,
    source: SourceConnection,
    /// The served generation, for its replication lag.
    served: watch::Receiver<Arc<Served>>,
    configs: RwLock<SyncConfigs>,
    reprocess: mpsc::Sender<ReprocessRequest>,
}

impl AdminApi {
    /// The API, with the receiver of its re-copy requests for the engine.
    pub fn new(
        tokens: ApiTokens,
        status: Arc<StatusCell>,
        source: SourceConnection,
        served: watch::Receiver<Arc<Served>>,
    ) -> (Self, mpsc::Receiver<ReprocessRequest>) {
        let (reprocess, requests) = mpsc::channel(4);
        let api = Self {
            tokens,
            status,
            source,
            served,
            configs: RwLock::new(SyncConfigs::default()),
            reprocess,
        };
        (api, requests)
    }

    /// The engine publishes what it serves and deploys (after every change).
    pub fn set_configs(&self, configs: SyncConfigs) {
        *self.configs.write() = configs;
    }

    /// Checks an `Authorization` header against `api.tokens`, as the official service
    /// does: `Bearer <token>` or `Token <token>`, compared in constant time.
    pub fn authorize(&self, header: Option<&str>) -> Result<(), AdminError> {
        if self.tokens.is_empty() {
            return Err(AdminError::disabled());
        }
        let token = header
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("Token "))
            })
            .filter(|t| !t.is_empty() && !t.contains(char::is_whitespace))
            .ok_or_else(AdminError::no_token)?;
        let known = self.tokens.expose().iter().fold(false, |found, t| {
            found | bool::from(t.as_bytes().ct_eq(token.as_bytes()))
        });
        if known {
            Ok(())
        } else {
            Err(AdminError::wrong_token())
        }
    }

    /// `POST /api/admin/v1/diagnostics`.
    pub async fn diagnostics(&self, include_content: bool) -> Value {
        let configs = self.configs.read().clone();
        diagnostics::diagnostics(self, &configs, include_content).await
    }

    /// The served generation's replication lag now, seconds (as
    /// `powersync_replication_lag_seconds`).
    fn lag_seconds(&self) -> f64 {
        let served = self.served.borrow().clone();
        served
            .stream_progress
            .pending
            .lag_seconds(status::unix_now_ms())
    }

    /// `POST /api/admin/v1/schema`.
    pub async fn schema(&self) -> Result<Value, AdminError> {
        schema::instance_schema(&self.source).await
    }

    /// `POST /api/admin/v1/validate`: compiles `text` without deploying it and checks
    /// the tables it reads on the primary.
    pub async fn validate(&self, text: &str) -> Value {
        sync_rules_status::validate(&self.source, text).await
    }

    /// `POST /api/admin/v1/reprocess`: the served config is copied again from a new slot
    /// into a new generation, switched to once caught up, as a deploy does.
    pub async fn reprocess(&self) -> Result<Value, AdminError> {
        let slot = self.start_reprocess().await?;
        Ok(json!({
            "connections": [{ "id": CONNECTION_ID, "tag": CONNECTION_TAG, "slot_name": slot }]
        }))
    }

    /// `POST /api/sync-rules/v1/reprocess`: the same, in that route's shape.
    pub async fn reprocess_sync_rules(&self) -> Result<Value, AdminError> {
        let slot = self.start_reprocess().await?;
        Ok(json!({ "slot_name": slot }))
    }

    /// `GET /api/sync-rules/v1/current`: the served config and the one being deployed.
    pub async fn current(&self) -> Result<Value, AdminError> {
        let configs = self.configs.read().clone();
        let active = configs.active.ok_or_else(AdminError::no_active_config)?;
        let current = sync_rules_status::debug_config(&self.source, &active).await;
        let next = match &configs.deploying {
            Some(next) => sync_rules_status::debug_config(&self.source, next).await,
            None => Value::Null,
        };
        Ok(json!({ "current": current, "next": next }))
    }

    /// `POST /api/sync-rules/v1/validate`: what the rules define and read, or their
    /// errors.
    pub async fn validate_sync_rules(&self, text: &str) -> Value {
        sync_rules_status::debug_text(&self.source, text).await
    }

    async fn start_reprocess(&self) -> Result<String, AdminError> {
        if self.configs.read().active.is_none() {
            return Err(AdminError::no_active_config());
        }
        let (reply, answer) = oneshot::channel();
        let gone = || AdminError::unavailable("the engine is stopping; try again".to_owned());
        self.reprocess
            .send_timeout(ReprocessRequest { reply }, REPROCESS_WAIT)
            .await
            .map_err(|_| gone())?;
        match tokio::time::timeout(REPROCESS_WAIT, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(gone()),
            Err(_) => Err(AdminError::unavailable(format!(
                "the engine did not take the re-copy within {}s; try again",
                REPROCESS_WAIT.as_secs()
            ))),
        }
    }
}

/// The one source connection's id and tag, as the official service names a connection
/// the file gives neither.
pub(crate) const CONNECTION_ID: &str = "default";
/// See [`CONNECTION_ID`].
pub(crate) const CONNECTION_TAG: &str = "default";

/// Connects to the primary within [`ADMIN_DEADLINE`]; the error as diagnostics show it.
pub(crate) async fn connect(source: &SourceConnection) -> Result<tokio_postgres::Client, String> {
    match tokio::time::timeout(ADMIN_DEADLINE, source::connect(source)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "the primary did not accept a connection within {}s",
            ADMIN_DEADLINE.as_secs()
        )),
    }
}

/// One entry of an `errors` list.
pub(crate) fn problem(level: &str, message: impl Into<String>) -> Value {
    json!({ "level": level, "message": message.into(), "ts": now_iso() })
}

/// Now, as the official service writes times.
pub(crate) fn now_iso() -> String {
    status::iso_time(status::unix_now_ms())
}

#[cfg(test)]
mod tests;
