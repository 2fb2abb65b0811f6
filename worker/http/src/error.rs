//! JSON error answers in the official service's shape:
//! `{"error": {"code", "description", "status", "name"}}` with the HTTP status in `status`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{header, Response, StatusCode};

use super::body::Body;
use auth::AuthError;

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

    /// Clients cannot sync yet: the initial snapshot is not complete (they retry).
    pub fn not_ready() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "PSYNC_S2302",
            name: "NotReady",
            description: "the sync replica has no complete snapshot yet; retry shortly \
                          (SELECT powersync_mdbx.status() shows the progress)"
                .into(),
        }
    }

    /// The operator took the replica out of rotation (`powersync_mdbx.in_rotation`): the
    /// client retries, through its load balancer, on a replica in rotation.
    pub fn out_of_rotation() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "PSM_H1506",
            name: "OutOfRotation",
            description: "this sync replica was taken out of rotation by its operator \
                          (powersync_mdbx.in_rotation = off); connect to another replica"
                .into(),
        }
    }

    /// The server holds as many streams as it accepts.
    pub fn too_many_streams() -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "PSM_H1429",
            name: "TooManyStreams",
            description: "the server holds as many sync streams as it accepts; retry later".into(),
        }
    }

    /// The user already holds as many streams as one user may.
    pub fn too_many_user_streams(max: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "PSM_H1430",
            name: "TooManyStreamsForUser",
            description: format!(
                "this user already holds {max} sync streams, as many as one user may; close \
                 some, or retry later"
            ),
        }
    }

    /// A request whose body is not what the endpoint takes; `description` says what it
    /// takes.
    pub fn bad_request(description: String) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "PSM_H1400",
            name: "BadRequest",
            description,
        }
    }

    /// The user asks for write checkpoints faster than one user may.
    pub fn too_many_write_checkpoints() -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "PSM_H1431",
            name: "TooManyWriteCheckpoints",
            description: "this user asks for write checkpoints faster than 10 per second; \
                          retry shortly"
                .into(),
        }
    }

    /// The server holds as many connections as it accepts.
    pub fn too_many_connections() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "PSM_H1504",
            name: "TooManyConnections",
            description: "the server holds as many connections as it accepts; retry later".into(),
        }
    }

    /// The request's body did not arrive whole within `within` (the connection is closed
    /// after this answer).
    pub fn body_timeout(within: std::time::Duration) -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            code: "PSM_H1408",
            name: "RequestTimeout",
            description: format!(
                "the request's body did not arrive within {} s of its headers; send it at once",
                within.as_secs_f64()
            ),
        }
    }

    /// The server holds as many WebSockets waiting for their SETUP frame as it accepts.
    pub fn too_many_setups() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "PSM_H1505",
            name: "TooManyWebSocketsWaiting",
            description: "the server holds as many WebSockets waiting for their SETUP frame as \
                          it accepts; retry later"
                .into(),
        }
    }

    /// A dependency (the primary, the store) cannot serve the request now.
    pub fn unavailable(description: String) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "PSM_H1503",
            name: "Unavailable",
            description,
        }
    }

    /// The JSON body of the answer.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "code": self.code,
                "name": self.name,
                "description": self.description,
                "status": self.status.as_u16(),
            }
        })
    }

    /// The JSON body as bytes (for answers written without hyper).
    pub fn json_body(&self) -> Vec<u8> {
        self.json().to_string().into_bytes()
    }

    /// Renders the JSON response.
    pub fn into_response(self) -> Response<Body> {
        let body = self.json();
        let retry = matches!(
            self.status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        );
        let mut response = json_response(self.status, &body);
        if retry {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
        }
        // What is left of a body that did not arrive in time is not waited for.
        if self.status == StatusCode::REQUEST_TIMEOUT {
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        response
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

/// A refused token as the official service answers it: 401, or 503 when keys are unavailable.
impl From<AuthError> for ApiError {
    fn from(error: AuthError) -> Self {
        Self {
            status: StatusCode::from_u16(error.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code: error.code(),
            name: error.name(),
            description: error.to_string(),
        }
    }
}
