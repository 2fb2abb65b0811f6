//! The stored form of a row record: `varint(head length) · head · packed outputs`.
//!
//! The head (table, memberships, lookups, stash) is small and changes with
//! every write; it stays raw. The outputs (object type, id and data JSON) are most of the
//! bytes, compress well and are all a reader needs; the record codec packs them apart, so
//! the snapshot's evaluator threads can compress them before the one writer sees the row
//! ([`super::PreparedRow`]), and readers of PUT ops never decode the head.

use std::borrow::Cow;

use super::codec::{Corrupt, Reader, Writer};
use super::compress::RecordCodec;
use super::record::{decode_outputs, head_table_id, Output, RowRecord};

const WHAT: &str = "stored row";

/// Joins a head and packed outputs into the stored form.
pub(super) fn join(head: &[u8], packed_outputs: &[u8]) -> Vec<u8> {
    let mut w = Writer::with_capacity(head.len() + packed_outputs.len() + 3);
    w.bytes(head).raw(packed_outputs);
    w.finish()
}

/// The head and the packed outputs of a stored row.
fn split(stored: &[u8]) -> Result<(&[u8], &[u8]), Corrupt> {
    let mut r = Reader::new(stored, WHAT);
    let head = r.bytes()?;
    let rest = stored
        .get(stored.len() - r.remaining()..)
        .unwrap_or_default();
    Ok((head, rest))
}

/// The unpacked outputs section of a stored row.
fn outputs<'a>(codec: &RecordCodec, packed: &'a [u8]) -> Result<Cow<'a, [u8]>, Corrupt> {
    codec.unpack(packed)
}

/// Decodes a whole stored row.
pub(super) fn decode(codec: &RecordCodec, stored: &[u8]) -> Result<RowRecord, Corrupt> {
    let (head, packed) = split(stored)?;
    RowRecord::decode(head, &outputs(codec, packed)?)
}

/// The source table id and output `index` of a stored row (what a PUT op shows).
pub(super) fn output(
    codec: &RecordCodec,
    stored: &[u8],
    index: u8,
) -> Result<(u32, Output), Corrupt> {
    let (head, packed) = split(stored)?;
    let table_id = head_table_id(head)?;
    let output = decode_outputs(&outputs(codec, packed)?)?
        .into_iter()
        .nth(usize::from(index))
        .ok_or(Corrupt { what: WHAT })?;
    Ok((table_id, output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::Packer;
    use crate::record::{LookupRef, Membership};

    #[test]
    fn stored_rows_round_trip_and_reject_damage() {
        let record = RowRecord {
            table_id: 3,
            outputs: vec![Output {
                object_type: "tasks".into(),
                object_id: "t1".into(),
                data: "{\"id\":\"t1\"}".into(),
            }],
            memberships: vec![Membership {
                bucket_id: 1,
                op_id: 9,
                output: 0,
            }],
            lookups: vec![LookupRef {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            }],
            stash: Vec::new(),
        };
        let codec = RecordCodec::raw();
        let stored = join(
            &record.encode_head(),
            &Packer::raw().pack(&record.encode_outputs()),
        );
        assert_eq!(decode(&codec, &stored).unwrap(), record);
        let (table, output) = output(&codec, &stored, 0).unwrap();
        assert_eq!((table, &output), (3, &record.outputs[0]));
        assert!(super::output(&codec, &stored, 1).is_err());
        for cut in 0..stored.len() {
            assert!(decode(&codec, &stored[..cut]).is_err(), "cut {cut}");
        }
    }
}
