//! Releasing what a store owns on the primary, for `powersync_mdbx.reset()`.

use std::path::Path;

use super::{BootstrapIntent, ReplicationError};
use crate::config::SourceConnection;
use crate::source::{connect, drop_slot, slot_info};
use crate::store::Store;

/// Drops the replication slot recorded in the store at `dir`, if the store holds a
/// bootstrap record and the slot exists, is idle and decodes the recorded database.
/// Returns the slot dropped. A store that cannot be opened (foreign, damaged) owns nothing.
pub async fn release_slot(
    conn: &SourceConnection,
    dir: &Path,
) -> Result<Option<String>, ReplicationError> {
    if !dir.join(crate::store::STORE_FILES[0]).exists() {
        return Ok(None);
    }
    let intent = match Store::open(dir) {
        Ok(store) => store.read(|view| Ok(BootstrapIntent::load(view)))??,
        // Foreign, damaged or unopenable storage records no slot of ours.
        Err(_) => return Ok(None),
    };
    let Some(intent) = intent else {
        return Ok(None);
    };
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
    Ok(Some(intent.slot))
}
