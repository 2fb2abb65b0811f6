//! `GET /write-checkpoint2.json?client_id=…`: a managed write checkpoint whose id is the
//! primary's WAL position (see [`service::write_checkpoint`]).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::authorization::authenticate;
use super::error::{json_response, ApiError};
use super::Body;
use service::write_checkpoint::record_key;
use service::SyncService;

/// Answers one write-checkpoint request.
pub async fn handle(req: Request<Incoming>, service: Arc<SyncService>) -> Response<Body> {
    match create(&req, &service).await {
        Ok(id) => json_response(
            StatusCode::OK,
            &serde_json::json!({ "data": { "write_checkpoint": id.to_string() } }),
        ),
        Err(error) => error.into_response(),
    }
}

async fn create(req: &Request<Incoming>, service: &Arc<SyncService>) -> Result<u64, ApiError> {
    if !service.status.snapshot().ready {
        return Err(ApiError::not_ready());
    }
    let user = authenticate(service, req.headers()).await?;
    if !service.write_checkpoint_rate.allow(&user.user_id) {
        return Err(ApiError::too_many_write_checkpoints());
    }
    let client_id = req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "client_id")
            .map(|(_, v)| v.into_owned())
            .filter(|v| !v.is_empty())
    });
    let unreachable = |e: source::SourceError| {
        tracing::warn!(error = %e, "write checkpoint: the primary cannot be reached");
        ApiError::unavailable(format!(
            "cannot reach the primary for a write checkpoint: {e}"
        ))
    };
    let lsn = service.head.current_lsn().await.map_err(unreachable)?;
    // Recorded before the ping: a stream woken by the ping's checkpoint must see it.
    let key = record_key(&user.user_id, client_id.as_deref());
    service
        .record_write_checkpoint(key.clone(), lsn)
        .await
        .map_err(|e| ApiError::unavailable(format!("write checkpoint: {e}")))?;
    // The ping also carries the request to every other replica of the primary.
    service.head.ping(&key, lsn).await.map_err(unreachable)?;
    Ok(lsn)
}
