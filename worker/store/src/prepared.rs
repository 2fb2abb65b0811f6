//! New source rows made ready for the writer on another thread.
//!
//! During the snapshot one thread writes MDBX while several evaluate rows. Everything
//! about a new row that does not depend on the writer's counters happens on the
//! evaluator side: its distinct outputs found, encoded and compressed
//! ([`RowPacker`]). The writer then only assigns ids, appends ops and writes the
//! record ([`WriteTxn::insert_prepared`]).
//!
//! The stream does the same for the rows it upserts: the stream's task packs a row's
//! outputs ([`OutputPacker`]) while the applier writes earlier ones, which then only
//! assigns ids, supersedes and writes the record ([`WriteTxn::upsert_row_packed`]).

use std::sync::Arc;

use libmdbx::WriteFlags;
use smallvec::SmallVec;

use super::compress::{Packer, RecordCodec, SharedPacker};
use super::record::{decode_outputs, encode_head, encode_outputs_into};
use super::tables::row_key;
use super::writer::{LookupPut, RowPut, Stash, WriteTxn};
use super::{Store, StoreError};

/// A PUT of a prepared row: its bucket (the name ends at `name_end` in the row's bytes,
/// right after the previous PUT's) and which of the row's outputs it shows.
#[derive(Debug, Clone, Copy)]
struct PreparedPut {
    name_end: u32,
    output: u8,
    checksum: u32,
}

/// A new source row, its outputs encoded once and packed ([`RowPacker`]) before the
/// writer sees it. Its identity, bucket names and packed outputs share one allocation:
/// the writer frees one block per row that another thread allocated, not one per part.
#[derive(Debug, Clone)]
pub struct PreparedRow {
    table_id: u32,
    /// The identity, the bucket names of `puts` in order, then the packed outputs.
    bytes: Vec<u8>,
    identity_end: u32,
    puts: SmallVec<[PreparedPut; 4]>,
    /// `(encoded key, encoded outputs)` of each lookup entry.
    lookups: Vec<(Vec<u8>, Vec<u8>)>,
    stash: Stash,
}

impl PreparedRow {
    /// Prepares a new row of table `table_id` from the bucket memberships it produces,
    /// packing its outputs with `packer`. `None` when it has more than 255 distinct outputs
    /// (the record indexes them with one byte) or its names exceed 4 GiB.
    pub fn new(
        table_id: u32,
        identity: &[u8],
        memberships: &[RowPut<'_>],
        lookups: Vec<(Vec<u8>, Vec<u8>)>,
        stash: Stash,
        packer: &mut RowPacker<'_>,
    ) -> Option<Self> {
        // Outputs are stored once per row; the buckets of one evaluation usually share
        // one output, so compare where it lives before its bytes.
        let mut distinct: SmallVec<[&RowPut<'_>; 2]> = SmallVec::new();
        let names: usize = memberships.iter().map(|m| m.bucket.len()).sum();
        let mut bytes = Vec::with_capacity(identity.len() + names + packer.expected_len());
        bytes.extend_from_slice(identity);
        let identity_end = u32::try_from(bytes.len()).ok()?;
        let mut puts = SmallVec::with_capacity(memberships.len());
        for m in memberships {
            let index = output_index(&mut distinct, m);
            bytes.extend_from_slice(m.bucket.as_bytes());
            puts.push(PreparedPut {
                name_end: u32::try_from(bytes.len()).ok()?,
                output: u8::try_from(index).ok()?,
                checksum: m.checksum,
            });
        }
        packer.pack_outputs(
            distinct
                .iter()
                .map(|o| (o.object_type, o.object_id, o.data)),
            &mut bytes,
        );
        Some(Self {
            table_id,
            bytes,
            identity_end,
            puts,
            lookups,
            stash,
        })
    }

    fn identity(&self) -> &[u8] {
        self.bytes
            .get(..self.identity_end as usize)
            .unwrap_or_default()
    }

    /// The packed outputs section.
    fn outputs(&self) -> &[u8] {
        self.bytes.get(self.names_end()..).unwrap_or_default()
    }

    /// Where the bucket names end and the packed outputs start.
    fn names_end(&self) -> usize {
        self.puts
            .last()
            .map_or(self.identity_end, |put| put.name_end) as usize
    }

    /// Each PUT's bucket name, output index and checksum; `None` for a name that is not
    /// where it was written (a bug).
    fn puts(&self) -> impl Iterator<Item = Option<(&str, u8, u32)>> {
        let mut start = self.identity_end as usize;
        self.puts.iter().map(move |put| {
            let end = put.name_end as usize;
            let name = self.bytes.get(start..end)?;
            start = end;
            debug_assert!(std::str::from_utf8(name).is_ok());
            // SAFETY: `new` copied exactly these bytes from a `&str` (the names lie
            // between consecutive `name_end`s, after the identity) and nothing changes
            // `bytes` after it.
            let name = unsafe { std::str::from_utf8_unchecked(name) };
            Some((name, put.output, put.checksum))
        })
    }
}

/// The index of `put`'s output among a row's `distinct` ones so far, added if new.
fn output_index<'a, 'p>(
    distinct: &mut SmallVec<[&'a RowPut<'p>; 2]>,
    put: &'a RowPut<'p>,
) -> usize {
    distinct
        .iter()
        .position(|o| same_output(o, put))
        .unwrap_or_else(|| {
            distinct.push(put);
            distinct.len() - 1
        })
}

/// Whether two memberships show the same output (the same data in the same place first).
fn same_output(a: &RowPut<'_>, b: &RowPut<'_>) -> bool {
    (std::ptr::eq(a.data, b.data) && std::ptr::eq(a.object_id, b.object_id))
        || (a.data == b.data && a.object_id == b.object_id && a.object_type == b.object_type)
}

impl Store {
    /// The store's record codec of this moment, for packing prepared rows on another
    /// thread.
    pub fn row_codec(&self) -> RowCodec {
        RowCodec(self.codec.read().clone())
    }
}

/// A record codec held by a thread that packs prepared rows ([`Store::row_codec`]).
pub struct RowCodec(Arc<RecordCodec>);

impl RowCodec {
    /// True once the store packs differently (it trained its dictionary): take a new one.
    pub fn is_stale(&self, store: &Store) -> bool {
        !Arc::ptr_eq(&self.0, &store.codec.read())
    }

    /// A packer (one compression context and one buffer, reused for every row it packs).
    pub fn packer(&self) -> RowPacker<'_> {
        RowPacker {
            packer: self.0.packer(),
            raw: Vec::new(),
        }
    }
}

/// Encodes and compresses prepared rows' outputs with one codec.
pub struct RowPacker<'c> {
    packer: Packer<'c>,
    /// The last row's encoded outputs (reused).
    raw: Vec<u8>,
}

impl RowPacker<'_> {
    /// Appends the packed form of `outputs` (raw while the store has no dictionary) to
    /// `out`.
    fn pack_outputs<'a>(
        &mut self,
        outputs: impl Iterator<Item = (&'a str, &'a str, &'a str)> + Clone,
        out: &mut Vec<u8>,
    ) {
        encode_outputs_into(outputs, &mut self.raw);
        self.packer.pack_into(&self.raw, out);
    }

    /// Room for packing a row like the last one: what compressing needs reserved
    /// (LZ4's bound), so the row's bytes are allocated once.
    fn expected_len(&self) -> usize {
        self.raw.len() + self.raw.len() / 255 + 24
    }
}

impl WriteTxn<'_, '_> {
    /// Inserts a prepared new row: its PUTs, lookups and record. An identity already
    /// stored (identical rows of a REPLICA IDENTITY FULL table) becomes an update of
    /// that row.
    pub fn insert_prepared(&mut self, row: PreparedRow) -> Result<(), StoreError> {
        // Packed before the store trained its dictionary: compress it now rather than
        // keep it large.
        let repacked = self.repack(row.outputs());
        let outputs = repacked.as_deref().unwrap_or(row.outputs());
        self.flush_if_full()?;
        let key = row_key(row.table_id, row.identity());
        let Some(row_id) = self.claim_row(&key)? else {
            return self.update_with_prepared(&row, outputs);
        };
        let mut memberships: SmallVec<[_; 4]> = SmallVec::with_capacity(row.puts.len());
        for put in row.puts() {
            let (bucket, output, checksum) = put.ok_or_else(|| self.corrupt(NAME))?;
            memberships.push(self.put_op(bucket, output, checksum, row_id)?);
        }
        let lookups: Vec<LookupPut<'_>> = row
            .lookups
            .iter()
            .map(|(key, outputs)| LookupPut { key, outputs })
            .collect();
        let lookups = self.put_new_lookups(row_id, &lookups)?;
        let head = encode_head(row.table_id, &memberships, &lookups, &row.stash);
        // New rows get increasing ids: appending skips the search for their place.
        self.store_packed(row_id, &head, outputs, WriteFlags::APPEND)
    }

    /// The rare path: the identity is stored already, so apply the row as an update.
    fn update_with_prepared(&mut self, row: &PreparedRow, packed: &[u8]) -> Result<(), StoreError> {
        let raw = self.unpack_outputs(packed)?;
        let outputs = decode_outputs(&raw).map_err(|c| self.corrupt(c.what))?;
        let mut puts = Vec::with_capacity(row.puts.len());
        for put in row.puts() {
            let (bucket, output, checksum) = put.ok_or_else(|| self.corrupt(NAME))?;
            let o = outputs
                .get(usize::from(output))
                .ok_or_else(|| self.corrupt("prepared row output"))?;
            puts.push(RowPut {
                bucket,
                object_type: &o.object_type,
                object_id: &o.object_id,
                data: &o.data,
                checksum,
            });
        }
        let lookups: Vec<LookupPut<'_>> = row
            .lookups
            .iter()
            .map(|(key, outputs)| LookupPut { key, outputs })
            .collect();
        self.apply_row(
            row.table_id,
            row.identity(),
            &puts,
            &lookups,
            row.stash.clone(),
            super::writer::RowWrite::Upsert,
            super::writer::Outputs::Encode,
        )
        .map(drop)
    }
}

/// A row's outputs packed ahead of the writer ([`OutputPacker::pack`]): which of them
/// each PUT shows, and the packed outputs section, as the writer would have made them.
pub struct PackedOutputs {
    /// Per PUT, in order: the index of the output it shows.
    indices: SmallVec<[u8; 4]>,
    bytes: Vec<u8>,
    /// What packed `bytes` (the writer's own may differ: see `upsert_row_packed`).
    codec: Arc<RecordCodec>,
}

impl std::fmt::Debug for PackedOutputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedOutputs")
            .field("indices", &self.indices)
            .field("bytes", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

/// Packs the outputs of rows a stream upserts, on the stream's task: holds its codec and
/// compression state across waits.
pub struct OutputPacker {
    packer: SharedPacker,
    /// The last row's encoded outputs (reused).
    raw: Vec<u8>,
}

impl Store {
    /// A packer with the store's codec of this moment.
    pub fn output_packer(&self) -> OutputPacker {
        OutputPacker {
            packer: SharedPacker::new(self.codec.read().clone()),
            raw: Vec::new(),
        }
    }
}

impl OutputPacker {
    /// True once the store packs differently (it trained its dictionary): take a new one.
    pub fn is_stale(&self, store: &Store) -> bool {
        !Arc::ptr_eq(self.packer.codec(), &store.codec.read())
    }

    /// The packed outputs of a row with these PUTs (its distinct outputs in the order the
    /// PUTs first show them, as the writer finds them); `None` beyond 255 distinct ones.
    pub fn pack(&mut self, puts: &[RowPut<'_>]) -> Option<PackedOutputs> {
        let mut distinct: SmallVec<[&RowPut<'_>; 2]> = SmallVec::new();
        let mut indices = SmallVec::with_capacity(puts.len());
        for put in puts {
            indices.push(u8::try_from(output_index(&mut distinct, put)).ok()?);
        }
        encode_outputs_into(
            distinct
                .iter()
                .map(|o| (o.object_type, o.object_id, o.data)),
            &mut self.raw,
        );
        let mut bytes = Vec::with_capacity(self.raw.len() + self.raw.len() / 255 + 24);
        self.packer.pack_into(&self.raw, &mut bytes);
        Some(PackedOutputs {
            indices,
            bytes,
            codec: self.packer.codec().clone(),
        })
    }
}

impl WriteTxn<'_, '_> {
    /// [`Self::upsert_row_stashed`] with the row's outputs packed already from exactly
    /// these `puts` ([`OutputPacker::pack`]).
    pub fn upsert_row_packed(
        &mut self,
        table_id: u32,
        identity: &[u8],
        puts: &[RowPut<'_>],
        lookups: &[LookupPut<'_>],
        stash: Stash,
        packed: &PackedOutputs,
    ) -> Result<(), StoreError> {
        if packed.indices.len() != puts.len() {
            return Err(self.corrupt("packed outputs of other puts (a bug)"));
        }
        let repacked = self.repack_from(&packed.codec, &packed.bytes)?;
        let outputs = super::writer::Outputs::Packed {
            indices: &packed.indices,
            bytes: repacked.as_deref().unwrap_or(&packed.bytes),
        };
        self.apply_row(
            table_id,
            identity,
            puts,
            lookups,
            stash,
            super::writer::RowWrite::Upsert,
            outputs,
        )
        .map(drop)
    }
}

/// What a prepared row whose bucket name does not read back is reported as.
const NAME: &str = "prepared row bucket name";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ObjectRead, OpKind};

    fn put<'a>(bucket: &'a str, id: &'a str, data: &'a str) -> RowPut<'a> {
        RowPut {
            bucket,
            object_type: "tasks",
            object_id: id,
            data,
            checksum: data.len() as u32,
        }
    }

    /// `(id, data)` rows prepared for `store`, each in `buckets`, as the evaluators
    /// prepare them.
    fn prepare<'a>(
        store: &Store,
        rows: impl Iterator<Item = (&'a str, String)>,
        buckets: &[&str],
    ) -> Vec<PreparedRow> {
        let codec = store.row_codec();
        let mut packer = codec.packer();
        rows.map(|(id, data)| {
            let memberships: Vec<RowPut<'_>> = buckets.iter().map(|b| put(b, id, &data)).collect();
            PreparedRow::new(
                1,
                id.as_bytes(),
                &memberships,
                Vec::new(),
                Stash::new(),
                &mut packer,
            )
            .unwrap()
        })
        .collect()
    }

    /// Every op of `bucket` as (kind, object, data), read back through the reader.
    fn ops_of(store: &Store, bucket: &str) -> (u64, u32, Vec<(OpKind, Option<ObjectRead>)>) {
        store
            .read(|r| {
                let state = r.bucket(bucket)?.unwrap();
                let page = r.ops(state.id, 0, u64::MAX, usize::MAX)?;
                let ops = page.ops.into_iter().map(|o| (o.kind, o.object)).collect();
                Ok((state.count, state.checksum, ops))
            })
            .unwrap()
    }

    /// Prepared rows (raw while the store has no dictionary, compressed after) read back
    /// exactly like rows inserted on the writer, and a repeated identity is an update.
    #[test]
    fn prepared_rows_equal_rows_inserted_by_the_writer() {
        let root = tempfile::tempdir().unwrap();
        let (direct, prepared) = (
            Store::open(&root.path().join("direct")).unwrap(),
            Store::open(&root.path().join("prepared")).unwrap(),
        );
        let rows: Vec<(String, String)> = (0..5000)
            .map(|i| {
                (
                    format!("t{i}"),
                    format!("{{\"id\":\"t{i}\",\"title\":\"Task {i}\"}}"),
                )
            })
            .chain([(
                "t7".to_owned(),
                "{\"id\":\"t7\",\"title\":\"again\"}".to_owned(),
            )])
            .collect();
        for chunk in rows.chunks(3000) {
            direct
                .write(0, |w| {
                    for (id, data) in chunk {
                        let puts = [put("a[]", id, data), put("b[]", id, data)];
                        w.upsert_row(1, id.as_bytes(), &puts, &[])?;
                    }
                    Ok(())
                })
                .unwrap();
            let batch = prepare(
                &prepared,
                chunk.iter().map(|(id, data)| (id.as_str(), data.clone())),
                &["a[]", "b[]"],
            );
            assert_eq!(batch[0].puts[1].output, 0, "one output for both buckets");
            let (name, _, _) = batch[0].puts().nth(1).unwrap().unwrap();
            assert_eq!(name, "b[]");
            prepared
                .write(0, |w| {
                    batch.into_iter().try_for_each(|row| w.insert_prepared(row))
                })
                .unwrap();
        }
        assert!(prepared.codec.read().has_dictionary());
        for bucket in ["a[]", "b[]"] {
            let (expected, got) = (ops_of(&direct, bucket), ops_of(&prepared, bucket));
            assert_eq!(got, expected);
            assert_eq!(got.0, 5001);
            let last = got.2.last().unwrap().1.as_ref().unwrap();
            assert_eq!(
                last.data.as_deref(),
                Some("{\"id\":\"t7\",\"title\":\"again\"}")
            );
        }
        assert!(prepared.used_bytes() < direct.used_bytes() * 2);
    }

    /// Rows upserted with their outputs packed ahead read back exactly like rows the
    /// writer packs: new rows, updates that change an output or leave a bucket, with a
    /// packer whose codec is the transaction's, an older one (raw, from before the store
    /// trained its dictionary) or another store's.
    #[test]
    fn rows_packed_ahead_equal_rows_packed_by_the_writer() {
        let root = tempfile::tempdir().unwrap();
        let open = |name: &str| Store::open(&root.path().join(name)).unwrap();
        let (direct, ahead, other) = (open("direct"), open("ahead"), open("other"));
        other
            .write(0, |w| {
                for i in 0..3000 {
                    let (id, data) = (format!("o{i}"), format!("{{\"other\":{i}}}"));
                    w.upsert_row(1, id.as_bytes(), &[put("x[]", &id, &data)], &[])?;
                }
                Ok(())
            })
            .unwrap();
        assert!(other.codec.read().has_dictionary());
        // Round 1 inserts, later rounds update: new data for some rows, bucket b left by others.
        let puts_of = |round: usize, i: usize, id: &'static str, data: &'static str| {
            let mut puts = vec![put("a[]", id, data)];
            if round == 0 || !i.is_multiple_of(5) {
                puts.push(put("b[]", id, data));
            }
            if i.is_multiple_of(2) {
                puts.push(put("c[]", id, "{\"short\":true}"));
            }
            puts
        };
        let stale = ahead.output_packer();
        for (round, packer) in [
            (0, None),
            (1, Some(stale)),
            (2, Some(other.output_packer())),
        ] {
            let rows: Vec<(&'static str, &'static str)> = (0..5000usize)
                .map(|i| {
                    let data = if round > 0 && i.is_multiple_of(3) {
                        format!("{{\"id\":\"t{i}\",\"round\":{round}}}")
                    } else {
                        format!("{{\"id\":\"t{i}\",\"title\":\"Task {i}\"}}")
                    };
                    (&*format!("t{i}").leak(), &*data.leak())
                })
                .collect();
            let mut packer = packer.unwrap_or_else(|| ahead.output_packer());
            for chunk in rows
                .chunks(2500)
                .enumerate()
                .map(|(c, rows)| (c * 2500, rows))
            {
                let (start, chunk) = chunk;
                direct
                    .write(0, |w| {
                        for (n, (id, data)) in chunk.iter().enumerate() {
                            let puts = puts_of(round, start + n, id, data);
                            w.upsert_row(1, id.as_bytes(), &puts, &[])?;
                        }
                        Ok(())
                    })
                    .unwrap();
                let packed: Vec<_> = chunk
                    .iter()
                    .enumerate()
                    .map(|(n, (id, data))| {
                        let puts = puts_of(round, start + n, id, data);
                        (puts.clone(), packer.pack(&puts).unwrap())
                    })
                    .collect();
                ahead
                    .write(0, |w| {
                        for (puts, packed) in &packed {
                            let id = puts[0].object_id;
                            w.upsert_row_packed(1, id.as_bytes(), puts, &[], Stash::new(), packed)?;
                        }
                        Ok(())
                    })
                    .unwrap();
            }
        }
        assert!(ahead.codec.read().has_dictionary());
        for bucket in ["a[]", "b[]", "c[]"] {
            let (expected, got) = (ops_of(&direct, bucket), ops_of(&ahead, bucket));
            assert_eq!(got, expected, "{bucket}");
        }
        let (_, _, ops) = ops_of(&ahead, "b[]");
        assert!(ops.iter().any(|(kind, _)| *kind == OpKind::Remove));
        assert!(ahead.used_bytes() < direct.used_bytes() * 2);
    }

    /// Row keys claimed past the tree's end are appended, others placed by search; either
    /// way every identity finds its own row, across transactions and after a rekey.
    #[test]
    fn identities_in_any_order_find_their_rows() {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(&root.path().join("store")).unwrap();
        let insert = |ids: &[&str]| {
            let rows = ids.iter().map(|id| (*id, format!("{{\"id\":\"{id}\"}}")));
            let batch = prepare(&store, rows, &["a[]"]);
            store
                .write(0, |w| {
                    batch.into_iter().try_for_each(|row| w.insert_prepared(row))
                })
                .unwrap();
        };
        insert(&["k05", "k06", "k07", "k01", "k08", "k06"]);
        insert(&["k09", "k02", "k10"]);
        store
            .write(0, |w| {
                assert!(w.rekey_row(1, b"k10", b"k99")?);
                Ok(())
            })
            .unwrap();
        insert(&["k50", "k98", "k03", "zz"]);
        let (count, _, ops) = ops_of(&store, "a[]");
        // 13 inserts, one of them a repeated identity: 12 rows, and the repeat's update
        // superseded the first PUT of k06.
        assert_eq!(count, 13);
        let mut ids: Vec<String> = ops
            .iter()
            .filter(|(kind, _)| *kind == OpKind::Put)
            .map(|(_, object)| object.as_ref().unwrap().object_id.clone())
            .collect();
        ids.sort();
        let expected = [
            "k01", "k02", "k03", "k05", "k06", "k07", "k08", "k09", "k10", "k50", "k98", "zz",
        ];
        assert_eq!(ids, expected);
        store
            .write(0, |w| {
                for id in [
                    "k01", "k02", "k03", "k05", "k06", "k07", "k08", "k09", "k99",
                ] {
                    assert!(w.delete_row(1, id.as_bytes())?, "{id}");
                }
                for id in ["k50", "k98", "zz"] {
                    assert!(w.delete_row(1, id.as_bytes())?, "{id}");
                    assert!(!w.delete_row(1, id.as_bytes())?, "{id} twice");
                }
                assert!(!w.delete_row(1, b"k10")?, "moved to k99");
                Ok(())
            })
            .unwrap();
    }
}
