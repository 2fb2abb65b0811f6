//! The background worker's main thread: reads GUCs, drives the engine's [`Host`], forwards
//! log events into the server log and publishes status into shared memory. It is the only
//! thread that calls PostgreSQL.

use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use engine::host::{Host, HostSettings, Tick};
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;
use status::StatusCell;

use crate::shared::{self, Request};
use crate::{guc, logbridge, signals};

/// How often the loop wakes without a signal: log forwarding, status, reset requests.
const POLL: Duration = Duration::from_millis(100);
/// Threads of the engine's tokio runtime.
const RUNTIME_THREADS: usize = 2;

/// Entry point named in the worker registration.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn powersync_mdbx_worker_main(_arg: pg_sys::Datum) {
    disable_transparent_huge_pages();
    engine::idle_release::set_release(release_free_memory);
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // Attach to no database (like the logical replication launcher): the worker then has
    // a PGPROC, shows in pg_stat_activity and answers pg_terminate_backend.
    BackgroundWorker::connect_worker_to_spi(None, None);
    let logs = logbridge::install();
    let status = Arc::new(StatusCell::new(std::process::id()));
    let mut host = Host::new(settings(), status.clone(), block_signals);
    pgrx::log!(
        "powersync_mdbx: worker started (pid {})",
        std::process::id()
    );
    shared::worker_started();
    host.start();
    let mut published = 0;
    // The reset request being served (the host carries it on over several ticks).
    let mut reset_number = None;
    let exit_code = loop {
        logbridge::forward(logs.as_ref());
        publish(&status, &mut published);
        if !BackgroundWorker::wait_latch(Some(POLL)) {
            break 1;
        }
        if BackgroundWorker::sighup_received() {
            reload_config();
            host.reload(settings());
        }
        if let Some((number, _)) = shared::take(Request::Reload) {
            reload_config();
            let result = host.reload(settings());
            logbridge::forward(logs.as_ref());
            shared::complete(Request::Reload, number, &result.to_string());
        }
        if reset_number.is_none() {
            if let Some((number, force)) = shared::take(Request::Reset) {
                host.start_reset(force);
                reset_number = Some(number);
            }
        }
        let tick = host.tick();
        answer_reset(&mut host, &mut reset_number);
        if let Tick::Exit(code) = tick {
            break code;
        }
    };
    let joined = host.shutdown();
    // A reset still waiting for its slots answers that it removed nothing.
    answer_reset(&mut host, &mut reset_number);
    logbridge::forward(logs.as_ref());
    publish(&status, &mut published);
    if joined {
        pgrx::log!("powersync_mdbx: worker stopped, engine threads joined");
    } else {
        pgrx::warning!("powersync_mdbx: worker exiting with engine threads still running");
    }
    // Exit code 1 asks the postmaster to restart the worker (after pg_terminate_backend,
    // or engine threads that would not stop); during shutdown it is not restarted. Other
    // engine failures never get here: the host starts the engine again inside the worker.
    // SAFETY: ends the process the PostgreSQL way, running its exit callbacks.
    unsafe { pg_sys::proc_exit(exit_code) };
}

/// Completes the reset request being served once the host has its result.
fn answer_reset(host: &mut Host, number: &mut Option<u64>) {
    if let Some(n) = *number {
        if let Some(result) = host.take_reset_result() {
            shared::complete(Request::Reset, n, &result.to_string());
            *number = None;
        }
    }
}

fn publish(status: &StatusCell, published: &mut u64) {
    let version = status.version();
    if version != *published {
        let json = status::status_json_within(&status.snapshot(), shared::STATUS_BYTES);
        shared::publish_status(&json);
        *published = version;
    }
}

/// Re-reads postgresql.conf on the main thread, as PostgreSQL does after SIGHUP.
fn reload_config() {
    // SAFETY: called on the worker's main thread, outside any transaction.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
}

fn block_signals(f: &mut dyn FnMut()) {
    signals::with_all_signals_blocked(f)
}

fn settings() -> HostSettings {
    HostSettings {
        config_file: guc::get(&guc::CONFIG_FILE).map(PathBuf::from),
        storage_dir: guc::get(&guc::STORAGE_DIR)
            .map(PathBuf::from)
            .unwrap_or_else(default_storage_dir),
        listen_addresses: guc::get(&guc::LISTEN_ADDRESSES)
            .unwrap_or_else(|| "127.0.0.1".into())
            .split(',')
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .collect(),
        runtime_threads: RUNTIME_THREADS,
        slot_name: guc::get(&guc::SLOT_NAME).unwrap_or_else(|| "powersync_mdbx".into()),
        admin_socket: Some(crate::admin_client::socket_path()),
        peer_secret_file: guc::get(&guc::PEER_SECRET_FILE).map(PathBuf::from),
        peer_secret_in_setting: guc::get(&guc::PEER_SECRET).is_some(),
        seed_from: guc::get(&guc::SEED_FROM),
        peer_loopback: guc::PEER_LOOPBACK.get(),
        peer_listen: guc::get(&guc::PEER_LISTEN),
        peer_tls: engine::PeerTlsFiles {
            cert_file: guc::get(&guc::PEER_TLS_CERT_FILE).map(PathBuf::from),
            key_file: guc::get(&guc::PEER_TLS_KEY_FILE).map(PathBuf::from),
            ca_file: guc::get(&guc::PEER_TLS_CA_FILE).map(PathBuf::from),
        },
        in_rotation: guc::IN_ROTATION.get(),
    }
}

/// `<data directory>.powersync_mdbx`, beside the data directory.
fn default_storage_dir() -> PathBuf {
    // SAFETY: DataDir is set (absolute) before any background worker starts.
    let data_dir = unsafe { CStr::from_ptr(pg_sys::DataDir) };
    let mut dir = data_dir.to_string_lossy().trim_end_matches('/').to_owned();
    dir.push_str(".powersync_mdbx");
    PathBuf::from(dir)
}

/// Gives the free pages of the calling thread's heap back to the system, and those of
/// threads that exited (`engine::idle_release`: a runtime thread about to park).
fn release_free_memory() {
    // SAFETY: mi_collect only walks mimalloc's own structures; any thread may call it.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// Turns transparent huge pages off for the worker's process. mimalloc asks for them for
/// its arenas (`MADV_HUGEPAGE`), so every first touch of one zeroed 2 MiB and a sparsely
/// used huge page counted whole in the worker's memory: with 10,000 open streams a fifth
/// of the worker's CPU went to zeroing them (`docs/benchmark.md`, "Fan-out"). Other
/// processes of the server are not affected.
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes one integer argument and touches no memory of ours.
    let result = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if result != 0 {
        pgrx::warning!(
            "powersync_mdbx: could not turn transparent huge pages off for the worker: {}",
            std::io::Error::last_os_error()
        );
    }
}
