//! Write checkpoints (see [`service::write_checkpoint`]): `GET /write-checkpoint2.json?
//! client_id=…`, whose id is the primary's WAL position, and `POST /sync/checkpoint-request`
//! (the SDKs' `checkpointMode: 'requests'`), whose client-chosen id the service keeps at
//! least that position. Both record the request, then have the source emit a logical
//! message that every replica of the primary records too. A request is authenticated (and
//! held to its user's rate) from its headers, before a body is read.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::Value;

use super::authorization::authenticate;
use super::body::Body;
use super::error::{json_response, ApiError};
use super::request_body::read_body;
use auth::AuthenticatedUser;
use service::write_checkpoint::record_key;
use service::SyncService;
use status::Phase;

/// `POST /sync/checkpoint-request`'s path.
pub const REQUEST_PATH: &str = "/sync/checkpoint-request";
/// The largest checkpoint-request body read.
const MAX_REQUEST_BYTES: usize = 64 << 10;

/// Answers one `GET /write-checkpoint2.json`.
pub async fn handle(req: Request<Incoming>, service: Arc<SyncService>) -> Response<Body> {
    let client_id = req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "client_id")
            .map(|(_, v)| v.into_owned())
            .filter(|v| !v.is_empty())
    });
    let created = match authorize(&service, &req).await {
        Ok(user) => create(&service, &user, client_id.as_deref(), None).await,
        Err(error) => Err(error),
    };
    match created {
        Ok(id) => json_response(
            StatusCode::OK,
            &serde_json::json!({ "data": { "write_checkpoint": id.to_string() } }),
        ),
        Err(error) => error.into_response(),
    }
}

/// Answers one `POST /sync/checkpoint-request` (`{"client_id", "checkpoint_request_id"}`)
/// with the id in effect, at least the one asked for. The body must arrive whole within
/// `body_within` of the headers.
pub async fn handle_request(
    req: Request<Incoming>,
    service: Arc<SyncService>,
    body_within: Duration,
) -> Response<Body> {
    match checkpoint_request(req, &service, body_within).await {
        Ok(id) => json_response(
            StatusCode::OK,
            &serde_json::json!({ "data": { "checkpoint_request_id": id.to_string() } }),
        ),
        Err(error) => error.into_response(),
    }
}

/// Authorizes a checkpoint request, then reads, parses and records it.
async fn checkpoint_request(
    req: Request<Incoming>,
    service: &Arc<SyncService>,
    body_within: Duration,
) -> Result<u64, ApiError> {
    let user = authorize(service, &req).await?;
    let body = read_body(req.into_body(), MAX_REQUEST_BYTES, body_within)
        .await
        .map_err(|e| {
            e.answer().unwrap_or_else(|| {
                ApiError::bad_request(format!("the body is larger than {MAX_REQUEST_BYTES} bytes"))
            })
        })?;
    let (client_id, asked) = parse_request(&body)?;
    create(service, &user, Some(&client_id), Some(asked)).await
}

/// The client id and the checkpoint-request id of a body: the id a positive `i64`, as a
/// decimal string or a JSON number.
pub(crate) fn parse_request(body: &[u8]) -> Result<(String, u64), ApiError> {
    let shape = || {
        ApiError::bad_request(
            "send {\"client_id\": \"<id>\", \"checkpoint_request_id\": \"<1..9223372036854775807>\"}"
                .into(),
        )
    };
    let value: Value = serde_json::from_slice(body).map_err(|_| shape())?;
    let client_id = value["client_id"].as_str().ok_or_else(shape)?.to_owned();
    let id = match &value["checkpoint_request_id"] {
        Value::String(text) => text.parse::<u64>().ok(),
        Value::Number(number) => number.as_u64(),
        _ => None,
    }
    .filter(|id| (1..=i64::MAX as u64).contains(id))
    .ok_or_else(shape)?;
    Ok((client_id, id))
}

/// The user of a write-checkpoint request, from its headers alone: the service is ready,
/// its ingest streams (a write checkpoint completes only once the stream applies it), the
/// token valid and the user within its rate.
async fn authorize<B>(
    service: &Arc<SyncService>,
    req: &Request<B>,
) -> Result<AuthenticatedUser, ApiError> {
    let status = service.status.snapshot();
    if !status.ready {
        return Err(ApiError::not_ready());
    }
    if !status.ingest.running || !matches!(status.phase, Phase::Ready | Phase::Streaming) {
        return Err(ApiError::unavailable(format!(
            "this replica serves its last checkpoint but does not apply the source's changes \
             now (phase {}): a write checkpoint could not complete; retry",
            status.phase.name()
        )));
    }
    let user = authenticate(service, req.headers()).await?;
    if !service.write_checkpoint_rate.allow(&user.user_id) {
        return Err(ApiError::too_many_write_checkpoints());
    }
    Ok(user)
}

/// Records a request of `user` for `client_id` (with `asked`, a checkpoint request's id)
/// and announces it; returns the id in effect.
async fn create(
    service: &Arc<SyncService>,
    user: &AuthenticatedUser,
    client_id: Option<&str>,
    asked: Option<u64>,
) -> Result<u64, ApiError> {
    let unreachable = |e: source::SourceError| {
        tracing::warn!(error = %e, "write checkpoint: the primary cannot be reached");
        ApiError::unavailable(format!(
            "cannot reach the primary for a write checkpoint: {e}"
        ))
    };
    let lsn = service.head.current_lsn().await.map_err(unreachable)?;
    // Recorded before the ping: a stream woken by the ping's checkpoint must see it.
    let key = record_key(&user.user_id, client_id);
    let id = service
        .record_write_checkpoint(key.clone(), lsn, asked)
        .await
        .map_err(|e| ApiError::unavailable(format!("write checkpoint: {e}")))?;
    // The ping also carries the request to every other replica of the primary.
    service
        .head
        .ping(&key, lsn, id)
        .await
        .map_err(unreachable)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_requests_carry_a_client_and_a_positive_i64() {
        let ok = |body: &str| parse_request(body.as_bytes()).unwrap();
        assert_eq!(
            ok(r#"{"client_id":"c1","checkpoint_request_id":"42"}"#),
            ("c1".to_owned(), 42)
        );
        assert_eq!(
            ok(r#"{"client_id":"c1","checkpoint_request_id":7,"x":1}"#),
            ("c1".to_owned(), 7)
        );
        assert_eq!(
            ok(r#"{"client_id":"","checkpoint_request_id":"9223372036854775807"}"#).1,
            i64::MAX as u64
        );
        for bad in [
            r#"{"client_id":"c1","checkpoint_request_id":"0"}"#,
            r#"{"client_id":"c1","checkpoint_request_id":"9223372036854775808"}"#,
            r#"{"client_id":"c1","checkpoint_request_id":-1}"#,
            r#"{"client_id":"c1","checkpoint_request_id":"x"}"#,
            r#"{"checkpoint_request_id":"1"}"#,
            r#"{"client_id":1,"checkpoint_request_id":"1"}"#,
            "not json",
        ] {
            let error = parse_request(bad.as_bytes()).unwrap_err();
            assert_eq!(error.code, "PSM_H1400", "{bad}");
        }
    }
}
