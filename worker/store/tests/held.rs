//! Held writes (`Store::hold`, `WriteTxn::hold_open`): readers see the last commit before
//! the hold until it is released, then every held write at once; an abandoned hold (or a
//! held write that fails) leaves the store as that commit, keeping the stage records
//! others wrote meanwhile.
use crate::support::put;
use store::{Checkpoint, Store, StoreError};

const BUCKET: &str = "1#user[\"u1\"]";

/// The bucket's live rows and the checkpoint, as a client reading now sees them.
fn seen(store: &Store) -> (Checkpoint, Vec<(String, String)>) {
    store
        .read(|view| {
            let checkpoint = view.checkpoint()?;
            let mut rows = std::collections::BTreeMap::new();
            let Some(id) = view
                .bucket_names()?
                .into_iter()
                .find(|(_, name)| name == BUCKET)
                .map(|(id, _)| id)
            else {
                return Ok((checkpoint, Vec::new()));
            };
            for op in view.ops(id, 0, checkpoint.op_id, usize::MAX)?.ops {
                let Some(object) = op.object else { continue };
                match op.kind {
                    store::OpKind::Put => {
                        rows.insert(object.object_id, object.data.unwrap_or_default());
                    }
                    store::OpKind::Remove => {
                        rows.remove(&object.object_id);
                    }
                    _ => {}
                }
            }
            Ok((checkpoint, rows.into_iter().collect()))
        })
        .unwrap()
}

fn write_row(store: &Store, lsn: u64, id: &str, data: &str) -> Checkpoint {
    store
        .write(lsn, |w| {
            w.upsert_row(1, id.as_bytes(), &[put(BUCKET, id, data)], &[])
        })
        .unwrap()
        .1
}

fn opened() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    (dir, store)
}

#[test]
fn held_writes_are_seen_only_when_released_and_then_all_at_once() {
    seen_at_release(false);
}

#[test]
fn held_writes_through_the_map_are_seen_only_when_released() {
    seen_at_release(true);
}

fn seen_at_release(through_map: bool) {
    let (_dir, store) = opened();
    if through_map {
        // Where the file system allows it (ext4, XFS); the writes are the same otherwise.
        eprintln!(
            "writes through the map: {}",
            store.write_through_map().unwrap()
        );
    }
    let before = write_row(&store, 10, "a", "{\"v\":1}");
    let shown = seen(&store);
    assert!(store.take_changes().buckets.contains(BUCKET));

    store.hold().unwrap();
    assert!(store.is_held());
    write_row(&store, 20, "a", "{\"v\":2}");
    assert_eq!(seen(&store), shown, "a held write is not seen");
    let last = write_row(&store, 30, "b", "{\"v\":3}");
    assert_eq!(seen(&store), shown, "nor a second");
    assert!(
        store.take_changes().is_empty(),
        "nothing to wake a stream for yet"
    );
    assert!(last.lsn == 30 && last.op_id > before.op_id);

    assert_eq!(store.release().unwrap(), Some(last));
    assert!(!store.is_held());
    let (checkpoint, rows) = seen(&store);
    assert_eq!(checkpoint, last);
    assert_eq!(
        rows,
        [
            ("a".to_owned(), "{\"v\":2}".to_owned()),
            ("b".to_owned(), "{\"v\":3}".to_owned())
        ]
    );
    assert!(store.take_changes().buckets.contains(BUCKET));
    assert_eq!(store.release().unwrap(), None, "released once");
}

#[test]
fn a_write_that_asks_to_be_held_is_not_committed_until_released() {
    let (_dir, store) = opened();
    write_row(&store, 10, "a", "{\"v\":1}");
    let shown = seen(&store);
    store
        .write(20, |w| {
            w.hold_open();
            w.upsert_row(1, b"a", &[put(BUCKET, "a", "{\"v\":2}")], &[])
        })
        .unwrap();
    assert!(store.is_held());
    assert_eq!(seen(&store), shown);
    let last = write_row(&store, 30, "a", "{\"v\":3}");
    assert_eq!(store.release().unwrap(), Some(last));
    assert_eq!(seen(&store).1, [("a".to_owned(), "{\"v\":3}".to_owned())]);
}

#[test]
fn an_abandoned_hold_leaves_the_last_commit_and_keeps_stage_records_written_into_it() {
    let (dir, store) = opened();
    write_row(&store, 10, "a", "{\"v\":1}");
    let shown = seen(&store);
    store.hold().unwrap();
    write_row(&store, 20, "a", "{\"v\":2}");
    // A write-checkpoint request while writes are held goes into them (the MDBX writer
    // is theirs) ...
    store.put_stage_record("wc.u1", b"7").unwrap();
    let id = store
        .update_stage_record("wc.u2", |stored| {
            assert_eq!(stored, None);
            (Some(b"8".to_vec()), 8)
        })
        .unwrap();
    assert_eq!(id, 8);
    let record = |store: &Store, key: &str| store.read(|view| view.stage_record(key)).unwrap();
    assert_eq!(record(&store, "wc.u1"), None, "not seen while held");
    store.abandon().unwrap();
    assert!(!store.is_held());
    assert_eq!(seen(&store), shown, "the held write is gone");
    // ... and is not lost with them.
    assert_eq!(record(&store, "wc.u1").as_deref(), Some(&b"7"[..]));
    assert_eq!(record(&store, "wc.u2").as_deref(), Some(&b"8"[..]));

    // Writes go on as before; a reopened store holds what was committed.
    let next = write_row(&store, 30, "c", "{}");
    drop(store);
    let store = Store::open(&dir.path().join("store")).unwrap();
    assert_eq!(seen(&store).0, next);
    assert_eq!(seen(&store).1.len(), 2);
}

#[test]
fn a_held_write_that_fails_abandons_the_whole_hold() {
    let (_dir, store) = opened();
    write_row(&store, 10, "a", "{\"v\":1}");
    let shown = seen(&store);
    store.hold().unwrap();
    write_row(&store, 20, "b", "{}");
    let failed = store.write_with(30, |w| {
        w.upsert_row(1, b"c", &[put(BUCKET, "c", "{}")], &[])?;
        Err::<(), _>(StoreError::corrupt(
            std::path::Path::new("x"),
            "a test's failure",
        ))
    });
    assert!(failed.is_err());
    assert!(!store.is_held(), "a write that failed ends the hold");
    assert_eq!(seen(&store), shown, "none of the held writes is kept");
    assert_eq!(store.release().unwrap(), None);
}

#[test]
fn a_hold_that_ends_with_the_store_leaves_the_last_commit() {
    let (dir, store) = opened();
    let committed = write_row(&store, 10, "a", "{\"v\":1}");
    store.hold().unwrap();
    write_row(&store, 20, "a", "{\"v\":2}");
    // The process ending (here: the store dropped) while writes are held.
    drop(store);
    let store = Store::open(&dir.path().join("store")).unwrap();
    assert_eq!(seen(&store).0, committed);
    assert_eq!(seen(&store).1, [("a".to_owned(), "{\"v\":1}".to_owned())]);
}
