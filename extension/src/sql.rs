//! SQL functions of schema `powersync_mdbx`. They run in ordinary backends: they read
//! shared memory or file a request there, and never touch the MDBX store.

use std::time::{Duration, Instant};

use pgrx::prelude::*;
use pgrx::JsonB;

use crate::shared::{self, Request};

/// How long `reset()` waits for the worker: twice the bound of the worker's own network
/// work for a reset, so a refusal for a primary that does not answer reaches the caller.
const RESET_TIMEOUT: Duration = Duration::from_secs(60);
const _: () = assert!(RESET_TIMEOUT.as_secs() >= 2 * engine::host::RELEASE_TIMEOUT.as_secs());
/// How long `reload()` waits for the worker.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Raises an SQL error with a hint (does not return).
pub(crate) fn fail(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    pgrx::pg_sys::panic::ErrorReport::new(code, message, pgrx::function_name!())
        .set_hint(hint)
        .report(PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

/// Raises the not-preloaded error (with its hint) unless the worker exists.
pub(crate) fn require_preloaded() {
    if !crate::preloaded() {
        fail(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "powersync_mdbx is not loaded through shared_preload_libraries, so its worker is \
             not running"
                .to_owned(),
            "Add powersync_mdbx to shared_preload_libraries in postgresql.conf, set \
             powersync_mdbx.config_file, and restart PostgreSQL.",
        );
    }
}

/// The worker's status: phase, pid, configuration file, storage, listen addresses, the
/// last error, replication and deploy progress (`docs/operations.md`).
#[pg_extern]
fn status() -> JsonB {
    require_preloaded();
    let value = match shared::read_status() {
        Some(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
            serde_json::json!({ "phase": "unknown", "error": format!("unreadable status: {e}") })
        }),
        None => serde_json::json!({
            "phase": "not_started",
            "ready": false,
            "hint": "the background worker has not published a status yet; it starts after \
                     recovery finishes and restarts within seconds after a crash",
        }),
    };
    JsonB(value)
}

/// Asks the worker to drop its replication slots and storage and start over. Waits for
/// the worker and returns what it did. When a slot cannot be dropped (primary not
/// reachable, slot in use, configuration not loadable) it removes nothing, unless `force`:
/// then the stores go anyway and the result names the slots left on the primary.
#[pg_extern]
fn reset(force: default!(bool, false)) -> JsonB {
    serve(Request::Reset, force, "reset", RESET_TIMEOUT)
}

/// Asks the worker to re-read postgresql.conf and its configuration file now, as
/// `pg_reload_conf()` does, and returns what it did: changed sync rules start a deploy
/// (inside the served store when it can be, or in a new generation built beside it;
/// `status()` shows its progress),
/// invalid rules or keys change nothing and return the error.
#[pg_extern]
fn reload() -> JsonB {
    serve(Request::Reload, false, "reload", RELOAD_TIMEOUT)
}

/// Files `request` (with `flag`), waits for the worker to serve it and returns its result.
fn serve(request: Request, flag: bool, name: &str, timeout: Duration) -> JsonB {
    require_preloaded();
    let number = shared::file(request, flag);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(text) = shared::result(request, number) {
            return JsonB(serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)));
        }
        if Instant::now() >= deadline {
            fail(
                PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
                format!(
                    "the powersync_mdbx worker did not carry out the {name} within {timeout:?}"
                ),
                "Check SELECT powersync_mdbx.status() and the server log; the request stays \
                 filed and the worker serves it when it runs.",
            );
        }
        pgrx::check_for_interrupts!();
        // SAFETY: plain sleep on the backend's main thread.
        unsafe { pg_sys::pg_usleep(20_000) };
    }
}

extension_sql!(
    r#"
REVOKE ALL ON FUNCTION reset(boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION reload() FROM PUBLIC;
REVOKE ALL ON FUNCTION status() FROM PUBLIC;
GRANT USAGE ON SCHEMA powersync_mdbx TO pg_monitor;
GRANT EXECUTE ON FUNCTION status() TO pg_monitor;
COMMENT ON FUNCTION reload() IS 'Re-reads the configuration now; changed sync rules are deployed without downtime, inside the served store or in a new generation beside it, and switched to once caught up.';
COMMENT ON FUNCTION status() IS 'Status of the powersync_mdbx background worker (jsonb).';
COMMENT ON FUNCTION reset(boolean) IS 'Drops the worker''s replication slots and storage and starts over; removes nothing when a slot cannot be dropped, unless force => true.';
CREATE FUNCTION replication() RETURNS TABLE(
    phase text, slot text, consistent_point pg_lsn, applied_lsn pg_lsn, primary_lsn pg_lsn,
    lag_bytes bigint, retained_wal_bytes bigint, last_op_id bigint,
    transactions bigint, changes bigint, rows bigint)
LANGUAGE sql STABLE
AS $$
    SELECT s->>'phase', r->>'slot', (r->>'consistent_point')::pg_lsn,
           (r->>'applied_lsn')::pg_lsn, (r->>'primary_lsn')::pg_lsn,
           (r->>'lag_bytes')::bigint, (r->>'retained_wal_bytes')::bigint,
           (r->>'last_op_id')::bigint, (r->>'transactions')::bigint,
           (r->>'changes')::bigint, (r->>'rows')::bigint
    FROM powersync_mdbx.status() AS s, LATERAL (SELECT s->'replication' AS r) AS x
$$;
REVOKE ALL ON FUNCTION buckets() FROM PUBLIC;
REVOKE ALL ON FUNCTION user_buckets(jsonb, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION streams() FROM PUBLIC;
REVOKE ALL ON FUNCTION replication() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION replication() TO pg_monitor;
COMMENT ON FUNCTION validate_rules(text) IS 'Compiles sync-rules YAML; jsonb with the names it defines or its errors with locations.';
COMMENT ON FUNCTION buckets() IS 'Every stored bucket with ops, checksum (signed, as sent to clients) and last op id at the current checkpoint.';
COMMENT ON FUNCTION user_buckets(jsonb, jsonb) IS 'The bucket set a client with these JWT claims and /sync/stream body gets now.';
COMMENT ON FUNCTION streams() IS 'The open /sync/stream connections.';
COMMENT ON FUNCTION replication() IS 'The replication slot, applied LSN, lag and retained WAL from the worker''s status.';
"#,
    name = "privileges",
    requires = [status, reset, reload],
    finalize
);
