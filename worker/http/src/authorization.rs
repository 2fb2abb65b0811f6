//! The `Authorization` header handed to the service's authenticator.

use auth::AuthenticatedUser;
use hyper::header::{self, HeaderMap};
use service::SyncService;

use super::error::ApiError;

/// Verifies the request's `Authorization` header (the service counts refusals by code).
pub async fn authenticate(
    service: &SyncService,
    headers: &HeaderMap,
) -> Result<AuthenticatedUser, ApiError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    Ok(service.authenticate(authorization).await?)
}
