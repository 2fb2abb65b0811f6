//! Client JWT authentication (`docs/spec/protocol.md` §6): which tokens the sync endpoints accept,
//! and the user each one stands for.
//!
//! Keys come from `client_auth.jwks.keys` (inline, checked at startup) and
//! `client_auth.jwks_uri` (fetched and cached). A token is taken apart (`token`), its key
//! chosen and its signature verified (`keys`, `jwks`), then its claims checked (`claims`).
#![warn(missing_docs)]

mod address;
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

use address::AddressPolicy;
use claims::ClaimPolicy;
use config::ClientAuth;
use jwks::{JwksLimits, RemoteJwks};
use keys::VerifyKey;
use token::Jwt;

/// The longest accepted token lifetime (`exp - iat`), as in the official service.
pub const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(86_400);

/// Tolerance for `exp` and `nbf` against this server's clock.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// The `aud` a Supabase Auth token must carry (whatever `client_auth.audience` says), as
/// in the official service.
pub const SUPABASE_AUDIENCE: &str = "authenticated";

/// The longest Supabase Auth token lifetime: a week and 20 minutes, as in the official
/// service.
pub const SUPABASE_MAX_LIFETIME: Duration = Duration::from_secs(86_400 * 7 + 1200);

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
    /// `supabase_jwt_secret` (with `supabase: true`).
    supabase_inline: Arc<[VerifyKey]>,
    /// The Supabase project's JWKS (with `supabase: true`).
    supabase_remote: Option<Arc<RemoteJwks>>,
    audience: Vec<String>,
    issuer: Option<String>,
    options: AuthOptions,
}

/// Whose key verified a token, which decides the claims it must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyOwner {
    /// `jwks.keys`, `jwks_uri`: `audience`, `issuer` and the lifetime limit as configured.
    Configured,
    /// Supabase Auth (`supabase: true`): `aud` [`SUPABASE_AUDIENCE`], lifetime up to
    /// [`SUPABASE_MAX_LIFETIME`], no `issuer` check.
    Supabase,
}

/// The outcome of trying keys on a token.
enum Selection {
    Verified(KeyOwner),
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
        let addresses = Arc::new(
            AddressPolicy::new(&config.jwks_reject_ip_ranges, config.jwks_reject_ipv6).map_err(
                |reason| AuthError::InvalidJwksUri {
                    uri: "client_auth.jwks_reject_ip_ranges".to_owned(),
                    reason,
                },
            )?,
        );
        let remote_jwks = |uri: &str| {
            RemoteJwks::new(uri, limits, config.jwks_allow_http, addresses.clone()).map(Arc::new)
        };
        let remote = config
            .jwks_uri
            .iter()
            .map(|uri| remote_jwks(uri))
            .collect::<Result<Vec<_>, _>>()?;
        let (supabase_inline, supabase_remote) = match &config.supabase {
            None => (Vec::new(), None),
            Some(supabase) => supabase_keys(supabase, remote_jwks)?,
        };
        if inline.is_empty()
            && remote.is_empty()
            && supabase_inline.is_empty()
            && supabase_remote.is_none()
        {
            tracing::warn!(
                "client_auth has no keys (neither jwks.keys nor jwks_uri nor Supabase's): every \
                 token is refused"
            );
        }
        Ok(Self {
            inner: Arc::new(Inner {
                inline: inline.into(),
                remote,
                supabase_inline: supabase_inline.into(),
                supabase_remote,
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
        let owner = self.verify_signature(&jwt).await?;
        let payload = jwt.payload()?;
        let inner = &self.inner;
        let supabase_audience = [SUPABASE_AUDIENCE.to_owned()];
        let policy = match owner {
            KeyOwner::Configured => ClaimPolicy {
                audience: &inner.audience,
                issuer: inner.issuer.as_deref(),
                max_lifetime: inner.options.max_lifetime,
                clock_skew: inner.options.clock_skew,
            },
            KeyOwner::Supabase => ClaimPolicy {
                audience: &supabase_audience,
                issuer: None,
                max_lifetime: SUPABASE_MAX_LIFETIME,
                clock_skew: inner.options.clock_skew,
            },
        };
        let checked = claims::check(&payload, &policy, now)?;
        Ok(AuthenticatedUser {
            user_id: checked.user_id,
            claims: Value::Object(payload),
            expires_at: checked.expires_at,
        })
    }

    async fn verify_signature(&self, jwt: &Jwt<'_>) -> Result<KeyOwner, AuthError> {
        let (sets, outage) = self.key_sets().await;
        let error = match select(&sets, jwt) {
            Selection::Verified(owner) => return Ok(owner),
            Selection::Refused(error) => return Err(error),
            Selection::Missed(error) => error,
        };
        let mut refreshed = false;
        for remote in self.remotes() {
            refreshed |= remote.refetch_after_miss().await;
        }
        if refreshed {
            let (sets, outage) = self.key_sets().await;
            return match select(&sets, jwt) {
                Selection::Verified(owner) => Ok(owner),
                Selection::Refused(error) => Err(error),
                Selection::Missed(error) => Err(outage.unwrap_or(error)),
            };
        }
        Err(outage.unwrap_or(error))
    }

    /// Every remote key set, configured ones first.
    fn remotes(&self) -> impl Iterator<Item = &Arc<RemoteJwks>> {
        self.inner
            .remote
            .iter()
            .chain(self.inner.supabase_remote.as_ref())
    }

    /// Every key set with its owner: inline first, then each JWKS in configured order,
    /// then Supabase's. Also the first source that has no keys at all because fetching
    /// failed.
    async fn key_sets(&self) -> (Vec<(Arc<[VerifyKey]>, KeyOwner)>, Option<AuthError>) {
        let inner = &self.inner;
        let mut sets = vec![(Arc::clone(&inner.inline), KeyOwner::Configured)];
        let mut outage = None;
        for remote in &inner.remote {
            match remote.keys().await {
                Ok(keys) => sets.push((keys, KeyOwner::Configured)),
                Err(error) => {
                    outage.get_or_insert(error);
                }
            }
        }
        sets.push((Arc::clone(&inner.supabase_inline), KeyOwner::Supabase));
        if let Some(remote) = &inner.supabase_remote {
            match remote.keys().await {
                Ok(keys) => sets.push((keys, KeyOwner::Supabase)),
                Err(error) => {
                    outage.get_or_insert(error);
                }
            }
        }
        (sets, outage)
    }
}

/// Supabase Auth's inline keys and its project's JWKS.
type SupabaseKeys = (Vec<VerifyKey>, Option<Arc<RemoteJwks>>);

/// Supabase Auth's keys: the legacy secret as an HS256 key without a kid (any token's kid
/// matches it), and the project's JWKS.
fn supabase_keys(
    supabase: &config::Supabase,
    remote_jwks: impl Fn(&str) -> Result<Arc<RemoteJwks>, AuthError>,
) -> Result<SupabaseKeys, AuthError> {
    use base64::Engine;
    let mut inline = Vec::new();
    if let Some(secret) = &supabase.jwt_secret {
        let jwk = serde_json::json!({
            "kty": "oct",
            "alg": "HS256",
            "k": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret.as_bytes()),
        });
        let key = VerifyKey::from_jwk(&jwk).map_err(|reason| AuthError::InvalidKey {
            index: 0,
            reason: format!("client_auth.supabase_jwt_secret: {reason}"),
        })?;
        if secret.len() < MIN_HMAC_SECRET_BYTES {
            tracing::warn!(
                "client_auth.supabase_jwt_secret has {} bytes, fewer than {MIN_HMAC_SECRET_BYTES}: \
                 is it the project's JWT secret?",
                secret.len()
            );
        }
        inline.push(key);
    }
    let remote = supabase.jwks_uri.as_deref().map(remote_jwks).transpose()?;
    match &remote {
        Some(_) => tracing::info!(
            jwks_uri = supabase.jwks_uri.as_deref().unwrap_or_default(),
            "Supabase Auth configured"
        ),
        None => tracing::warn!(
            "client_auth.supabase is on, but the source connection's host is not \
             db.<project>.supabase.co: Supabase's signing keys are not fetched (only \
             supabase_jwt_secret, when set, verifies its tokens)"
        ),
    }
    Ok((inline, remote))
}

/// Spec §6 key selection: the key with the token's `kid` if there is one (its algorithm must
/// fit); otherwise every key without a kid that accepts the algorithm, first to verify wins.
fn select(sets: &[(Arc<[VerifyKey]>, KeyOwner)], jwt: &Jwt<'_>) -> Selection {
    let keys = || {
        sets.iter()
            .flat_map(|(set, owner)| set.iter().map(move |key| (key, *owner)))
    };
    let message = jwt.signed.as_bytes();
    if let Some(kid) = jwt.kid.as_deref() {
        if let Some((key, owner)) = keys().find(|(k, _)| k.kid() == Some(kid)) {
            if !key.accepts(jwt.alg) {
                return Selection::Refused(AuthError::UnexpectedAlgorithm {
                    kid: error::shorten(kid, 64),
                    alg: jwt.alg.name(),
                });
            }
            return if key.verifies(jwt.alg, message, jwt.signature) {
                Selection::Verified(owner)
            } else {
                Selection::Refused(AuthError::BadSignature {
                    keys: format!("the key with kid `{}`", error::shorten(kid, 64)),
                })
            };
        }
    }
    let mut tried = 0usize;
    for (key, owner) in keys().filter(|(k, _)| k.kid().is_none() && k.accepts(jwt.alg)) {
        if key.verifies(jwt.alg, message, jwt.signature) {
            return Selection::Verified(owner);
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
