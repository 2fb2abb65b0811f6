//! Managed write checkpoints (`docs/spec/protocol.md` §9), with the source LSN as the id.
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

/// The record a request for `lsn` makes of the `stored` one, and its id: the largest of
/// the stored id, `asked` (a checkpoint request's client-chosen id) and `lsn`, so a key's
/// ids never go back, and an id this service hands out is never below an LSN it reported
/// before (a connection's first line may report its checkpoint's LSN, see [`to_report`]).
/// The writer expires it once it is old (`store::Expiry`).
pub fn next_record(stored: Option<&[u8]>, lsn: u64, asked: Option<u64>) -> (Vec<u8>, u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let stored = stored.and_then(WriteCheckpointRecord::decode);
    let id = lsn.max(asked.unwrap_or(0)).max(stored.map_or(0, |s| s.id));
    let lsn = lsn.max(stored.map_or(0, |s| s.lsn));
    (WriteCheckpointRecord::encode_with_id(lsn, now, id), id)
}

/// The request a user/client last made, if any (records of every format).
pub fn requested(
    view: &ReadTxn<'_, '_>,
    key: &str,
) -> Result<Option<WriteCheckpointRecord>, StoreError> {
    Ok(view
        .stage_record(key)?
        .and_then(|bytes| WriteCheckpointRecord::decode(&bytes)))
}

/// What a connection reports at a checkpoint of `checkpoint_lsn`.
///
/// The recorded request's id once the checkpoint reaches its LSN. Without a reached
/// request: the value reported before (never going back to "absent", which would only
/// cause an extra line), or — on a connection's first line — the checkpoint's own LSN,
/// which truthfully covers every write committed before it (this also acknowledges
/// requests recorded before a restart or reset that lost them; ids are never below it,
/// [`next_record`]).
pub fn to_report(
    requested: Option<WriteCheckpointRecord>,
    checkpoint_lsn: u64,
    reported: Option<u64>,
) -> Option<u64> {
    match requested {
        Some(r) if r.lsn <= checkpoint_lsn => Some(r.id.max(reported.unwrap_or(0))),
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
        store
            .put_stage_record(&key, &next_record(None, 42, None).0)
            .unwrap();
        let got = store.read(|view| requested(view, &key)).unwrap().unwrap();
        assert_eq!((got.lsn, got.id), (42, 42));
        // A record of an earlier build (the LSN alone) still reads.
        store.put_stage_record(&key, &43u64.to_le_bytes()).unwrap();
        let got = store.read(|view| requested(view, &key)).unwrap().unwrap();
        assert_eq!((got.lsn, got.id), (43, 43));
    }

    fn record(lsn: u64, id: u64) -> Option<WriteCheckpointRecord> {
        WriteCheckpointRecord::decode(&WriteCheckpointRecord::encode_with_id(lsn, 0, id))
    }

    #[test]
    fn a_request_is_reported_once_reached_and_never_retracted() {
        // First line, nothing requested: the checkpoint's LSN.
        assert_eq!(to_report(None, 100, None), Some(100));
        // A request above the checkpoint: keep what was reported.
        assert_eq!(to_report(record(150, 150), 120, Some(100)), Some(100));
        // Reached.
        assert_eq!(to_report(record(150, 150), 160, Some(100)), Some(150));
        // A checkpoint request's id, reported once its LSN is reached.
        assert_eq!(to_report(record(150, 900), 149, Some(100)), Some(100));
        assert_eq!(to_report(record(150, 900), 150, Some(100)), Some(900));
        // An empty source (LSN 0) reports nothing.
        assert_eq!(to_report(None, 0, None), None);
    }

    #[test]
    fn ids_never_go_back_and_never_fall_below_the_lsn() {
        let id = |stored: Option<&[u8]>, lsn, asked| next_record(stored, lsn, asked).1;
        // write-checkpoint2: the LSN; a checkpoint request: at least the LSN, so no LSN a
        // first line reported earlier exceeds it.
        assert_eq!(id(None, 500, None), 500);
        assert_eq!(id(None, 500, Some(3)), 500);
        assert_eq!(id(None, 500, Some(9_000)), 9_000);
        // A stored id above: kept (a stale or repeated request gets the stored one back).
        let (stored, _) = next_record(None, 500, Some(9_000));
        assert_eq!(id(Some(&stored), 600, Some(10)), 9_000);
        let (again, _) = next_record(Some(&stored), 600, Some(10));
        let record = WriteCheckpointRecord::decode(&again).unwrap();
        assert_eq!((record.lsn, record.id), (600, 9_000));
        assert_eq!(id(Some(&again), 700, Some(9_001)), 9_001);
    }
}
