//! The checkpoint record: the last op id committed and the source LSN applied with it.

use crate::codec::fixed;

/// A consistent point clients can sync to: every op up to `op_id` is committed, and the
/// source is applied up to `lsn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Checkpoint {
    /// Last op id committed.
    pub op_id: u64,
    /// Source LSN applied.
    pub lsn: u64,
}

impl Checkpoint {
    pub(crate) fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.op_id.to_le_bytes());
        out[8..].copy_from_slice(&self.lsn.to_le_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        Some(Self {
            op_id: u64::from_le_bytes(fixed(bytes, 0, "checkpoint").ok()?),
            lsn: u64::from_le_bytes(fixed(bytes, 8, "checkpoint").ok()?),
        })
    }
}
