//! Rules deploys. Usually inside the served store (`in_place`): the tables the new rules
//! read differently are copied again while the stream evaluates both rules, then the
//! endpoints switch; buckets of unchanged definitions keep their histories. When that
//! cannot be (a store whose bucket names carry its generation, a change of edition), the
//! rules are built into a new generation beside the served one (its own store in
//! `g<generation>/`, its own slot and exported snapshot), which follows its slot until it
//! has reached the primary's position; the engine then switches the served generation and
//! retires the old one (slot dropped, files removed). Clients move over through an
//! ordinary `checkpoint_diff`. Until the switch nothing changes for them.
//!
//! This file holds the engine's generations (the served one and the build) and their
//! life (open, events, stop); the deploy's steps have a file each: a deploy inside the
//! store (`in_place`), the build (`build`), the switch (`switch`), retiring a generation
//! (`retire`) and sorting out what a crash left behind at start (`recovery`).

mod build;
mod in_place;
mod recovery;
mod retire;
mod switch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::generation::{slot_for, Generation, OpenedStore};
use super::EngineError;
use config::SourceConnection;
use source::PrimaryHead;
use status::StatusCell;

/// How long the served generation's replication gets to commit its current transaction
/// when it stops for a switch.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The engine's generations: the served one and, during a deploy, the one being built.
pub(super) struct Generations {
    root: PathBuf,
    slot_base: String,
    source: SourceConnection,
    status: Arc<StatusCell>,
    head: PrimaryHead,
    /// Given to every generation's stream (see [`crate::EngineConfig`]).
    write_checkpoint_max_age: std::time::Duration,
    /// The served generation.
    pub active: Generation,
    build: Option<Build>,
    /// A deploy inside the served store (see `in_place`).
    in_place: Option<in_place::InPlace>,
    /// Generations being retired in the background.
    retiring: JoinSet<()>,
}

/// A generation being built for changed rules, beside the served one.
struct Build {
    generation: Generation,
    started: Instant,
    /// The primary's position the build must reach before the switch, once taken.
    target: Option<u64>,
}

impl Generations {
    /// The served rules and those being deployed, for the admin API.
    pub fn configs(&self) -> service::SyncConfigs {
        let active = service::ConfigInUse {
            rules: self.active.rules.clone(),
            slot: self.active.plan.slot.clone(),
        };
        let deploying = match (&self.build, &self.in_place) {
            (Some(build), _) => Some(service::ConfigInUse {
                rules: build.generation.rules.clone(),
                slot: build.generation.plan.slot.clone(),
            }),
            (None, Some(in_place)) => Some(service::ConfigInUse {
                rules: in_place.rules.clone(),
                slot: active.slot.clone(),
            }),
            (None, None) => None,
        };
        service::SyncConfigs {
            active: Some(active),
            deploying,
        }
    }

    /// Opens the served generation and looks at what else the storage directory holds:
    /// a build the configured rules still want is resumed, anything else retired.
    pub async fn open(
        root: PathBuf,
        slot_base: String,
        source: SourceConnection,
        config_rules: &str,
        status: Arc<StatusCell>,
        write_checkpoint_max_age: std::time::Duration,
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
        let mut active = Generation::new(opened, number, &text, slot, source.clone(), true)?;
        active.write_checkpoint_max_age = write_checkpoint_max_age;
        let head = PrimaryHead::new(source.clone());
        let mut generations = Self {
            root,
            slot_base,
            source,
            status,
            head,
            write_checkpoint_max_age,
            active,
            build: None,
            in_place: None,
            retiring: JoinSet::new(),
        };
        generations.resume_recorded_deploy(config_rules).await?;
        generations.sort_out_others(config_rules).await?;
        Ok(generations)
    }

    /// The next thing the engine must act on: the served generation's replication
    /// ended, or the build reached the primary's position (then call [`Self::switch`])
    /// or failed. Cancel-safe: the build keeps the progress made towards it.
    pub async fn next_event(&mut self) -> GenerationEvent {
        let watch = self.in_place.is_some().then(|| {
            (
                self.active.stream_progress.clone(),
                self.active.checkpoints(),
            )
        });
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
            () = in_place::in_place_ready(watch) => GenerationEvent::InPlaceReady,
        }
    }

    /// A deploy the served store records (the worker stopped during it): resumed when the
    /// configuration still holds its rules, abandoned otherwise.
    async fn resume_recorded_deploy(&mut self, config_rules: &str) -> Result<(), EngineError> {
        let store = self.active.store.clone();
        let recorded = blocking_replication(move || {
            store.read(|view| Ok(replication::deploy_in_progress(view)))?
        })
        .await?;
        let Some(text) = recorded else {
            return Ok(());
        };
        match self.in_place_rules(&text).filter(|_| text == config_rules) {
            Some((next, both)) => {
                tracing::info!("resuming the rules deploy in the served store");
                let marked = self
                    .active
                    .store
                    .read(|view| Ok(replication::BootstrapIntent::load(view)))??
                    .map_or(0, |i| i.tables.iter().filter(|t| t.recopy).count() as u64);
                let status = self.deploy_status_for(&next, marked);
                self.status.update(|s| s.deploy = Some(status));
                self.resume_in_place(Arc::new(next), Arc::new(both), marked);
            }
            None => {
                tracing::info!("abandoning a rules deploy the configuration no longer asks for");
                let store = self.active.store.clone();
                blocking_replication(move || replication::abandon_deploy(&store)).await?;
            }
        }
        Ok(())
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
}

/// What [`Generations::next_event`] saw.
pub(super) enum GenerationEvent {
    /// The served generation's replication ended (`Ok`: it was asked to stop).
    ServedStopped(Result<(), EngineError>),
    /// The build reached the primary's position (`Ok`), or failed.
    BuildReady(Result<(), EngineError>),
    /// A deploy inside the served store merged every table it marked: switch the
    /// endpoints ([`Generations::finish_in_place`]).
    InPlaceReady,
}

/// Resolves once `build` has reached the primary's position, or with the error that
/// ended it; pending without a build.
async fn build_ready(build: &mut Option<Build>, head: &PrimaryHead) -> Result<(), EngineError> {
    let Some(build) = build.as_mut() else {
        return std::future::pending().await;
    };
    build.caught_up(head).await
}

/// Runs store work of the replication crate on a blocking thread.
async fn blocking_replication<R: Send + 'static>(
    work: impl FnOnce() -> Result<R, replication::ReplicationError> + Send + 'static,
) -> Result<R, EngineError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| EngineError::Thread(std::io::Error::other(e)))?
        .map_err(EngineError::Replication)
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
