//! Setting a stream up: the stored snapshot's record, the slot checked (a lost one rebuilt
//! from a new slot, a stale walsender of this worker ended), each step bounded in time.

use std::time::Duration;

use crate::context::StreamContext;
use crate::error::{stream_error, ReplicationError};
use crate::intent::{BootstrapIntent, BootstrapState};
use crate::liveness::Liveness;
use crate::plan::SourcePlan;
use crate::resync::rebuild;
use source::{
    connect, format_lsn, primary_identity, slot_info, slot_walsender, terminate_backend,
    wal_sender_timeout,
};

/// The complete snapshot's record the stream follows the slot of (rebuilt from a new slot
/// when a rebuild was interrupted or the slot is lost), where the stream starts, and the
/// liveness bound it streams with.
pub(super) async fn slot_to_follow(
    plan: &SourcePlan,
    context: &StreamContext,
) -> Result<(BootstrapIntent, u64, Duration), ReplicationError> {
    let mut intent = context
        .store
        .read(|view| Ok(BootstrapIntent::load(view)))??
        .filter(|i| i.state == BootstrapState::Complete)
        .ok_or_else(|| stream_error("streaming needs a complete snapshot".into()))?;
    if intent.rebuilding {
        intent = rebuild(
            plan,
            context,
            &intent,
            "a rebuild from a new slot was interrupted",
        )
        .await?;
    }
    let durable = context.store.read(|view| view.checkpoint())?;
    let start = durable.lsn.max(intent.consistent_point.unwrap_or(0));
    let liveness = &context.liveness;
    let checked = within_setup(liveness, check_slot(plan, &intent, start, liveness)).await?;
    let (dead_after, start) = match checked {
        SlotCheck::Healthy(dead_after) => (dead_after, start),
        SlotCheck::Lost(why) => {
            intent = rebuild(plan, context, &intent, &why).await?;
            let start = intent.consistent_point.unwrap_or(0);
            match within_setup(liveness, check_slot(plan, &intent, start, liveness)).await? {
                SlotCheck::Healthy(dead_after) => (dead_after, start),
                SlotCheck::Lost(why) => return Err(stream_error(why)),
            }
        }
    };
    Ok((intent, start, dead_after))
}

/// `step` of a stream's setup (its checks, its start), bounded by
/// [`Liveness::setup_within`]: past it, a transient error, so the stream is set up again.
pub(super) async fn within_setup<T>(
    liveness: &Liveness,
    step: impl std::future::Future<Output = Result<T, ReplicationError>>,
) -> Result<T, ReplicationError> {
    tokio::time::timeout(liveness.setup_within, step)
        .await
        .unwrap_or_else(|_| {
            Err(stream_error(format!(
                "setting up the stream took longer than {:?} (the network to the primary may \
                 have stopped forwarding); reconnecting",
                liveness.setup_within
            )))
        })
}

/// What [`check_slot`] found.
enum SlotCheck {
    /// Stream with this liveness bound.
    Healthy(Duration),
    /// The slot is gone or invalidated (`PSM_R2005`, `PSM_R2006`, the text says which and
    /// why): the store is rebuilt from a new one.
    Lost(String),
}

/// Checks, before streaming: the primary is the cluster the store was built from; the
/// slot exists, is valid and confirmed nothing beyond what the store holds (`start`: else
/// changes the buckets need are lost); a walsender still holding the slot is this
/// worker's own stale one (silent beyond the liveness bound) and is ended.
async fn check_slot(
    plan: &SourcePlan,
    intent: &BootstrapIntent,
    start: u64,
    liveness: &Liveness,
) -> Result<SlotCheck, ReplicationError> {
    let client = connect(&plan.connection).await?;
    let identity = primary_identity(&client).await?;
    if identity.system_identifier != intent.system_identifier {
        return Err(ReplicationError::Stream {
            code: "PSM_R2008",
            message: format!(
                "the primary this worker reached is another PostgreSQL cluster (system \
                 identifier {}, the storage was built from {}): a clone, a restored backup or \
                 a connection that now leads elsewhere. Nothing was read from it; point the \
                 connection back at the original primary, or run SELECT \
                 powersync_mdbx.reset() to replicate from this one",
                identity.system_identifier, intent.system_identifier
            ),
            operator: true,
        });
    }
    let dead_after = liveness.dead_after(wal_sender_timeout(&client).await?);
    let slot = slot_info(&client, &plan.slot).await?;
    let lost = |code: &'static str, what: &str| {
        Ok(SlotCheck::Lost(format!(
            "{code} replication slot \"{}\" {what}, so changes since the last checkpoint are \
             lost (raise max_slot_wal_keep_size on the primary if WAL retention invalidated it)",
            plan.slot
        )))
    };
    let failed_over = intent
        .timeline
        .filter(|&then| then != identity.timeline)
        .map(|then| {
            let failover = if plan.connection.slot_failover {
                "; slot_failover is on, so the promoted standby had not synchronized the slot \
                 yet: before a promotion, check that pg_replication_slots.synced is true for it \
                 on the standby"
            } else {
                "; with slot_failover (PostgreSQL 17+) a standby that synchronizes slots keeps it"
            };
            format!(
                "is gone from the primary, which now runs on timeline {} (the snapshot was \
                 taken on timeline {then}: a failover or point-in-time recovery promoted a \
                 server that did not carry the slot over{failover})",
                identity.timeline
            )
        });
    match slot {
        None => lost(
            "PSM_R2005",
            failed_over.as_deref().unwrap_or("is gone from the primary"),
        ),
        Some(s) if s.wal_status.as_deref() == Some("lost") => {
            lost("PSM_R2006", "was invalidated (wal_status lost)")
        }
        // This worker reports a position flushed only after it is durable in the store, so
        // a slot ahead of the store means the store is not the one that read the slot: a
        // restored backup, or a copy of another replica's store on the same slot.
        Some(s) if s.confirmed_flush_lsn.is_some_and(|c| c > start) => {
            Err(ReplicationError::Stream {
                code: "PSM_R2007",
                message: format!(
                    "replication slot \"{}\" confirmed changes up to {}, but this storage holds \
                     them only up to {} (a store restored from a backup, or a copy of another \
                     sync replica's store using the same slot); the changes in between are gone \
                     from the slot, so run SELECT powersync_mdbx.reset() to take a new snapshot",
                    plan.slot,
                    format_lsn(s.confirmed_flush_lsn.unwrap_or_default()),
                    format_lsn(start)
                ),
                operator: true,
            })
        }
        Some(s) => {
            if s.active {
                end_stale_walsender(&client, plan, dead_after).await?;
            }
            if plan.connection.slot_failover && s.failover == Some(false) {
                make_failover(plan, &client).await;
            }
            Ok(SlotCheck::Healthy(dead_after))
        }
    }
}

/// `slot_failover` set after the slot was created without failover: the slot is made a
/// failover slot before streaming from it. When that cannot be (an older primary, no
/// `synchronized_standby_slots`, the slot still held by a walsender that is ending), the
/// stream goes on without and the next setup tries again: what replicates today is not
/// stopped for a protection it never had.
async fn make_failover(plan: &SourcePlan, client: &tokio_postgres::Client) {
    match source::make_failover_slot(&plan.connection, client, &plan.slot).await {
        Ok(()) => tracing::info!(
            slot = %plan.slot,
            "the replication slot is now a failover slot (slot_failover)"
        ),
        Err(e) => tracing::warn!(
            slot = %plan.slot,
            "{e}; the slot stays without failover until a later reconnect makes it one"
        ),
    }
}

/// The slot is held by a walsender. It is this worker's own stale one when it runs as
/// this worker's role and has heard nothing from its client for `dead_after` (the
/// connection died without the primary noticing yet): it is ended so that streaming
/// resumes now rather than after the primary's `wal_sender_timeout`. Anything else is
/// another live client, and the slot is left alone (retried).
async fn end_stale_walsender(
    client: &tokio_postgres::Client,
    plan: &SourcePlan,
    dead_after: Duration,
) -> Result<(), ReplicationError> {
    let holder = slot_walsender(client, &plan.slot).await?;
    let busy = |detail: String| {
        Err(stream_error(format!(
            "replication slot \"{}\" is in use by another connection{detail} (an earlier one \
             of this worker may still be closing); retrying",
            plan.slot
        )))
    };
    let Some(holder) = holder else {
        return Ok(()); // released meanwhile
    };
    let silent = holder.silent_for.unwrap_or_default();
    if !holder.same_role || silent < dead_after {
        return busy(format!(
            " (walsender pid {}, last heard from its client {:.0} s ago)",
            holder.pid,
            silent.as_secs_f64()
        ));
    }
    tracing::warn!(
        pid = holder.pid,
        silent_s = silent.as_secs(),
        slot = %plan.slot,
        "ending this worker's stale walsender: it has heard nothing from its client for \
         longer than the liveness bound"
    );
    if !terminate_backend(client, holder.pid).await? {
        return busy(format!(" (walsender pid {} did not end)", holder.pid));
    }
    Ok(())
}
