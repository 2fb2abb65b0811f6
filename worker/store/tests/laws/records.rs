//! Row records: unchanged memberships keep one copy of data, snapshot inserts merge
//! identical identities and skip empty rows, records compress once a dictionary is trained.
use super::*;

#[test]
fn unchanged_memberships_keep_a_single_copy_of_data() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let data = "{\"id\":\"t1\",\"title\":\"x\"}";
    let puts: Vec<RowPut<'_>> = BUCKETS[..3]
        .iter()
        .map(|b| RowPut {
            bucket: b,
            object_type: "tasks",
            object_id: "t1",
            data,
            checksum: 5,
        })
        .collect();
    let (_, cp) = store
        .write(1, |w| w.upsert_row(9, b"t1", &puts, &[]))
        .unwrap();
    assert_eq!(cp.op_id, 3);
    store
        .read(|v| {
            for b in &BUCKETS[..3] {
                let state = v.bucket(b)?.unwrap();
                assert_eq!(
                    (state.count, state.checksum, state.last_op),
                    (1, 5, state.last_op)
                );
                let page = v.ops(state.id, 0, cp.op_id, 10)?;
                assert_eq!(
                    page.ops[0].object.as_ref().unwrap().data.as_deref(),
                    Some(data)
                );
            }
            Ok(())
        })
        .unwrap();
    // The delete removes it from all three; a redelivered delete is a no-op.
    let (removed, cp) = store.write(2, |w| w.delete_row(9, b"t1")).unwrap();
    assert!(removed);
    assert_eq!(cp.op_id, 6);
    let (again, cp2) = store.write(3, |w| w.delete_row(9, b"t1")).unwrap();
    assert!(!again);
    assert_eq!(cp2.op_id, 6);
    assert_eq!(cp2.lsn, 3);
    store
        .read(|v| {
            let state = v.bucket(BUCKETS[0])?.unwrap();
            let page = v.ops(state.id, 0, cp.op_id, 10)?;
            assert_eq!(
                page.ops.iter().map(|o| o.kind).collect::<Vec<_>>(),
                vec![OpKind::Move, OpKind::Remove]
            );
            assert_eq!(page.max_target, page.ops[1].op_id);
            Ok(())
        })
        .unwrap();
}

#[test]
fn snapshot_inserts_merge_identical_identities_and_skip_empty_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let put = |data: &'static str| RowPut {
        bucket: "all",
        object_type: "t",
        object_id: "1",
        data,
        checksum: 7,
    };
    store
        .write(1, |w| {
            w.insert_row(1, b"same", &[put("{\"v\":1}")], &[])?;
            // A second row with the same identity (REPLICA IDENTITY FULL duplicates).
            w.insert_row(1, b"same", &[put("{\"v\":1}")], &[])?;
            w.insert_row(1, b"nothing", &[], &[])
        })
        .unwrap();
    let (removed, _) = store.write(2, |w| w.delete_row(1, b"nothing")).unwrap();
    assert!(!removed, "a row without buckets or lookups is not stored");
    store
        .read(|v| {
            let state = v.bucket("all")?.unwrap();
            let page = v.ops(state.id, 0, 10, 10)?;
            assert_eq!(
                page.ops.iter().map(|o| o.kind).collect::<Vec<_>>(),
                vec![OpKind::Move, OpKind::Put]
            );
            Ok(())
        })
        .unwrap();
}

#[test]
fn records_compress_once_a_dictionary_is_trained_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = Store::open(&path).unwrap();
    let data = |i: u32| {
        format!("{{\"id\":\"task-{i:06}\",\"title\":\"Task {i}\",\"status\":\"todo\",\"summary\":\"{}\"}}", "ab".repeat(40))
    };
    let write = |range: std::ops::Range<u32>| {
        store
            .write(1, |w| {
                for i in range {
                    let (id, d) = (format!("task-{i:06}"), data(i));
                    let put = RowPut {
                        bucket: "all",
                        object_type: "tasks",
                        object_id: &id,
                        data: &d,
                        checksum: i,
                    };
                    w.insert_row(1, id.as_bytes(), &[put], &[])?;
                }
                Ok(())
            })
            .unwrap()
    };
    write(0..3000); // raw, and trains the dictionary
    let raw_bytes = store
        .table_sizes()
        .unwrap()
        .into_iter()
        .find(|t| t.0 == "rows")
        .unwrap()
        .2;
    write(3000..6000); // compressed
    let all_bytes = store
        .table_sizes()
        .unwrap()
        .into_iter()
        .find(|t| t.0 == "rows")
        .unwrap()
        .2;
    assert!(
        all_bytes - raw_bytes < raw_bytes / 2,
        "compressed half {} vs raw half {raw_bytes}",
        all_bytes - raw_bytes
    );
    drop(store);
    // Reopened (dictionary loaded from the store), every record reads back exactly.
    let store = Store::open(&path).unwrap();
    store
        .read(|v| {
            let state = v.bucket("all")?.unwrap();
            let page = v.ops(state.id, 0, u64::MAX, usize::MAX)?;
            assert_eq!(page.ops.len(), 6000);
            for (i, op) in page.ops.iter().enumerate() {
                assert_eq!(
                    op.object.as_ref().unwrap().data.as_deref(),
                    Some(data(i as u32).as_str())
                );
            }
            Ok(())
        })
        .unwrap();
    // Updates of compressed rows still find and supersede them.
    store
        .write(2, |w| w.delete_row(1, b"task-004000"))
        .map(|(removed, _)| assert!(removed))
        .unwrap();
}
