//! Shared memory between the worker and the backends that run the SQL functions:
//! the published status (JSON) and the reset handshake.

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};

/// Bytes reserved for the status JSON.
const STATUS_BYTES: usize = 16 * 1024;
/// Bytes reserved for the result of the last reset.
const RESULT_BYTES: usize = 4 * 1024;

/// The shared block. Plain bytes, so it can live in PostgreSQL shared memory.
#[derive(Clone, Copy)]
pub struct Shared {
    status_len: usize,
    status: [u8; STATUS_BYTES],
    /// Incremented by `reset()`; the worker serves requests up to this number.
    reset_requested: u64,
    /// The last request number the worker finished.
    reset_completed: u64,
    result_len: usize,
    result: [u8; RESULT_BYTES],
}

// SAFETY: `Shared` is plain old data without pointers.
unsafe impl PGRXSharedMemory for Shared {}

impl Default for Shared {
    fn default() -> Self {
        Self {
            status_len: 0,
            status: [0; STATUS_BYTES],
            reset_requested: 0,
            reset_completed: 0,
            result_len: 0,
            result: [0; RESULT_BYTES],
        }
    }
}

static SHARED: PgLwLock<Shared> = unsafe { PgLwLock::new(c"powersync_mdbx_shared") };

/// Requests the shared block. Only from `_PG_init` during `shared_preload_libraries`.
pub fn init() {
    pg_shmem_init!(SHARED);
}

fn store(buffer: &mut [u8], len: &mut usize, text: &str) {
    let fallback;
    let bytes = if text.len() <= buffer.len() {
        text.as_bytes()
    } else {
        fallback = serde_json::json!({
            "error": format!("status too large for shared memory ({} bytes)", text.len())
        })
        .to_string();
        fallback.as_bytes()
    };
    let n = bytes.len().min(buffer.len());
    buffer[..n].copy_from_slice(&bytes[..n]);
    *len = n;
}

fn load(buffer: &[u8], len: usize) -> Option<String> {
    (len > 0).then(|| String::from_utf8_lossy(&buffer[..len.min(buffer.len())]).into_owned())
}

/// Publishes the worker's status JSON.
pub fn publish_status(json: &str) {
    let mut shared = SHARED.exclusive();
    let Shared {
        status, status_len, ..
    } = &mut *shared;
    store(status, status_len, json);
}

/// The last published status JSON, if the worker ever published one.
pub fn read_status() -> Option<String> {
    let shared = SHARED.share();
    load(&shared.status, shared.status_len)
}

/// Files a reset request; returns its number.
pub fn request_reset() -> u64 {
    let mut shared = SHARED.exclusive();
    shared.reset_requested += 1;
    shared.reset_requested
}

/// For the worker: the newest request not yet served, if any.
pub fn pending_reset() -> Option<u64> {
    let shared = SHARED.share();
    (shared.reset_requested > shared.reset_completed).then_some(shared.reset_requested)
}

/// For the worker: marks requests up to `number` served with `result`.
pub fn complete_reset(number: u64, result: &str) {
    let mut shared = SHARED.exclusive();
    let Shared {
        result: buffer,
        result_len,
        ..
    } = &mut *shared;
    store(buffer, result_len, result);
    shared.reset_completed = number;
}

/// The result of request `number`, once served.
pub fn reset_result(number: u64) -> Option<String> {
    let shared = SHARED.share();
    if shared.reset_completed >= number {
        Some(load(&shared.result, shared.result_len).unwrap_or_default())
    } else {
        None
    }
}
