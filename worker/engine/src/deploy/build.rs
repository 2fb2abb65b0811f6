//! A rules deploy's build: changed rules are built into the next generation beside the
//! served one until it has caught up with the primary, or fail and leave the served
//! generation as it was.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{blocking, Build, Generations};
use crate::generation::{slot_for, Generation, OpenedStore};
use crate::EngineError;
use rules::SyncRules;
use service::AdminError;
use source::{format_lsn, PrimaryHead};
use status::{unix_now, DeployPhase, DeployStatus, ErrorReport};

impl Generations {
    /// Rules (re)loaded from the configuration: build them unless they are served or
    /// being built already. Invalid rules change nothing; the error shows in `status()`.
    pub async fn consider(&mut self, text: Arc<str>) {
        if *text == *self.active.rules.text() {
            if self
                .build
                .as_ref()
                .is_some_and(|b| b.generation.rules.text() == &*text)
            {
                // A re-copy of the served rules (`reprocess`) goes on.
                return;
            }
            if let Some(build) = self.build.take() {
                tracing::info!(
                    generation = build.generation.number,
                    "the served rules are configured again; abandoning the deploy"
                );
                self.retire(build.generation);
            }
            self.abandon_in_place().await;
            self.status.update(|s| s.deploy = None);
            return;
        }
        if self
            .build
            .as_ref()
            .is_some_and(|b| b.generation.rules.text() == &*text)
            || self
                .in_place
                .as_ref()
                .is_some_and(|d| d.rules.text() == &*text)
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
        self.abandon_in_place().await;
        if let Some((next, both)) = self.in_place_rules(&text) {
            self.start_in_place(next, both).await;
            return;
        }
        self.start_build(text, None).await;
    }

    /// The admin API's `reprocess`: the served rules copied again from a new slot into a
    /// new generation, switched to once caught up as a deploy is. Refused while a deploy
    /// is in progress. Answers the new generation's slot.
    pub async fn reprocess(&mut self) -> Result<String, AdminError> {
        if self.build.is_some() || self.in_place.is_some() {
            return Err(AdminError::busy());
        }
        let text: Arc<str> = Arc::from(self.active.rules.text());
        tracing::info!("reprocess: copying the served rules again into a new generation");
        self.start_build(text, None).await;
        match &self.build {
            Some(build) => Ok(build.generation.plan.slot.clone()),
            None => Err(AdminError::unavailable(format!(
                "the re-copy could not start: {}",
                self.status
                    .snapshot()
                    .last_error
                    .map_or_else(|| "see the worker's log".to_owned(), |e| e.message)
            ))),
        }
    }

    /// Starts building `text` in a new generation directory (or resumes generation
    /// `number` in `dir`). A build that cannot even start (its directory or store cannot
    /// be created) is reported in `status().last_error`; the served generation stays.
    pub(super) async fn start_build(&mut self, text: Arc<str>, resume: Option<(PathBuf, u64)>) {
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
                in_place: false,
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
        let mut generation =
            Generation::new(opened, number, text, slot, self.source.clone(), false)?;
        generation.write_checkpoint_max_age = self.write_checkpoint_max_age;
        Ok(generation)
    }

    /// Refreshes the deploy's progress in `status()` (from the engine's heartbeat).
    pub fn report_progress(&self) {
        self.report_in_place();
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
}

impl Build {
    /// Resolves once the build has reached the primary's position, or with the error
    /// that ended it. Cancel-safe: the position it must reach is kept once taken.
    pub(super) async fn caught_up(&mut self, head: &PrimaryHead) -> Result<(), EngineError> {
        let mut done = self.generation.snapshot_done();
        tokio::select! {
            _ = done.wait_for(|d| *d) => {}
            ended = self.generation.replication_ended() => return ended.and(Err(stopped())),
        }
        let target = match self.target {
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
                self.target = Some(target);
                target
            }
        };
        let mut checkpoints = self.generation.checkpoints();
        tokio::select! {
            _ = checkpoints.wait_for(|c| c.lsn >= target) => Ok(()),
            ended = self.generation.replication_ended() => ended.and(Err(stopped())),
        }
    }
}

/// The error of a build whose replication ended before the switch.
pub(super) fn stopped() -> EngineError {
    EngineError::Deploy("PSM_D2002 the new generation's replication stopped".to_owned())
}
