//! A replica started on empty storage with `powersync_mdbx.seed_from` fills its store
//! with a copy of that peer's store (`replication::seed`) before the engine opens it for
//! serving, so both replicas continue one history; errors that may pass (the peer not up,
//! not caught up, busy with a re-copy) are retried with backoff while `status()` shows the
//! phase `seeding` and the error.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;

use super::generation::{slot_for, OpenedStore, RETRY_MAX, RETRY_MIN};
use super::EngineError;
use config::SourceConnection;
use replication::{Progress, SeedSource, SourcePlan};
use rules::{BucketVersion, SyncRules};
use status::{ErrorReport, Phase, StatusCell};

/// What seeding needs besides the peer.
pub(super) struct SeedTarget<'a> {
    pub root: &'a Path,
    pub slot_base: &'a str,
    pub connection: &'a SourceConnection,
    pub rules_text: &'a str,
}

/// Seeds the served store from `from` unless it is complete already. Returns false when
/// the engine was stopped meanwhile. The store is closed again when this returns: the
/// engine opens it as usual, with the history the copy brought.
pub(super) async fn seed_unless_complete(
    target: SeedTarget<'_>,
    from: &SeedSource,
    status: &StatusCell,
    mut stop: watch::Receiver<bool>,
) -> Result<bool, EngineError> {
    let root = target.root.to_owned();
    let active_dir = tokio::task::spawn_blocking(move || store::active_dir(&root))
        .await
        .map_err(|e| EngineError::Thread(std::io::Error::other(e)))??;
    let opened = OpenedStore::open(active_dir.clone()).await?;
    if opened.is_complete() {
        return Ok(true);
    }
    let number = match &opened.intent {
        Some(intent) => intent.generation,
        None => {
            let root = target.root.to_owned();
            tokio::task::spawn_blocking(move || store::next_generation(&root))
                .await
                .map_err(|e| EngineError::Thread(std::io::Error::other(e)))??
        }
    };
    let rules_hash = SyncRules::parse_with_version(target.rules_text, BucketVersion::Unversioned)?
        .content_hash_hex();
    let plan = SourcePlan {
        connection: target.connection.clone(),
        slot: slot_for(target.slot_base, target.root, &active_dir, number),
    };
    // Seeding opens the store itself: it closes it to put the copy in its place.
    drop(opened);
    let progress = Arc::new(Progress::default());
    let mut backoff = RETRY_MIN;
    loop {
        status.update(|s| s.phase = Phase::Seeding);
        let attempt = replication::seed(
            &plan,
            from,
            target.rules_text,
            &rules_hash,
            number,
            &active_dir,
            progress.clone(),
        );
        let outcome = tokio::select! {
            outcome = attempt => outcome,
            _ = stop.wait_for(|s| *s) => return Ok(false),
        };
        match outcome {
            Ok(_) => {
                status.update(|s| s.last_error = None);
                return Ok(true);
            }
            Err(e) if e.needs_operator() || e.needs_restart() => return Err(e.into()),
            Err(e) => {
                tracing::warn!("{e}; retrying in {backoff:?}");
                status.update(|s| s.last_error = Some(ErrorReport::new(e.to_string(), false)));
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => return Ok(false),
                }
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}
