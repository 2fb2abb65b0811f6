//! `powersync_mdbx.reset()`: which stores it may remove, the slots they own, and the
//! decision to remove or to refuse.
//!
//! The contract: a reset removes only stores that carry this project's metadata (a
//! directory whose data file is anything else keeps all it holds, also with `force`); it
//! removes nothing while a slot of those stores could not be dropped, unless forced, and
//! then names each slot left behind with the statement that drops it. Its network work
//! (connect, slot lookup, drop) runs on a thread of its own, bounded by
//! [`RELEASE_TIMEOUT`], while the host's thread keeps serving its loop: the host polls
//! [`Reset::poll`] from its ticks.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use config::SourceConnection;
use replication::BootstrapIntent;
use store::DataFile;

use super::SpawnGuard;

/// How long the release of the stores' slots may take in all (connecting, looking each
/// slot up, dropping it). `powersync_mdbx.reset()` waits for the worker twice as long,
/// so a refusal for a primary that does not answer reaches the caller.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);
/// The host waits this much longer than the release thread's own bound, so the thread
/// normally reports its timeout itself.
const RELEASE_GRACE: Duration = Duration::from_secs(2);

/// Why a reset removed nothing, or what it left behind.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// A store directory holds a data file that is not shown to be a powersync_mdbx
    /// store.
    #[error(
        "PSM_E1003 reset() removed nothing: {}; reset() removes only powersync_mdbx \
         stores: move that file out of the storage directory (or point \
         powersync_mdbx.storage_dir elsewhere), then run reset() again",
        .0.join("; ")
    )]
    NotOurs(Vec<String>),
    /// A slot of a store to be removed could not be dropped, and the reset was not forced.
    #[error(
        "PSM_E1004 reset() removed nothing: {}; fix the cause and run reset() again, or \
         drop the slot by hand and run SELECT powersync_mdbx.reset(force => true) to \
         remove the store without it",
        describe(.0)
    )]
    SlotsLeft(Vec<SlotLeft>),
    /// Forced: the stores were removed, these slots stay on the primary.
    #[error(
        "PSM_E1004 the store was removed, but {}; until it is dropped the primary keeps \
         WAL for it, and the new bootstrap refuses a slot of the same name (PSM_R1013)",
        describe(.0)
    )]
    SlotsLeftForced(Vec<SlotLeft>),
    /// The worker stopped while the slots were being released.
    #[error(
        "PSM_E1005 the worker stopped during reset(), while the slots were being released; \
         no file was removed: run reset() again once status() shows the worker running"
    )]
    Interrupted,
    /// The storage directory cannot be listed.
    #[error("{0}")]
    Store(#[from] store::StoreError),
}

/// A slot a store owns that the reset could not drop.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SlotLeft {
    /// The store's directory.
    pub store: String,
    /// The slot, when its bootstrap record could be read.
    pub slot: Option<String>,
    /// The database it decodes on the primary.
    pub database: Option<String>,
    /// Why it was not dropped.
    pub reason: String,
    /// What drops it by hand, on the primary.
    pub drop_by_hand: String,
}

fn describe(left: &[SlotLeft]) -> String {
    let slots: Vec<String> = left
        .iter()
        .map(|l| match &l.slot {
            Some(slot) => format!(
                "the replication slot \"{slot}\" of {} could not be dropped ({}); to drop it \
                 by hand, run in database \"{}\" of the primary: {}",
                l.store,
                l.reason,
                l.database.as_deref().unwrap_or("?"),
                l.drop_by_hand
            ),
            None => format!(
                "the replication slot of {} is not known ({}); {}",
                l.store, l.reason, l.drop_by_hand
            ),
        })
        .collect();
    slots.join("; ")
}

/// The answer of the release thread for the slot of one store.
type Released = (usize, Result<Option<String>, String>);

/// The release thread in flight.
struct Release {
    answers: mpsc::Receiver<Released>,
    deadline: Instant,
    timeout: Duration,
}

/// A reset in progress: what it found in the storage directory and what it waits for.
pub(super) struct Reset {
    force: bool,
    was_running: bool,
    root: PathBuf,
    /// Every store directory (all of them ours, or [`Self::refused`] says why not).
    stores: Vec<PathBuf>,
    /// Some directory holds a data file of ours.
    has_store: bool,
    /// The slots to drop: the store and its bootstrap record.
    owned: Vec<(PathBuf, BootstrapIntent)>,
    answers: Vec<Option<Result<Option<String>, String>>>,
    release: Option<Release>,
    left: Vec<SlotLeft>,
    refused: Option<ResetError>,
}

impl Reset {
    /// Lists the stores under `root` and reads what each data file is (locally; libmdbx
    /// opens under `guard`). `slot_name` names the slots in advice when a store's record
    /// cannot be read.
    pub(super) fn survey(
        root: &Path,
        slot_name: &str,
        force: bool,
        was_running: bool,
        guard: SpawnGuard,
    ) -> Self {
        let mut reset = Self {
            force,
            was_running,
            root: root.to_owned(),
            stores: Vec::new(),
            has_store: false,
            owned: Vec::new(),
            answers: Vec::new(),
            release: None,
            left: Vec::new(),
            refused: None,
        };
        // Every store: the served one, and a deploy's build or a retired generation the
        // engine had not removed yet.
        let listed = store::active_dir(root).and_then(|active| {
            let mut all = vec![active.clone()];
            all.extend(store::other_stores(root, &active)?);
            Ok(all)
        });
        match listed {
            Ok(stores) => reset.stores = stores,
            Err(e) => {
                reset.refused = Some(e.into());
                return reset;
            }
        }
        let mut not_ours = Vec::new();
        for dir in reset.stores.clone() {
            let mut found = DataFile::Absent;
            guard(&mut || found = store::inspect_data_file(&dir, BootstrapIntent::KEY));
            let record = match found {
                DataFile::Absent => continue,
                DataFile::NotOurs { reason } => {
                    not_ours.push(format!(
                        "{} is not a powersync_mdbx store ({reason})",
                        dir.join(store::STORE_FILES[0]).display()
                    ));
                    continue;
                }
                DataFile::Ours { record, .. } => record,
            };
            reset.has_store = true;
            let unknown = |reason: String| SlotLeft {
                store: dir.display().to_string(),
                slot: None,
                database: None,
                reason,
                drop_by_hand: format!(
                    "look for it in pg_replication_slots on the primary (it is named \
                     \"{}\") and drop it with pg_drop_replication_slot",
                    expected_slot(root, &dir, slot_name)
                ),
            };
            match record.map(|r| r.map(|bytes| BootstrapIntent::decode(&bytes))) {
                // No bootstrap record: the slot is created only after it is written.
                Ok(None) => {}
                Ok(Some(Ok(intent))) => reset.owned.push((dir, intent)),
                Ok(Some(Err(e))) => reset.left.push(unknown(e.to_string())),
                Err(e) => reset
                    .left
                    .push(unknown(format!("its bootstrap record cannot be read: {e}"))),
            }
        }
        if !not_ours.is_empty() {
            reset.refused = Some(ResetError::NotOurs(not_ours));
        }
        reset.answers = vec![None; reset.owned.len()];
        reset
    }

    /// True when slots must be dropped on the primary (the caller then loads the
    /// configuration and calls [`Self::release`] or [`Self::cannot_release`]).
    pub(super) fn needs_primary(&self) -> bool {
        self.refused.is_none() && !self.owned.is_empty()
    }

    /// No slot can be dropped: `reason` for all of them.
    pub(super) fn cannot_release(&mut self, reason: &str) {
        for answer in &mut self.answers {
            *answer = Some(Err(reason.to_owned()));
        }
    }

    /// Starts the release of the slots on a thread of its own (spawned under `guard`),
    /// bounded by `timeout`.
    pub(super) fn release(
        &mut self,
        source: SourceConnection,
        timeout: Duration,
        guard: SpawnGuard,
    ) {
        let (tx, answers) = mpsc::channel();
        let intents: Vec<BootstrapIntent> = self.owned.iter().map(|(_, i)| i.clone()).collect();
        let mut job = Some(move || release_all(&source, &intents, timeout, &tx));
        let mut spawned = None;
        guard(&mut || {
            if let Some(job) = job.take() {
                spawned = Some(
                    std::thread::Builder::new()
                        .name("psm-reset".into())
                        .spawn(job),
                );
            }
        });
        match spawned {
            Some(Ok(_detached)) => {
                self.release = Some(Release {
                    answers,
                    deadline: Instant::now() + timeout + RELEASE_GRACE,
                    timeout,
                });
            }
            Some(Err(e)) => self.cannot_release(&format!("the reset's thread cannot start: {e}")),
            None => self.cannot_release("the reset's thread was not started"),
        }
    }

    /// Takes the release thread's answers; true once every slot is answered for or the
    /// bound has passed (a slot without an answer then counts as not dropped).
    pub(super) fn poll(&mut self) -> bool {
        let Some(release) = &self.release else {
            return true;
        };
        loop {
            match release.answers.try_recv() {
                Ok((index, answer)) => {
                    if let Some(slot) = self.answers.get_mut(index) {
                        *slot = Some(answer);
                    }
                }
                Err(mpsc::TryRecvError::Empty) => {
                    if self.answers.iter().any(Option::is_none) && Instant::now() < release.deadline
                    {
                        return false;
                    }
                    break;
                }
                Err(mpsc::TryRecvError::Disconnected) => break,
            }
        }
        let timeout = release.timeout;
        self.release = None;
        for answer in &mut self.answers {
            answer.get_or_insert_with(|| {
                Err(format!(
                    "the primary did not answer within {} s",
                    timeout.as_secs_f64()
                ))
            });
        }
        true
    }

    /// The reset stopped with the worker before its slots were released.
    pub(super) fn interrupted(self) -> serde_json::Value {
        let error = ResetError::Interrupted;
        tracing::warn!("{error}");
        self.report(&[], None, &[], Some(error.to_string()), None)
    }

    /// Removes the stores, or refuses: the reset's result (`engine_restarted` is the
    /// host's to add).
    pub(super) fn finish(mut self) -> serde_json::Value {
        let mut dropped = Vec::new();
        for ((dir, intent), answer) in self.owned.iter().zip(&self.answers) {
            match answer {
                Some(Ok(Some(slot))) => dropped.push(slot.clone()),
                // Gone already, or a slot of that name on another database: not ours.
                Some(Ok(None)) => {}
                Some(Err(reason)) => self.left.push(SlotLeft {
                    store: dir.display().to_string(),
                    slot: Some(intent.slot.clone()),
                    database: Some(intent.database.clone()),
                    reason: reason.clone(),
                    drop_by_hand: format!("SELECT pg_drop_replication_slot('{}')", intent.slot),
                }),
                None => {}
            }
        }
        if let Some(refused) = self.refused.take() {
            return self.refuse(refused, &dropped);
        }
        if !self.left.is_empty() && !self.force {
            let refused = ResetError::SlotsLeft(self.left.clone());
            return self.refuse(refused, &dropped);
        }
        // The rebuilt data gets new bucket names. Advanced before the files go: a store
        // left in place keeps the generation recorded in its own data.
        let mut generation = None;
        let mut removed = Vec::new();
        let result = self
            .has_store
            .then(|| store::advance_generation(&self.root))
            .transpose()
            .and_then(|g| {
                generation = g;
                for dir in &self.stores {
                    removed.extend(store::remove_store(&self.root, dir)?);
                }
                store::remove_active_file(&self.root)
            });
        let warning = (!self.left.is_empty()).then(|| {
            let warning = ResetError::SlotsLeftForced(self.left.clone()).to_string();
            tracing::warn!("{warning}");
            warning
        });
        let error = result.err().map(|e| e.to_string());
        self.report(&removed, generation, &dropped, error, warning)
    }

    fn refuse(&self, refused: ResetError, dropped: &[String]) -> serde_json::Value {
        let error = refused.to_string();
        tracing::warn!("{error}");
        self.report(&[], None, dropped, Some(error), None)
    }

    fn report(
        &self,
        removed: &[String],
        generation: Option<u64>,
        dropped: &[String],
        error: Option<String>,
        warning: Option<String>,
    ) -> serde_json::Value {
        serde_json::json!({
            "reset": error.is_none(),
            "force": self.force,
            "storage_dir": self.root.display().to_string(),
            "removed_files": removed,
            "bucket_generation": generation,
            "slot_dropped": dropped.first(),
            "slots_dropped": dropped,
            "slots_left": self.left,
            "engine_was_running": self.was_running,
            "error": error,
            "warning": warning,
        })
    }
}

/// The slot a store in `dir` is created with: `slot_name`, `<slot_name>_g<N>` for a
/// deploy's build in `g<N>`.
fn expected_slot(root: &Path, dir: &Path, slot_name: &str) -> String {
    match dir.strip_prefix(root).ok().and_then(|p| p.to_str()) {
        Some(generation) if !generation.is_empty() => format!("{slot_name}_{generation}"),
        _ => slot_name.to_owned(),
    }
}

/// The release thread: drops each slot in turn, answering for each, within `timeout` in
/// all. Runs its own runtime, so nothing of it touches the host's thread.
fn release_all(
    source: &SourceConnection,
    intents: &[BootstrapIntent],
    timeout: Duration,
    answers: &mpsc::Sender<Released>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            for index in 0..intents.len() {
                let _ = answers.send((index, Err(format!("the reset's runtime: {e}"))));
            }
            return;
        }
    };
    runtime.block_on(async {
        let all = async {
            for (index, intent) in intents.iter().enumerate() {
                let answer = replication::release_intent_slot(source, intent)
                    .await
                    .map_err(|e| e.to_string());
                if answers.send((index, answer)).is_err() {
                    return;
                }
            }
        };
        // Past the bound the slots not answered for count as not dropped.
        let _ = tokio::time::timeout(timeout, all).await;
    });
    // A name lookup still running on the blocking pool must not hold this thread.
    runtime.shutdown_background();
}
