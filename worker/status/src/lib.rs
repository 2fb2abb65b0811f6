//! The engine's status: one shared value that the HTTP probes read and the extension
//! publishes to shared memory for `powersync_mdbx.status()`.
#![warn(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use serde::Serialize;
use tokio::sync::watch;

use store::StoreIdentity;

/// Where the worker is in its life (`docs/architecture.md`, "Engine life cycle").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The worker started and is reading its configuration.
    Starting,
    /// The configuration cannot be used; waiting for the operator to fix it and reload.
    ConfigError,
    /// Opening (or creating) the MDBX store.
    OpeningStorage,
    /// Connecting to the primary and validating it, and checking the slot and the stored
    /// bootstrap (retried with backoff on errors
    /// that may pass; `last_error` shows the latest).
    Validating,
    /// Filling an empty store with a copy of a peer's store (`powersync_mdbx.seed_from`)
    /// instead of a snapshot; errors that may pass are retried (`last_error`).
    Seeding,
    /// Copying the initial snapshot.
    Snapshotting,
    /// The snapshot is complete and durable: clients may sync.
    Ready,
    /// Ready, and following the slot: source changes reach the buckets.
    Streaming,
    /// The engine stopped on an error the operator must fix; waiting for a reload or reset.
    Failed,
    /// A reset is clearing the store.
    Resetting,
    /// Shutting down.
    Stopping,
    /// Stopped.
    Stopped,
}

impl Phase {
    /// Every phase, in life-cycle order.
    pub const ALL: [Phase; 12] = [
        Self::Starting,
        Self::ConfigError,
        Self::OpeningStorage,
        Self::Validating,
        Self::Seeding,
        Self::Snapshotting,
        Self::Ready,
        Self::Streaming,
        Self::Failed,
        Self::Resetting,
        Self::Stopping,
        Self::Stopped,
    ];

    /// The name `status()` shows (snake case).
    pub fn name(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::ConfigError => "config_error",
            Self::OpeningStorage => "opening_storage",
            Self::Validating => "validating",
            Self::Seeding => "seeding",
            Self::Snapshotting => "snapshotting",
            Self::Ready => "ready",
            Self::Streaming => "streaming",
            Self::Failed => "failed",
            Self::Resetting => "resetting",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
        }
    }
}

/// The most recent error, as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorReport {
    /// Stable code, e.g. `PSM_C1003`.
    pub code: String,
    /// The whole message, with the fix.
    pub message: String,
    /// Unix seconds.
    pub at: u64,
    /// True when only the operator can fix it; false when the worker retries by itself.
    pub needs_operator: bool,
}

impl ErrorReport {
    /// Builds a report from an error whose message starts with its code.
    pub fn new(message: String, needs_operator: bool) -> Self {
        let code = message
            .split_whitespace()
            .next()
            .filter(|word| word.starts_with("PSM_"))
            .unwrap_or("PSM_X0000")
            .to_owned();
        Self {
            code,
            message,
            at: unix_now(),
            needs_operator,
        }
    }
}

/// Everything `status()` shows. Fields are optional until the stage that fills them runs.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// Life-cycle phase.
    pub phase: Phase,
    /// True while the engine serves a complete store (the readiness probe answers 200):
    /// from the engine's start when the store it opens is complete, whatever its ingest
    /// does after.
    pub ready: bool,
    /// The last checkpoint served, and since when (what a client gets now).
    pub served: Option<ServedCheckpoint>,
    /// Whether the served store's ingest (its replication) runs, and if not why.
    pub ingest: IngestStatus,
    /// False while the operator has taken the replica out of rotation
    /// (`powersync_mdbx.in_rotation = off`): the readiness probe fails, new sync
    /// connections are refused and open streams end, whatever is served.
    pub in_rotation: bool,
    /// Process id of the background worker (or test process).
    pub worker_pid: u32,
    /// The configuration file in use.
    pub config_file: Option<String>,
    /// The storage directory.
    pub storage_dir: Option<String>,
    /// Addresses the HTTP server listens on (`host:port`).
    pub listen: Vec<String>,
    /// The admin socket the SQL support functions use, while served.
    pub admin_socket: Option<String>,
    /// The store's identity and size, once open.
    pub store: Option<StoreStatus>,
    /// Replication progress, once the engine talks to the primary.
    pub replication: Option<ReplicationStatus>,
    /// The generation number of the store served (its `g<N>` directory after a deploy in a
    /// new generation; bucket names carry a tag of the store's history instead).
    pub generation: Option<u64>,
    /// SHA-256 (hex) of the sync rules served.
    pub rules_hash: Option<String>,
    /// A rules deploy building the next generation beside the served one.
    pub deploy: Option<DeployStatus>,
    /// The last deploy that switched over.
    pub last_deploy: Option<DeployDone>,
    /// Top-level configuration keys present but not used by this engine.
    pub config_ignored: Vec<String>,
    /// Settings that work but weaken the service (short HMAC secrets).
    pub config_warnings: Vec<String>,
    /// The last error, kept until the next successful start.
    pub last_error: Option<ErrorReport>,
    /// How often the engine has been started in this worker process.
    pub engine_starts: u64,
    /// Unix seconds of the current engine start.
    pub started_at: Option<u64>,
}

/// The checkpoint served.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ServedCheckpoint {
    /// The source position it includes.
    pub lsn: String,
    /// Its op id.
    pub op_id: u64,
    /// Unix seconds since this engine first served it.
    pub since: u64,
    /// Seconds it has been served, when the status was last refreshed (each second).
    pub age_seconds: u64,
}

/// The served store's ingest (`docs/operations.md`, "Serving and ingest").
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct IngestStatus {
    /// The served generation's replication runs (validating, copying or streaming).
    pub running: bool,
    /// Why it stopped, while it does not run.
    pub stopped_because: Option<String>,
    /// It waits for the operator (fix the cause, then `reload()`).
    pub waiting_for_operator: bool,
    /// Failures in a row that a new attempt may fix.
    pub failures: u32,
    /// Unix seconds of its next attempt, when one is planned.
    pub next_attempt_at: Option<u64>,
    /// Times it started again in this engine after stopping on an error.
    pub restarts: u32,
}

/// The store as shown in status.
#[derive(Debug, Clone, Serialize)]
pub struct StoreStatus {
    /// Format and id.
    #[serde(flatten)]
    pub identity: StoreIdentity,
    /// Size of the data file.
    pub file_bytes: u64,
    /// Bytes of the data file in use.
    pub used_bytes: u64,
    /// Forks of its history (writes of this replica alone, `docs/storage.md`).
    pub history_forks: u64,
    /// Its write transactions change the mapped file in place (the stream on ext4 or
    /// XFS); false while they write pages with file writes (the snapshot, other file
    /// systems).
    pub writes_through_map: bool,
}

/// Where a rules deploy is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeployPhase {
    /// Checking the primary and creating the new generation's slot.
    Validating,
    /// Copying the snapshot for the new rules.
    Snapshotting,
    /// Snapshot complete; following the new slot until it reaches the primary's position.
    CatchingUp,
    /// Replacing the served generation.
    Switching,
    /// The build stopped on an error; the served generation is unaffected.
    Failed,
}

/// A rules deploy in progress, as shown in status.
#[derive(Debug, Clone, Serialize)]
pub struct DeployStatus {
    /// The generation being built.
    pub generation: u64,
    /// Where it is.
    pub phase: DeployPhase,
    /// SHA-256 (hex) of the rules being deployed.
    pub rules_hash: String,
    /// The new generation's storage directory.
    pub dir: String,
    /// Its replication slot.
    pub slot: String,
    /// Unix seconds when the build started.
    pub started_at: u64,
    /// Tables the new rules read, and those copied.
    pub tables_total: u64,
    /// Tables fully copied.
    pub tables_done: u64,
    /// Rows copied so far.
    pub rows: u64,
    /// Disk the new generation holds now (its data file), bytes.
    pub file_bytes: u64,
    /// The source LSN of its latest checkpoint, once streaming (`X/Y`).
    pub applied_lsn: Option<String>,
    /// Deployed inside the served store (its generation, directory and slot), copying
    /// again only the tables the new rules read differently (`tables_total` of them),
    /// instead of a new generation with a snapshot of its own.
    pub in_place: bool,
    /// Why it stopped, or the latest error it retries.
    pub last_error: Option<ErrorReport>,
}

/// The last deploy that switched over.
#[derive(Debug, Clone, Serialize)]
pub struct DeployDone {
    /// The generation it built (now served).
    pub generation: u64,
    /// Seconds from the start of the build to the switch.
    pub seconds: f64,
    /// Rows its snapshot copied.
    pub rows: u64,
    /// Unix seconds of the switch.
    pub switched_at: u64,
}

/// A table being copied again beside the stream.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RecopyStatus {
    /// The table (`schema.name`).
    pub table: String,
    /// Why it is copied again.
    pub reason: String,
    /// Unix seconds of its start.
    pub started_at: u64,
    /// Copied rows merged so far.
    pub rows_merged: u64,
    /// Of those, rows written because their output changed.
    pub rows_written: u64,
    /// How much the store's file grew since it started, bytes.
    pub extra_file_bytes: u64,
}

/// A rebuild from a new slot (its slot was lost or invalidated).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RebuildStatus {
    /// What happened to the old slot.
    pub reason: String,
    /// Unix seconds of its start.
    pub started_at: u64,
    /// Tables the rules read.
    pub tables_total: u64,
    /// Tables copied and merged.
    pub tables_done: u64,
    /// Copied rows merged so far.
    pub rows_merged: u64,
    /// The planner's estimate of the rows to copy (0: unknown).
    pub rows_estimated: u64,
    /// `rows_merged` against `rows_estimated` (at most 99.9 until done); `None` without
    /// an estimate.
    pub percent: Option<f64>,
    /// Seconds still needed at the rate so far; `None` without an estimate.
    pub eta_seconds: Option<f64>,
    /// Of those, rows written because their output changed.
    pub rows_written: u64,
    /// How much the store's file grew since it started, bytes.
    pub extra_file_bytes: u64,
}

/// A rebuild from a new slot that completed.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RebuildDone {
    /// What happened to the old slot (its code first).
    pub reason: String,
    /// Unix seconds of its end.
    pub finished_at: u64,
    /// How long it took, seconds.
    pub seconds: f64,
    /// Rows copied from the new slot's snapshot.
    pub rows: u64,
}

/// Replication as shown in status.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplicationStatus {
    /// The slot this replica owns.
    pub slot: String,
    /// The slot's consistent point (`X/Y`), once created.
    pub consistent_point: Option<String>,
    /// Tables the rules read.
    pub tables_total: u64,
    /// Tables fully copied.
    pub tables_done: u64,
    /// Rows written to the store.
    pub rows: u64,
    /// The planner's estimate of the rows the snapshot copies (`pg_class.reltuples` when
    /// it began; 0 when unknown, e.g. tables never analyzed).
    pub rows_estimated: u64,
    /// `rows` against `rows_estimated` while snapshotting, at most 99.9 until the copy
    /// completes (the estimate is the planner's); `None` without an estimate.
    pub percent: Option<f64>,
    /// Seconds the snapshot still needs at its rate so far, while snapshotting with an
    /// estimate; `None` otherwise.
    pub eta_seconds: Option<f64>,
    /// Rows per second over the snapshot so far.
    pub rows_per_second: f64,
    /// Seconds since the snapshot started (or its total, once complete).
    pub snapshot_seconds: f64,
    /// The source LSN of the latest durable checkpoint (`X/Y`).
    pub applied_lsn: Option<String>,
    /// The op id of the latest durable checkpoint.
    pub last_op_id: u64,
    /// Source transactions applied since streaming (re)started.
    pub transactions: u64,
    /// Row changes applied since streaming (re)started.
    pub changes: u64,
    /// Row changes received from the primary since streaming (re)started (those of
    /// transactions skipped as already applied included); moves inside a large source
    /// transaction, where `applied_lsn` waits for its commit.
    pub changes_received: u64,
    /// Row changes of the source transaction being applied, written to the store and not
    /// committed yet; 0 between transactions.
    pub uncommitted_changes: u64,
    /// WAL the primary retains for the slot, bytes (checked every 10 s).
    pub retained_wal_bytes: u64,
    /// Tables being copied again beside the stream (columns the rules read changed).
    pub recopying: u64,
    /// Each table being copied again: why, since when, its progress and extra disk.
    pub recopies: Vec<RecopyStatus>,
    /// The rebuild from a new slot in progress (with `rebuilding`).
    pub rebuild: Option<RebuildStatus>,
    /// The last rebuild from a new slot that completed since the stream started: why the
    /// old slot was lost, when it ended, how long it took, the rows it copied.
    pub last_rebuild: Option<RebuildDone>,
    /// Tables the sync rules read that are gone from the primary under their name
    /// (renamed, dropped, or out of the publication): their rows left the buckets.
    pub tables_gone: u64,
    /// Tables the sync rules read that are missing from the primary under their name and
    /// still served: gone unless published again within 30 s.
    pub tables_missing: u64,
    /// The slot was lost and the store is being rebuilt from a new one; what it serves
    /// is stale until the rebuild ends.
    pub rebuilding: bool,
    /// The primary's WAL position at the last slot check (`X/Y`).
    pub primary_lsn: Option<String>,
    /// WAL bytes between the primary's position at the last check and the applied LSN
    /// (0 when caught up; includes WAL with nothing for this replica while it is idle).
    pub lag_bytes: u64,
    /// Unix seconds when replication last heard from the primary: a message of the
    /// stream, rows of a copy, or the primary's word that its walsender hears this worker.
    pub source_heard_at: Option<u64>,
    /// Replication has heard nothing from the primary for longer than its bound (120 s;
    /// `docs/operations.md`, "A network that stops forwarding"): the network to it may
    /// have stopped forwarding, or it is down. What is served does not advance (the
    /// readiness probe's body says so).
    pub source_stalled: bool,
}

impl Status {
    /// True when the served store's source is stalled (`replication.source_stalled`).
    pub fn source_stalled(&self) -> bool {
        self.replication.as_ref().is_some_and(|r| r.source_stalled)
    }
}

/// A [`Status`] shared between threads, with a version number so publishers copy it only
/// when it changed, and a heartbeat the liveness probe reads.
pub struct StatusCell {
    status: RwLock<Status>,
    version: AtomicU64,
    touched_at_ms: AtomicU64,
    /// [`Status::in_rotation`], for the streams that end when it turns false.
    rotation: watch::Sender<bool>,
}

impl StatusCell {
    /// A fresh status for the worker process `pid`.
    pub fn new(pid: u32) -> Self {
        let status = Status {
            phase: Phase::Starting,
            ready: false,
            served: None,
            ingest: IngestStatus::default(),
            in_rotation: true,
            worker_pid: pid,
            config_file: None,
            storage_dir: None,
            listen: Vec::new(),
            admin_socket: None,
            store: None,
            replication: None,
            generation: None,
            rules_hash: None,
            deploy: None,
            last_deploy: None,
            config_ignored: Vec::new(),
            config_warnings: Vec::new(),
            last_error: None,
            engine_starts: 0,
            started_at: None,
        };
        Self {
            status: RwLock::new(status),
            version: AtomicU64::new(1),
            touched_at_ms: AtomicU64::new(0),
            rotation: watch::Sender::new(true),
        }
    }

    /// Puts the replica in rotation or takes it out (`powersync_mdbx.in_rotation`).
    pub fn set_in_rotation(&self, in_rotation: bool) {
        if self.rotation.send_replace(in_rotation) != in_rotation {
            self.update(|s| s.in_rotation = in_rotation);
        }
    }

    /// Follows [`Status::in_rotation`]: a stream waits on it to end when it turns false.
    pub fn rotation(&self) -> watch::Receiver<bool> {
        self.rotation.subscribe()
    }

    /// Changes the status and bumps its version.
    pub fn update(&self, change: impl FnOnce(&mut Status)) {
        change(&mut self.status.write());
        self.version.fetch_add(1, Ordering::Release);
    }

    /// A copy of the current status.
    pub fn snapshot(&self) -> Status {
        self.status.read().clone()
    }

    /// Increases on every change.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Records that the engine's loop is alive (for the liveness probe).
    pub fn touch(&self) {
        self.touched_at_ms.store(unix_now_ms(), Ordering::Relaxed);
    }

    /// Unix milliseconds of the last [`touch`](Self::touch), 0 if never.
    pub fn touched_at_ms(&self) -> u64 {
        self.touched_at_ms.load(Ordering::Relaxed)
    }

    /// Enters `phase` with an error the status keeps showing.
    pub fn fail(&self, phase: Phase, error: ErrorReport) {
        self.update(|s| {
            s.phase = phase;
            s.ready = false;
            s.last_error = Some(error);
        });
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    unix_now_ms() / 1000
}

/// Milliseconds since the Unix epoch.
pub fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds, like JavaScript's
/// `Date.toISOString()`.
pub fn iso_time(ms: u64) -> String {
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

/// `status` as JSON of at most `max` bytes (what the shared memory the SQL functions read
/// it from holds). A status over it — long error messages, many tables copied again — keeps
/// its shape: its long texts and lists are cut, shorter each round, and it says
/// `"truncated": true`; only if even that does not fit, its phase, readiness and error
/// code alone.
pub fn status_json_within(status: &Status, max: usize) -> String {
    let Ok(value) = serde_json::to_value(status) else {
        return serde_json::json!({"phase": status.phase.name(), "truncated": true}).to_string();
    };
    let whole = value.to_string();
    if whole.len() <= max {
        return whole;
    }
    for (chars, items) in [(1024, 32), (256, 8), (64, 2), (16, 0)] {
        let mut cut = value.clone();
        shorten(&mut cut, chars, items);
        cut["truncated"] = true.into();
        let text = cut.to_string();
        if text.len() <= max {
            return text;
        }
    }
    serde_json::json!({
        "phase": value["phase"],
        "ready": value["ready"],
        "last_error": {"code": value["last_error"]["code"]},
        "truncated": true,
    })
    .to_string()
}

/// Cuts every string of `value` to `chars` characters (marked with `…`) and every list to
/// `items` entries.
fn shorten(value: &mut serde_json::Value, chars: usize, items: usize) {
    use serde_json::Value;
    match value {
        Value::String(text) => {
            if let Some((at, _)) = text.char_indices().nth(chars) {
                text.truncate(at);
                text.push('…');
            }
        }
        Value::Array(list) => {
            list.truncate(items);
            list.iter_mut().for_each(|v| shorten(v, chars, items));
        }
        Value::Object(fields) => fields.values_mut().for_each(|v| shorten(v, chars, items)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_timestamps() {
        assert_eq!(iso_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_time(1_796_000_123_456), "2026-11-30T00:55:23.456Z");
        assert_eq!(iso_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn a_status_too_large_for_its_space_keeps_its_shape_and_says_it_was_cut() {
        let cell = StatusCell::new(7);
        cell.fail(
            Phase::Failed,
            ErrorReport::new(
                format!("PSM_C1010 {}", "a long rules error ".repeat(2000)),
                true,
            ),
        );
        cell.update(|s| {
            s.config_warnings = (0..500).map(|i| format!("warning {i}")).collect();
        });
        let status = cell.snapshot();
        assert!(serde_json::to_string(&status).unwrap().len() > 16 * 1024);
        let text = status_json_within(&status, 16 * 1024);
        assert!(text.len() <= 16 * 1024, "{}", text.len());
        let shown: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(shown["phase"], "failed");
        assert_eq!(shown["ready"], false);
        assert_eq!(shown["truncated"], true);
        assert_eq!(shown["last_error"]["code"], "PSM_C1010");
        assert_eq!(shown["last_error"]["needs_operator"], true);
        assert!(shown["last_error"]["message"]
            .as_str()
            .unwrap()
            .ends_with('…'));
        assert_eq!(shown["worker_pid"], 7);
        // Small enough: as it is, without the mark.
        let small = StatusCell::new(7).snapshot();
        let text = status_json_within(&small, 16 * 1024);
        assert_eq!(text, serde_json::to_string(&small).unwrap());
        // Room for nothing but the core.
        let tiny: serde_json::Value =
            serde_json::from_str(&status_json_within(&status, 120)).unwrap();
        assert_eq!(tiny["last_error"]["code"], "PSM_C1010");
        assert_eq!(tiny["truncated"], true);
    }

    #[test]
    fn phase_names_match_the_json() {
        for phase in Phase::ALL {
            assert_eq!(
                serde_json::to_value(phase).ok(),
                Some(serde_json::Value::from(phase.name()))
            );
        }
    }
}
