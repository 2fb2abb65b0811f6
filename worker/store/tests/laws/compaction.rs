//! Compaction after bulk updates: ops superseded in a write are MOVEs for a compaction in
//! it, and a prefix longer than one compaction step is folded whole.
use super::client::Client;
use super::*;

/// Rows `0..rows` of bucket `b0`, each with data `{"id":"r<row>","v":<version>}`.
fn upsert_all(w: &mut store::WriteTxn<'_, '_>, rows: u64, version: u32) -> Result<(), StoreError> {
    for row in 0..rows {
        let data = format!("{{\"id\":\"r{row}\",\"v\":{version}}}");
        let object_id = format!("r{row}");
        let put = RowPut {
            bucket: BUCKETS[0],
            object_type: "items",
            object_id: &object_id,
            data: &data,
            checksum: checksum_of(&data),
        };
        w.upsert_row(1, &row.to_be_bytes(), &[put], &[])?;
    }
    Ok(())
}

/// A bulk update supersedes ops block after block; a compaction later in the same write
/// sees them as MOVEs, and what a client downloads adds up.
#[test]
fn ops_superseded_in_a_write_are_moves_for_a_compaction_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let truth_at = |updated: u64| {
        let rows: BTreeMap<String, String> = (0..1000)
            .map(|row| {
                let version = if row < updated { 2 } else { 1 };
                let data = format!("{{\"id\":\"r{row}\",\"v\":{version}}}");
                (format!("r{row}"), data)
            })
            .collect();
        BTreeMap::from([(BUCKETS[0], rows)])
    };
    // 1,000 rows: six blocks of ops; a client syncs them.
    store.write(1, |w| upsert_all(w, 1000, 1)).unwrap();
    let mut behind = Client::default();
    behind.sync(&store, &truth_at(0));
    let id = store
        .read(|v| Ok(v.bucket(BUCKETS[0])?.unwrap().id))
        .unwrap();
    let (removed, cp) = store
        .write(2, |w| {
            upsert_all(w, 700, 2)?;
            w.compact_bucket(id)
        })
        .unwrap();
    // The 700 superseded PUTs lead the bucket: one CLEAR stands for them.
    assert_eq!(removed, 699);
    assert_eq!(cp.op_id, 1700);
    // A new client and the one synced before both end with the rows and checksums.
    Client::default().sync(&store, &truth_at(700));
    behind.sync(&store, &truth_at(700));
}

/// A full-table update of a table larger than one compaction step (100,000 ops): the
/// compaction due at its end folds all of the superseded prefix, not one step of it, so
/// repeated bulk updates leave `CLEAR, live PUTs` and storage stays bounded. The
/// compaction runs at the start of the next write, also after a restart in between.
#[test]
fn a_prefix_longer_than_one_compaction_step_is_folded_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(&dir.path().join("store")).unwrap();
    const ROWS: u64 = 120_000;
    store.write(1, |w| upsert_all(w, ROWS, 1)).unwrap();
    for version in 2..=3 {
        let (marked, _) = store
            .write(u64::from(version), |w| {
                upsert_all(w, ROWS, version)?;
                w.compact_due(1024)
            })
            .unwrap();
        assert!(marked, "the update made its bucket due");
        if version == 3 {
            // Marked, then stopped before compacting: the mark was committed with the ops.
            drop(store);
            store = Store::open(&dir.path().join("store")).unwrap();
        }
        // The next write compacts it first.
        store.write(u64::from(version), |_| Ok(())).unwrap();
        let (count, first) = store
            .read(|v| {
                let state = v.bucket(BUCKETS[0])?.unwrap();
                let first = v.ops(state.id, 0, u64::MAX, 2)?.ops;
                Ok((
                    state.count,
                    first.iter().map(|op| op.kind).collect::<Vec<_>>(),
                ))
            })
            .unwrap();
        assert_eq!(
            (count, first),
            (ROWS + 1, vec![OpKind::Clear, OpKind::Put]),
            "after update {version}: one CLEAR, then the live PUTs"
        );
    }
}
