//! Write-checkpoint requests (`GET /write-checkpoint2.json`): one stage record per user
//! and client under [`WRITE_CHECKPOINT_PREFIX`], holding the source LSN asked for and when
//! it was asked. The sync service writes and reads them; the single writer expires old
//! ones ([`super::WriteTxn::expire_write_checkpoints`]), so clients that invent client ids
//! cannot grow the store without bound.

/// The start of every request's stage-record key.
pub const WRITE_CHECKPOINT_PREFIX: &str = "write_checkpoint/";

/// One stored request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteCheckpointRecord {
    /// The source LSN a checkpoint must reach before the request is acknowledged.
    pub lsn: u64,
    /// Unix seconds when it was asked; `None` for a record of a build that did not record
    /// the time (8 bytes: the LSN alone).
    pub requested_at: Option<u64>,
    /// The id the stream reports once a checkpoint reaches `lsn`: the LSN itself for
    /// `GET /write-checkpoint2.json`, possibly more for `POST /sync/checkpoint-request`,
    /// whose ids the client picks (`service::write_checkpoint`).
    pub id: u64,
}

impl WriteCheckpointRecord {
    /// The stored value of a request whose id is its LSN: the LSN and the time,
    /// little-endian.
    pub fn encode(lsn: u64, requested_at: u64) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&lsn.to_le_bytes());
        out[8..].copy_from_slice(&requested_at.to_le_bytes());
        out
    }

    /// The stored value of any request: [`Self::encode`]'s when the id is the LSN, else
    /// the id after it (24 bytes).
    pub fn encode_with_id(lsn: u64, requested_at: u64, id: u64) -> Vec<u8> {
        let mut out = Self::encode(lsn, requested_at).to_vec();
        if id != lsn {
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// A stored value of any format; `None` when it is none.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let lsn = word(0)?;
        match bytes.len() {
            8 => Some(Self {
                lsn,
                requested_at: None,
                id: lsn,
            }),
            16 => Some(Self {
                lsn,
                requested_at: Some(word(8)?),
                id: lsn,
            }),
            24 => Some(Self {
                lsn,
                requested_at: Some(word(8)?),
                id: word(16)?,
            }),
            _ => None,
        }
    }
}

/// What one expiry pass may remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// Unix seconds now (injected: tests move the clock).
    pub now: u64,
    /// A request older than this many seconds may go.
    pub max_age: u64,
    /// Only requests at or below this LSN go: every checkpoint published since has
    /// reported them, so no connected client still waits for one.
    pub reached_lsn: u64,
    /// Records looked at in this pass, at most (bounds the transaction).
    pub budget: usize,
}

/// What one expiry pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpiryPass {
    /// Records looked at.
    pub examined: usize,
    /// Records removed.
    pub expired: usize,
    /// Records of the earlier format given the pass's time (they expire one age later).
    pub stamped: usize,
    /// Where the next pass continues, when the budget ran out before the last record.
    pub resume: Option<Vec<u8>>,
}
