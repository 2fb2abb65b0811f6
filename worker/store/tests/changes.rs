//! What commits changed, as the sync service's wakeups take it (`Store::take_changes`):
//! the buckets that received ops, whether a parameter lookup moved, the stage records
//! written; and "everything" when the store was emptied.
use store::{LookupPut, RowPut, Store};

fn put<'a>(bucket: &'a str, id: &'a str) -> RowPut<'a> {
    RowPut {
        bucket,
        object_type: "notes",
        object_id: id,
        data: "{}",
        checksum: 7,
    }
}

#[test]
fn each_commit_names_the_buckets_lookups_and_records_it_changed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    store
        .write(1, |w| {
            w.upsert_row(1, b"a", &[put("1#global[]", "a")], &[])?;
            w.upsert_row(1, b"b", &[put("1#user[\"u1\"]", "b")], &[])
        })
        .unwrap();
    let changes = store.take_changes();
    assert_eq!(
        changes.buckets,
        ["1#global[]".to_owned(), "1#user[\"u1\"]".to_owned()].into()
    );
    assert!(!changes.lookups && !changes.everything && changes.stage_keys.is_empty());
    assert!(store.take_changes().is_empty(), "taken once");

    // A row of one bucket: the other is left out.
    store
        .write(2, |w| w.upsert_row(1, b"a", &[put("1#global[]", "a")], &[]))
        .unwrap();
    assert_eq!(
        store.take_changes().buckets,
        ["1#global[]".to_owned()].into()
    );

    // A lookup written, then the same lookup again (unchanged), then removed.
    let lookup = [LookupPut {
        key: b"[\"access\",\"u1\"]",
        outputs: b"p1",
    }];
    store
        .write(3, |w| w.upsert_row(2, b"acc", &[], &lookup))
        .unwrap();
    assert!(store.take_changes().lookups);
    store
        .write(4, |w| w.upsert_row(2, b"acc", &[], &lookup))
        .unwrap();
    assert!(!store.take_changes().lookups, "an unchanged lookup");
    store
        .write(5, |w| w.delete_row(2, b"acc").map(|_| ()))
        .unwrap();
    assert!(store.take_changes().lookups);

    // Stage records, in a write and on their own.
    store
        .write(6, |w| w.put_stage_record("wc.k1", b"x"))
        .unwrap();
    store.put_stage_record("wc.k2", b"y").unwrap();
    store
        .update_stage_record("wc.k3", |_| (Some(b"z".to_vec()), ()))
        .unwrap();
    store.update_stage_record("wc.k4", |_| (None, ())).unwrap();
    assert_eq!(
        store.take_changes().stage_keys,
        ["wc.k1".to_owned(), "wc.k2".to_owned(), "wc.k3".to_owned()].into()
    );

    store.clear_data().unwrap();
    assert!(store.take_changes().everything);
}
