//! A sync stream's places, taken once its token is accepted and before its request is
//! read, whatever the transport: [`admit`].

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::error::ApiError;
use auth::AuthenticatedUser;
use service::{Registration, SyncService};

/// A stream's place among the server's streams and among its user's; both are given back
/// when the stream ends (or when it never starts: a request that does not arrive in time).
pub(crate) struct Admission {
    pub permit: OwnedSemaphorePermit,
    pub registration: Registration,
}

/// Admits a stream of `user`: 429 `PSM_H1429` when the server holds as many streams as it
/// accepts, 429 `PSM_H1430` when the user does. Taken before the request's body is read,
/// so neither limit can be passed by connections that hold a request half sent.
pub(crate) fn admit(
    service: &Arc<SyncService>,
    user: &AuthenticatedUser,
) -> Result<Admission, ApiError> {
    let permit = service
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::too_many_streams())?;
    let expires = user
        .expires_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let registration = service
        .registry
        .register(&user.user_id, expires, service.limits.max_streams_per_user)
        .map_err(|full| ApiError::too_many_user_streams(full.max))?;
    Ok(Admission {
        permit,
        registration,
    })
}
