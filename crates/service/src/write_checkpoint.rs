//! Managed write checkpoints (spec §9), with the source LSN as the id.
//!
//! `GET /write-checkpoint2.json` records, per user and client, the primary's WAL position
//! at the request (and makes the source emit a logical message so even an idle stream
//! passes it). A connection reports that id as `write_checkpoint` once a published
//! checkpoint's LSN reaches it: every write the client uploaded before asking is then in
//! the data it receives. LSNs only grow, so ids stay monotonic across worker restarts and
//! storage resets, which a per-key counter would not.

use store::{ReadTxn, StoreError};

/// The start of every request's stage-record key.
pub const RECORD_PREFIX: &str = "write_checkpoint/";

/// Stage-record key of a user's (and client's) latest request.
pub fn record_key(user_id: &str, client_id: Option<&str>) -> String {
    match client_id {
        Some(client) => format!("{RECORD_PREFIX}{user_id}/{client}"),
        None => format!("{RECORD_PREFIX}{user_id}"),
    }
}

/// The LSN a user/client last asked for, if any.
pub fn requested(view: &ReadTxn<'_, '_>, key: &str) -> Result<Option<u64>, StoreError> {
    Ok(view.stage_record(key)?.and_then(|bytes| {
        let array: [u8; 8] = bytes.as_slice().try_into().ok()?;
        Some(u64::from_le_bytes(array))
    }))
}

/// What a connection reports at a checkpoint of `checkpoint_lsn`.
///
/// The recorded request once the checkpoint reaches it. Without a reached request: the
/// value reported before (never going back to "absent", which would only cause an extra
/// line), or — on a connection's first line — the checkpoint's own LSN, which truthfully
/// covers every write committed before it (this also acknowledges requests recorded
/// before a restart or reset that lost them).
pub fn to_report(
    requested: Option<u64>,
    checkpoint_lsn: u64,
    reported: Option<u64>,
) -> Option<u64> {
    match requested {
        Some(lsn) if lsn <= checkpoint_lsn => Some(lsn.max(reported.unwrap_or(0))),
        _ => reported.or(Some(checkpoint_lsn).filter(|&l| l > 0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_reported_once_reached_and_never_retracted() {
        // First line, nothing requested: the checkpoint's LSN.
        assert_eq!(to_report(None, 100, None), Some(100));
        // A request above the checkpoint: keep what was reported.
        assert_eq!(to_report(Some(150), 120, Some(100)), Some(100));
        // Reached.
        assert_eq!(to_report(Some(150), 160, Some(100)), Some(150));
        // An empty source (LSN 0) reports nothing.
        assert_eq!(to_report(None, 0, None), None);
    }
}
