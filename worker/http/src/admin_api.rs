//! The admin API's routes (`/api/admin/v1/*`, `/api/sync-rules/v1/*`) over
//! [`service::AdminApi`]: the token is checked before any body is read, bodies are read
//! within a size limit and a deadline, answers are `{"data": …}` as the official service
//! sends them.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::{header, Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::body::Body;
use super::error::{json_response, ApiError};
use super::request_body::read_body;
use service::{AdminApi, AdminError};

/// The largest admin request body read (a sync config is a few KiB).
const MAX_ADMIN_BODY_BYTES: usize = 1 << 20;

/// True for a path of the admin API.
pub fn is_admin_path(path: &str) -> bool {
    path.starts_with("/api/admin/v1/") || path.starts_with("/api/sync-rules/v1/")
}

/// Answers one admin request.
pub async fn handle(req: Request<Incoming>, api: &AdminApi, within: Duration) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let known = ROUTES.iter().find(|(p, _)| *p == path);
    let Some((_, expected)) = known else {
        return ApiError::not_found(&path).into_response();
    };
    if method != *expected {
        return ApiError::method_not_allowed(&method, &path).into_response();
    }
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Err(e) = api.authorize(authorization) {
        return refused(e);
    }
    let yaml = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/yaml"));
    let body = match read_body(req.into_body(), MAX_ADMIN_BODY_BYTES, within).await {
        Ok(body) => body,
        Err(e) => {
            return e
                .answer()
                .unwrap_or_else(|| {
                    ApiError::bad_request(format!(
                        "the request body is larger than {MAX_ADMIN_BODY_BYTES} bytes"
                    ))
                })
                .into_response()
        }
    };
    let params = match Params::read(&body, yaml) {
        Ok(params) => params,
        Err(e) => return refused(e),
    };
    match answer(&path, api, params).await {
        Ok(Answer::Data(data)) => json_response(StatusCode::OK, &json!({ "data": data })),
        Ok(Answer::Plain(body)) => json_response(StatusCode::OK, &body),
        Err(e) => refused(e),
    }
}

/// Every route and its method.
const ROUTES: [(&str, Method); 9] = [
    ("/api/admin/v1/diagnostics", Method::POST),
    ("/api/admin/v1/schema", Method::POST),
    ("/api/admin/v1/validate", Method::POST),
    ("/api/admin/v1/reprocess", Method::POST),
    ("/api/admin/v1/execute-sql", Method::POST),
    ("/api/sync-rules/v1/deploy", Method::POST),
    ("/api/sync-rules/v1/validate", Method::POST),
    ("/api/sync-rules/v1/current", Method::GET),
    ("/api/sync-rules/v1/reprocess", Method::POST),
];

/// How a route's answer is sent: wrapped in `{"data": …}`, or as it is (the official
/// `/api/sync-rules/v1/validate` and `current` write their JSON themselves).
enum Answer {
    Data(Value),
    Plain(Value),
}

async fn answer(path: &str, api: &AdminApi, params: Params) -> Result<Answer, AdminError> {
    Ok(match path {
        "/api/admin/v1/diagnostics" => {
            let content = params
                .json
                .get("sync_rules_content")
                .and_then(Value::as_bool);
            Answer::Data(api.diagnostics(content.unwrap_or(false)).await)
        }
        "/api/admin/v1/schema" => Answer::Data(api.schema().await?),
        "/api/admin/v1/validate" => {
            let text = params.text("sync_rules")?;
            Answer::Data(api.validate(&text).await)
        }
        "/api/admin/v1/reprocess" => Answer::Data(api.reprocess().await?),
        "/api/admin/v1/execute-sql" => Answer::Data(sql_not_enabled()),
        "/api/sync-rules/v1/deploy" => return Err(AdminError::deploy_from_file()),
        "/api/sync-rules/v1/validate" => {
            let text = params.text("content")?;
            Answer::Plain(api.validate_sync_rules(&text).await)
        }
        "/api/sync-rules/v1/current" => Answer::Plain(json!({ "data": api.current().await? })),
        _ => Answer::Data(api.reprocess_sync_rules().await?),
    })
}

/// The official answer of `execute-sql` when SQL querying is off; this replica never
/// runs SQL sent over HTTP (`docs/operations.md`, "The admin API and the official CLI").
fn sql_not_enabled() -> Value {
    json!({
        "success": false,
        "results": { "columns": [], "rows": [] },
        "error": "SQL querying is not enabled: this sync replica does not run SQL sent to \
                  its admin API; query the primary with psql",
    })
}

/// A request's parameters: its JSON object, or a YAML body taken as `content`.
struct Params {
    json: Value,
}

impl Params {
    fn read(body: &[u8], yaml: bool) -> Result<Self, AdminError> {
        if yaml {
            let text = std::str::from_utf8(body)
                .map_err(|_| AdminError::bad_request("the YAML body is not UTF-8".to_owned()))?;
            return Ok(Self {
                json: json!({ "content": text }),
            });
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self { json: json!({}) });
        }
        match serde_json::from_slice::<Value>(body) {
            Ok(json @ Value::Object(_)) => Ok(Self { json }),
            Ok(_) => Err(AdminError::bad_request(
                "the request body must be a JSON object".to_owned(),
            )),
            Err(e) => Err(AdminError::bad_request(format!(
                "the request body is not JSON: {e}"
            ))),
        }
    }

    /// The string parameter `name`, required.
    fn text(&self, name: &str) -> Result<String, AdminError> {
        self.json
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| AdminError::bad_request(format!("the request needs `{name}`: a string")))
    }
}

fn refused(e: AdminError) -> Response<Body> {
    ApiError {
        status: StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        code: e.code,
        name: e.name,
        description: e.description,
    }
    .into_response()
}
