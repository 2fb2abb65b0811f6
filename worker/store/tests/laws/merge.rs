//! A table's re-copy: a row compares with its stored record, and a merged row writes ops
//! only where its output changed.
use super::*;

/// What a table's re-copy asks the writer: a row evaluated as it is stored compares
/// `Same` (a re-copy writes nothing for it), other data or buckets `Different`, other
/// kept values alone `SameButStash` (replaced without an op); a table's identities come
/// back page by page, in key order.
#[test]
fn a_row_compares_with_its_stored_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let put = |bucket: &'static str, data: &'static str| RowPut {
        bucket,
        object_type: "tasks",
        object_id: "t1",
        data,
        checksum: 5,
    };
    let stored = [put(BUCKETS[0], "{\"a\":1}"), put(BUCKETS[1], "{\"a\":1}")];
    let stash = vec![("body".to_owned(), b"long".to_vec())];
    store
        .write(1, |w| {
            for id in [b"t0".as_slice(), b"t2", b"t3"] {
                w.upsert_row(9, id, &stored, &[])?;
            }
            w.upsert_row_stashed(9, b"t1", &stored, &[], stash.clone())
        })
        .unwrap();
    let ((), before) = store.write(2, |_| Ok(())).unwrap();
    store
        .write(2, |w| {
            let none = Vec::new();
            let as_stored = |w: &mut store::WriteTxn<'_, '_>, puts: &[RowPut<'_>], stash| {
                w.stored_as(9, b"t1", puts, &[], stash)
                    .map(|(verdict, _)| verdict)
            };
            assert_eq!(as_stored(w, &stored, &stash)?, StoredAs::Same);
            let reordered = [stored[1], stored[0]];
            assert_eq!(as_stored(w, &reordered, &stash)?, StoredAs::Same);
            let other_data = [put(BUCKETS[0], "{\"a\":2}"), stored[1]];
            assert_eq!(as_stored(w, &other_data, &stash)?, StoredAs::Different);
            let other_bucket = [put(BUCKETS[2], "{\"a\":1}"), stored[1]];
            assert_eq!(as_stored(w, &other_bucket, &stash)?, StoredAs::Different);
            assert_eq!(as_stored(w, &stored[..1], &stash)?, StoredAs::Different);
            assert_eq!(as_stored(w, &stored, &none)?, StoredAs::SameButStash);
            assert!(w.restash_row(9, b"t1", Vec::new())?);
            assert_eq!(as_stored(w, &stored, &none)?, StoredAs::Same);
            // A row the store does not hold is the same only when it produces nothing.
            assert_eq!(
                w.stored_as(9, b"tx", &[], &[], &Vec::new())?,
                (StoredAs::Same, None)
            );
            assert_eq!(
                w.stored_as(9, b"tx", &stored, &[], &Vec::new())?,
                (StoredAs::Different, None)
            );
            // The sweep of a re-copy: the table's rows whose row id is not held.
            let (_, t1) = w.stored_as(9, b"t1", &stored, &[], &none)?;
            let t1 = t1.expect("t1 is stored");
            let ids = |rows: &[&[u8]]| rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>();
            assert_eq!(
                w.table_rows_not_held(9, |_| false)?,
                ids(&[b"t0", b"t1", b"t2", b"t3"])
            );
            assert_eq!(
                w.table_rows_not_held(9, |row_id| row_id == t1)?,
                ids(&[b"t0", b"t2", b"t3"])
            );
            assert!(w.table_rows_not_held(8, |_| false)?.is_empty());
            Ok(())
        })
        .unwrap();
    // Comparing and replacing kept values wrote no op.
    let ((), after) = store.write(3, |_| Ok(())).unwrap();
    assert_eq!(after.op_id, before.op_id);
}

/// A bucket's ops (kind, op id) and the live data they leave, as a client replays them.
type ServedBucket = (Vec<(OpKind, u64)>, Option<String>);

/// A re-copy's write of a row: a bucket whose output of the row is what it holds keeps its
/// op (no PUT: clients of that bucket get nothing), a changed output gets a PUT, a new
/// bucket a PUT, a bucket left a REMOVE; each bucket's ops still add up to its checksum and
/// serve the row's current output. A later update of the row is an ordinary one again.
#[test]
fn a_merged_row_writes_ops_only_where_its_output_changed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let put = |bucket: &'static str, data: &'static str| RowPut {
        bucket,
        object_type: "tasks",
        object_id: "t1",
        data,
        checksum: checksum_of(data),
    };
    let served = |store: &Store| -> BTreeMap<String, ServedBucket> {
        store
            .read(|view| {
                let checkpoint = view.checkpoint()?;
                let mut out = BTreeMap::new();
                for (id, name) in view.bucket_names()? {
                    let state = view.bucket(&name)?.unwrap();
                    let page = view.ops(id, 0, checkpoint.op_id, usize::MAX)?;
                    let sum = page
                        .ops
                        .iter()
                        .fold(0u32, |s, op| s.wrapping_add(op.checksum));
                    assert_eq!(sum, state.checksum, "{name}");
                    let mut live = None;
                    for op in &page.ops {
                        match op.kind {
                            OpKind::Put => live = op.object.as_ref().and_then(|o| o.data.clone()),
                            OpKind::Remove => live = None,
                            OpKind::Move | OpKind::Clear => {}
                        }
                    }
                    let ops = page.ops.iter().map(|op| (op.kind, op.op_id)).collect();
                    out.insert(name, (ops, live));
                }
                Ok(out)
            })
            .unwrap()
    };
    store
        .write(1, |w| {
            w.upsert_row(
                9,
                b"t1",
                &[put(BUCKETS[0], "{\"a\":1}"), put(BUCKETS[1], "{\"a\":1}")],
                &[],
            )
        })
        .unwrap();
    let before = served(&store);

    let merged = [
        put(BUCKETS[0], "{\"a\":1}"),
        put(BUCKETS[1], "{\"a\":2}"),
        put(BUCKETS[2], "{\"a\":1}"),
    ];
    store
        .write(2, |w| {
            w.merge_row_stashed(9, b"t1", &merged, &[], Vec::new())
        })
        .unwrap()
        .0
        .expect("the merged row is stored");
    let after = served(&store);
    assert_eq!(after[BUCKETS[0]], before[BUCKETS[0]], "unchanged: no op");
    assert_eq!(after[BUCKETS[1]].1.as_deref(), Some("{\"a\":2}"));
    assert_eq!(after[BUCKETS[1]].0.len(), 2, "{:?}", after[BUCKETS[1]]);
    assert_eq!(after[BUCKETS[2]].1.as_deref(), Some("{\"a\":1}"));
    // The record compares as what was merged.
    store
        .write(2, |w| {
            assert_eq!(
                w.stored_as(9, b"t1", &merged, &[], &Vec::new())?.0,
                StoredAs::Same
            );
            Ok(())
        })
        .unwrap();

    // Left bucket 0, bucket 2 unchanged: a REMOVE in 0 only.
    let merged_again = [put(BUCKETS[1], "{\"a\":2}"), put(BUCKETS[2], "{\"a\":1}")];
    store
        .write(3, |w| {
            w.merge_row_stashed(9, b"t1", &merged_again, &[], Vec::new())
        })
        .unwrap()
        .0
        .expect("the merged row is stored");
    let third = served(&store);
    assert_eq!(third[BUCKETS[0]].1, None);
    assert_eq!(third[BUCKETS[1]], after[BUCKETS[1]]);
    assert_eq!(third[BUCKETS[2]], after[BUCKETS[2]]);

    // An ordinary update puts the row in each of its buckets again.
    store
        .write(4, |w| w.upsert_row(9, b"t1", &merged_again, &[]))
        .unwrap();
    let fourth = served(&store);
    for bucket in [BUCKETS[1], BUCKETS[2]] {
        assert_eq!(
            fourth[bucket].0.len(),
            third[bucket].0.len() + 1,
            "{bucket}"
        );
        assert_eq!(fourth[bucket].1, third[bucket].1, "{bucket}");
    }
}

/// A merge that changes every output of its rows writes records as an update does: the
/// old outputs are not kept when no op names them (else every record would carry both).
#[test]
fn a_merge_that_changes_every_output_does_not_grow_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, merge: bool| -> u64 {
        let store = Store::open(&dir.path().join(name)).unwrap();
        let rows: Vec<(String, String, String)> = (0..2_000)
            .map(|i| {
                (
                    format!("t{i}"),
                    format!("{{\"body\":\"{}\",\"n\":{i}}}", "first ".repeat(40)),
                    format!("{{\"body\":\"{}\",\"n\":{i}}}", "second ".repeat(40)),
                )
            })
            .collect();
        fn put(data: &str) -> RowPut<'_> {
            RowPut {
                bucket: BUCKETS[0],
                object_type: "tasks",
                object_id: "t",
                data,
                checksum: checksum_of(data),
            }
        }
        store
            .write(1, |w| {
                for (id, first, _) in &rows {
                    w.upsert_row(9, id.as_bytes(), &[put(first)], &[])?;
                }
                Ok(())
            })
            .unwrap();
        store
            .write(2, |w| {
                for (id, _, second) in &rows {
                    if merge {
                        w.merge_row_stashed(9, id.as_bytes(), &[put(second)], &[], Vec::new())?;
                    } else {
                        w.upsert_row(9, id.as_bytes(), &[put(second)], &[])?;
                    }
                }
                Ok(())
            })
            .unwrap();
        store.used_bytes()
    };
    let updated = write("updated", false);
    let merged = write("merged", true);
    assert!(
        merged <= updated + updated / 10,
        "merged {merged} bytes, updated {updated}"
    );
}
