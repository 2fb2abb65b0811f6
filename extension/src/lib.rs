//! The `powersync_mdbx` PostgreSQL extension: registers the background worker, its GUCs and
//! shared memory, and the SQL functions of schema `powersync_mdbx`.
//!
//! Thin by design: the engine (`powersync-mdbx-engine`) does the work on its own threads;
//! this crate reads configuration on the worker's main thread, relays log events and status,
//! and answers SQL from other backends through shared memory.

mod admin_client;
mod bgworker;
mod guc;
mod logbridge;
mod shared;
mod signals;
mod sql;
mod support;

use pgrx::bgworkers::{BackgroundWorkerBuilder, BgWorkerStartTime};
use pgrx::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

::pgrx::pg_module_magic!();

/// The engine's threads allocate and free per row on different threads; mimalloc's
/// per-thread heaps avoid glibc's arena locks there (about a third of the snapshot's CPU
/// went to malloc). PostgreSQL's own memory (palloc) is not affected. The `local_dynamic_tls`
/// feature is required: PostgreSQL loads the library with dlopen, where mimalloc's default
/// initial-exec TLS fails ("cannot allocate memory in static TLS block").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Seconds the postmaster waits before restarting the worker after it exits with code 1.
const RESTART_SECONDS: u64 = 3;

/// True in processes where the library was loaded through `shared_preload_libraries`
/// (the flag is set in the postmaster and inherited by every forked backend).
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Whether the worker, GUCs and shared memory exist in this server.
pub(crate) fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: reading a PostgreSQL global on the main thread during library load.
    let in_preload = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    guc::define(in_preload);
    if !in_preload {
        // Loaded by CREATE EXTENSION or a function call: no worker, no shared memory.
        // The SQL functions then explain how to preload the library.
        return;
    }
    PRELOADED.store(true, Ordering::Relaxed);
    store::quiet_library_logging();
    shared::init();
    BackgroundWorkerBuilder::new("powersync_mdbx")
        .set_type("powersync_mdbx")
        .set_library("powersync_mdbx")
        .set_function("powersync_mdbx_worker_main")
        .enable_shmem_access(None)
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(RESTART_SECONDS)))
        .load();
}

/// pgrx's SQL generation and `cargo pgrx test` hooks.
#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    /// No per-test setup.
    pub fn setup(_options: Vec<&str>) {}
    /// No extra postgresql.conf lines.
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
