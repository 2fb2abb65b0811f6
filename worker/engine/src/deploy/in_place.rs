//! A rules deploy inside the served store: for a store whose bucket names derive from its
//! history, changed rules are deployed without a new generation. The served generation's
//! stream evaluates the served and the new rules together while the tables the new rules
//! read differently are copied again (`replication::begin_deploy`); once none is left,
//! the endpoints switch to the new rules over the same store and the stream goes on with
//! them alone. Buckets of unchanged definitions keep their names, op ids and checksums, so
//! their clients receive nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{blocking_replication, Generations, STOP_GRACE};
use rules::SyncRules;
use service::SyncService;
use source::format_lsn;
use status::{unix_now, DeployDone, DeployPhase, DeployStatus, ErrorReport};

/// A deploy in progress inside the served store.
pub(super) struct InPlace {
    /// The rules being deployed.
    pub rules: Arc<SyncRules>,
    started: Instant,
    /// Tables it marked for a re-copy.
    marked: u64,
}

impl Generations {
    /// `text` compiled for the served store and evaluated with its rules, when it can be
    /// deployed inside it: the store names buckets by its history and the edition options
    /// are unchanged (otherwise every definition changes and a new generation is built).
    pub(super) fn in_place_rules(&self, text: &str) -> Option<(SyncRules, SyncRules)> {
        let next = SyncRules::parse_with_version(text, self.active.rules.bucket_version()).ok()?;
        let both = self.active.rules.with_rows_of(&next)?;
        Some((next, both))
    }

    /// Starts deploying `next` inside the served store (`both`: the served rules and
    /// `next` together). On an error the served rules stay and `status().deploy` shows it.
    pub(super) async fn start_in_place(&mut self, next: SyncRules, both: SyncRules) {
        let (next, both) = (Arc::new(next), Arc::new(both));
        tracing::info!("deploying changed sync rules in the served store");
        self.active.stop(STOP_GRACE).await;
        let marked =
            replication::begin_deploy(&self.source, &self.active.store, &self.active.rules, &next)
                .await;
        let status = self.deploy_status_for(&next, marked.as_ref().map_or(0, |m| *m as u64));
        self.status.update(|s| s.deploy = Some(status));
        let marked = match marked {
            Ok(marked) => marked as u64,
            Err(e) => {
                self.active.start(self.status.clone());
                let report = ErrorReport::new(e.to_string(), e.needs_operator());
                tracing::error!(
                    "the rules deploy failed: {}; the served rules stay in force (fix the \
                     cause, then reload to try again)",
                    report.message
                );
                self.status.update(|s| {
                    if let Some(d) = s.deploy.as_mut() {
                        d.phase = DeployPhase::Failed;
                        d.last_error = Some(report);
                    }
                });
                return;
            }
        };
        tracing::info!(
            tables = marked,
            "copying again the tables the new rules read differently; clients keep the served rules meanwhile"
        );
        self.resume_in_place(next, both, marked);
        self.active.start(self.status.clone());
    }

    /// Goes on with a deploy recorded in the served store (just begun, or found at start):
    /// its stream, started (again) by the caller, evaluates `both` until the marked tables
    /// are merged.
    pub(super) fn resume_in_place(
        &mut self,
        next: Arc<SyncRules>,
        both: Arc<SyncRules>,
        marked: u64,
    ) {
        self.active.stream_rules = Some(both);
        // Counted until its stream publishes its own count (which it does with every
        // commit), so nobody sees the deploy done before its re-copies started.
        self.active
            .stream_progress
            .recopying
            .store(marked, Ordering::Release);
        self.in_place = Some(InPlace {
            rules: next,
            started: Instant::now(),
            marked,
        });
    }

    /// Abandons a deploy inside the served store: its stream goes on with the served rules
    /// alone (the tables it marked are still copied again, under them).
    pub(super) async fn abandon_in_place(&mut self) {
        if self.in_place.take().is_none() {
            return;
        }
        tracing::info!("abandoning the rules deploy in the served store");
        self.active.stop(STOP_GRACE).await;
        let store = self.active.store.clone();
        if let Err(e) = blocking_replication(move || replication::abandon_deploy(&store)).await {
            tracing::warn!("{e}; the deploy record stays until the next start");
        }
        self.active.stream_rules = None;
        self.active.start(self.status.clone());
    }

    /// Switches the endpoints to the deployed rules once its re-copies are merged, and
    /// the stream to them alone.
    pub async fn finish_in_place(&mut self, sync: &SyncService) {
        let Some(deploy) = self.in_place.take() else {
            return;
        };
        self.status.update(|s| {
            if let Some(d) = s.deploy.as_mut() {
                d.phase = DeployPhase::Switching;
            }
        });
        self.active.stop(STOP_GRACE).await;
        let (store, rules) = (self.active.store.clone(), deploy.rules.clone());
        if let Err(e) =
            blocking_replication(move || replication::finish_deploy(&store, &rules)).await
        {
            tracing::error!("{e}; the deploy goes on and is switched again");
            self.in_place = Some(deploy);
            self.active.start(self.status.clone());
            return;
        }
        self.active.rules = deploy.rules.clone();
        self.active.stream_rules = None;
        if let Err(e) = sync.switch_to(self.active.served()).await {
            // The store records the new rules: a restart serves them.
            tracing::error!("{e}; the endpoints serve the new rules after the next start");
        }
        self.active.start(self.status.clone());
        let seconds = deploy.started.elapsed().as_secs_f64();
        let (number, hash) = (self.active.number, deploy.rules.content_hash_hex());
        self.status.update(|s| {
            s.rules_hash = Some(hash);
            s.deploy = None;
            s.last_deploy = Some(DeployDone {
                generation: number,
                seconds,
                rows: 0,
                switched_at: unix_now(),
            });
        });
        tracing::info!(
            seconds = format!("{seconds:.1}"),
            tables = deploy.marked,
            "rules deploy switched over in the served store"
        );
    }

    /// Refreshes an in-place deploy's progress in `status()`.
    pub(super) fn report_in_place(&self) {
        let Some(deploy) = &self.in_place else { return };
        let left = self
            .active
            .stream_progress
            .recopying
            .load(Ordering::Relaxed);
        let (file_bytes, lsn) = (self.active.store.file_bytes(), self.active.checkpoint().lsn);
        let marked = deploy.marked;
        self.status.update(|s| {
            if let Some(d) = s.deploy.as_mut() {
                d.tables_done = marked.saturating_sub(left);
                d.file_bytes = file_bytes;
                d.applied_lsn = Some(format_lsn(lsn));
            }
        });
    }

    pub(super) fn deploy_status_for(&self, next: &SyncRules, marked: u64) -> DeployStatus {
        DeployStatus {
            generation: self.active.number,
            phase: DeployPhase::CatchingUp,
            rules_hash: next.content_hash_hex(),
            dir: self.active.dir().display().to_string(),
            slot: self.active.plan.slot.clone(),
            started_at: unix_now(),
            tables_total: marked,
            tables_done: 0,
            rows: 0,
            file_bytes: self.active.store.file_bytes(),
            applied_lsn: None,
            in_place: true,
            last_error: None,
        }
    }
}

/// What [`in_place_ready`] watches: the served stream's progress and checkpoints.
pub(super) type Watch = (
    Arc<replication::StreamProgress>,
    tokio::sync::watch::Receiver<store::Checkpoint>,
);

/// Resolves once the deploy inside the served store has merged every table it marked
/// (`watch`, taken while one is in progress); pending without one. Cancel-safe.
pub(super) async fn in_place_ready(watch: Option<Watch>) {
    let Some((progress, mut checkpoints)) = watch else {
        return std::future::pending().await;
    };
    let merged = move |_: &store::Checkpoint| progress.recopying.load(Ordering::Acquire) == 0;
    if checkpoints.wait_for(merged).await.is_err() {
        // The stream stopped (it is started again by whoever stopped it).
        std::future::pending::<()>().await;
    }
}
