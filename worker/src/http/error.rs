//! JSON error answers in the official service's shape:
//! `{"error": {"code", "description", "status", "name"}}` with the HTTP status in `status`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{header, Response, StatusCode};

use super::Body;

/// An error answer. The code is stable; clients only act on the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code.
    pub code: &'static str,
    /// Short error class name.
    pub name: &'static str,
    /// What happened and what to do.
    pub description: String,
}

impl ApiError {
    /// No route at this path.
    pub fn not_found(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: "PSM_H1404",
            name: "RouteNotFound",
            description: format!("no endpoint at {path}"),
        }
    }

    /// The path exists, the method does not.
    pub fn method_not_allowed(method: &hyper::Method, path: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: "PSM_H1405",
            name: "MethodNotAllowed",
            description: format!("{method} is not allowed on {path}"),
        }
    }

    /// Renders the JSON response.
    pub fn into_response(self) -> Response<Body> {
        let body = serde_json::json!({
            "error": {
                "code": self.code,
                "name": self.name,
                "description": self.description,
                "status": self.status.as_u16(),
            }
        });
        json_response(self.status, &body)
    }
}

/// A JSON response with the given status.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}
