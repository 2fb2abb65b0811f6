//! The backend side of the engine's admin socket: where it is (inside the data directory,
//! derived the same way by the worker and every backend) and one call to it that stays
//! interruptible and turns every failure into an SQL error with a hint.

use std::ffi::CStr;
use std::path::PathBuf;
use std::time::Duration;

use admin::{AdminError, AdminRequest, AdminResponse};
use pgrx::prelude::*;

use crate::shared;

/// How long a backend waits for the engine's answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// `<data directory>/powersync_mdbx_admin.sock`.
pub fn socket_path() -> PathBuf {
    // SAFETY: DataDir is set (absolute) before any backend or worker runs SQL.
    let data_dir = unsafe { CStr::from_ptr(pg_sys::DataDir) };
    PathBuf::from(data_dir.to_string_lossy().into_owned()).join(admin::SOCKET_NAME)
}

/// Sends `request` and returns the engine's answer; raises an SQL error otherwise.
pub fn call(request: &AdminRequest) -> AdminResponse {
    crate::sql::require_preloaded();
    let path = socket_path();
    match admin::call(&path, request, TIMEOUT, || {
        pgrx::check_for_interrupts!();
    }) {
        Ok(AdminResponse::Error {
            code,
            message,
            hint,
        }) => fail(format!("{code} {message}"), &hint),
        Ok(response) => response,
        Err(e @ AdminError::NotRunning { .. }) => fail(
            format!("{e}; the worker's engine is {}", engine_state()),
            "SELECT powersync_mdbx.status() shows the phase and the last error; the engine \
             serves these functions once its configuration is valid and its storage is open",
        ),
        Err(e) => fail(
            e.to_string(),
            "SELECT powersync_mdbx.status() and the server log show what the worker is doing",
        ),
    }
}

/// The published phase and last error, for messages.
fn engine_state() -> String {
    let Some(text) = shared::read_status() else {
        return "not started yet".to_owned();
    };
    let status: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let phase = status["phase"].as_str().unwrap_or("unknown");
    match status["last_error"]["message"].as_str() {
        Some(error) => format!("in phase {phase} (last error: {error})"),
        None => format!("in phase {phase}"),
    }
}

/// Raises an SQL error that the worker's state explains (does not return).
fn fail(message: String, hint: &str) -> ! {
    crate::sql::fail(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        message,
        hint,
    )
}
