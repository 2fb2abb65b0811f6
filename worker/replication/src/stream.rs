//! Following the slot after the snapshot: check the slot's health, `START_REPLICATION`
//! from the durable LSN, turn pgoutput events into [`Change`]s for the applier thread,
//! follow tables whose columns change (copying one again when the rules see the change,
//! see `recopy`), leave a table gone from the primary under its name (its rows leave the
//! buckets; it is copied when published under its name again), and refuse a table whose
//! replica identity became `NOTHING`.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pg_walstream::CancellationToken;
use tokio::sync::watch;

use super::apply::{
    stream_error, Applier, Change, StreamProgress, StreamTable, WriteCheckpointNote,
};
use super::catalog::{watch_catalog, CatalogState};
use super::intent::{BootstrapIntent, BootstrapState};
use super::liveness::{watch_liveness, Heard, Liveness};
use super::recopy::{Applied, Handover, Recopies, RecopyEvent};
use super::resync::rebuild;
use super::{ReplicationError, SourcePlan};
use metrics::PendingCommits;
use read::{Event, Reader};
use rules::SyncRules;
use source::{
    connect, format_lsn, primary_identity, replication_error, slot_info, slot_walsender,
    start_stream, terminate_backend, wal_sender_timeout, ColumnMeta, Message, Pgoutput, Relation,
    Tuple,
};
use store::{Checkpoint, Store};

/// Messages of one transaction decoded in a row, as long as they are read without waiting.
const DRAIN: usize = 1024;

/// Everything a stream run needs besides the plan.
#[derive(Clone)]
pub struct StreamContext {
    /// The compiled rules.
    pub rules: Arc<SyncRules>,
    /// The store.
    pub store: Arc<Store>,
    /// Where durable checkpoints are published.
    pub published: watch::Sender<Checkpoint>,
    /// Counters for `status()`.
    pub progress: Arc<StreamProgress>,
    /// When a silent stream is checked and given up.
    pub liveness: Liveness,
    /// Write-checkpoint requests older than this are removed once reached
    /// ([`crate::WRITE_CHECKPOINT_MAX_AGE`] by default).
    pub write_checkpoint_max_age: std::time::Duration,
    /// How long the rows of a covered table missing under its name stay served
    /// ([`GONE_AFTER`] by default).
    pub gone_after: Duration,
    /// How long after a store commit the next one waits for more source transactions
    /// ([`GROUP_WINDOW`](crate::GROUP_WINDOW) by default).
    pub group_window: Duration,
}

/// How long the rows of a covered table missing from the primary under its name (renamed,
/// dropped, out of the publication) stay served before they leave the buckets.
pub const GONE_AFTER: Duration = Duration::from_secs(30);

/// How long a stopping stream waits for the primary to end replication.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Streams changes until `stop` turns true (then `Ok`) or an error.
pub async fn follow_slot(
    plan: &SourcePlan,
    context: &StreamContext,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ReplicationError> {
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
    let durable = context.store.read(|view| view.checkpoint())?;
    let tables = intent
        .tables
        .iter()
        .map(|t| StreamTable::from_intent(t, &context.rules))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ReplicationError::Stream {
            code: "PSM_R2004",
            message: "the stored snapshot predates change streaming (no column record); run \
                      SELECT powersync_mdbx.reset() to take a new one"
                .into(),
            operator: true,
        })?;
    context
        .progress
        .tables_gone
        .store(tables.iter().filter(|t| t.gone).count() as u64, Relaxed);
    let stream = within_setup(liveness, async {
        Ok(start_stream(&plan.connection, &plan.slot, start).await?)
    })
    .await?;
    tracing::info!(slot = %plan.slot, from = %format_lsn(start), "streaming changes");

    context.progress.pending.clear();
    context.progress.uncommitted.store(0, Relaxed);
    let mut decoder = Decoder::new(&context.progress.pending, tables.clone(), &context.rules);
    decoder.gone_after = context.gone_after;
    let handover = Arc::new(Handover::default());
    let mut recopies = Recopies::new(
        plan,
        &intent.system_identifier,
        context.rules.clone(),
        handover.clone(),
        Applied {
            store: context.store.clone(),
            checkpoints: context.published.subscribe(),
        },
    );
    // Tables whose re-copy a restart interrupted copy again from the start, as do those a
    // rules deploy marked.
    let deploying = context
        .store
        .read(|view| Ok(super::deploy::deploy_in_progress(view)))??
        .is_some();
    let mut merges = HashMap::new();
    for (index, table) in intent.tables.iter().enumerate() {
        if table.recopy {
            recopies.start(index, &tables[index], &table.rekey_from);
            merges.insert(
                index,
                super::merge::Merge::rekeying(
                    table.rekey_from.clone(),
                    if deploying {
                        super::deploy::RECOPY_REASON.into()
                    } else {
                        "a restart interrupted its re-copy".into()
                    },
                    context.store.file_bytes(),
                ),
            );
        }
    }
    let (mut input, changes) = super::handoff::channel();
    let applier = Applier {
        store: context.store.clone(),
        rules: context.rules.clone(),
        tables,
        durable,
        published: context.published.clone(),
        feedback: stream.shared_lsn_feedback.clone(),
        progress: context.progress.clone(),
        sweep: super::expiry::Sweep::new(context.write_checkpoint_max_age),
        merges,
        handover: handover.clone(),
        published_at: None,
        group_window: context.group_window,
    };
    let applying = std::thread::Builder::new()
        .name("psm-stream-apply".into())
        .spawn(move || applier.run(changes))
        .map_err(|e| stream_error(format!("cannot start the apply thread: {e}")))?;

    let watcher = tokio::spawn(slot_watch::watch_slot(
        plan.clone(),
        context.progress.clone(),
        slot_watch::EVERY,
    ));
    let cancel = CancellationToken::new();
    let heard = Arc::new(Heard::new());
    let dead = Arc::new(parking_lot::Mutex::new(None));
    let monitor = tokio::spawn(watch_liveness(
        plan.clone(),
        context.liveness,
        dead_after,
        heard.clone(),
        dead.clone(),
        cancel.clone(),
    ));
    let stopper = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let _ = stop.wait_for(|s| *s).await;
            cancel.cancel();
        })
    };
    let (catalog_out, mut catalog) = watch::channel(None);
    let catalog_watcher = tokio::spawn(watch_catalog(
        plan.clone(),
        intent.system_identifier.clone(),
        decoder.tables.iter().map(StreamTable::source).collect(),
        catalog_out,
    ));
    // The catalog's last reading, until the stream has passed its position.
    let mut catalog_seen: Option<Arc<CatalogState>> = None;
    // Rows are evaluated and packed here, beside the applier that writes them.
    let mut preparer = super::prepare::Preparer::new(context.store.clone());
    let mut reader = Reader::new(stream, cancel.clone());
    // An event read without waiting, not handled yet.
    let mut lookahead: Option<Event> = None;
    let received = 'stream: loop {
        // What the catalog showed applies between transactions, once every transaction
        // committed before it was decoded.
        if let Some(state) =
            catalog_seen.take_if(|s| !decoder.in_transaction && decoder.passed >= s.lsn)
        {
            for (index, table) in state.tables.iter().enumerate() {
                let change = match decoder.check_catalog(index, table.as_ref(), state.lsn) {
                    Ok(Some(change)) => change,
                    Ok(None) => continue,
                    Err(e) => break 'stream Err(e),
                };
                follow_recopies(&mut recopies, &decoder, &change);
                if input.push(change).await.is_err() {
                    break 'stream Ok(()); // the applier stopped; its error is reported below
                }
            }
        }
        // A table missing under its name for long enough is gone (between transactions).
        context
            .progress
            .tables_missing
            .store(decoder.missing_since.len() as u64, Relaxed);
        if !decoder.in_transaction && !decoder.missing_since.is_empty() {
            for change in decoder.due_gone(Instant::now()) {
                follow_recopies(&mut recopies, &decoder, &change);
                if input.push(change).await.is_err() {
                    break 'stream Ok(()); // the applier stopped; its error is reported below
                }
            }
        }
        // A re-copy's events reach the applier between transactions, its rows only once
        // every transaction committed before its snapshot did.
        if !decoder.in_transaction {
            let mut forwarded = false;
            while let Some(event) = recopies.ready(decoder.passed) {
                forwarded = true;
                if let RecopyEvent::Started { table, columns, .. } = &event {
                    decoder.learn_attnums(
                        *table,
                        columns
                            .iter()
                            .map(|c| (c.name.as_str(), c.type_oid, c.attnum)),
                    );
                }
                if input.push(Change::Recopy(event)).await.is_err() {
                    break;
                }
            }
            if forwarded {
                heard.now();
            }
        }
        // The applier ending (a failed commit, a full disk) must end the stream at once,
        // not at the next change the primary happens to send: an idle source would leave a
        // dead applier unnoticed, and nothing applied, indefinitely.
        let gone_at = decoder.next_gone_at();
        // Changes go to the applier in batches; what is collected goes before any wait
        // between transactions. Inside one, the applier cannot commit before its Commit
        // anyway: a batch goes when full, so a transaction arriving no faster than the
        // applier takes it costs a wake-up of each side per batch, not per few rows.
        if lookahead.is_none() {
            lookahead = reader.ready().await;
        }
        if lookahead.is_none() && !decoder.in_transaction && input.flush().await.is_err() {
            break Ok(()); // the applier stopped; its error is reported below
        }
        let next = tokio::select! {
            biased;
            () = cancel.cancelled() => break cancelled(&dead),
            () = sleep_until(gone_at), if gone_at.is_some() => continue,
            () = input.closed() => break Ok(()), // its error is reported below
            () = std::future::ready(()), if lookahead.is_some() => match lookahead.take() {
                Some(next) => next,
                None => continue,
            },
            next = reader.next() => next,
            () = handover.freed() => continue,
            Ok(()) = catalog.changed() => {
                catalog_seen = catalog.borrow_and_update().clone();
                continue;
            }
            recopied = recopies.next_event() => match recopied {
                Ok(()) => continue,
                Err(e) => break Err(e),
            },
        };
        let mut next = next;
        heard.now();
        // The messages of a transaction already read go on without the checks and waits
        // above (they apply between transactions): a bulk change costs no `select!` per
        // row, and still meets one every `DRAIN` messages.
        for drained in 1.. {
            let event = match next {
                Ok(event) => event,
                Err(pg_walstream::ReplicationError::Cancelled(_)) => {
                    break 'stream cancelled(&dead)
                }
                Err(e) => break 'stream Err(ReplicationError::from(replication_error(e))),
            };
            match decoder.decode(event.data) {
                Ok(Some(mut change)) => {
                    preparer.prepare(&decoder.tables, &mut change);
                    if change.is_row_change() {
                        context.progress.received.fetch_add(1, Relaxed);
                    }
                    follow_recopies(&mut recopies, &decoder, &change);
                    if input.push(change).await.is_err() {
                        break 'stream Ok(()); // the applier stopped; its error is reported below
                    }
                }
                Ok(None) => {}
                Err(e) => break 'stream Err(e),
            }
            if !decoder.in_transaction || drained == DRAIN {
                break;
            }
            next = match reader.ready().await {
                Some(event) => event,
                None => break,
            };
        }
        // Waiting for a busy applier is not silence of the primary.
        heard.now();
    };
    stopper.abort();
    watcher.abort();
    catalog_watcher.abort();
    monitor.abort();
    recopies.abort();
    cancel.cancel();
    drop(input);
    // The read in progress ends at once after `cancel`, its throttled feedback first: a
    // write the socket holds (a peer that stopped reading) must not hold the stop.
    if let Ok(mut stream) = tokio::time::timeout(STOP_WAIT, reader.into_stream()).await {
        // Ending the replication politely waits for the server; never for long.
        let _ = tokio::time::timeout(STOP_WAIT, stream.stop()).await;
    }
    let applied = tokio::task::spawn_blocking(move || applying.join())
        .await
        .map_err(|e| stream_error(format!("apply thread: {e}")))?
        .unwrap_or_else(|_| Err(stream_error("the apply thread panicked (a bug)".into())));
    // An open store transaction ended with the applier: nothing of it is pending now.
    context.progress.uncommitted.store(0, Relaxed);
    // A stream error is the cause when both failed (the applier then saw its input end
    // inside a transaction); otherwise the applier's own error.
    received.and(applied)
}

/// `step` of a stream's setup (its checks, its start), bounded by
/// [`Liveness::setup_within`]: past it, a transient error, so the stream is set up again.
async fn within_setup<T>(
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

/// Resolves at `at` (never without it).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Starts the re-copy a Relation change asks for; stops the one of a table gone.
fn follow_recopies(recopies: &mut Recopies, decoder: &Decoder<'_>, change: &Change) {
    match change {
        Change::Relation {
            table,
            recopy: true,
            rekey_from,
            ..
        } => recopies.start(*table, &decoder.tables[*table], rekey_from),
        Change::Gone { table } => recopies.stop(*table),
        _ => {}
    }
}

/// Why the reader was cancelled: a stop (`Ok`), or the liveness check found the
/// connection dead (a transient error, so it is made again).
fn cancelled(dead: &parking_lot::Mutex<Option<String>>) -> Result<(), ReplicationError> {
    match dead.lock().take() {
        Some(reason) => Err(stream_error(format!("{reason}; reconnecting"))),
        None => Ok(()),
    }
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
            format!(
                "is gone from the primary, which now runs on timeline {} (the snapshot was \
                 taken on timeline {then}: a failover or point-in-time recovery promoted a \
                 server that did not carry the slot over)",
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
        Some(s) if s.active => {
            end_stale_walsender(&client, plan, dead_after).await?;
            Ok(SlotCheck::Healthy(dead_after))
        }
        Some(_) => Ok(SlotCheck::Healthy(dead_after)),
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

/// pgoutput messages → changes for the tables the rules read.
pub(super) struct Decoder<'a> {
    /// The session's messages as read, with the relations they described.
    pgoutput: Pgoutput,
    /// Per table: for each of its columns, where the value sits in the tuples of its
    /// relation's last Relation message (`None` until needed after a change of either).
    layouts: Vec<Option<Vec<Option<usize>>>>,
    /// Where each transaction's Begin is noted for the lag in seconds.
    pending: &'a PendingCommits,
    /// The tables as their rows come now (the snapshot's columns, then each Relation
    /// message's the rules do not see); the applier keeps its own copy in step.
    tables: Vec<StreamTable>,
    rules: &'a SyncRules,
    by_oid: HashMap<u32, usize>,
    by_name: HashMap<String, usize>,
    in_transaction: bool,
    /// Every source transaction committing below this LSN has been decoded.
    passed: u64,
    /// The commit LSN of the transaction being decoded.
    commit_lsn: u64,
    /// Per table, the commit LSN of the transaction whose Relation message described it
    /// last (0: none yet).
    described_at: Vec<u64>,
    /// The tables missing under their name (not gone yet), by index: since when.
    missing_since: std::collections::BTreeMap<usize, Instant>,
    /// How long a missing table's rows stay served.
    pub(super) gone_after: Duration,
}

impl<'a> Decoder<'a> {
    /// A decoder for `tables`, outside any transaction.
    pub(super) fn new(
        pending: &'a PendingCommits,
        tables: Vec<StreamTable>,
        rules: &'a SyncRules,
    ) -> Self {
        Self {
            pgoutput: Pgoutput::default(),
            layouts: vec![None; tables.len()],
            pending,
            by_oid: tables
                .iter()
                .enumerate()
                .filter(|(_, t)| !t.gone)
                .map(|(i, t)| (t.oid, i))
                .collect(),
            by_name: tables
                .iter()
                .enumerate()
                .map(|(i, t)| (t.qualified(), i))
                .collect(),
            described_at: vec![0; tables.len()],
            missing_since: std::collections::BTreeMap::new(),
            gone_after: GONE_AFTER,
            tables,
            rules,
            in_transaction: false,
            passed: 0,
            commit_lsn: 0,
        }
    }

    /// Decodes one message (the payload of an XLogData frame).
    pub(super) fn decode(&mut self, payload: Bytes) -> Result<Option<Change>, ReplicationError> {
        let message = self
            .read(payload)
            .map_err(|e| stream_error(e.to_string()))?;
        self.decode_message(message)
    }

    /// Reads one message (it may describe a relation).
    pub(super) fn read(&mut self, payload: Bytes) -> Result<Message, source::PgoutputError> {
        self.pgoutput.read(payload)
    }

    /// The change a message read makes, if any.
    pub(super) fn decode_message(
        &mut self,
        message: Message,
    ) -> Result<Option<Change>, ReplicationError> {
        Ok(match message {
            Message::Begin {
                final_lsn,
                commit_micros,
            } => {
                self.in_transaction = true;
                self.commit_lsn = final_lsn;
                self.passed = self.passed.max(final_lsn);
                self.pending.received(final_lsn, commit_micros);
                Some(Change::Begin {
                    commit_lsn: final_lsn,
                })
            }
            Message::Commit { end_lsn } => {
                self.in_transaction = false;
                self.passed = self.passed.max(end_lsn);
                Some(Change::Commit {
                    end_lsn,
                    received: std::time::Instant::now(),
                })
            }
            Message::Relation(relation) => self.check_relation(&relation)?,
            Message::Insert { relation, new } => {
                self.row_of(relation, [&new])?
                    .map(|(table, [new])| Change::Insert {
                        table,
                        new,
                        prepared: None,
                    })
            }
            Message::Update {
                relation,
                old: Some(old),
                new,
            } => self
                .row_of(relation, [&old, &new])?
                .map(|(table, [old, new])| Change::Update {
                    table,
                    old: Some(Box::new(old)),
                    new,
                    prepared: None,
                }),
            Message::Update {
                relation,
                old: None,
                new,
            } => self
                .row_of(relation, [&new])?
                .map(|(table, [new])| Change::Update {
                    table,
                    old: None,
                    new,
                    prepared: None,
                }),
            Message::Delete { relation, old } => self
                .row_of(relation, [&old])?
                .map(|(table, [old])| Change::Delete { table, old }),
            Message::Truncate { relations } => {
                let tables: Vec<usize> = relations
                    .iter()
                    .filter_map(|name| self.by_name.get(name).copied())
                    .collect();
                (!tables.is_empty()).then_some(Change::Truncate { tables })
            }
            Message::Logical {
                transactional: false,
                lsn,
                prefix,
                content,
            } if !self.in_transaction => {
                self.passed = self.passed.max(lsn);
                let write_checkpoint = (prefix == "powersync")
                    .then(|| WriteCheckpointNote::parse(&content, lsn))
                    .flatten();
                Some(Change::Advance {
                    lsn,
                    write_checkpoint,
                })
            }
            Message::Unexpected(name) => {
                return Err(stream_error(format!(
                    "unexpected pgoutput message {name} (streaming and two-phase are off)"
                )))
            }
            Message::Logical { .. } | Message::Other => None,
        })
    }

    /// The covered table of relation `oid` and `tuples` with their values in that table's
    /// column order; `None` when the rules do not read the relation.
    fn row_of<const N: usize>(
        &mut self,
        oid: u32,
        tuples: [&Tuple; N],
    ) -> Result<Option<(usize, [Tuple; N])>, ReplicationError> {
        let Some(&index) = self.by_oid.get(&oid) else {
            return Ok(None);
        };
        let layout = match &self.layouts[index] {
            Some(layout) => layout,
            None => {
                let table = &self.tables[index];
                let relation = self.pgoutput.relation(oid).ok_or_else(|| {
                    stream_error(format!(
                        "a row of {} came before a Relation message described the table",
                        table.qualified()
                    ))
                })?;
                let layout = table
                    .columns
                    .iter()
                    .map(|c| relation.columns.iter().position(|r| r.name == c.name))
                    .collect();
                self.layouts[index].insert(layout)
            }
        };
        Ok(Some((index, tuples.map(|t| t.arranged(layout)))))
    }

    /// A Relation message for a table the rules read: it must be the table of that name.
    /// When it changed, returns the change to hand the applier: the columns (and replica
    /// identity) to decode its rows with from here on, and whether its rows are copied
    /// again (a column the rules read added, dropped, renamed or retyped; the table
    /// created again; its replica identity changed).
    fn check_relation(&mut self, relation: &Relation) -> Result<Option<Change>, ReplicationError> {
        let qualified = relation.qualified();
        let index = match (self.by_oid.get(&relation.oid), self.by_name.get(&qualified)) {
            (None, None) => return Ok(None),
            (Some(&i), _) | (None, Some(&i)) => i,
        };
        self.described_at[index] = self.commit_lsn;
        // Its tuples may list the columns otherwise now.
        self.layouts[index] = None;
        // pgoutput does not say where a column sits (0: unknown).
        let shape: Vec<Column<'_>> = relation
            .columns
            .iter()
            .map(|c| (c.name.as_str(), c.type_oid, 0))
            .collect();
        let identity = relation
            .columns
            .iter()
            .filter(|c| c.is_key)
            .map(|c| c.name.clone())
            .collect();
        self.check_shape(index, relation.oid, &qualified, &shape, identity)
    }

    /// The catalog's view of covered table `index` at LSN `lsn` (see `catalog`), applied
    /// like a Relation message once every transaction committed before `lsn` was decoded;
    /// not when a Relation message of a transaction committed after `lsn` described the
    /// table since (the stream knows a later shape: going back to the catalog's would
    /// decode the next rows with old columns).
    pub(super) fn check_catalog(
        &mut self,
        index: usize,
        table: Option<&super::catalog::CatalogTable>,
        lsn: u64,
    ) -> Result<Option<Change>, ReplicationError> {
        let Some(known) = self.tables.get(index) else {
            return Ok(None);
        };
        if self.described_at.get(index).is_some_and(|&at| at >= lsn) {
            return Ok(None);
        }
        let Some(table) = table else {
            self.missing(
                index,
                "it is no longer published under its name (renamed, dropped, or taken out of \
                 the publication)",
            );
            return Ok(None);
        };
        let qualified = known.qualified();
        let shape: Vec<Column<'_>> = table
            .columns
            .iter()
            .map(|c| (c.name.as_str(), c.type_oid, c.attnum))
            .collect();
        self.check_shape(index, table.oid, &qualified, &shape, table.identity.clone())
    }

    /// Compares table `index` with what the primary says it is now: OID `oid`, name
    /// `qualified`, columns (see [`Column`]) and replica `identity`.
    fn check_shape(
        &mut self,
        index: usize,
        oid: u32,
        qualified: &str,
        columns: &[Column<'_>],
        identity: Vec<String>,
    ) -> Result<Option<Change>, ReplicationError> {
        let known = &self.tables[index];
        if known.qualified() != qualified {
            self.missing(index, &format!("it was renamed to {qualified}"));
            return Ok(None);
        }
        let mut problems = Vec::new();
        // Dropped and created again under its name (and published again), or published
        // under its name again after it was gone: its rows are copied from the table now.
        let returned = known.gone || self.missing_since.contains_key(&index);
        let recreated = known.oid != oid || returned;
        let now: Vec<Column<'_>> = columns.to_vec();
        let shape = &known.columns;
        let then: Vec<Column<'_>> = shape
            .iter()
            .map(|c| (c.name.as_str(), c.type_oid, c.attnum))
            .collect();
        let plan = self.rules.plan_for(&known.schema, &known.name);
        let read = |column: &str| plan.is_some_and(|p| p.reads_column(column));
        // Added, dropped (a rename is both) or retyped columns the rules read.
        let seen: Vec<&str> = now
            .iter()
            .filter(|c| !then.iter().any(|t| same_column(c, t)))
            .chain(
                then.iter()
                    .filter(|c| !now.iter().any(|n| same_column(c, n))),
            )
            .map(|(name, _, _)| *name)
            .filter(|name| read(name))
            .collect();
        let mut keys_now: Vec<&str> = identity.iter().map(String::as_str).collect();
        let mut keys_then: Vec<&str> = known.identity_names.iter().map(String::as_str).collect();
        keys_now.sort_unstable();
        keys_then.sort_unstable();
        let rekeyed = keys_now != keys_then;
        if rekeyed && keys_now.is_empty() {
            problems.push(
                "its replica identity is NOTHING now (updates and deletes cannot be followed)"
                    .to_owned(),
            );
        }
        let recopy = !seen.is_empty() || recreated || rekeyed;
        if !problems.is_empty() {
            return Err(ReplicationError::Stream {
                code: "PSM_R2002",
                message: format!(
                    "table {} changed on the primary after the snapshot: {}. Nothing of it \
                     was applied and the stored rows stay as they were; give it a replica \
                     identity again (ALTER TABLE … REPLICA IDENTITY DEFAULT), then run \
                     SELECT powersync_mdbx.reset() to take a new snapshot",
                    known.qualified(),
                    problems.join("; ")
                ),
                operator: true,
            });
        }
        let unchanged =
            now.len() == then.len() && now.iter().zip(&then).all(|(n, t)| same_column(n, t));
        if unchanged && !recreated && !rekeyed {
            self.learn_attnums(index, columns.iter().map(|c| (c.0, c.1, c.2)));
            return Ok(None);
        }
        let rebound: Vec<ColumnMeta> = columns
            .iter()
            .map(|&(name, type_id, attnum)| {
                let known = shape
                    .iter()
                    .find(|s| s.name == name && s.type_oid == type_id);
                match known {
                    Some(known) => ColumnMeta {
                        attnum: if attnum != 0 { attnum } else { known.attnum },
                        ..known.clone()
                    },
                    None => ColumnMeta {
                        name: name.to_owned(),
                        type_oid: type_id,
                        element_oid: None,
                        // Unknown here: counted as variable length (may be TOASTed).
                        typlen: -1,
                        attnum,
                    },
                }
            })
            .collect();
        let why = if returned {
            self.missing_since.remove(&index);
            self.by_oid.insert(oid, index);
            format!("a table of this name is published again (OID {oid})")
        } else if recreated {
            let old = known.oid;
            self.by_oid.remove(&old);
            self.by_oid.insert(oid, index);
            format!("the table was dropped and created again (OID {old} → {oid})")
        } else if rekeyed {
            format!(
                "its replica identity changed from ({}) to ({})",
                keys_then.join(", "),
                keys_now.join(", ")
            )
        } else if recopy {
            let mut names = seen;
            names.sort_unstable();
            names.dedup();
            format!(
                "columns the sync rules read changed: {} (from ({}) to ({}))",
                names.join(", "),
                describe(&then),
                describe(&now)
            )
        } else {
            String::new()
        };
        let table = self.tables[index].qualified();
        if recopy {
            tracing::info!(
                table = %table,
                "{why} on the primary; the table is copied again while the stream goes on"
            );
        } else {
            tracing::info!(
                table = %table,
                "columns the sync rules do not read changed on the primary; rows are \
                 decoded with the new columns"
            );
        }
        let change = Change::Relation {
            table: index,
            oid,
            identity,
            columns: rebound,
            recopy,
            rekey_from: if rekeyed {
                self.tables[index].identity_names.clone()
            } else {
                Vec::new()
            },
            why,
        };
        super::apply::rebind_to(&mut self.tables, &change, self.rules)?;
        // Its columns (their order, say) are the new ones from here on.
        self.layouts[index] = None;
        Ok(Some(change))
    }
}

impl Decoder<'_> {
    /// Table `index` is missing from the primary under its name (`why`): its changes are no
    /// longer followed; its rows stay served for `gone_after` (a migration that swaps or
    /// recreates the table in several transactions leaves no window of missing rows), then
    /// leave the buckets ([`Self::due_gone`]), as a replica started now would not find it.
    /// A table published under its name again is copied.
    fn missing(&mut self, index: usize, why: &str) {
        let table = &self.tables[index];
        if table.gone || self.missing_since.contains_key(&index) {
            return;
        }
        tracing::warn!(
            table = %table.qualified(),
            "the sync rules read this table, but {why}: its changes are not followed; unless a \
             table of this name is published again within {} s its rows leave the buckets (the \
             other tables stream on). Point the sync rules at its new name and deploy them, or \
             publish a table of this name again (it is then copied)",
            self.gone_after.as_secs()
        );
        if self.by_oid.get(&table.oid) == Some(&index) {
            self.by_oid.remove(&table.oid);
        }
        self.missing_since.insert(index, Instant::now());
    }

    /// Notes where the columns of table `index` sit (`(name, type, attnum)` as the catalog
    /// or a re-copy's snapshot saw them) where a Relation message left it unknown, so that
    /// one of them dropped and added again shows in the next catalog reading.
    pub(super) fn learn_attnums<'c>(
        &mut self,
        index: usize,
        seen: impl IntoIterator<Item = (&'c str, u32, i16)>,
    ) {
        let Some(table) = self.tables.get_mut(index) else {
            return;
        };
        for (name, type_oid, attnum) in seen {
            if let Some(column) = table
                .columns
                .iter_mut()
                .find(|c| c.attnum == 0 && c.name == name && c.type_oid == type_oid)
            {
                column.attnum = attnum;
            }
        }
    }

    /// When the next missing table is due to be gone.
    pub(super) fn next_gone_at(&self) -> Option<Instant> {
        self.missing_since
            .values()
            .min()
            .map(|since| *since + self.gone_after)
    }

    /// The tables missing for `gone_after` by `now`: gone, their rows leave the buckets.
    pub(super) fn due_gone(&mut self, now: Instant) -> Vec<Change> {
        let gone_after = self.gone_after;
        let due: Vec<usize> = self
            .missing_since
            .iter()
            .filter(|(_, since)| **since + gone_after <= now)
            .map(|(&index, _)| index)
            .collect();
        due.into_iter()
            .map(|index| {
                self.missing_since.remove(&index);
                self.tables[index].gone = true;
                Change::Gone { table: index }
            })
            .collect()
    }
}

/// A column as the primary describes it: name, type OID and attnum (0 when the message
/// does not say: a Relation message).
type Column<'a> = (&'a str, u32, i16);

/// The same column: its name and type, and its attnum where both sides know it (a column
/// dropped and added again under its name and type has a new attnum, and new values).
fn same_column(a: &Column<'_>, b: &Column<'_>) -> bool {
    a.0 == b.0 && a.1 == b.1 && (a.2 == 0 || b.2 == 0 || a.2 == b.2)
}

fn describe(columns: &[Column<'_>]) -> String {
    columns
        .iter()
        .map(|(name, oid, _)| format!("{name} oid {oid}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;

mod read;
mod slot_watch;
