//! The replication slot: inspecting it, dropping one we own, and creating it with an
//! exported snapshot (through `pg_walstream`'s replication connection).

use std::time::Duration;

use pg_walstream::{
    LogicalReplicationStream, ReplicationSlotOptions, ReplicationStreamConfig, RetryConfig,
};
use tokio_postgres::Client;

use super::client::replication_uri;
use super::validate::PUBLICATION;
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
}

/// Looks up slot `name`.
pub async fn slot_info(client: &Client, name: &str) -> Result<Option<SlotInfo>, SourceError> {
    let row = client
        .query_opt(
            "SELECT database::text, plugin::text, active, wal_status::text, \
                    (confirmed_flush_lsn - '0/0'::pg_lsn)::text \
             FROM pg_replication_slots WHERE slot_name = $1",
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
    }))
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
pub async fn create_slot(
    conn: &SourceConnection,
    client: &Client,
    name: &str,
) -> Result<ExportedSlot, SourceError> {
    let config = ReplicationStreamConfig::builder(name, PUBLICATION)
        .with_protocol_version(1)
        .with_connection_timeout(Duration::from_secs(10))
        .with_retry_config(RetryConfig {
            max_attempts: 1,
            ..RetryConfig::default()
        })
        .with_slot_options(ReplicationSlotOptions {
            snapshot: Some("export".into()),
            ..ReplicationSlotOptions::default()
        });
    let mut stream = LogicalReplicationStream::new(&replication_uri(conn)?, config)
        .await
        .map_err(replication_error)?;
    stream
        .ensure_replication_slot()
        .await
        .map_err(replication_error)?;
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
