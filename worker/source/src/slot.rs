//! The replication slot: inspecting it, dropping one we own, and creating it with an
//! exported snapshot (through `pg_walstream`'s replication connection).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_walstream::{
    LogicalReplicationStream, ReplicationSlotOptions, ReplicationStreamConfig, RetryConfig,
};
use tokio_postgres::Client;

use super::client::replication_uri;
use super::validate::{version_name, PUBLICATION};
use super::SourceError;
use config::SourceConnection;

/// A slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    /// Database the slot decodes.
    pub database: Option<String>,
    /// Output plugin.
    pub plugin: Option<String>,
    /// A walsender is streaming from it right now.
    pub active: bool,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// Where a restart resumes.
    pub confirmed_flush_lsn: Option<u64>,
    /// The slot is synchronized to standbys that synchronize slots (PostgreSQL 17+;
    /// `None` on older primaries).
    pub failover: Option<bool>,
}

/// Looks up slot `name`.
pub async fn slot_info(client: &Client, name: &str) -> Result<Option<SlotInfo>, SourceError> {
    let row = client
        .query_opt(
            "SELECT database::text, plugin::text, active, wal_status::text, \
                    (confirmed_flush_lsn - '0/0'::pg_lsn)::text, \
                    (to_jsonb(s) ->> 'failover')::bool \
             FROM pg_replication_slots s WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(SourceError::query("replication slot"))?;
    Ok(row.map(|r| SlotInfo {
        database: r.try_get(0).ok(),
        plugin: r.try_get(1).ok(),
        active: r.try_get(2).unwrap_or(true),
        wal_status: r.try_get(3).ok(),
        confirmed_flush_lsn: r
            .try_get::<_, Option<String>>(4)
            .ok()
            .flatten()
            .and_then(|s| s.parse().ok()),
        failover: r.try_get::<_, Option<bool>>(5).ok().flatten(),
    }))
}

/// How long making an existing slot a failover slot may take (a replication connection
/// and one command).
const ALTER_WITHIN: Duration = Duration::from_secs(30);

/// Makes slot `name`, created without failover, a failover slot
/// (`ALTER_REPLICATION_SLOT … (FAILOVER true)`), for `slot_failover` set after the slot was
/// created: refused as creating one is (`PSM_R1016`, `PSM_R1017`). The slot must not be in
/// use.
pub async fn make_failover_slot(
    conn: &SourceConnection,
    client: &Client,
    name: &str,
) -> Result<(), SourceError> {
    require_failover_slots(client).await?;
    let uri = replication_uri(conn)?;
    let slot = name.to_owned();
    let alter = tokio::task::spawn_blocking(move || {
        let mut replication = pg_walstream::connection::PgReplicationConnection::connect(&uri)?;
        replication.alter_replication_slot(&slot, None, Some(true))?;
        Ok::<_, pg_walstream::ReplicationError>(())
    });
    match tokio::time::timeout(ALTER_WITHIN, alter).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(replication_error(e)),
        Ok(Err(e)) => Err(SourceError::Connection(format!(
            "making slot \"{name}\" a failover slot: {e}"
        ))),
        Err(_) => Err(SourceError::stalled(
            format!("making slot \"{name}\" a failover slot"),
            ALTER_WITHIN,
        )),
    }
}

/// Drops slot `name` (which must be inactive).
pub async fn drop_slot(client: &Client, name: &str) -> Result<(), SourceError> {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&name])
        .await
        .map_err(SourceError::query("drop replication slot"))?;
    Ok(())
}

/// A slot this worker just created, with its exported snapshot. Keep it alive (and idle)
/// until every snapshot COPY has finished: the next command on the replication
/// connection destroys the snapshot.
pub struct ExportedSlot {
    /// The replication connection that holds the snapshot open.
    pub stream: LogicalReplicationStream,
    /// Snapshot name for `SET TRANSACTION SNAPSHOT`.
    pub snapshot: String,
    /// The LSN the snapshot is consistent with; streaming starts here.
    pub consistent_point: u64,
}

/// Creates logical slot `name` (pgoutput) with `EXPORT_SNAPSHOT`.
///
/// The primary finishes creating a slot only once every transaction running when it
/// began has ended, which a long transaction makes take as long as it does; the
/// replication connection's commands block their thread meanwhile. So the creation runs
/// on a blocking thread, and a caller that stops waiting (the future is dropped: the
/// engine stops, the deploy is abandoned) has the primary cancel it (see
/// [`CancelOnDrop`]) instead of leaving a thread and a walsender waiting on it.
pub async fn create_slot(
    conn: &SourceConnection,
    client: &Client,
    name: &str,
) -> Result<ExportedSlot, SourceError> {
    create_exporting_slot(conn, client, name, SlotKind::Lasting).await
}

/// [`create_slot`] for a rebuild after the slot was lost, typically to a promotion that
/// came before the standby synchronized it: the new primary often has no standby of its
/// own yet, so with `slot_failover` an empty `synchronized_standby_slots` is warned about
/// (`PSM_R1017`'s text in the log) instead of refused, and the rebuild goes on.
pub async fn create_slot_after_loss(
    conn: &SourceConnection,
    client: &Client,
    name: &str,
) -> Result<ExportedSlot, SourceError> {
    create_exporting_slot(conn, client, name, SlotKind::Rebuilt).await
}

/// [`create_slot`] for a temporary slot: the primary drops it when the returned
/// connection closes (a table's re-copy reads its exported snapshot and never streams
/// from it).
pub async fn create_temporary_slot(
    conn: &SourceConnection,
    client: &Client,
    name: &str,
) -> Result<ExportedSlot, SourceError> {
    create_exporting_slot(conn, client, name, SlotKind::Temporary).await
}

/// Which slot is made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SlotKind {
    /// A store's slot, made at its bootstrap.
    Lasting,
    /// A store's slot made again after it was lost ([`create_slot_after_loss`]).
    Rebuilt,
    /// A re-copy's, dropped with its connection.
    Temporary,
}

async fn create_exporting_slot(
    conn: &SourceConnection,
    client: &Client,
    name: &str,
    kind: SlotKind,
) -> Result<ExportedSlot, SourceError> {
    let temporary = kind == SlotKind::Temporary;
    // A temporary slot (a re-copy's) never outlives its connection, so never fails over.
    let failover = conn.slot_failover && !temporary;
    if failover {
        match require_failover_slots(client).await {
            Err(SourceError::Setup {
                code: "PSM_R1017",
                message,
            }) if kind == SlotKind::Rebuilt => tracing::warn!(
                "PSM_R1017 {message}; the slot is made again with failover all the same, so \
                 that replication goes on after the promotion: set synchronized_standby_slots \
                 on this primary once it has a standby that synchronizes slots"
            ),
            other => other?,
        }
    }
    let config = ReplicationStreamConfig::builder(name, PUBLICATION)
        .with_protocol_version(1)
        .with_connection_timeout(Duration::from_secs(10))
        .with_retry_config(RetryConfig {
            max_attempts: 1,
            ..RetryConfig::default()
        })
        .with_slot_options(ReplicationSlotOptions {
            snapshot: Some("export".into()),
            temporary,
            failover,
            ..ReplicationSlotOptions::default()
        });
    let uri = replication_uri(conn)?;
    let guard = CancelOnDrop::new(conn.clone(), name.to_owned());
    let finished = guard.finished.clone();
    let runtime = tokio::runtime::Handle::current();
    let created = tokio::task::spawn_blocking(move || {
        let created = runtime.block_on(async {
            let mut stream = LogicalReplicationStream::new(&uri, config).await?;
            stream.ensure_replication_slot().await?;
            Ok(stream)
        });
        finished.store(true, Ordering::Release);
        created
    })
    .await
    .map_err(|e| SourceError::Connection(format!("creating slot \"{name}\": {e}")))?;
    guard.disarm();
    let stream = created.map_err(replication_error)?;
    let Some(snapshot) = stream.exported_snapshot_name().map(str::to_owned) else {
        return Err(SourceError::setup(
            "PSM_R1013",
            format!("replication slot \"{name}\" appeared while this worker was creating it; another process uses the name. Set powersync_mdbx.slot_name to a name of its own"),
        ));
    };
    let info = slot_info(client, name).await?.ok_or_else(|| {
        SourceError::Connection(format!(
            "slot \"{name}\" vanished right after it was created"
        ))
    })?;
    let consistent_point = info.confirmed_flush_lsn.ok_or_else(|| {
        SourceError::Connection(format!("slot \"{name}\" has no confirmed_flush_lsn"))
    })?;
    Ok(ExportedSlot {
        stream,
        snapshot,
        consistent_point,
    })
}

/// How long an abandoned slot creation is cancelled again and again (it may not have
/// reached the primary yet when first cancelled) before it is left to end by itself.
const CANCEL_PATIENCE: Duration = Duration::from_secs(30);

/// Armed while a slot creation runs: dropped armed (its caller stopped waiting), it
/// cancels the creation's command on the primary (`pg_cancel_backend` of the walsender
/// holding the slot) until the creating thread has ended. It works from a thread and a
/// runtime of its own, so that it also completes while the engine's runtime shuts down
/// (which waits for the creating thread).
struct CancelOnDrop {
    conn: SourceConnection,
    slot: String,
    /// Set by the creating thread when the creation has ended either way.
    finished: Arc<AtomicBool>,
    armed: bool,
}

impl CancelOnDrop {
    fn new(conn: SourceConnection, slot: String) -> Self {
        Self {
            conn,
            slot,
            finished: Arc::new(AtomicBool::new(false)),
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed || self.finished.load(Ordering::Acquire) {
            return;
        }
        let (conn, slot, finished) = (
            self.conn.clone(),
            std::mem::take(&mut self.slot),
            self.finished.clone(),
        );
        tracing::info!(slot = %slot, "cancelling the abandoned creation of the slot");
        let cancelling = std::thread::Builder::new()
            .name("psm-slot-cancel".into())
            .spawn(move || cancel_creation(&conn, &slot, &finished));
        if let Err(e) = cancelling {
            tracing::warn!(error = %e, "the abandoned slot creation cannot be cancelled; it ends with the transactions it waits for");
        }
    }
}

/// Cancels the walsender creating `slot` until `finished` (bounded by
/// [`CANCEL_PATIENCE`]).
fn cancel_creation(conn: &SourceConnection, slot: &str, finished: &AtomicBool) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let deadline = std::time::Instant::now() + CANCEL_PATIENCE;
    runtime.block_on(async {
        let mut client = None;
        while !finished.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            if client.is_none() {
                client = super::client::connect(conn).await.ok();
            }
            if let Some(c) = &client {
                let cancelled = c
                    .execute(
                        "SELECT pg_cancel_backend(active_pid) FROM pg_replication_slots \
                         WHERE slot_name = $1 AND active_pid IS NOT NULL",
                        &[&slot],
                    )
                    .await;
                if cancelled.is_err() {
                    client = None;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// Refuses `slot_failover` on a primary older than PostgreSQL 17, which has no failover
/// slots (`PSM_R1016`), or one whose `synchronized_standby_slots` names no standby
/// (`PSM_R1017`).
async fn require_failover_slots(client: &Client) -> Result<(), SourceError> {
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(SourceError::query("the server version"))?;
    if version < 170_000 {
        return Err(SourceError::setup(
            "PSM_R1016",
            format!(
                "replication.connections[0].slot_failover is true, but the primary runs \
                 PostgreSQL {}, which has no failover slots (they came with 17): remove \
                 slot_failover, or upgrade the primary",
                version_name(version)
            ),
        ));
    }
    let standbys: String = client
        .query_one("SELECT current_setting('synchronized_standby_slots')", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(SourceError::query("synchronized_standby_slots"))?;
    if standbys.trim().is_empty() {
        return Err(SourceError::setup(
            "PSM_R1017",
            "replication.connections[0].slot_failover is true, but the primary's \
             synchronized_standby_slots is empty: the primary could then send this replica \
             changes its standby has not received, which a promotion loses while the replica \
             keeps them. Set synchronized_standby_slots to the physical slot of each standby \
             that synchronizes slots (ALTER SYSTEM SET synchronized_standby_slots = \
             '<slot>'; SELECT pg_reload_conf()), or remove slot_failover",
        ));
    }
    Ok(())
}

/// Opens a replication connection and starts streaming slot `name` from `start_lsn`
/// (pgoutput protocol 1, logical messages on, so write checkpoints advance an idle
/// source). Feedback reports only what the caller marks flushed.
pub async fn start_stream(
    conn: &SourceConnection,
    name: &str,
    start_lsn: u64,
) -> Result<LogicalReplicationStream, SourceError> {
    let config = ReplicationStreamConfig::builder(name, PUBLICATION)
        .with_protocol_version(1)
        .with_messages(true)
        .with_feedback_interval(Duration::from_secs(1))
        .with_connection_timeout(Duration::from_secs(10))
        .with_retry_config(RetryConfig {
            max_attempts: 1,
            ..RetryConfig::default()
        });
    let mut stream = LogicalReplicationStream::new(&replication_uri(conn)?, config)
        .await
        .map_err(replication_error)?;
    stream
        .start(Some(start_lsn))
        .await
        .map_err(replication_error)?;
    Ok(stream)
}

/// Classifies a replication-connection error: TLS problems and setup errors need the
/// operator, the rest may pass.
pub fn replication_error(e: pg_walstream::ReplicationError) -> SourceError {
    let text = e.to_string();
    if text.contains("certificate") || text.contains("TLS") || text.contains("tls") {
        SourceError::Tls(text)
    } else if e.is_transient() {
        SourceError::Connection(text)
    } else {
        SourceError::setup(
            "PSM_R1014",
            format!("the replication connection failed: {text}"),
        )
    }
}

/// Formats an LSN as PostgreSQL does (`16/B374D848`).
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// Parses an LSN as PostgreSQL writes it (`16/B374D848`); `None` for anything else.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    let high = u32::from_str_radix(high, 16).ok()?;
    let low = u32::from_str_radix(low, 16).ok()?;
    Some((u64::from(high) << 32) | u64::from(low))
}

#[cfg(test)]
mod tests {
    #[test]
    fn lsns_read_back_as_written() {
        for lsn in [0, 0x16_B374_D848, u64::MAX] {
            assert_eq!(super::parse_lsn(&super::format_lsn(lsn)), Some(lsn));
        }
        for bad in ["", "16", "16/", "G/1", "1/2/3"] {
            assert_eq!(super::parse_lsn(bad), None, "{bad}");
        }
    }
}
