//! Managed write checkpoints (spec §9), with the source LSN as the id.
//!
//! `GET /write-checkpoint2.json` records, per user and client, the primary's WAL position
//! at the request (and makes the source emit a logical message so even an idle stream
//! passes it). A connection reports that id as `write_checkpoint` once a published
//! checkpoint's LSN reaches it: every write the client uploaded before asking is then in
//! the data it receives. LSNs only grow, so ids stay monotonic across worker restarts and
//! storage resets, which a per-key counter would not.

use sha2::{Digest, Sha256};
use store::{ReadTxn, StoreError, WriteCheckpointRecord};

/// The start of every request's stage-record key.
pub const RECORD_PREFIX: &str = store::WRITE_CHECKPOINT_PREFIX;

/// Stage-record key of a user's (and client's) latest request: the prefix and the
/// SHA-256 of the length-prefixed ids, in hex. Fixed in length whatever the token's `sub`
/// and the request's `client_id` hold (a store key takes about 2 KB), and unambiguous
/// (user `a/b` without a client is not user `a` with client `b`).
pub fn record_key(user_id: &str, client_id: Option<&str>) -> String {
    let mut hash = Sha256::new();
    hash.update((user_id.len() as u64).to_le_bytes());
    hash.update(user_id.as_bytes());
    match client_id {
        Some(client) => {
            hash.update([1]);
            hash.update(client.as_bytes());
        }
        None => hash.update([0]),
    }
    format!("{RECORD_PREFIX}{:x}", hash.finalize())
}

/// The stored value of a request for `lsn` made now (the writer expires it once it is
/// old, `store::Expiry`).
pub fn record_value(lsn: u64) -> [u8; 16] {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    WriteCheckpointRecord::encode(lsn, now)
}

/// The LSN a user/client last asked for, if any (records of either format).
pub fn requested(view: &ReadTxn<'_, '_>, key: &str) -> Result<Option<u64>, StoreError> {
    Ok(view
        .stage_record(key)?
        .and_then(|bytes| WriteCheckpointRecord::decode(&bytes))
        .map(|record| record.lsn))
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
    fn keys_are_unambiguous_and_any_id_is_recorded() {
        assert_ne!(record_key("a/b", None), record_key("a", Some("b")));
        assert_ne!(record_key("a", None), record_key("a", Some("")));
        assert_eq!(record_key("u", Some("c")), record_key("u", Some("c")));
        let long_user = "u".repeat(100_000);
        let key = record_key(&long_user, Some(&"c".repeat(10_000)));
        assert_eq!(key.len(), RECORD_PREFIX.len() + 64);

        let dir = tempfile::tempdir().unwrap();
        let store = store::Store::open(&dir.path().join("store")).unwrap();
        store.put_stage_record(&key, &record_value(42)).unwrap();
        let got = store.read(|view| requested(view, &key)).unwrap();
        assert_eq!(got, Some(42));
        // A record of an earlier build (the LSN alone) still reads.
        store.put_stage_record(&key, &43u64.to_le_bytes()).unwrap();
        let got = store.read(|view| requested(view, &key)).unwrap();
        assert_eq!(got, Some(43));
    }

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
