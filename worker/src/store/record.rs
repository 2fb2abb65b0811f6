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
    /// Encoded replica identity.
    pub identity: Vec<u8>,
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
    /// Compact binary encoding.
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = 16
            + self.identity.len()
            + self
                .outputs
                .iter()
                .map(|o| o.data.len() + o.object_id.len() + o.object_type.len() + 6)
                .sum::<usize>()
            + self.memberships.len() * 12
            + self
                .lookups
                .iter()
                .map(|l| l.key.len() + l.value.len() + 4)
                .sum::<usize>();
        let mut w = Writer::with_capacity(size);
        w.varint(u64::from(self.table_id)).bytes(&self.identity);
        w.varint(self.outputs.len() as u64);
        for o in &self.outputs {
            w.str(&o.object_type).str(&o.object_id).str(&o.data);
        }
        w.varint(self.memberships.len() as u64);
        for m in &self.memberships {
            w.varint(u64::from(m.bucket_id))
                .varint(m.op_id)
                .varint(u64::from(m.output));
        }
        w.varint(self.lookups.len() as u64);
        for l in &self.lookups {
            w.bytes(&l.key).bytes(&l.value);
        }
        // Optional trailing section: records without a stash end here.
        if !self.stash.is_empty() {
            w.varint(self.stash.len() as u64);
            for (name, value) in &self.stash {
                w.str(name).bytes(value);
            }
        }
        w.finish()
    }

    /// Decodes a stored record.
    pub fn decode(bytes: &[u8]) -> Result<Self, Corrupt> {
        let mut r = Reader::new(bytes, WHAT);
        let small = |v: u64| u32::try_from(v).map_err(|_| Corrupt { what: WHAT });
        let table_id = small(r.varint()?)?;
        let identity = r.bytes()?.to_vec();
        let n = r.varint()?;
        let mut outputs = Vec::new();
        for _ in 0..n {
            outputs.push(Output {
                object_type: r.str()?.to_owned(),
                object_id: r.str()?.to_owned(),
                data: r.str()?.to_owned(),
            });
        }
        let n = r.varint()?;
        let mut memberships = Vec::new();
        for _ in 0..n {
            let bucket_id = small(r.varint()?)?;
            let op_id = r.varint()?;
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
            identity,
            outputs,
            memberships,
            lookups,
            stash,
        })
    }
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
    /// Binary encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(
            self.object_type.len() + self.object_id.len() + self.subkey.len() + 6,
        );
        w.str(&self.object_type)
            .str(&self.object_id)
            .str(&self.subkey);
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
    format!("{table_id}/{row_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_damage() {
        let mut record = RowRecord {
            table_id: 7,
            identity: b"\x03abc".to_vec(),
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
            ],
            lookups: vec![LookupRef {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            }],
            stash: Vec::new(),
        };
        let bytes = record.encode();
        assert_eq!(RowRecord::decode(&bytes).unwrap(), record);
        for cut in 0..bytes.len() {
            assert!(RowRecord::decode(&bytes[..cut]).is_err(), "cut {cut}");
        }
        // The stash is an optional trailing section.
        let plain = bytes.len();
        record.stash = vec![("summary".into(), b"long text".to_vec())];
        let bytes = record.encode();
        assert_eq!(RowRecord::decode(&bytes).unwrap(), record);
        for cut in (0..bytes.len()).filter(|&c| c != plain) {
            assert!(RowRecord::decode(&bytes[..cut]).is_err(), "cut {cut}");
        }
        let t = Tombstone {
            object_type: "a".into(),
            object_id: "b".into(),
            subkey: subkey(1, 2),
        };
        assert_eq!(Tombstone::decode(&t.encode()).unwrap(), t);
    }
}
