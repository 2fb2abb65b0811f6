//! `/probes/startup`, `/probes/liveness`, `/probes/readiness`: unauthenticated JSON
//! `{ready, started, touched_at}` as the official service answers, 200 or 400, with what
//! this service adds: `ingest_running`, `source_stalled` and `in_rotation`. Readiness
//! keeps the official meaning, the one load balancers act on: the sync endpoints serve (a
//! complete store, whatever its ingest does; `docs/operations.md`, "Serving and ingest"),
//! unless the operator took the replica out of rotation. A stalled source or a stopped
//! ingest shows in the body, `status()` and `/metrics`.

use hyper::{Response, StatusCode};

use super::body::Body;
use super::error::json_response;
use super::state::HttpState;
use status::unix_now_ms;

/// The engine's loop must have touched the status this recently to count as alive.
const LIVENESS_WINDOW_MS: u64 = 10_000;

/// Which probe was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    Startup,
    Liveness,
    Readiness,
}

impl Probe {
    pub(super) fn from_path(path: &str) -> Option<Self> {
        match path {
            "/probes/startup" => Some(Self::Startup),
            "/probes/liveness" => Some(Self::Liveness),
            "/probes/readiness" => Some(Self::Readiness),
            _ => None,
        }
    }
}

pub(super) fn answer(probe: Probe, state: &HttpState) -> Response<Body> {
    let status = state.status.snapshot();
    let ready = status.ready && status.in_rotation;
    let touched_ms = state.status.touched_at_ms();
    let alive = touched_ms > 0 && unix_now_ms().saturating_sub(touched_ms) <= LIVENESS_WINDOW_MS;
    let ok = match probe {
        Probe::Startup => true,
        Probe::Liveness => alive,
        Probe::Readiness => ready,
    };
    let body = serde_json::json!({
        "ready": ready,
        "started": true,
        "touched_at": status::iso_time(touched_ms),
        "ingest_running": status.ingest.running,
        "source_stalled": status.source_stalled(),
        "in_rotation": status.in_rotation,
    });
    json_response(
        if ok {
            StatusCode::OK
        } else {
            StatusCode::BAD_REQUEST
        },
        &body,
    )
}
