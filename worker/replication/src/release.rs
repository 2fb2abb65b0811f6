//! Releasing what a store owns on the primary, for `powersync_mdbx.reset()` and for a
//! generation a rules deploy leaves behind.

use crate::error::ReplicationError;
use crate::intent::BootstrapIntent;
use config::SourceConnection;
use source::{connect, drop_slot, slot_info};

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
