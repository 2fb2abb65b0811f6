//! Following the slot after the snapshot: check the slot's health, `START_REPLICATION`
//! from the durable LSN, turn pgoutput events into [`Change`]s for the applier thread,
//! follow tables whose columns change (copying one again when the rules see the change,
//! see `recopy`), leave a table gone from the primary under its name (its rows leave the
//! buckets; it is copied when published under its name again), and refuse a table whose
//! replica identity became `NOTHING`.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use pg_walstream::CancellationToken;
use tokio::sync::watch;

use crate::apply::Applier;
use crate::catalog::{watch_catalog, CatalogState, Watched};
use crate::change::Change;
use crate::context::StreamContext;
use crate::copied::RecopyEvent;
use crate::error::{stream_error, ReplicationError};
use crate::handoff::ChangeSender;
use crate::intent::BootstrapIntent;
use crate::liveness::{watch_liveness, Heard};
use crate::merge::Merge;
use crate::plan::SourcePlan;
use crate::prepare::Preparer;
use crate::recopy::{Applied, Handover, Recopies};
use crate::table::StreamTable;
use read::{Event, Reader};
use rules::SyncRules;
use setup::{slot_to_follow, within_setup};
use source::{format_lsn, replication_error, start_stream};

mod decode;
mod partitions;
mod read;
mod setup;
mod shape;
mod slot_watch;
#[cfg(test)]
mod tests;

pub(crate) use decode::Decoder;

/// Messages of one transaction decoded in a row, as long as they are read without waiting.
const DRAIN: usize = 1024;

/// How long a stopping stream waits for the primary to end replication.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Streams changes until `stop` turns true (then `Ok`) or an error.
pub async fn follow_slot(
    plan: &SourcePlan,
    context: &StreamContext,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ReplicationError> {
    let (intent, start, dead_after) = slot_to_follow(plan, context).await?;
    let liveness = &context.liveness;
    let durable = context.store.read(|view| view.checkpoint())?;
    let tables = stream_tables(&intent, &context.rules)?;
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
    let merges = resume_recopies(context, &intent, &tables, &mut recopies)?;
    let (input, changes) = crate::handoff::channel();
    let applier = Applier {
        store: context.store.clone(),
        rules: context.rules.clone(),
        tables,
        applied: durable,
        visible: durable,
        published: context.published.clone(),
        feedback: stream.shared_lsn_feedback.clone(),
        progress: context.progress.clone(),
        sweep: crate::expiry::Sweep::new(context.write_checkpoint_max_age),
        merges,
        handover: handover.clone(),
        published_at: None,
        group_window: context.group_window,
        passing: None,
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
    let heard = Arc::new(Heard::new(context.progress.clone()));
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
    let (catalog_out, catalog) = watch::channel(None);
    let catalog_watcher = tokio::spawn(watch_catalog(
        plan.clone(),
        intent.system_identifier.clone(),
        Watched {
            tables: decoder.tables.iter().map(StreamTable::source).collect(),
            wildcards: wildcards(&context.rules),
            reported: Vec::new(),
        },
        catalog_out,
    ));
    let reader = Reader::new(stream, cancel.clone());
    let mut following = Following {
        context,
        decoder,
        // Rows are evaluated and packed here, beside the applier that writes them.
        preparer: Preparer::new(context.store.clone()),
        reader,
        lookahead: None,
        input,
        recopies,
        handover,
        heard,
        cancel,
        dead,
        catalog,
        catalog_seen: None,
    };
    let received = following.run().await;
    stopper.abort();
    watcher.abort();
    catalog_watcher.abort();
    monitor.abort();
    following.finish(received, applying).await
}

/// The tables as the stream applies them, from the snapshot's record.
fn stream_tables(
    intent: &BootstrapIntent,
    rules: &SyncRules,
) -> Result<Vec<StreamTable>, ReplicationError> {
    intent
        .tables
        .iter()
        .map(|t| StreamTable::from_intent(t, rules))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ReplicationError::Stream {
            code: "PSM_R2004",
            message: "the stored snapshot predates change streaming (no column record); run \
                      SELECT powersync_mdbx.reset() to take a new one"
                .into(),
            operator: true,
        })
}

/// Starts again the re-copies a restart interrupted, and those a rules deploy marked;
/// returns their merges, by table index, for the applier. A deploy's do not hold what
/// clients see (they write only into buckets not served yet); others do (a mark a store
/// kept from before held re-copies).
fn resume_recopies(
    context: &StreamContext,
    intent: &BootstrapIntent,
    tables: &[StreamTable],
    recopies: &mut Recopies,
) -> Result<HashMap<usize, Merge>, ReplicationError> {
    // Tables whose re-copy a restart interrupted copy again from the start, as do those a
    // rules deploy marked.
    let deploying = context
        .store
        .read(|view| Ok(crate::deploy::deploy_in_progress(view)))??
        .is_some();
    let mut merges = HashMap::new();
    for (index, table) in intent.tables.iter().enumerate() {
        if table.recopy {
            recopies.start(index, &tables[index], &table.rekey_from, !deploying);
            merges.insert(
                index,
                Merge::rekeying(
                    table.rekey_from.clone(),
                    if deploying {
                        crate::deploy::RECOPY_REASON.into()
                    } else {
                        "a restart interrupted its re-copy".into()
                    },
                    context.store.file_bytes(),
                )
                .holding(!deploying),
            );
        }
    }
    Ok(merges)
}

/// A stream's loop and what it works with: the decoder, the hand-off to the applier, the
/// re-copies, and the catalog's readings.
struct Following<'a> {
    context: &'a StreamContext,
    decoder: Decoder<'a>,
    /// Rows are evaluated and packed here, beside the applier that writes them.
    preparer: Preparer,
    reader: Reader,
    /// An event read without waiting, not handled yet.
    lookahead: Option<Event>,
    input: ChangeSender,
    recopies: Recopies,
    handover: Arc<Handover>,
    heard: Arc<Heard>,
    cancel: CancellationToken,
    dead: Arc<parking_lot::Mutex<Option<String>>>,
    catalog: watch::Receiver<Option<Arc<CatalogState>>>,
    /// The catalog's last reading, until the stream has passed its position.
    catalog_seen: Option<Arc<CatalogState>>,
}

impl Following<'_> {
    /// Decodes changes and hands them to the applier until a stop (`Ok`), an error, or the
    /// applier's end (`Ok`: its error is reported by [`Self::finish`]).
    async fn run(&mut self) -> Result<(), ReplicationError> {
        loop {
            if let ControlFlow::Break(end) = self.between_transactions().await {
                return end;
            }
            // The applier ending (a failed commit, a full disk) must end the stream at once,
            // not at the next change the primary happens to send: an idle source would leave a
            // dead applier unnoticed, and nothing applied, indefinitely.
            let gone_at = self.decoder.next_gone_at();
            // Changes go to the applier in batches; what is collected goes before any wait
            // between transactions. Inside one, the applier cannot commit before its Commit
            // anyway: a batch goes when full, so a transaction arriving no faster than the
            // applier takes it costs a wake-up of each side per batch, not per few rows.
            if self.lookahead.is_none() {
                self.lookahead = self.reader.ready().await;
            }
            if self.lookahead.is_none()
                && !self.decoder.in_transaction
                && self.input.flush().await.is_err()
            {
                return Ok(()); // the applier stopped; its error is reported below
            }
            let next = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return cancelled(&self.dead),
                () = sleep_until(gone_at), if gone_at.is_some() => continue,
                () = self.input.closed() => return Ok(()), // its error is reported below
                () = std::future::ready(()), if self.lookahead.is_some() => {
                    match self.lookahead.take() {
                        Some(next) => next,
                        None => continue,
                    }
                }
                next = self.reader.next() => next,
                () = self.handover.freed() => continue,
                Ok(()) = self.catalog.changed() => {
                    self.catalog_seen = self.catalog.borrow_and_update().clone();
                    continue;
                }
                recopied = self.recopies.next_event() => match recopied {
                    Ok(()) => continue,
                    Err(e) => return Err(e),
                },
            };
            self.heard.now();
            if let ControlFlow::Break(end) = self.drain(next).await {
                return end;
            }
            // Waiting for a busy applier is not silence of the primary.
            self.heard.now();
        }
    }

    /// What applies between transactions: the catalog's last reading, tables missing for
    /// long enough gone, the re-copies' events.
    async fn between_transactions(&mut self) -> ControlFlow<Result<(), ReplicationError>> {
        self.apply_catalog().await?;
        self.leave_gone().await?;
        self.forward_recopies().await;
        ControlFlow::Continue(())
    }

    /// What the catalog showed applies between transactions, once every transaction
    /// committed before it was decoded.
    async fn apply_catalog(&mut self) -> ControlFlow<Result<(), ReplicationError>> {
        let decoder = &self.decoder;
        let Some(state) = self
            .catalog_seen
            .take_if(|s| !decoder.in_transaction && decoder.passed >= s.lsn)
        else {
            return ControlFlow::Continue(());
        };
        let shapes = state
            .tables
            .iter()
            .enumerate()
            .map(|(index, table)| self.decoder.check_catalog(index, table.as_ref(), state.lsn))
            .collect::<Vec<_>>();
        let added = state
            .added
            .iter()
            .map(|(table, seen)| self.decoder.added_in_catalog(table, seen));
        for change in shapes.into_iter().chain(added.collect::<Vec<_>>()) {
            let change = match change {
                Ok(Some(change)) => change,
                Ok(None) => continue,
                Err(e) => return ControlFlow::Break(Err(e)),
            };
            follow_recopies(&mut self.recopies, &self.decoder, &change);
            if self.input.push(change).await.is_err() {
                // The applier stopped; its error is reported below.
                return ControlFlow::Break(Ok(()));
            }
        }
        ControlFlow::Continue(())
    }

    /// A table missing under its name for long enough is gone (between transactions).
    async fn leave_gone(&mut self) -> ControlFlow<Result<(), ReplicationError>> {
        self.context
            .progress
            .tables_missing
            .store(self.decoder.missing_since.len() as u64, Relaxed);
        if !self.decoder.in_transaction && !self.decoder.missing_since.is_empty() {
            for change in self.decoder.due_gone(Instant::now()) {
                follow_recopies(&mut self.recopies, &self.decoder, &change);
                if self.input.push(change).await.is_err() {
                    // The applier stopped; its error is reported below.
                    return ControlFlow::Break(Ok(()));
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// A re-copy's events reach the applier between transactions, its rows only once
    /// every transaction committed before its snapshot did.
    async fn forward_recopies(&mut self) {
        if self.decoder.in_transaction {
            return;
        }
        let mut forwarded = false;
        while let Some(event) = self.recopies.ready(self.decoder.passed) {
            forwarded = true;
            if let RecopyEvent::Started {
                table,
                columns,
                partitions,
                consistent_point,
            } = &event
            {
                self.decoder.learn_attnums(
                    *table,
                    columns
                        .iter()
                        .map(|c| (c.name.as_str(), c.type_oid, c.attnum)),
                );
                let partitions = partitions.clone();
                self.decoder
                    .learn_partitions(*table, partitions, *consistent_point);
            }
            if self.input.push(Change::Recopy(event)).await.is_err() {
                break;
            }
        }
        if forwarded {
            self.heard.now();
        }
    }

    /// Decodes `next` and hands its change over. The messages of a transaction already
    /// read go on without the checks and waits of [`Self::run`] (they apply between
    /// transactions): a bulk change costs no `select!` per row, and still meets one every
    /// `DRAIN` messages.
    async fn drain(&mut self, mut next: Event) -> ControlFlow<Result<(), ReplicationError>> {
        for drained in 1.. {
            let event = match next {
                Ok(event) => event,
                Err(pg_walstream::ReplicationError::Cancelled(_)) => {
                    return ControlFlow::Break(cancelled(&self.dead))
                }
                Err(e) => {
                    return ControlFlow::Break(Err(ReplicationError::from(replication_error(e))))
                }
            };
            match self.decoder.decode(event.data) {
                Ok(Some(mut change)) => {
                    self.preparer.prepare(&self.decoder.tables, &mut change);
                    if change.is_row_change() {
                        self.context.progress.received.fetch_add(1, Relaxed);
                    }
                    follow_recopies(&mut self.recopies, &self.decoder, &change);
                    if self.input.push(change).await.is_err() {
                        // The applier stopped; its error is reported below.
                        return ControlFlow::Break(Ok(()));
                    }
                }
                Ok(None) => {}
                Err(e) => return ControlFlow::Break(Err(e)),
            }
            if !self.decoder.in_transaction || drained == DRAIN {
                break;
            }
            next = match self.reader.ready().await {
                Some(event) => event,
                None => break,
            };
        }
        ControlFlow::Continue(())
    }

    /// Ends the stream after its loop ended with `received`: the re-copies stopped, the
    /// replication ended, the applier (`applying`) joined. Returns the stream's error, or
    /// else the applier's.
    async fn finish(
        self,
        received: Result<(), ReplicationError>,
        applying: std::thread::JoinHandle<Result<(), ReplicationError>>,
    ) -> Result<(), ReplicationError> {
        let Following {
            context,
            mut recopies,
            cancel,
            input,
            reader,
            ..
        } = self;
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
}

/// The wildcard tables of `rules` as `(schema, prefix)`.
fn wildcards(rules: &SyncRules) -> Vec<(String, String)> {
    rules
        .tables()
        .into_iter()
        .filter_map(|(t, _)| Some((t.schema.clone(), t.name.strip_suffix('%')?.to_owned())))
        .collect()
}

/// Resolves at `at` (never without it).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Starts the re-copy a Relation change asks for (it holds what clients see: the applier
/// holds its writes from that change on); stops the one of a table gone.
fn follow_recopies(recopies: &mut Recopies, decoder: &Decoder<'_>, change: &Change) {
    match change {
        Change::Relation {
            table,
            recopy: true,
            rekey_from,
            ..
        } => recopies.start(*table, &decoder.tables[*table], rekey_from, true),
        Change::Added { index, .. } => recopies.start(*index, &decoder.tables[*index], &[], true),
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
