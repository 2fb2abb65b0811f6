//! Client JWT authentication (spec §6): which tokens the sync endpoints accept, and the user
//! each one stands for.
//!
//! Keys come from `client_auth.jwks.keys` (inline, checked at startup) and
//! `client_auth.jwks_uri` (fetched and cached). A token is taken apart (`token`), its key
//! chosen and its signature verified (`keys`, `jwks`), then its claims checked (`claims`).
#![warn(missing_docs)]

mod claims;
mod error;
mod fetch;
mod jwks;
mod keys;
mod token;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

pub use error::AuthError;
pub use keys::{weak_key_warnings, MIN_HMAC_SECRET_BYTES};

use claims::ClaimPolicy;
use config::ClientAuth;
use jwks::{JwksLimits, RemoteJwks};
use keys::VerifyKey;
use token::Jwt;

/// The longest accepted token lifetime (`exp - iat`), as in the official service.
pub const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(86_400);

/// Tolerance for `exp` and `nbf` against this server's clock.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Limits of token checks and key fetching. `Default` is the production policy; tests shorten
/// the intervals.
#[derive(Debug, Clone, Copy)]
pub struct AuthOptions {
    /// Largest `exp - iat`.
    pub max_lifetime: Duration,
    /// Tolerance for `exp` and `nbf`.
    pub clock_skew: Duration,
    /// Cached remote keys older than this are refetched in the background.
    pub jwks_refresh_after: Duration,
    /// After a key miss, a JWKS is refetched only if the last fetch is at least this old.
    pub jwks_miss_refetch_after: Duration,
    /// Deadline of one JWKS fetch.
    pub jwks_fetch_timeout: Duration,
    /// Largest accepted JWKS document.
    pub jwks_max_bytes: usize,
}

impl Default for AuthOptions {
    fn default() -> Self {
        Self {
            max_lifetime: MAX_TOKEN_LIFETIME,
            clock_skew: CLOCK_SKEW,
            jwks_refresh_after: Duration::from_secs(300),
            jwks_miss_refetch_after: Duration::from_secs(30),
            jwks_fetch_timeout: Duration::from_secs(10),
            jwks_max_bytes: 1024 * 1024,
        }
    }
}

/// A verified token: who the client is, and until when.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthenticatedUser {
    /// `sub` as text (a numeric `sub` becomes its decimal text).
    pub user_id: String,
    /// The whole payload object, for `request.jwt()` and `token_parameters`.
    pub claims: Value,
    /// `exp`: the sync stream must not outlive it.
    pub expires_at: SystemTime,
}

/// Verifies client tokens against the configured keys. Cheap to clone; shared by all
/// connections.
#[derive(Debug, Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    inline: Arc<[VerifyKey]>,
    remote: Vec<Arc<RemoteJwks>>,
    audience: Vec<String>,
    issuer: Option<String>,
    options: AuthOptions,
}

/// The outcome of trying keys on a token.
enum Selection {
    Verified,
    /// Settled: retrying with fresh keys would not change it.
    Refused(AuthError),
    /// No key fitted, or no key without a kid verified: fresh keys might help.
    Missed(AuthError),
}

impl Authenticator {
    /// Loads inline keys and checks JWKS URIs (nothing is fetched yet). A bad inline key or
    /// URI is a configuration error.
    pub fn new(config: &ClientAuth) -> Result<Self, AuthError> {
        Self::with_options(config, AuthOptions::default())
    }

    /// [`Authenticator::new`] with other limits.
    pub fn with_options(config: &ClientAuth, options: AuthOptions) -> Result<Self, AuthError> {
        let inline = config
            .jwks_keys
            .iter()
            .enumerate()
            .map(|(index, jwk)| {
                VerifyKey::from_jwk(jwk).map_err(|reason| AuthError::InvalidKey { index, reason })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let limits = JwksLimits {
            refresh_after: options.jwks_refresh_after,
            miss_refetch_after: options.jwks_miss_refetch_after,
            fetch_timeout: options.jwks_fetch_timeout,
            max_bytes: options.jwks_max_bytes,
        };
        let remote = config
            .jwks_uri
            .iter()
            .map(|uri| RemoteJwks::new(uri, limits, config.jwks_allow_http).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        if inline.is_empty() && remote.is_empty() {
            tracing::warn!(
                "client_auth has no keys (neither jwks.keys nor jwks_uri): every token is refused"
            );
        }
        Ok(Self {
            inner: Arc::new(Inner {
                inline: inline.into(),
                remote,
                audience: config.audience.clone(),
                issuer: config.issuer.clone(),
                options,
            }),
        })
    }

    /// Authenticates the `Authorization` header's token at `now`.
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
        now: SystemTime,
    ) -> Result<AuthenticatedUser, AuthError> {
        let jwt = Jwt::parse(token::from_header(authorization)?)?;
        self.verify_signature(&jwt).await?;
        let payload = jwt.payload()?;
        let inner = &self.inner;
        let policy = ClaimPolicy {
            audience: &inner.audience,
            issuer: inner.issuer.as_deref(),
            max_lifetime: inner.options.max_lifetime,
            clock_skew: inner.options.clock_skew,
        };
        let checked = claims::check(&payload, &policy, now)?;
        Ok(AuthenticatedUser {
            user_id: checked.user_id,
            claims: Value::Object(payload),
            expires_at: checked.expires_at,
        })
    }

    async fn verify_signature(&self, jwt: &Jwt<'_>) -> Result<(), AuthError> {
        let (sets, outage) = self.key_sets().await;
        let error = match select(&sets, jwt) {
            Selection::Verified => return Ok(()),
            Selection::Refused(error) => return Err(error),
            Selection::Missed(error) => error,
        };
        let mut refreshed = false;
        for remote in &self.inner.remote {
            refreshed |= remote.refetch_after_miss().await;
        }
        if refreshed {
            let (sets, outage) = self.key_sets().await;
            return match select(&sets, jwt) {
                Selection::Verified => Ok(()),
                Selection::Refused(error) => Err(error),
                Selection::Missed(error) => Err(outage.unwrap_or(error)),
            };
        }
        Err(outage.unwrap_or(error))
    }

    /// Every key set: inline first, then each JWKS in configured order. Also the first source
    /// that has no keys at all because fetching failed.
    async fn key_sets(&self) -> (Vec<Arc<[VerifyKey]>>, Option<AuthError>) {
        let mut sets = vec![Arc::clone(&self.inner.inline)];
        let mut outage = None;
        for remote in &self.inner.remote {
            match remote.keys().await {
                Ok(keys) => sets.push(keys),
                Err(error) => {
                    outage.get_or_insert(error);
                }
            }
        }
        (sets, outage)
    }
}

/// Spec §6 key selection: the key with the token's `kid` if there is one (its algorithm must
/// fit); otherwise every key without a kid that accepts the algorithm, first to verify wins.
fn select(sets: &[Arc<[VerifyKey]>], jwt: &Jwt<'_>) -> Selection {
    let keys = || sets.iter().flat_map(|set| set.iter());
    let message = jwt.signed.as_bytes();
    if let Some(kid) = jwt.kid.as_deref() {
        if let Some(key) = keys().find(|k| k.kid() == Some(kid)) {
            if !key.accepts(jwt.alg) {
                return Selection::Refused(AuthError::UnexpectedAlgorithm {
                    kid: error::shorten(kid, 64),
                    alg: jwt.alg.name(),
                });
            }
            return if key.verifies(jwt.alg, message, jwt.signature) {
                Selection::Verified
            } else {
                Selection::Refused(AuthError::BadSignature {
                    keys: format!("the key with kid `{}`", error::shorten(kid, 64)),
                })
            };
        }
    }
    let mut tried = 0usize;
    for key in keys().filter(|k| k.kid().is_none() && k.accepts(jwt.alg)) {
        if key.verifies(jwt.alg, message, jwt.signature) {
            return Selection::Verified;
        }
        tried += 1;
    }
    if tried > 0 {
        return Selection::Missed(AuthError::BadSignature {
            keys: format!(
                "any of the {tried} configured {} key(s) without a kid",
                jwt.alg.name()
            ),
        });
    }
    Selection::Missed(AuthError::NoSuitableKey {
        kid: jwt.kid.as_deref().map_or_else(
            || "(none)".to_owned(),
            |k| format!("`{}`", error::shorten(k, 64)),
        ),
        alg: jwt.alg.name(),
    })
}

#[cfg(test)]
mod tests;
