//! Bucket operations as stored: a fixed 24-byte record per op, in op id order within its
//! bucket's blocks ([`super::op_blocks`]).

use super::codec::{fixed, Corrupt};

/// What an op does for a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum OpKind {
    /// The row's current data (resolved from the row record at read time).
    Put,
    /// The row left the bucket (object identity kept in a tombstone).
    Remove,
    /// A superseded PUT or REMOVE: only its checksum remains.
    Move,
    /// A compacted prefix of the bucket: the sum of the checksums it replaced.
    Clear,
}

impl OpKind {
    fn code(self) -> u8 {
        match self {
            Self::Put => 1,
            Self::Remove => 2,
            Self::Move => 3,
            Self::Clear => 4,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::Put,
            2 => Self::Remove,
            3 => Self::Move,
            4 => Self::Clear,
            _ => return None,
        })
    }
}

/// One stored op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredOp {
    /// Global op id.
    pub op_id: u64,
    /// Kind.
    pub kind: OpKind,
    /// PUT: which output of the row record. Otherwise 0.
    pub output: u8,
    /// The op's checksum (kept unchanged when it becomes MOVE).
    pub checksum: u32,
    /// PUT: row id. REMOVE: row id the tombstone is keyed with. MOVE/CLEAR: target op id
    /// (the op that superseded it; a client at a checkpoint below it must not complete).
    pub reference: u64,
}

/// Size of the encoded op.
pub const OP_BYTES: usize = 24;

impl StoredOp {
    /// Big-endian op id first, so byte order is op order.
    pub fn encode(&self) -> [u8; OP_BYTES] {
        let mut out = [0u8; OP_BYTES];
        out[..8].copy_from_slice(&self.op_id.to_be_bytes());
        out[8] = self.kind.code();
        out[9] = self.output;
        out[12..16].copy_from_slice(&self.checksum.to_le_bytes());
        out[16..24].copy_from_slice(&self.reference.to_le_bytes());
        out
    }

    /// Decodes a stored op.
    pub fn decode(bytes: &[u8]) -> Result<Self, Corrupt> {
        const WHAT: &str = "bucket op";
        if bytes.len() != OP_BYTES {
            return Err(Corrupt { what: WHAT });
        }
        let kind_code = fixed::<1>(bytes, 8, WHAT)?[0];
        Ok(Self {
            op_id: u64::from_be_bytes(fixed(bytes, 0, WHAT)?),
            kind: OpKind::from_code(kind_code).ok_or(Corrupt { what: WHAT })?,
            output: fixed::<1>(bytes, 9, WHAT)?[0],
            checksum: u32::from_le_bytes(fixed(bytes, 12, WHAT)?),
            reference: u64::from_le_bytes(fixed(bytes, 16, WHAT)?),
        })
    }
}

/// Per-bucket accumulators over every op ever added (count and checksum include ops later
/// turned into MOVE/CLEAR, which keep their checksums).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketState {
    /// Internal id, the key of its ops.
    pub id: u32,
    /// Number of ops (a CLEAR counts as one; compaction lowers it).
    pub count: u64,
    /// Sum of op checksums modulo 2^32.
    pub checksum: u32,
    /// Largest op id in the bucket.
    pub last_op: u64,
}

impl BucketState {
    /// Encoded size.
    pub const BYTES: usize = 24;

    /// Fixed little-endian encoding.
    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..4].copy_from_slice(&self.id.to_le_bytes());
        out[4..8].copy_from_slice(&self.checksum.to_le_bytes());
        out[8..16].copy_from_slice(&self.count.to_le_bytes());
        out[16..24].copy_from_slice(&self.last_op.to_le_bytes());
        out
    }

    /// Decodes the accumulators.
    pub fn decode(bytes: &[u8]) -> Result<Self, Corrupt> {
        const WHAT: &str = "bucket state";
        if bytes.len() != Self::BYTES {
            return Err(Corrupt { what: WHAT });
        }
        Ok(Self {
            id: u32::from_le_bytes(fixed(bytes, 0, WHAT)?),
            checksum: u32::from_le_bytes(fixed(bytes, 4, WHAT)?),
            count: u64::from_le_bytes(fixed(bytes, 8, WHAT)?),
            last_op: u64::from_le_bytes(fixed(bytes, 16, WHAT)?),
        })
    }

    /// Adds one op.
    pub fn add(&mut self, op_id: u64, checksum: u32) {
        self.count += 1;
        self.checksum = self.checksum.wrapping_add(checksum);
        self.last_op = self.last_op.max(op_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip_and_sort_by_op_id() {
        let a = StoredOp {
            op_id: 255,
            kind: OpKind::Put,
            output: 2,
            checksum: u32::MAX,
            reference: 7,
        };
        let b = StoredOp {
            op_id: 256,
            kind: OpKind::Move,
            output: 0,
            checksum: 1,
            reference: 300,
        };
        assert_eq!(StoredOp::decode(&a.encode()).unwrap(), a);
        assert_eq!(StoredOp::decode(&b.encode()).unwrap(), b);
        assert!(a.encode() < b.encode());
        assert!(StoredOp::decode(&[0; 23]).is_err());
        let mut bad = a.encode();
        bad[8] = 9;
        assert!(StoredOp::decode(&bad).is_err());
        let s = BucketState {
            id: 3,
            count: 10,
            checksum: 99,
            last_op: 12,
        };
        assert_eq!(BucketState::decode(&s.encode()).unwrap(), s);
    }
}
