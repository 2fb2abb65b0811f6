//! New source rows made ready for the writer on another thread.
//!
//! During the snapshot one thread writes MDBX while several evaluate rows. Everything
//! about a new row that does not depend on the writer's counters happens on the
//! evaluator side: its distinct outputs found, encoded and compressed
//! ([`RowPacker`]). The writer then only assigns ids, appends ops and writes the
//! record ([`WriteTxn::insert_prepared`]).

use std::sync::Arc;

use libmdbx::WriteFlags;

use super::compress::{Packer, RecordCodec};
use super::record::{decode_outputs, encode_head, encode_outputs};
use super::tables::row_key;
use super::writer::{LookupPut, RowPut, Stash, WriteTxn};
use super::{Store, StoreError};
use crate::rules::{BucketRow, RowObject};

/// A PUT of a prepared row: the bucket and which of the row's outputs it shows.
#[derive(Debug, Clone)]
struct PreparedPut {
    bucket: String,
    output: u8,
    checksum: u32,
}

/// A new source row, its outputs encoded once and packed ([`RowPacker`]) before
/// the writer sees it.
#[derive(Debug, Clone)]
pub struct PreparedRow {
    table_id: u32,
    identity: Vec<u8>,
    puts: Vec<PreparedPut>,
    /// `(encoded key, encoded outputs)` of each lookup entry.
    lookups: Vec<(Vec<u8>, Vec<u8>)>,
    stash: Stash,
    /// The outputs section: raw until packed.
    outputs: Vec<u8>,
    packed: bool,
}

impl PreparedRow {
    /// Prepares a new row of table `table_id` from its evaluated bucket rows (their
    /// names move into the prepared row). `None` when it has more than 255 distinct
    /// outputs (the record indexes them with one byte).
    pub fn new(
        table_id: u32,
        identity: Vec<u8>,
        buckets: Vec<BucketRow>,
        lookups: Vec<(Vec<u8>, Vec<u8>)>,
        stash: Stash,
    ) -> Option<Self> {
        // Outputs are stored once per row; the buckets of one evaluation usually share
        // one object, so compare its pointer before its bytes.
        let mut distinct: Vec<Arc<RowObject>> = Vec::with_capacity(1);
        let mut puts = Vec::with_capacity(buckets.len());
        for b in buckets {
            let checksum = b.object.checksum;
            let index = match distinct.iter().position(|o| same(o, &b.object)) {
                Some(i) => i,
                None => {
                    distinct.push(b.object);
                    distinct.len() - 1
                }
            };
            puts.push(PreparedPut {
                bucket: b.bucket,
                output: u8::try_from(index).ok()?,
                checksum,
            });
        }
        let outputs = encode_outputs(
            distinct
                .iter()
                .map(|o| (&*o.object_type, &*o.object_id, &*o.data)),
        );
        Some(Self {
            table_id,
            identity,
            puts,
            lookups,
            stash,
            outputs,
            packed: false,
        })
    }
}

fn same(a: &Arc<RowObject>, b: &Arc<RowObject>) -> bool {
    Arc::ptr_eq(a, b)
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

    /// A packer (one compression context, reused for every row it packs).
    pub fn packer(&self) -> RowPacker<'_> {
        RowPacker(self.0.packer())
    }
}

/// Compresses prepared rows' outputs with one codec.
pub struct RowPacker<'c>(Packer<'c>);

impl RowPacker<'_> {
    /// Packs the outputs of `rows` (raw while the store has no dictionary).
    pub fn pack(&mut self, rows: &mut [PreparedRow]) {
        for row in rows.iter_mut().filter(|r| !r.packed) {
            row.outputs = self.0.pack(&row.outputs);
            row.packed = true;
        }
    }
}

impl WriteTxn<'_, '_> {
    /// Inserts a prepared new row: its PUTs, lookups and record. An identity already
    /// stored (identical rows of a REPLICA IDENTITY FULL table) becomes an update of
    /// that row.
    pub fn insert_prepared(&mut self, mut row: PreparedRow) -> Result<(), StoreError> {
        if !row.packed {
            row.outputs = self.pack_outputs(&row.outputs);
            row.packed = true;
        } else if let Some(packed) = self.repack(&row.outputs) {
            // Packed before the store trained its dictionary: compress it now rather
            // than keep it large.
            row.outputs = packed;
        }
        self.flush_if_full()?;
        let key = row_key(row.table_id, &row.identity);
        let Some(row_id) = self.claim_row(&key)? else {
            return self.update_with_prepared(row);
        };
        let mut memberships = Vec::with_capacity(row.puts.len());
        for put in &row.puts {
            memberships.push(self.put_op(&put.bucket, put.output, put.checksum, row_id)?);
        }
        let lookups: Vec<LookupPut<'_>> = row
            .lookups
            .iter()
            .map(|(key, outputs)| LookupPut { key, outputs })
            .collect();
        let lookups = self.put_new_lookups(row_id, &lookups)?;
        let head = encode_head(row.table_id, &memberships, &lookups, &row.stash);
        // New rows get increasing ids: appending skips the search for their place.
        self.store_packed(row_id, &head, &row.outputs, WriteFlags::APPEND)
    }

    /// The rare path: the identity is stored already, so apply the row as an update.
    fn update_with_prepared(&mut self, row: PreparedRow) -> Result<(), StoreError> {
        let raw = self.unpack_outputs(&row.outputs)?;
        let outputs = decode_outputs(&raw).map_err(|c| self.corrupt(c.what))?;
        let mut puts = Vec::with_capacity(row.puts.len());
        for put in &row.puts {
            let o = outputs
                .get(usize::from(put.output))
                .ok_or_else(|| self.corrupt("prepared row output"))?;
            puts.push(RowPut {
                bucket: &put.bucket,
                object_type: &o.object_type,
                object_id: &o.object_id,
                data: &o.data,
                checksum: put.checksum,
            });
        }
        let lookups: Vec<LookupPut<'_>> = row
            .lookups
            .iter()
            .map(|(key, outputs)| LookupPut { key, outputs })
            .collect();
        self.apply_row(
            row.table_id,
            &row.identity,
            &puts,
            &lookups,
            row.stash,
            false,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ObjectRead, OpKind};

    fn put<'a>(bucket: &'a str, id: &'a str, data: &'a str) -> RowPut<'a> {
        RowPut {
            bucket,
            object_type: "tasks",
            object_id: id,
            data,
            checksum: data.len() as u32,
        }
    }

    /// Bucket rows sharing one object, as the evaluator makes them.
    fn bucket_rows(buckets: &[&str], id: &str, data: &str) -> Vec<BucketRow> {
        let object = Arc::new(RowObject {
            object_type: "tasks".into(),
            object_id: id.into(),
            data: data.into(),
            checksum: data.len() as u32,
        });
        buckets
            .iter()
            .map(|b| BucketRow {
                bucket: (*b).to_owned(),
                object: object.clone(),
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
            let mut batch: Vec<PreparedRow> = chunk
                .iter()
                .map(|(id, data)| {
                    let rows = bucket_rows(&["a[]", "b[]"], id, data);
                    PreparedRow::new(1, id.as_bytes().to_vec(), rows, Vec::new(), Stash::new())
                        .unwrap()
                })
                .collect();
            assert_eq!(batch[0].puts[1].output, 0, "one output for both buckets");
            prepared.row_codec().packer().pack(&mut batch);
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

    /// Row keys claimed past the tree's end are appended, others placed by search; either
    /// way every identity finds its own row, across transactions and after a rekey.
    #[test]
    fn identities_in_any_order_find_their_rows() {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(&root.path().join("store")).unwrap();
        let insert = |ids: &[&str]| {
            let mut batch: Vec<PreparedRow> = ids
                .iter()
                .map(|id| {
                    let data = format!("{{\"id\":\"{id}\"}}");
                    let rows = bucket_rows(&["a[]"], id, &data);
                    PreparedRow::new(1, id.as_bytes().to_vec(), rows, Vec::new(), Stash::new())
                        .unwrap()
                })
                .collect();
            store.row_codec().packer().pack(&mut batch);
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
