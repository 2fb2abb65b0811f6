//! CORS for browser clients (the web SDK calls the service from another origin): the sync
//! endpoints' answers allow any origin, and their preflight requests are answered
//! directly. Probes and `/metrics` are not for browsers and carry no CORS headers. Tokens travel
//! in the `Authorization` header, never in cookies, so a wildcard origin is safe.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};

use super::body::Body;

/// Headers a browser may send when none are named in the preflight.
const DEFAULT_ALLOWED_HEADERS: &str = "authorization, content-type, x-user-agent";

/// The answer to an `OPTIONS` preflight.
pub fn preflight(request: &HeaderMap) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = StatusCode::NO_CONTENT;
    let headers = response.headers_mut();
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    let allowed = request
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static(DEFAULT_ALLOWED_HEADERS));
    headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allowed);
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    allow_origin(&mut response);
    response
}

/// Adds the origin header to an answer of a sync endpoint.
pub fn allow_origin(response: &mut Response<Body>) {
    response.headers_mut().insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
}
