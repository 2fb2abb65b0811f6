//! Rules deploys: changed sync rules are built into a new generation beside the served
//! one (its own store in `g<generation>/`, its own slot and exported snapshot), which
//! then follows its slot until it has reached the primary's position; the engine then
//! switches the served generation and retires the old one (slot dropped, files removed).
//! Clients move over through an ordinary `checkpoint_diff` (bucket names carry the
//! generation, spec §7.6). Until the switch nothing changes for them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::generation::{slot_for, store_status, Generation, OpenedStore};
use super::EngineError;
use config::SourceConnection;
use replication::{release_intent_slot, BootstrapIntent};
use rules::SyncRules;
use service::SyncService;
use source::{format_lsn, PrimaryHead};
use status::{
    unix_now, DeployDone, DeployPhase, DeployStatus, ErrorReport, Phase, ReplicationStatus,
    StatusCell,
};
use store::{self, Store};

/// How long the served generation's replication gets to commit its current transaction
/// when it stops for a switch.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How long a switch waits for the new generation to reach the old one's last position.
const SWITCH_WAIT: Duration = Duration::from_secs(60);
/// How long a retired generation waits for the streams still reading it.
const RETIRE_WAIT: Duration = Duration::from_secs(600);

/// The engine's generations: the served one and, during a deploy, the one being built.
pub(super) struct Generations {
    root: PathBuf,
    slot_base: String,
    source: SourceConnection,
    status: Arc<StatusCell>,
    head: PrimaryHead,
    /// The served generation.
    pub active: Generation,
    build: Option<Build>,
    /// Generations being retired in the background.
    retiring: JoinSet<()>,
}

struct Build {
    generation: Generation,
    started: Instant,
    /// The primary's position the build must reach before the switch, once taken.
    target: Option<u64>,
}

impl Generations {
    /// Opens the served generation and looks at what else the storage directory holds:
    /// a build the configured rules still want is resumed, anything else retired.
    pub async fn open(
        root: PathBuf,
        slot_base: String,
        source: SourceConnection,
        config_rules: &str,
        status: Arc<StatusCell>,
    ) -> Result<Self, EngineError> {
        let active_dir = blocking({
            let root = root.clone();
            move || store::active_dir(&root)
        })
        .await?;
        let opened = OpenedStore::open(active_dir.clone()).await?;
        let number = match &opened.intent {
            Some(intent) => intent.generation,
            None => {
                blocking({
                    let root = root.clone();
                    move || store::next_generation(&root)
                })
                .await?
            }
        };
        // A complete store serves with the rules it was built with; an unfinished one
        // (re)starts its snapshot with the configured rules.
        let text = match (&opened.rules_text, opened.is_complete()) {
            (Some(stored), true) => stored.clone(),
            _ => config_rules.to_owned(),
        };
        let slot = slot_for(&slot_base, &root, &active_dir, number);
        let active = Generation::new(opened, number, &text, slot, source.clone(), true)?;
        let head = PrimaryHead::new(source.clone());
        let mut generations = Self {
            root,
            slot_base,
            source,
            status,
            head,
            active,
            build: None,
            retiring: JoinSet::new(),
        };
        generations.sort_out_others(config_rules).await?;
        Ok(generations)
    }

    /// Resumes the build of `config_rules` if the directory holds one; retires every
    /// other store that is not the served one (left by a crash during a deploy or its
    /// switch).
    async fn sort_out_others(&mut self, config_rules: &str) -> Result<(), EngineError> {
        let others = blocking({
            let (root, active) = (self.root.clone(), self.active.dir().to_owned());
            move || store::other_stores(&root, &active)
        })
        .await?;
        for dir in others {
            let peek = blocking({
                let dir = dir.clone();
                move || {
                    let intent = store::stage_record_of_any_format(&dir, BootstrapIntent::KEY)?;
                    let rules =
                        store::stage_record_of_any_format(&dir, BootstrapIntent::RULES_KEY)?;
                    Ok((intent, rules))
                }
            })
            .await;
            let resumable = match &peek {
                Ok((Some(intent), Some(rules))) => BootstrapIntent::decode(intent)
                    .ok()
                    .map(|i| i.generation)
                    .filter(|g| {
                        dir != self.root
                            && self.build.is_none()
                            && rules.as_slice() == config_rules.as_bytes()
                            && config_rules != self.active.rules.text()
                            && *g > self.active.number
                    }),
                _ => None,
            };
            if let Some(number) = resumable {
                tracing::info!(dir = %dir.display(), "resuming the interrupted rules deploy");
                self.start_build(Arc::from(config_rules), Some((dir, number)))
                    .await;
            } else {
                tracing::info!(dir = %dir.display(), "removing a generation left behind");
                self.retire_dir(dir);
            }
        }
        Ok(())
    }

    /// Rules (re)loaded from the configuration: build them unless they are served or
    /// being built already. Invalid rules change nothing; the error shows in `status()`.
    pub async fn consider(&mut self, text: Arc<str>) {
        if *text == *self.active.rules.text() {
            if let Some(build) = self.build.take() {
                tracing::info!(
                    generation = build.generation.number,
                    "the served rules are configured again; abandoning the deploy"
                );
                self.retire(build.generation);
            }
            self.status.update(|s| s.deploy = None);
            return;
        }
        if self
            .build
            .as_ref()
            .is_some_and(|b| b.generation.rules.text() == &*text)
        {
            return;
        }
        if let Err(e) = SyncRules::parse(&text) {
            let report = ErrorReport::new(EngineError::Rules(e).to_string(), true);
            tracing::error!(
                "{}; the served rules stay in force until valid rules are configured",
                report.message
            );
            self.status.update(|s| s.last_error = Some(report));
            return;
        }
        if let Some(build) = self.build.take() {
            tracing::info!(
                generation = build.generation.number,
                "the rules changed again; abandoning the deploy in progress"
            );
            self.retire(build.generation);
        }
        self.start_build(text, None).await;
    }

    /// Starts building `text` in a new generation directory (or resumes generation
    /// `number` in `dir`). A build that cannot even start (its directory or store cannot
    /// be created) is reported in `status().last_error`; the served generation stays.
    async fn start_build(&mut self, text: Arc<str>, resume: Option<(PathBuf, u64)>) {
        let chosen = match resume {
            Some(resumed) => Ok(resumed),
            None => {
                let root = self.root.clone();
                let after = self.active.number;
                blocking(move || {
                    let number = store::next_generation(&root)?.max(after + 1);
                    // Later builds and resets count on from here.
                    store::set_next_generation(&root, number + 1)?;
                    Ok((store::build_dir(&root, number), number))
                })
                .await
            }
        };
        let started = match chosen {
            Ok((dir, number)) => match self.open_build(&text, dir.clone(), number).await {
                Ok(generation) => Ok(generation),
                Err(e) => {
                    self.retire_dir(dir);
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        let mut generation = match started {
            Ok(generation) => generation,
            Err(e) => {
                let report = ErrorReport::new(e.to_string(), e.needs_operator());
                tracing::error!(
                    "{}; the rules deploy cannot start, the served rules stay in force",
                    report.message
                );
                self.status.update(|s| s.last_error = Some(report));
                return;
            }
        };
        let (number, slot) = (generation.number, generation.plan.slot.clone());
        let dir = generation.dir().display().to_string();
        tracing::info!(generation = number, slot = %slot, dir = %dir, "deploying changed sync rules beside the served ones");
        let tables_total = generation.rules.tables().len() as u64;
        let rules_hash = generation.rules.content_hash_hex();
        self.status.update(|s| {
            s.deploy = Some(DeployStatus {
                generation: number,
                phase: DeployPhase::Validating,
                rules_hash,
                dir,
                slot,
                started_at: unix_now(),
                tables_total,
                tables_done: 0,
                rows: 0,
                file_bytes: 0,
                applied_lsn: None,
                last_error: None,
            });
        });
        generation.start(self.status.clone());
        self.build = Some(Build {
            generation,
            started: Instant::now(),
            target: None,
        });
    }

    /// Opens (or creates) the store of generation `number` in `dir` with `text`.
    async fn open_build(
        &self,
        text: &str,
        dir: PathBuf,
        number: u64,
    ) -> Result<Generation, EngineError> {
        let opened = OpenedStore::open(dir.clone()).await?;
        let slot = slot_for(&self.slot_base, &self.root, &dir, number);
        Generation::new(opened, number, text, slot, self.source.clone(), false)
    }

    /// Refreshes the deploy's progress in `status()` (from the engine's heartbeat).
    pub fn report_progress(&self) {
        let Some(build) = &self.build else { return };
        let g = &build.generation;
        let (rows, tables_done, copying) = (
            g.progress.rows(),
            g.progress.tables_done(),
            g.progress.copying(),
        );
        let file_bytes = g.store.file_bytes();
        let applied = (*g.snapshot_done().borrow()).then(|| format_lsn(g.checkpoint().lsn));
        self.status.update(|s| {
            if let Some(d) = s.deploy.as_mut() {
                if d.phase == DeployPhase::Validating && copying {
                    d.phase = DeployPhase::Snapshotting;
                }
                if d.phase == DeployPhase::Snapshotting {
                    d.rows = rows;
                    d.tables_done = tables_done;
                }
                d.file_bytes = file_bytes;
                d.applied_lsn = applied;
            }
        });
    }

    /// The next thing the engine must act on: the served generation's replication
    /// ended, or the build reached the primary's position (then call [`Self::switch`])
    /// or failed. Cancel-safe: the build keeps the progress made towards it.
    pub async fn next_event(&mut self) -> GenerationEvent {
        let Self {
            active,
            build,
            head,
            ..
        } = self;
        let replicating = active.is_replicating();
        tokio::select! {
            ended = active.replication_ended(), if replicating => GenerationEvent::ServedStopped(ended),
            ready = build_ready(build, head) => GenerationEvent::BuildReady(ready),
        }
    }

    /// The build ended with `error`: the served generation stays; the build's slot and
    /// files go, and `status().deploy` shows the error until the rules change or a
    /// reload hands the same rules over again (which tries again).
    pub fn fail_build(&mut self, error: &EngineError) {
        let Some(build) = self.build.take() else {
            return;
        };
        let report = ErrorReport::new(error.to_string(), error.needs_operator());
        tracing::error!(
            generation = build.generation.number,
            "the rules deploy failed: {}; the served rules stay in force (fix the cause, then \
             reload to try again)",
            report.message
        );
        self.status.update(|s| {
            if let Some(d) = s.deploy.as_mut() {
                d.phase = DeployPhase::Failed;
                d.last_error = Some(report);
            }
        });
        self.retire(build.generation);
    }

    /// Replaces the served generation with the caught-up build: the old one stops at its
    /// last commit, the build passes that position, the storage records the new one as
    /// served, the endpoints switch over, and the old one is retired. If any step fails
    /// the old generation resumes as it was and the build fails.
    pub async fn switch(&mut self, sync: &SyncService) {
        let Some(mut build) = self.build.take() else {
            return;
        };
        let intent = match build
            .generation
            .store
            .read(|view| Ok(BootstrapIntent::load(view)))
        {
            Ok(Ok(Some(intent))) => intent,
            Ok(Ok(None)) => return self.resume_served(build, stopped()),
            Ok(Err(e)) => return self.resume_served(build, e.into()),
            Err(e) => return self.resume_served(build, e.into()),
        };
        self.status.update(|s| {
            if let Some(d) = s.deploy.as_mut() {
                d.phase = DeployPhase::Switching;
            }
        });
        self.active.stop(STOP_GRACE).await;
        if let Err(e) = self.hand_over(&mut build, sync).await {
            self.active.start(self.status.clone());
            return self.resume_served(build, e);
        }
        build.generation.serve();
        let new = &build.generation;
        let seconds = build.started.elapsed().as_secs_f64();
        let (number, rows) = (new.number, intent.rows);
        let tables = new.rules.tables().len() as u64;
        let replication = ReplicationStatus {
            slot: new.plan.slot.clone(),
            consistent_point: intent.consistent_point.map(format_lsn),
            tables_total: tables,
            tables_done: tables,
            rows,
            ..ReplicationStatus::default()
        };
        let (rules_hash, store) = (new.rules.content_hash_hex(), store_status(&new.store));
        self.status.update(|s| {
            s.phase = Phase::Streaming;
            s.ready = true;
            s.generation = Some(number);
            s.rules_hash = Some(rules_hash);
            s.store = Some(store);
            s.replication = Some(replication);
            s.deploy = None;
            s.last_deploy = Some(DeployDone {
                generation: number,
                seconds,
                rows,
                switched_at: unix_now(),
            });
        });
        tracing::info!(
            generation = number,
            seconds = format!("{seconds:.1}"),
            "rules deploy switched over; retiring the previous generation"
        );
        let old = std::mem::replace(&mut self.active, build.generation);
        self.retire(old);
    }

    /// The switch proper, with the served generation stopped: the build passes its last
    /// position, `active` names the build, the endpoints serve it. On an error nothing of
    /// this stays (`active` names the served generation again).
    async fn hand_over(&self, build: &mut Build, sync: &SyncService) -> Result<(), EngineError> {
        let old_lsn = self.active.checkpoint().lsn;
        let mut checkpoints = build.generation.checkpoints();
        let reached = tokio::select! {
            r = tokio::time::timeout(SWITCH_WAIT, checkpoints.wait_for(|c| c.lsn >= old_lsn)) => {
                matches!(r, Ok(Ok(_)))
            }
            ended = build.generation.replication_ended() => ended.and(Err(stopped()))?,
        };
        if !reached {
            return Err(EngineError::Deploy(format!(
                "PSM_D2001 the new generation did not reach the served one's position {} within \
                 {SWITCH_WAIT:?}",
                format_lsn(old_lsn)
            )));
        }
        let (root, dir) = (self.root.clone(), build.generation.dir().to_owned());
        blocking(move || store::set_active(&root, &dir)).await?;
        if let Err(e) = sync.switch_to(build.generation.served()).await {
            let (root, served) = (self.root.clone(), self.active.dir().to_owned());
            let restored = blocking(move || {
                if served == root {
                    store::remove_active_file(&root)
                } else {
                    store::set_active(&root, &served)
                }
            })
            .await;
            if let Err(restore) = restored {
                // `active` names the build: a restart would serve it, complete and
                // caught up, which is correct; only this process keeps the old one.
                tracing::warn!("{restore}; the storage records the new generation as served");
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Fails `build` with `error` while the served generation stays.
    fn resume_served(&mut self, build: Build, error: EngineError) {
        self.build = Some(build);
        self.fail_build(&error);
    }

    /// Stops every generation's replication (engine shutdown). Retirements in progress
    /// are abandoned; the next start finishes them.
    pub async fn stop(&mut self) {
        if let Some(mut build) = self.build.take() {
            build.generation.stop(STOP_GRACE).await;
        }
        self.active.stop(STOP_GRACE).await;
        self.retiring.abort_all();
    }

    /// Retires `generation` in the background: its slot is dropped at once (its
    /// replication has stopped), its files once no stream reads it any more.
    fn retire(&mut self, generation: Generation) {
        let (source, root) = (self.source.clone(), self.root.clone());
        self.retiring.spawn(async move {
            let mut generation = generation;
            generation.stop(STOP_GRACE).await;
            let store = generation.store.clone();
            let dir = generation.dir().to_owned();
            drop(generation);
            let intent = store
                .read(|view| Ok(BootstrapIntent::load(view)))
                .ok()
                .and_then(|i| i.ok().flatten());
            if let Some(intent) = intent {
                drop_slot_with_retries(&source, &intent).await;
            }
            if wait_until_unused(store).await {
                remove_dir(root, dir).await;
            }
        });
    }

    /// Retires a store found on disk that is not open (left behind by a crash).
    fn retire_dir(&mut self, dir: PathBuf) {
        let (source, root) = (self.source.clone(), self.root.clone());
        self.retiring.spawn(async move {
            let intent = blocking({
                let dir = dir.clone();
                move || store::stage_record_of_any_format(&dir, BootstrapIntent::KEY)
            })
            .await
            .ok()
            .flatten()
            .and_then(|bytes| BootstrapIntent::decode(&bytes).ok());
            if let Some(intent) = intent {
                drop_slot_with_retries(&source, &intent).await;
            }
            remove_dir(root, dir).await;
        });
    }
}

/// What [`Generations::next_event`] saw.
pub(super) enum GenerationEvent {
    /// The served generation's replication ended (`Ok`: it was asked to stop).
    ServedStopped(Result<(), EngineError>),
    /// The build reached the primary's position (`Ok`), or failed.
    BuildReady(Result<(), EngineError>),
}

/// Resolves once `build` has reached the primary's position, or with the error that
/// ended it; pending without a build.
async fn build_ready(build: &mut Option<Build>, head: &PrimaryHead) -> Result<(), EngineError> {
    let Some(build) = build.as_mut() else {
        return std::future::pending().await;
    };
    let mut done = build.generation.snapshot_done();
    tokio::select! {
        _ = done.wait_for(|d| *d) => {}
        ended = build.generation.replication_ended() => return ended.and(Err(stopped())),
    }
    let target = match build.target {
        Some(target) => target,
        None => {
            let target = loop {
                match head.mark("deploy").await {
                    Ok(lsn) => break lsn,
                    Err(e) => {
                        tracing::warn!("{e}; the deploy retries in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            };
            build.target = Some(target);
            target
        }
    };
    let mut checkpoints = build.generation.checkpoints();
    tokio::select! {
        _ = checkpoints.wait_for(|c| c.lsn >= target) => Ok(()),
        ended = build.generation.replication_ended() => ended.and(Err(stopped())),
    }
}

fn stopped() -> EngineError {
    EngineError::Deploy("PSM_D2002 the new generation's replication stopped".to_owned())
}

async fn drop_slot_with_retries(source: &SourceConnection, intent: &BootstrapIntent) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match release_intent_slot(source, intent).await {
            Ok(dropped) => {
                if let Some(slot) = dropped {
                    tracing::info!(slot = %slot, "dropped the slot of a retired generation");
                }
                return;
            }
            Err(e) => {
                tracing::warn!(slot = %intent.slot, "{e}; dropping the retired generation's slot again in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// Waits until `store` is the last handle on its environment (streams still reading
/// the old generation let go at their next checkpoint), then closes it. False when it
/// stays in use: its files are then left for the next start to remove.
async fn wait_until_unused(store: Arc<Store>) -> bool {
    let deadline = Instant::now() + RETIRE_WAIT;
    while Arc::strong_count(&store) > 1 {
        if Instant::now() >= deadline {
            tracing::warn!(dir = %store.dir().display(), "a retired generation is still read; its files stay until the next start");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let closed = tokio::task::spawn_blocking(move || drop(store)).await;
    closed.is_ok()
}

async fn remove_dir(root: PathBuf, dir: PathBuf) {
    let shown = dir.display().to_string();
    match blocking(move || store::remove_store(&root, &dir)).await {
        Ok(removed) => {
            tracing::info!(dir = %shown, files = %removed.join(","), "removed a retired generation")
        }
        Err(e) => tracing::warn!(dir = %shown, "{e}; the next start tries again"),
    }
}

/// Runs filesystem work on a blocking thread.
async fn blocking<R: Send + 'static>(
    work: impl FnOnce() -> Result<R, store::StoreError> + Send + 'static,
) -> Result<R, EngineError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| EngineError::Thread(std::io::Error::other(e)))?
        .map_err(EngineError::Store)
}
