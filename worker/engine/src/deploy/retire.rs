//! Retiring a generation that no longer serves: its slot dropped, its files removed once
//! no stream reads it any more.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{blocking, Generations, STOP_GRACE};
use crate::generation::Generation;
use config::SourceConnection;
use replication::{release_intent_slot, BootstrapIntent};
use store::Store;

/// How long a retired generation waits for the streams still reading it.
const RETIRE_WAIT: Duration = Duration::from_secs(600);

impl Generations {
    /// Retires `generation` in the background: its slot is dropped at once (its
    /// replication has stopped), its files once no stream reads it any more.
    pub(super) fn retire(&mut self, generation: Generation) {
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
    pub(super) fn retire_dir(&mut self, dir: PathBuf) {
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
