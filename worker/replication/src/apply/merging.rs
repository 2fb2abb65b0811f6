//! The applier's merge of a table's re-copy events, between transactions (see `merge`).

use super::Applier;
use crate::copied::RecopyEvent;
use crate::error::ReplicationError;
use crate::intent::BootstrapIntent;
use crate::table::table_at;

impl Applier {
    /// Merges an event of a table's re-copy, between transactions: each in a store write
    /// of its own (held with the stream's, for a re-copy that holds them: `publish`).
    pub(super) fn merge(&mut self, event: RecopyEvent) -> Result<(), ReplicationError> {
        if matches!(event, RecopyEvent::Rows { .. }) {
            // Its room is free once it is here (merged now, or of a re-copy started over).
            self.handover.merged();
        }
        let index = event.table();
        let Some(mut merge) = self.merges.remove(&index) else {
            return Ok(()); // a re-copy that was started over
        };
        let lsn = self.applied.lsn;
        let result = match event {
            RecopyEvent::Started {
                consistent_point,
                columns,
                partitions,
                ..
            } => {
                let table = table_at(&self.tables, index)?;
                let mut shape = table.with_columns(columns, &self.rules).ok_or_else(|| {
                    ReplicationError::Stream {
                        code: "PSM_R2002",
                        message: format!(
                            "table {} lost a replica identity column ({}) on the primary; \
                             nothing of the new shape was applied: run SELECT \
                             powersync_mdbx.reset()",
                            table.qualified(),
                            table.identity_names.join(", ")
                        ),
                        operator: true,
                    }
                })?;
                // What the copy read, recorded with it once merged.
                shape.partitions = partitions;
                merge.start(consistent_point, shape);
                Ok(None)
            }
            RecopyEvent::Rows {
                rows, unchanged, ..
            } => self
                .store
                .write_with(lsn, |w| merge.rows(w, rows, unchanged))
                .map(|((), checkpoint)| Some(checkpoint)),
            RecopyEvent::Done { .. } => {
                let written = self.store.write_with(lsn, |w| {
                    // Taken before the merge ends, which lets go of the copy.
                    let copied = merge
                        .shape()
                        .map(|s| (s.store_id, s.columns.clone(), s.partitions.clone()));
                    let merged = merge.finish(w)?;
                    if let Some((store_id, columns, partitions)) = copied {
                        BootstrapIntent::update_table(w, store_id, |t| {
                            t.columns = columns;
                            t.partitions = partitions;
                            t.recopy = false;
                            t.rekey_from.clear();
                        })?;
                    }
                    Ok::<_, ReplicationError>(merged)
                });
                let (merged, checkpoint) = written?;
                let table = table_at(&self.tables, index)?;
                tracing::info!(
                    table = %table.qualified(),
                    rows = merged.rows,
                    written = merged.written,
                    deleted = merged.deleted,
                    "the table's re-copy is merged: clients got ops only for rows whose output changed"
                );
                return self.publish(checkpoint);
            }
        };
        self.merges.insert(index, merge);
        match result? {
            Some(checkpoint) => self.publish(checkpoint),
            None => Ok(()),
        }
    }
}
