//! Releasing what a store owns on the primary, for `powersync_mdbx.reset()` and for a
//! generation a rules deploy leaves behind.

use std::path::Path;

use super::{BootstrapIntent, ReplicationError};
use config::SourceConnection;
use source::{connect, drop_slot, slot_info};
use store::{stage_record_of_any_format, Store, StoreError};

/// Drops the replication slot recorded in the store at `dir`, if the store holds a
/// bootstrap record and the slot exists, is idle and decodes the recorded database.
/// Returns the slot dropped. A store that cannot be opened (foreign, damaged) owns nothing.
pub async fn release_slot(
    conn: &SourceConnection,
    dir: &Path,
) -> Result<Option<String>, ReplicationError> {
    if !dir.join(store::STORE_FILES[0]).exists() {
        return Ok(None);
    }
    let intent = match Store::open(dir) {
        Ok(store) => store.read(|view| Ok(BootstrapIntent::load(view)))?,
        // A store of another format (an upgrade) still names its slot.
        Err(StoreError::Incompatible { .. }) => {
            match stage_record_of_any_format(dir, BootstrapIntent::KEY)? {
                Some(bytes) => BootstrapIntent::decode(&bytes).map(Some),
                None => Ok(None),
            }
        }
        // Foreign, damaged or unopenable storage records no slot of ours.
        Err(_) => return Ok(None),
    };
    let intent = match intent {
        Ok(Some(intent)) => intent,
        Ok(None) => return Ok(None),
        // An unreadable record names no slot we could check: the files still go.
        Err(e) => {
            tracing::warn!("{e}; the reset removes the store but cannot tell which slot it owned");
            return Ok(None);
        }
    };
    release_intent_slot(conn, &intent).await
}

/// Drops the slot `intent` records, if it exists, is idle and decodes the recorded
/// database (a slot of that name on another database is not ours). Returns the slot
/// dropped.
pub async fn release_intent_slot(
    conn: &SourceConnection,
    intent: &BootstrapIntent,
) -> Result<Option<String>, ReplicationError> {
    let client = connect(conn).await?;
    let Some(slot) = slot_info(&client, &intent.slot).await? else {
        return Ok(None);
    };
    if slot.active {
        return Err(ReplicationError::Ownership {
            code: "PSM_B1005",
            message: format!(
                "replication slot \"{}\" is in use by another process; nothing was reset",
                intent.slot
            ),
        });
    }
    if slot.database.as_deref() != Some(intent.database.as_str()) {
        return Ok(None);
    }
    drop_slot(&client, &intent.slot).await?;
    Ok(Some(intent.slot.clone()))
}
