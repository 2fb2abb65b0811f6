//! What the primary knows about a replication connection: which cluster and timeline it
//! is, which walsender holds a slot and when that walsender last heard from its client,
//! and ending a walsender whose client is gone.

use std::time::Duration;

use tokio_postgres::Client;

use super::SourceError;

/// Which cluster the primary is, and which timeline it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryIdentity {
    /// `pg_control_system().system_identifier`: the same for a cluster and its physical
    /// standbys, different for anything created by another `initdb`.
    pub system_identifier: String,
    /// The timeline it writes WAL on (a promotion starts a new one; a standby reports
    /// its latest checkpoint's).
    pub timeline: u32,
}

/// Reads the primary's identity.
pub async fn primary_identity(client: &Client) -> Result<PrimaryIdentity, SourceError> {
    let row = client
        .query_one(
            "SELECT s.system_identifier::text, \
                    CASE WHEN pg_is_in_recovery() THEN c.timeline_id \
                    ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int \
                    END \
             FROM pg_control_system() s, pg_control_checkpoint() c",
            &[],
        )
        .await
        .map_err(SourceError::query("system identifier and timeline"))?;
    let timeline: i32 = row
        .try_get(1)
        .map_err(SourceError::query("system identifier and timeline"))?;
    Ok(PrimaryIdentity {
        system_identifier: row
            .try_get(0)
            .map_err(SourceError::query("system identifier and timeline"))?,
        timeline: u32::try_from(timeline).unwrap_or_default(),
    })
}

/// The walsender streaming a slot, as the primary sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotWalsender {
    /// Its backend pid.
    pub pid: i32,
    /// It runs as the role this connection uses (so this role may end it).
    pub same_role: bool,
    /// How long ago its client last replied (or, before any reply, connected), by the
    /// primary's clock; `None` when the primary does not show it to this role.
    pub silent_for: Option<Duration>,
}

/// The walsender holding slot `name`, if one does.
pub async fn slot_walsender(
    client: &Client,
    name: &str,
) -> Result<Option<SlotWalsender>, SourceError> {
    let row = client
        .query_opt(
            "SELECT s.active_pid, r.usename = current_user, \
                    extract(epoch FROM now() - coalesce(r.reply_time, r.backend_start))::float8 \
             FROM pg_replication_slots s \
             LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid \
             WHERE s.slot_name = $1 AND s.active_pid IS NOT NULL",
            &[&name],
        )
        .await
        .map_err(SourceError::query("the walsender of the replication slot"))?;
    let Some(r) = row else { return Ok(None) };
    Ok(Some(SlotWalsender {
        pid: r
            .try_get(0)
            .map_err(SourceError::query("the walsender of the replication slot"))?,
        same_role: r.try_get::<_, Option<bool>>(1).ok().flatten() == Some(true),
        silent_for: r
            .try_get::<_, Option<f64>>(2)
            .ok()
            .flatten()
            .map(|s| Duration::from_secs_f64(s.max(0.0))),
    }))
}

/// The primary's `wal_sender_timeout` (`Duration::ZERO`: it never ends a silent client,
/// and never asks an idle one to reply).
pub async fn wal_sender_timeout(client: &Client) -> Result<Duration, SourceError> {
    let row = client
        .query_one(
            "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await
        .map_err(SourceError::query("wal_sender_timeout"))?;
    let millis: i64 = row
        .try_get(0)
        .map_err(SourceError::query("wal_sender_timeout"))?;
    Ok(Duration::from_millis(u64::try_from(millis).unwrap_or(0)))
}

/// Ends backend `pid` and waits (up to 10 s) until it is gone. Returns false if the
/// primary refused (another role's backend) or it did not end in time.
pub async fn terminate_backend(client: &Client, pid: i32) -> Result<bool, SourceError> {
    let signalled: bool = client
        .query_one("SELECT pg_terminate_backend($1, 10000)", &[&pid])
        .await
        .map_err(SourceError::query("terminate a stale walsender"))?
        .try_get(0)
        .map_err(SourceError::query("terminate a stale walsender"))?;
    Ok(signalled)
}
