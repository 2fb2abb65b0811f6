//! The row record: one per source row, holding its distinct outputs once (however many
//! buckets it is in), its bucket memberships with the op that put it there, and the
//! parameter-lookup entries it wrote.

use super::codec::{Corrupt, Reader, Writer};

/// One distinct `(object_type, object_id, data)` the row produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Output table name.
    pub object_type: String,
    /// Row id text.
    pub object_id: String,
    /// The exact data JSON string.
    pub data: String,
}

/// The row is in a bucket through the PUT `op_id`, showing output `output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Membership {
    /// Bucket id.
    pub bucket_id: u32,
    /// The PUT op.
    pub op_id: u64,
    /// Index into the record's outputs.
    pub output: u8,
}

/// A lookup entry the row wrote (key and the exact dup value, so it can be removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupRef {
    /// Lookup key bytes.
    pub key: Vec<u8>,
    /// The stored value (row id prefix + outputs).
    pub value: Vec<u8>,
}

/// Everything the store keeps about one source row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RowRecord {
    /// Source table id (the store's own numbering).
    pub table_id: u32,
    /// Distinct outputs.
    pub outputs: Vec<Output>,
    /// Current bucket memberships.
    pub memberships: Vec<Membership>,
    /// Lookup entries written for this row.
    pub lookups: Vec<LookupRef>,
    /// Source values kept because the primary may send them later as "unchanged TOAST"
    /// (column name, text value); empty for rows too small to be TOASTed.
    pub stash: Vec<(String, Vec<u8>)>,
}

const WHAT: &str = "row record";

impl RowRecord {
    /// The record's head: everything but the outputs (see [`super::stored_row`]).
    pub fn encode_head(&self) -> Vec<u8> {
        encode_head(self.table_id, &self.memberships, &self.lookups, &self.stash)
    }

    /// The record's outputs section.
    pub fn encode_outputs(&self) -> Vec<u8> {
        encode_outputs(self.outputs.iter().map(|o| {
            (
                o.object_type.as_str(),
                o.object_id.as_str(),
                o.data.as_str(),
            )
        }))
    }

    /// Decodes a record from its head and its (unpacked) outputs section.
    pub fn decode(head: &[u8], outputs: &[u8]) -> Result<Self, Corrupt> {
        let outputs = decode_outputs(outputs)?;
        let mut r = Reader::new(head, WHAT);
        let small = |v: u64| u32::try_from(v).map_err(|_| Corrupt { what: WHAT });
        let table_id = small(r.varint()?)?;
        let n = r.varint()?;
        let mut memberships = Vec::new();
        let mut op_id = 0u64;
        for _ in 0..n {
            let bucket_id = small(r.varint()?)?;
            op_id = op_id.wrapping_add(unzigzag(r.varint()?));
            let output = u8::try_from(r.varint()?).map_err(|_| Corrupt { what: WHAT })?;
            if usize::from(output) >= outputs.len() {
                return Err(Corrupt { what: WHAT });
            }
            memberships.push(Membership {
                bucket_id,
                op_id,
                output,
            });
        }
        let n = r.varint()?;
        let mut lookups = Vec::new();
        for _ in 0..n {
            lookups.push(LookupRef {
                key: r.bytes()?.to_vec(),
                value: r.bytes()?.to_vec(),
            });
        }
        let mut stash = Vec::new();
        if !r.is_empty() {
            let n = r.varint()?;
            for _ in 0..n {
                stash.push((r.str()?.to_owned(), r.bytes()?.to_vec()));
            }
        }
        if !r.is_empty() {
            return Err(Corrupt { what: WHAT });
        }
        Ok(Self {
            table_id,
            outputs,
            memberships,
            lookups,
            stash,
        })
    }
}

/// Encodes a record head: table id, memberships (each op id as the difference to the
/// previous one: a row's ops are usually consecutive), lookups and the optional trailing
/// stash (records without one end after the lookups). The replica identity is not kept:
/// the row-key table maps it to the row, and nothing needs the way back.
pub fn encode_head(
    table_id: u32,
    memberships: &[Membership],
    lookups: &[LookupRef],
    stash: &[(String, Vec<u8>)],
) -> Vec<u8> {
    let size = 8
        + memberships.len() * 12
        + lookups
            .iter()
            .map(|l| l.key.len() + l.value.len() + 4)
            .sum::<usize>()
        + stash
            .iter()
            .map(|(n, v)| n.len() + v.len() + 4)
            .sum::<usize>();
    let mut w = Writer::with_capacity(size);
    w.varint(u64::from(table_id));
    w.varint(memberships.len() as u64);
    let mut previous = 0u64;
    for m in memberships {
        w.varint(u64::from(m.bucket_id))
            .varint(zigzag(m.op_id.wrapping_sub(previous)))
            .varint(u64::from(m.output));
        previous = m.op_id;
    }
    w.varint(lookups.len() as u64);
    for l in lookups {
        w.bytes(&l.key).bytes(&l.value);
    }
    if !stash.is_empty() {
        w.varint(stash.len() as u64);
        for (name, value) in stash {
            w.str(name).bytes(value);
        }
    }
    w.finish()
}

/// A signed difference as an unsigned varint value (small magnitudes stay small).
fn zigzag(delta: u64) -> u64 {
    let signed = delta as i64;
    ((signed << 1) ^ (signed >> 63)) as u64
}

fn unzigzag(value: u64) -> u64 {
    ((value >> 1) as i64 ^ -((value & 1) as i64)) as u64
}

/// Encodes a row's distinct outputs `(object_type, object_id, data)`.
pub fn encode_outputs<'a>(
    outputs: impl Iterator<Item = (&'a str, &'a str, &'a str)> + Clone,
) -> Vec<u8> {
    let mut out = Vec::new();
    encode_outputs_into(outputs, &mut out);
    out
}

/// [`encode_outputs`] into `out` (cleared first).
pub fn encode_outputs_into<'a>(
    outputs: impl Iterator<Item = (&'a str, &'a str, &'a str)> + Clone,
    out: &mut Vec<u8>,
) {
    let size: usize = 1 + outputs
        .clone()
        .map(|(t, i, d)| t.len() + i.len() + d.len() + 6)
        .sum::<usize>();
    out.clear();
    out.reserve(size);
    let mut w = Writer::over(std::mem::take(out));
    w.varint(outputs.clone().count() as u64);
    for (object_type, object_id, data) in outputs {
        w.str(object_type).str(object_id).str(data);
    }
    *out = w.finish();
}

/// Decodes an outputs section.
pub fn decode_outputs(bytes: &[u8]) -> Result<Vec<Output>, Corrupt> {
    let mut r = Reader::new(bytes, WHAT);
    let n = r.varint()?;
    let mut outputs = Vec::new();
    for _ in 0..n {
        outputs.push(Output {
            object_type: r.str()?.to_owned(),
            object_id: r.str()?.to_owned(),
            data: r.str()?.to_owned(),
        });
    }
    if !r.is_empty() {
        return Err(Corrupt { what: WHAT });
    }
    Ok(outputs)
}

/// The source table id a record head starts with.
pub fn head_table_id(head: &[u8]) -> Result<u32, Corrupt> {
    let value = Reader::new(head, WHAT).varint()?;
    u32::try_from(value).map_err(|_| Corrupt { what: WHAT })
}

/// What a REMOVE op shows on the wire after its row is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    /// Output table name.
    pub object_type: String,
    /// Row id text.
    pub object_id: String,
    /// The removed row's subkey.
    pub subkey: String,
}

impl Tombstone {
    /// The binary encoding of a tombstone of these parts.
    pub fn encode_parts(object_type: &str, object_id: &str, subkey: &str) -> Vec<u8> {
        let mut w = Writer::with_capacity(object_type.len() + object_id.len() + subkey.len() + 6);
        w.str(object_type).str(object_id).str(subkey);
        w.finish()
    }

    /// Decodes a stored tombstone.
    pub fn decode(bytes: &[u8]) -> Result<Self, Corrupt> {
        let mut r = Reader::new(bytes, "tombstone");
        Ok(Self {
            object_type: r.str()?.to_owned(),
            object_id: r.str()?.to_owned(),
            subkey: r.str()?.to_owned(),
        })
    }
}

/// The subkey of a source row: stable while the row exists, unique per source row.
pub fn subkey(table_id: u32, row_id: u64) -> String {
    // Made for every PUT served and every row deleted: without the formatting machinery.
    let (mut table, mut row) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (table, row) = (table.format(table_id), row.format(row_id));
    let mut subkey = String::with_capacity(table.len() + 1 + row.len());
    subkey.push_str(table);
    subkey.push('/');
    subkey.push_str(row);
    subkey
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subkey_is_the_table_id_and_the_row_id_in_decimal() {
        assert_eq!(subkey(7, 12_345_678_901), "7/12345678901");
        assert_eq!(subkey(0, 0), "0/0");
        assert_eq!(
            subkey(u32::MAX, u64::MAX),
            format!("{}/{}", u32::MAX, u64::MAX)
        );
    }

    #[test]
    fn records_round_trip_and_reject_damage() {
        let mut record = RowRecord {
            table_id: 7,
            outputs: vec![Output {
                object_type: "tasks".into(),
                object_id: "t1".into(),
                data: "{\"id\":\"t1\"}".into(),
            }],
            memberships: vec![
                Membership {
                    bucket_id: 1,
                    op_id: 10,
                    output: 0,
                },
                Membership {
                    bucket_id: 2,
                    op_id: 11,
                    output: 0,
                },
                Membership {
                    bucket_id: 3,
                    op_id: 4,
                    output: 0,
                },
            ],
            lookups: vec![LookupRef {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            }],
            stash: Vec::new(),
        };
        let (head, outputs) = (record.encode_head(), record.encode_outputs());
        assert_eq!(RowRecord::decode(&head, &outputs).unwrap(), record);
        assert_eq!(head_table_id(&head).unwrap(), 7);
        for cut in 0..head.len() {
            assert!(
                RowRecord::decode(&head[..cut], &outputs).is_err(),
                "cut {cut}"
            );
        }
        for cut in 0..outputs.len() {
            assert!(
                RowRecord::decode(&head, &outputs[..cut]).is_err(),
                "cut {cut}"
            );
        }
        // The stash is an optional trailing section.
        let plain = head.len();
        record.stash = vec![("summary".into(), b"long text".to_vec())];
        let head = record.encode_head();
        assert_eq!(RowRecord::decode(&head, &outputs).unwrap(), record);
        for cut in (0..head.len()).filter(|&c| c != plain) {
            assert!(
                RowRecord::decode(&head[..cut], &outputs).is_err(),
                "cut {cut}"
            );
        }
        let t = Tombstone {
            object_type: "a".into(),
            object_id: "b".into(),
            subkey: subkey(1, 2),
        };
        assert_eq!(
            Tombstone::decode(&Tombstone::encode_parts(
                &t.object_type,
                &t.object_id,
                &t.subkey
            ))
            .unwrap(),
            t
        );
    }
}
