//! One remote JWKS and its cached keys.
//!
//! The first use fetches and waits. Afterwards requests never wait for the network except
//! after a key miss: keys older than the refresh interval are refetched in the background; an
//! unknown `kid` refetches in the foreground at most once per miss interval, so a flood of
//! forged tokens cannot turn into a flood of fetches. A failed fetch keeps the cached keys.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::time::Instant;

use super::address::AddressPolicy;
use super::error::AuthError;
use super::fetch::FetchTarget;
use super::keys::{remote_key_usable, VerifyKey};

/// Timing and size limits of remote key sets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JwksLimits {
    pub refresh_after: Duration,
    pub miss_refetch_after: Duration,
    pub fetch_timeout: Duration,
    pub max_bytes: usize,
}

/// The keys of one `jwks_uri`.
#[derive(Debug)]
pub(crate) struct RemoteJwks {
    uri: String,
    target: FetchTarget,
    limits: JwksLimits,
    state: Mutex<CacheState>,
    /// Held while fetching, so concurrent callers share one fetch.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct CacheState {
    /// `None` until a fetch succeeded.
    keys: Option<Arc<[VerifyKey]>>,
    fetched_at: Option<Instant>,
    attempted_at: Option<Instant>,
    /// Counts finished fetches, so a waiter can tell one finished while it waited.
    attempts: u64,
    last_error: Option<String>,
    background: bool,
}

/// The keys of a source, or why there are none.
pub(crate) type Keys = Result<Arc<[VerifyKey]>, AuthError>;

impl RemoteJwks {
    /// Checks the URI; nothing is fetched yet.
    pub(crate) fn new(
        uri: &str,
        limits: JwksLimits,
        allow_http: bool,
        addresses: Arc<AddressPolicy>,
    ) -> Result<Self, AuthError> {
        let target = FetchTarget::parse(uri, allow_http, addresses).map_err(|reason| {
            AuthError::InvalidJwksUri {
                uri: uri.to_owned(),
                reason,
            }
        })?;
        Ok(Self {
            uri: uri.to_owned(),
            target,
            limits,
            state: Mutex::new(CacheState::default()),
            fetching: tokio::sync::Mutex::new(()),
        })
    }

    /// The cached keys, fetching first if there are none. Starts a background refresh when
    /// they are old.
    pub(crate) async fn keys(self: &Arc<Self>) -> Keys {
        let (cached, seen, stale) = {
            let state = self.state.lock();
            let stale = state
                .fetched_at
                .is_none_or(|at| at.elapsed() >= self.limits.refresh_after)
                && !state.background
                && state
                    .attempted_at
                    .is_none_or(|at| at.elapsed() >= self.limits.miss_refetch_after);
            (state.keys.clone(), state.attempts, stale)
        };
        match cached {
            Some(keys) => {
                if stale {
                    self.refresh_in_background(seen);
                }
                Ok(keys)
            }
            None => {
                self.fetch_once(seen).await;
                self.current()
            }
        }
    }

    /// After a key miss: refetches now unless the last attempt was within the miss interval.
    /// True when new keys arrived (the caller then retries once).
    pub(crate) async fn refetch_after_miss(&self) -> bool {
        let seen = {
            let state = self.state.lock();
            if state
                .attempted_at
                .is_some_and(|at| at.elapsed() < self.limits.miss_refetch_after)
            {
                return false;
            }
            state.attempts
        };
        self.fetch_once(seen).await
    }

    /// The keys as they are now, or the last fetch error.
    fn current(&self) -> Keys {
        let state = self.state.lock();
        match (&state.keys, &state.last_error) {
            (Some(keys), _) => Ok(Arc::clone(keys)),
            (None, reason) => Err(AuthError::KeysUnavailable {
                uri: self.uri.clone(),
                reason: reason
                    .clone()
                    .unwrap_or_else(|| "not fetched yet".to_owned()),
            }),
        }
    }

    fn refresh_in_background(self: &Arc<Self>, seen: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.state.lock().background = true;
        let this = Arc::clone(self);
        runtime.spawn(async move {
            this.fetch_once(seen).await;
            this.state.lock().background = false;
        });
    }

    /// Fetches unless another fetch finished since the caller looked (`seen`); concurrent
    /// callers wait for the one in flight. True when this call stored new keys.
    async fn fetch_once(&self, seen: u64) -> bool {
        let _guard = self.fetching.lock().await;
        if self.state.lock().attempts != seen {
            return false;
        }
        let result = self.fetch().await;
        let mut state = self.state.lock();
        state.attempts += 1;
        state.attempted_at = Some(Instant::now());
        match result {
            Ok(keys) => {
                if keys.is_empty() {
                    tracing::warn!(uri = %self.uri, "the JWKS has no usable signing keys");
                }
                state.keys = Some(keys.into());
                state.fetched_at = Some(Instant::now());
                state.last_error = None;
                true
            }
            Err(reason) => {
                if state.keys.is_some() {
                    tracing::warn!(
                        uri = %self.uri,
                        "JWKS refresh failed, keeping the cached keys: {reason}"
                    );
                } else {
                    tracing::warn!(uri = %self.uri, "JWKS fetch failed: {reason}");
                }
                state.last_error = Some(reason);
                false
            }
        }
    }

    async fn fetch(&self) -> Result<Vec<VerifyKey>, String> {
        let body = self
            .target
            .get(self.limits.fetch_timeout, self.limits.max_bytes)
            .await?;
        let document: Value =
            serde_json::from_slice(&body).map_err(|e| format!("the answer is not JSON: {e}"))?;
        let Some(list) = document.get("keys").and_then(Value::as_array) else {
            return Err("the answer has no `keys` array".to_owned());
        };
        Ok(list
            .iter()
            .enumerate()
            .filter_map(|(index, jwk)| {
                let parsed = remote_key_usable(jwk)
                    .map_err(str::to_owned)
                    .and_then(|()| VerifyKey::from_jwk(jwk));
                match parsed {
                    Ok(key) => Some(key),
                    Err(reason) => {
                        tracing::debug!(uri = %self.uri, index, "JWKS key skipped: {reason}");
                        None
                    }
                }
            })
            .collect())
    }
}
