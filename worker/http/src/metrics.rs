//! `GET /metrics`: the engine's counters and gauges in the Prometheus text format.
//! Unauthenticated like the probes (they reveal no data, only volumes): keep the port
//! firewalled from the internet, or let a proxy in front answer only the sync paths.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{header, Response, StatusCode};

use super::body::Body;
use super::metrics_text::{Kind, TextEncoder, CONTENT_TYPE};
use super::state::HttpState;
use service::Served;
use status::Phase;

/// Where Prometheus scrapes.
pub(super) const PATH: &str = "/metrics";

/// The exposition of every metric, 200.
pub(super) fn answer(state: &HttpState) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(render(state))).boxed());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

fn render(state: &HttpState) -> String {
    let mut e = TextEncoder::default();
    engine(&mut e, state);
    replication(&mut e, state);
    storage(&mut e, state);
    http(&mut e, state);
    official(&mut e, state);
    process(&mut e);
    e.finish()
}

fn engine(e: &mut TextEncoder, state: &HttpState) {
    e.family(
        "powersync_mdbx_build_info",
        Kind::Gauge,
        "Always 1; labels: this build's version and the store format it reads and writes.",
    );
    e.sample_u64(
        "powersync_mdbx_build_info",
        &[
            ("version", env!("CARGO_PKG_VERSION")),
            ("store_format", store::FORMAT),
        ],
        1,
    );
    let status = state.status.snapshot();
    let phase = status.phase;
    e.single_u64(
        "powersync_mdbx_serving",
        Kind::Gauge,
        "1 while the sync endpoints serve a complete store (whatever its ingest does), else 0.",
        u64::from(status.ready),
    );
    e.single_u64(
        "powersync_mdbx_in_rotation",
        Kind::Gauge,
        "0 while the operator has taken the replica out of rotation (powersync_mdbx.in_rotation \
         = off: readiness fails, new sync connections are refused), else 1.",
        u64::from(status.in_rotation),
    );
    e.single_u64(
        "powersync_mdbx_ingest_running",
        Kind::Gauge,
        "1 while the served store's ingest (its replication) runs; 0 while it waits to start \
         again or for the operator (status().ingest says why).",
        u64::from(status.ingest.running),
    );
    e.single_u64(
        "powersync_mdbx_served_checkpoint_age_seconds",
        Kind::Gauge,
        "Seconds the checkpoint served now has been served (it grows while nothing is \
         applied: an idle source, or an ingest that stopped); 0 while nothing is served.",
        status.served.as_ref().map_or(0, |s| s.age_seconds),
    );
    e.family(
        "powersync_mdbx_phase",
        Kind::Gauge,
        "The engine's life-cycle phase as in status(): 1 for the current phase, 0 for the others.",
    );
    for p in Phase::ALL {
        let value = u64::from(p == phase);
        e.sample_u64("powersync_mdbx_phase", &[("phase", p.name())], value);
    }
    let served = state.sync.current();
    let snapshot = &served.snapshot_progress;
    e.single_u64(
        "powersync_mdbx_snapshot_rows",
        Kind::Gauge,
        "Rows the current (or last) initial snapshot copied into the store; 0 when this engine \
         start found the snapshot complete.",
        snapshot.rows(),
    );
    e.single_u64(
        "powersync_mdbx_snapshot_rows_estimated",
        Kind::Gauge,
        "The planner's estimate (pg_class.reltuples) of the rows the current (or last) \
         snapshot copies, taken when it began; 0 when unknown or when this engine start found \
         the snapshot complete.",
        snapshot.rows_estimated(),
    );
    e.single_u64(
        "powersync_mdbx_snapshot_tables_done",
        Kind::Gauge,
        "Tables the current (or last) initial snapshot copied completely.",
        snapshot.tables_done(),
    );
}

fn replication(e: &mut TextEncoder, state: &HttpState) {
    let served = state.sync.current();
    replication_lag(e, &served);
    replication_work(e, &served);
}

/// Where replication stands against the primary: the applied and the primary's LSN, the
/// lag in bytes and seconds, the WAL the slot retains.
fn replication_lag(e: &mut TextEncoder, served: &Served) {
    let progress = &served.stream_progress;
    let applied = served.checkpoints.borrow().lsn;
    e.single_u64(
        "powersync_mdbx_applied_lsn",
        Kind::Gauge,
        "Source LSN of the latest published (durable) checkpoint, as a byte position.",
        applied,
    );
    let head = progress.primary_head_lsn.load(Relaxed);
    e.family(
        "powersync_mdbx_primary_wal_lsn",
        Kind::Gauge,
        "The primary's pg_current_wal_lsn() as a byte position, read every 10 s while \
         streaming; absent before the first reading.",
    );
    if head > 0 {
        e.sample_u64("powersync_mdbx_primary_wal_lsn", &[], head);
    }
    e.family(
        "powersync_mdbx_replication_lag_bytes",
        Kind::Gauge,
        "primary_wal_lsn minus applied_lsn (0 when applied is ahead of the last reading). On an \
         idle primary a few hundred bytes of WAL without changes (checkpoints, standby \
         snapshots) stay beyond the applied LSN; absent before the first reading.",
    );
    if head > 0 {
        e.sample_u64(
            "powersync_mdbx_replication_lag_bytes",
            &[],
            head.saturating_sub(applied),
        );
    }
    let lag = progress.pending.lag_seconds(status::unix_now_ms());
    e.single(
        "powersync_mdbx_replication_lag_seconds",
        Kind::Gauge,
        "Now minus the primary's commit time of the oldest source transaction received over \
         the replication connection whose checkpoint is not published yet; 0 when every \
         received transaction is published (caught up). Clock skew between the primary and \
         this server adds to it; WAL not yet sent by the primary shows in lag_bytes only.",
        lag,
    );
    e.single_u64(
        "powersync_mdbx_retained_wal_bytes",
        Kind::Gauge,
        "WAL the primary retains for the slot (pg_current_wal_lsn() - restart_lsn), read \
         every 10 s while streaming.",
        progress.retained_wal_bytes.load(Relaxed),
    );
}

/// What the stream is doing and has done: rebuilds, recopies, gone tables, the applied
/// transactions, changes and ops, and the time to publish.
fn replication_work(e: &mut TextEncoder, served: &Served) {
    let progress = &served.stream_progress;
    e.single_u64(
        "powersync_mdbx_rebuilding",
        Kind::Gauge,
        "1 while the store is rebuilt from a new slot because its slot was lost or \
         invalidated: what it serves is stale until the rebuild ends; else 0.",
        u64::from(progress.rebuilding.load(Relaxed)),
    );
    e.single_u64(
        "powersync_mdbx_tables_recopying",
        Kind::Gauge,
        "Tables being copied again beside the stream because columns the sync rules read \
         changed on the primary (or a rules deploy marked them); after a schema change \
         clients are served the last checkpoint from before it until the copy is merged.",
        progress.recopying.load(Relaxed),
    );
    e.single_u64(
        "powersync_mdbx_tables_gone",
        Kind::Gauge,
        "Tables the sync rules read that are no longer published under their name on the \
         primary (renamed, dropped, or taken out of the publication); their rows left the \
         buckets until a table of that name is published again.",
        progress.tables_gone.load(Relaxed),
    );
    e.single_u64(
        "powersync_mdbx_source_transactions_applied_total",
        Kind::Counter,
        "Source transactions the stream applied and published.",
        progress.transactions.load(Relaxed),
    );
    e.single_u64(
        "powersync_mdbx_transaction_commits_total",
        Kind::Counter,
        "Store commits that applied source transactions; small transactions arriving shortly \
         after the last commit share the next one (transactions per commit: the ratio of \
         powersync_mdbx_source_transactions_applied_total to this).",
        progress.transaction_commits.load(Relaxed),
    );
    e.single_u64(
        "powersync_mdbx_rows_applied_total",
        Kind::Counter,
        "Source row changes (insert, update, delete, truncated rows) the stream applied.",
        progress.changes.load(Relaxed),
    );
    e.single_u64(
        "powersync_mdbx_changes_received_total",
        Kind::Counter,
        "Source row changes received over the replication connection (a TRUNCATE counts \
         once; changes of transactions skipped as already applied included). Moves inside a \
         large transaction, where the applied LSN waits for its commit.",
        progress.received.load(Relaxed),
    );
    e.single_u64(
        "powersync_mdbx_uncommitted_changes",
        Kind::Gauge,
        "Row changes of the source transaction being applied that are written to the store \
         and not committed yet; 0 between transactions.",
        progress.uncommitted.load(Relaxed),
    );
    e.single_u64(
        "powersync_mdbx_ops_written_total",
        Kind::Counter,
        "Bucket ops the stream committed (PUT, REMOVE, MOVE and CLEAR; the op id advance).",
        progress.ops.load(Relaxed),
    );
    e.single_u64(
        "powersync_mdbx_write_checkpoints_expired_total",
        Kind::Counter,
        "Write-checkpoint requests removed as older than their age (24 h by default) after \
         a published checkpoint had passed them.",
        progress.write_checkpoints_expired.load(Relaxed),
    );
    e.histogram(
        "powersync_mdbx_checkpoint_publish_seconds",
        "Per source transaction: from the arrival of its Commit message on the replication \
         connection to the publish of the durable checkpoint that contains it (queue wait, \
         MDBX commit and fsync included).",
        &progress.publish_latency.snapshot(),
    );
}

fn storage(e: &mut TextEncoder, state: &HttpState) {
    let served = state.sync.current();
    let store = &served.store;
    e.single_u64(
        "powersync_mdbx_storage_file_bytes",
        Kind::Gauge,
        "Size of the MDBX data file.",
        store.file_bytes(),
    );
    e.single_u64(
        "powersync_mdbx_storage_used_bytes",
        Kind::Gauge,
        "Bytes of the MDBX data file up to its last allocated page.",
        store.used_bytes(),
    );
    e.single_u64(
        "powersync_mdbx_storage_syncs_total",
        Kind::Counter,
        "Durable writes of the store, each a flush to disk: source transactions (grouped), \
         this service's logical messages, write-checkpoint records, schema changes.",
        store.syncs(),
    );
    e.single_u64(
        "powersync_mdbx_history_forks",
        Kind::Gauge,
        "Forks of the store's history: writes of this replica alone (a re-copy, a table \
         gone, a rebuild, a deploy) after which peers' clients download their buckets again \
         when they move here.",
        store.history_forks(),
    );
    let reads = store.reads();
    e.single(
        "powersync_mdbx_read_txn_oldest_age_seconds",
        Kind::Gauge,
        "Age of the oldest MDBX read transaction open now (0 when none is); a long one keeps \
         MDBX from reusing freed pages.",
        reads.oldest_age().as_secs_f64(),
    );
    e.single_u64(
        "powersync_mdbx_read_txns_total",
        Kind::Counter,
        "MDBX read transactions started.",
        reads.total(),
    );
}

fn http(e: &mut TextEncoder, state: &HttpState) {
    let sync = &state.sync;
    e.single_u64(
        "powersync_mdbx_sync_streams_open",
        Kind::Gauge,
        "/sync/stream connections open now.",
        sync.open_streams() as u64,
    );
    e.single_u64(
        "powersync_mdbx_sync_ops_sent_total",
        Kind::Counter,
        "Bucket ops sent to clients in data lines, over every stream.",
        sync.ops_sent.load(std::sync::atomic::Ordering::Relaxed),
    );
    e.family(
        "powersync_mdbx_sync_responses_total",
        Kind::Counter,
        "/sync/stream answers by HTTP status (200 counts when a stream starts).",
    );
    for (status, count) in sync.sync_responses.nonzero() {
        e.sample_u64(
            "powersync_mdbx_sync_responses_total",
            &[("status", &status.to_string())],
            count,
        );
    }
    e.family(
        "powersync_mdbx_auth_failures_total",
        Kind::Counter,
        "Refused client tokens on /sync/stream and /write-checkpoint2.json, by error code.",
    );
    for (code, count) in sync.auth_failures.all() {
        e.sample_u64(
            "powersync_mdbx_auth_failures_total",
            &[("code", code)],
            count,
        );
    }
    e.family(
        "powersync_sync_connections_total",
        Kind::Counter,
        "Sync connections by how they ended: client_closed, service_closed (token expiry, \
         out of rotation), shutdown, error, or refused (an error answer instead of a stream).",
    );
    for (outcome, count) in sync.connection_outcomes.all() {
        e.sample_u64(
            "powersync_sync_connections_total",
            &[("outcome", outcome)],
            count,
        );
    }
}

/// The official service's metric names (`@powersync/service-types`, `metrics.ts`), so its
/// dashboards find them; each has a `powersync_mdbx_` twin above.
fn official(e: &mut TextEncoder, state: &HttpState) {
    let sync = &state.sync;
    let served = sync.current();
    let progress = &served.stream_progress;
    for (name, kind, help, value) in [
        (
            "powersync_concurrent_connections",
            Kind::Gauge,
            "Sync connections open now (as powersync_mdbx_sync_streams_open).",
            sync.open_streams() as u64,
        ),
        (
            "powersync_operations_synced_total",
            Kind::Counter,
            "Bucket ops sent to clients (as powersync_mdbx_sync_ops_sent_total).",
            sync.ops_sent.load(Relaxed),
        ),
        (
            "powersync_data_synced_bytes_total",
            Kind::Counter,
            "Bytes of sync lines sent to clients, before compression.",
            sync.bytes_synced.load(Relaxed),
        ),
        (
            "powersync_data_sent_bytes_total",
            Kind::Counter,
            "Bytes sent to clients, after compression where the client asked for it.",
            sync.bytes_sent.load(Relaxed),
        ),
        (
            "powersync_rows_replicated_total",
            Kind::Counter,
            "Source row changes applied (as powersync_mdbx_rows_applied_total).",
            progress.changes.load(Relaxed),
        ),
        (
            "powersync_transactions_replicated_total",
            Kind::Counter,
            "Source transactions applied (as powersync_mdbx_source_transactions_applied_total).",
            progress.transactions.load(Relaxed),
        ),
    ] {
        e.single_u64(name, kind, help, value);
    }
    e.single(
        "powersync_replication_lag_seconds",
        Kind::Gauge,
        "As powersync_mdbx_replication_lag_seconds.",
        progress.pending.lag_seconds(status::unix_now_ms()),
    );
    // Unreadable sizes are left out rather than shown as zero (the store's own errors
    // reach the stream and status()).
    let Ok(sizes) = served.store.table_sizes() else {
        return;
    };
    let bytes_of = |tables: &[&str]| -> u64 {
        sizes
            .iter()
            .filter(|(name, _, _)| tables.contains(name))
            .map(|(_, _, bytes)| bytes)
            .sum()
    };
    for (name, help, tables) in [
        (
            "powersync_replication_storage_size_bytes",
            "Bytes of the store's pages holding the replicated rows (rows, row_keys, tombstones).",
            &["rows", "row_keys", "tombstones"][..],
        ),
        (
            "powersync_operation_storage_size_bytes",
            "Bytes of the store's pages holding bucket ops and bucket state (ops, buckets, \
             bucket_names, compaction_debt).",
            &["ops", "buckets", "bucket_names", "compaction_debt"][..],
        ),
        (
            "powersync_parameter_storage_size_bytes",
            "Bytes of the store's pages holding parameter lookups (lookups).",
            &["lookups"][..],
        ),
    ] {
        e.single_u64(name, Kind::Gauge, help, bytes_of(tables));
    }
}

/// The worker process's own figures, read from `/proc` by the `procfs` crate, under the
/// names Prometheus client libraries use.
fn process(e: &mut TextEncoder) {
    let Ok(me) = procfs::process::Process::myself() else {
        return;
    };
    if let Ok(stat) = me.stat() {
        let ticks = procfs::ticks_per_second() as f64;
        e.single(
            "process_cpu_seconds_total",
            Kind::Counter,
            "User and system CPU time of the worker's process (the PostgreSQL background \
             worker), in seconds.",
            (stat.utime + stat.stime) as f64 / ticks,
        );
        e.single_u64(
            "process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory of the worker's process (shared pages it touched included).",
            stat.rss * procfs::page_size(),
        );
        e.single_u64(
            "process_virtual_memory_bytes",
            Kind::Gauge,
            "Virtual memory of the worker's process.",
            stat.vsize,
        );
        e.single_u64(
            "process_threads",
            Kind::Gauge,
            "Threads of the worker's process.",
            u64::try_from(stat.num_threads).unwrap_or(0),
        );
        if let Ok(boot) = procfs::boot_time_secs() {
            e.single(
                "process_start_time_seconds",
                Kind::Gauge,
                "Start of the worker's process, in seconds since the Unix epoch.",
                boot as f64 + stat.starttime as f64 / ticks,
            );
        }
    }
    if let Ok(open) = me.fd_count() {
        e.single_u64(
            "process_open_fds",
            Kind::Gauge,
            "Open file descriptors of the worker's process.",
            open as u64,
        );
    }
    if let Ok(limits) = me.limits() {
        if let procfs::process::LimitValue::Value(max) = limits.max_open_files.soft_limit {
            e.single_u64(
                "process_max_fds",
                Kind::Gauge,
                "The worker process's limit of open file descriptors.",
                max,
            );
        }
    }
}
