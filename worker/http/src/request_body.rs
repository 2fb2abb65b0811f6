//! A request's body read whole, within a size limit and a deadline: a client that
//! announces a body and then sends it slowly, or never, holds its connection only that
//! long (hyper bounds the head, `HttpLimits::header_read_timeout`, not the body).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body as _, Incoming};

use super::error::ApiError;

/// Why a body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyError {
    /// It is (or announces) more bytes than the limit.
    TooLarge,
    /// It was not whole within the deadline (answered 408, [`ApiError::body_timeout`]).
    TooSlow(Duration),
    /// The client left, or the connection failed, while sending it.
    Broken,
}

impl BodyError {
    /// The answer for a body that was too slow or broken; `None` for one too large, which
    /// each endpoint answers in its own terms.
    pub(crate) fn answer(self) -> Option<ApiError> {
        match self {
            Self::TooLarge => None,
            Self::TooSlow(within) => Some(ApiError::body_timeout(within)),
            Self::Broken => Some(ApiError::bad_request(
                "the request's body could not be read: the connection failed".into(),
            )),
        }
    }
}

/// `body` whole when it has at most `max` bytes and all of it arrives within `within`.
pub(crate) async fn read_body(
    body: Incoming,
    max: usize,
    within: Duration,
) -> Result<Bytes, BodyError> {
    // A `Content-Length` over the limit is refused before anything is read.
    if body.size_hint().lower() > max as u64 {
        return Err(BodyError::TooLarge);
    }
    match tokio::time::timeout(within, Limited::new(body, max).collect()).await {
        Err(_) => Err(BodyError::TooSlow(within)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge),
        Ok(Err(_)) => Err(BodyError::Broken),
    }
}
