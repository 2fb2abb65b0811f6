//! Shared memory between the worker and the backends that run the SQL functions:
//! the published status (JSON) and the reset and reload handshakes.

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgLwLock};

/// Bytes reserved for the status JSON (`status::status_json_within` fits it in them).
pub const STATUS_BYTES: usize = 16 * 1024;
/// Bytes reserved for the result of the last reset or reload (a reset that names the
/// slots of several stores with their reasons takes a few KiB).
const RESULT_BYTES: usize = 16 * 1024;

/// A request a backend files and the worker serves: numbered, with its flag and the last
/// result.
#[derive(Clone, Copy)]
pub struct Handshake {
    /// Incremented by each request; the worker serves requests up to this number.
    requested: u64,
    /// The last request number the worker took up (it may still be serving it).
    taken: u64,
    /// The last request number the worker finished.
    completed: u64,
    /// The requests not yet taken up all asked for it (`reset(force => true)`): requests
    /// filed together are served as one, and one that did not ask for force is never
    /// served forced.
    flag: bool,
    result_len: usize,
    result: [u8; RESULT_BYTES],
}

impl Default for Handshake {
    fn default() -> Self {
        Self {
            requested: 0,
            taken: 0,
            completed: 0,
            flag: false,
            result_len: 0,
            result: [0; RESULT_BYTES],
        }
    }
}

/// The requests backends can file.
#[derive(Clone, Copy)]
pub enum Request {
    /// `powersync_mdbx.reset()`.
    Reset,
    /// `powersync_mdbx.reload()`.
    Reload,
}

/// The shared block. Plain bytes, so it can live in PostgreSQL shared memory.
#[derive(Clone, Copy)]
pub struct Shared {
    status_len: usize,
    status: [u8; STATUS_BYTES],
    reset: Handshake,
    reload: Handshake,
}

// SAFETY: `Shared` is plain old data without pointers.
unsafe impl PGRXSharedMemory for Shared {}

impl Default for Shared {
    fn default() -> Self {
        Self {
            status_len: 0,
            status: [0; STATUS_BYTES],
            reset: Handshake::default(),
            reload: Handshake::default(),
        }
    }
}

impl Shared {
    fn handshake(&self, request: Request) -> &Handshake {
        match request {
            Request::Reset => &self.reset,
            Request::Reload => &self.reload,
        }
    }

    fn handshake_mut(&mut self, request: Request) -> &mut Handshake {
        match request {
            Request::Reset => &mut self.reset,
            Request::Reload => &mut self.reload,
        }
    }
}

// SAFETY: one static under a name no other lock uses; `init` attaches it to shared
// memory with `pg_shmem_init!` in `_PG_init`, before anything locks it.
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

/// Files a request with its flag; returns its number.
pub fn file(request: Request, flag: bool) -> u64 {
    let mut shared = SHARED.exclusive();
    let handshake = shared.handshake_mut(request);
    handshake.flag = if handshake.requested == handshake.taken {
        flag
    } else {
        handshake.flag && flag
    };
    handshake.requested += 1;
    handshake.requested
}

/// For the worker: takes up the newest request of this kind not yet taken, if any, with
/// its flag; [`complete`] with the number it returned answers every request up to it.
pub fn take(request: Request) -> Option<(u64, bool)> {
    let mut shared = SHARED.exclusive();
    let handshake = shared.handshake_mut(request);
    if handshake.requested > handshake.taken {
        handshake.taken = handshake.requested;
        Some((handshake.requested, handshake.flag))
    } else {
        None
    }
}

/// For a worker that just started: requests an earlier worker took up but did not finish
/// (it exited) are served again.
pub fn worker_started() {
    let mut shared = SHARED.exclusive();
    for request in [Request::Reset, Request::Reload] {
        let handshake = shared.handshake_mut(request);
        handshake.taken = handshake.completed;
    }
}

/// For the worker: marks requests up to `number` served with `result`.
pub fn complete(request: Request, number: u64, result: &str) {
    let mut shared = SHARED.exclusive();
    let handshake = shared.handshake_mut(request);
    store(&mut handshake.result, &mut handshake.result_len, result);
    handshake.completed = number;
}

/// The result of request `number`, once served.
pub fn result(request: Request, number: u64) -> Option<String> {
    let shared = SHARED.share();
    let handshake = shared.handshake(request);
    if handshake.completed >= number {
        Some(load(&handshake.result, handshake.result_len).unwrap_or_default())
    } else {
        None
    }
}
