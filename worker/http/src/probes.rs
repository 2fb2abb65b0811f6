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
        "touched_at": touched_at_iso(touched_ms),
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

/// RFC 3339 UTC with milliseconds, like JavaScript's `Date.toISOString()`.
fn touched_at_iso(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_timestamps() {
        assert_eq!(touched_at_iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            touched_at_iso(1_796_000_123_456),
            "2026-11-30T00:55:23.456Z"
        );
        assert_eq!(touched_at_iso(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
