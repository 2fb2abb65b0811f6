//! Expiring old write-checkpoint requests, inside the single writer's transaction.

use libmdbx::WriteFlags;

use super::txn::WriteTxn;
use crate::write_checkpoints::{
    Expiry, ExpiryPass, WriteCheckpointRecord, WRITE_CHECKPOINT_PREFIX,
};
use crate::StoreError;

impl WriteTxn<'_, '_> {
    /// Removes write-checkpoint requests older than `expiry.max_age` whose LSN was
    /// reached, looking at no more than `expiry.budget` records from `from` (a previous
    /// pass's [`ExpiryPass::resume`]) on. A record of the earlier format (no time) is
    /// given `expiry.now`; one that does not decode is removed.
    pub fn expire_write_checkpoints(
        &self,
        expiry: &Expiry,
        from: Option<&[u8]>,
    ) -> Result<ExpiryPass, StoreError> {
        let prefix = format!("stage.{WRITE_CHECKPOINT_PREFIX}");
        let start = from.map_or_else(|| prefix.as_bytes().to_vec(), <[u8]>::to_vec);
        let mut found: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut more = false;
        {
            let mut cursor = self
                .txn
                .cursor(&self.tables.meta)
                .map_err(self.mdbx("open a cursor"))?;
            let mut item = cursor
                .set_range::<Vec<u8>, Vec<u8>>(&start)
                .map_err(self.mdbx("read write checkpoints"))?;
            while let Some((key, value)) = item {
                if !key.starts_with(prefix.as_bytes()) {
                    break;
                }
                if found.len() == expiry.budget {
                    more = true;
                    break;
                }
                found.push((key, value));
                item = cursor.next().map_err(self.mdbx("read write checkpoints"))?;
            }
        }
        let mut pass = ExpiryPass {
            examined: found.len(),
            ..ExpiryPass::default()
        };
        for (key, value) in &found {
            match WriteCheckpointRecord::decode(value) {
                Some(WriteCheckpointRecord {
                    lsn,
                    requested_at: None,
                    ..
                }) => {
                    let stamped = WriteCheckpointRecord::encode(lsn, expiry.now);
                    self.txn
                        .put(&self.tables.meta, key, stamped, WriteFlags::UPSERT)
                        .map_err(self.mdbx("stamp a write checkpoint"))?;
                    pass.stamped += 1;
                }
                Some(WriteCheckpointRecord {
                    lsn,
                    requested_at: Some(at),
                    ..
                }) if at.saturating_add(expiry.max_age) > expiry.now
                    || lsn > expiry.reached_lsn => {}
                _ => {
                    self.txn
                        .del(&self.tables.meta, key, None)
                        .map_err(self.mdbx("expire a write checkpoint"))?;
                    pass.expired += 1;
                }
            }
        }
        if more {
            // Strictly after the last record looked at.
            pass.resume = found.last().map(|(key, _)| {
                let mut next = key.clone();
                next.push(0);
                next
            });
        }
        Ok(pass)
    }
}
