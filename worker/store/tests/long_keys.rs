//! Bucket names, lookup keys and lookup outputs of any length are stored and read back
//! exactly (libmdbx takes keys and DUPSORT values of about half a page only), and a row's
//! long entries go when the row changes or is deleted.
use crate::support::put;
use store::long_keys::{max_dup_value, max_key};
use store::{LookupPut, OpKind, Store};

/// A bucket name of `len` bytes that differs from its neighbours only in its last part.
fn bucket(len: usize, tail: &str) -> String {
    let mut name = String::from("1#by_note[\"");
    while name.len() + tail.len() + 2 < len {
        name.push('n');
    }
    name.push_str(tail);
    name.push_str("\"]");
    name
}

/// Every live row of `bucket` as (id, data), read as a client would.
fn rows_of(store: &Store, bucket: &str) -> Vec<(String, String)> {
    store
        .read(|view| {
            let state = view.bucket(bucket)?.expect("the bucket exists");
            let cp = view.checkpoint()?.op_id;
            let page = view.ops(state.id, 0, cp, usize::MAX)?;
            let mut rows = std::collections::BTreeMap::new();
            for op in page.ops {
                let object = op.object.clone();
                match op.kind {
                    OpKind::Put => {
                        let o = object.unwrap();
                        rows.insert(o.object_id, o.data.unwrap());
                    }
                    OpKind::Remove => {
                        rows.remove(&object.unwrap().object_id);
                    }
                    OpKind::Move | OpKind::Clear => {}
                }
            }
            Ok(rows.into_iter().collect())
        })
        .unwrap()
}

#[test]
fn names_keys_and_outputs_of_any_length_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let names = [
        bucket(max_key(), "at-the-limit"),
        bucket(max_key() + 1, "just-over"),
        bucket(3_000, "a"),
        bucket(3_000, "b"),
        bucket(100_000, "c"),
    ];
    let long_key = format!("[\"notes\",\"q\",\"{}\"]", "k".repeat(3_000));
    let other_long_key = format!("[\"notes\",\"q\",\"{}\"]", "j".repeat(3_000));
    let long_outputs = vec![b'o'; max_dup_value() + 10];
    store
        .write(1, |w| {
            for (i, name) in names.iter().enumerate() {
                let id = format!("r{i}");
                let data = format!("{{\"id\":\"{id}\"}}");
                let out = format!("out{i}");
                let lookups = [
                    LookupPut {
                        key: long_key.as_bytes(),
                        outputs: out.as_bytes(),
                    },
                    LookupPut {
                        key: b"[\"short\"]",
                        outputs: &long_outputs,
                    },
                ];
                w.upsert_row(1, id.as_bytes(), &[put(name, &id, &data)], &lookups)?;
            }
            w.upsert_row(
                1,
                b"other",
                &[put(&names[0], "other", "{}")],
                &[LookupPut {
                    key: other_long_key.as_bytes(),
                    outputs: b"other-out",
                }],
            )?;
            Ok(())
        })
        .unwrap();

    for (i, name) in names.iter().enumerate() {
        let mut want = vec![(format!("r{i}"), format!("{{\"id\":\"r{i}\"}}"))];
        if i == 0 {
            want.insert(0, ("other".into(), "{}".into()));
        }
        assert_eq!(
            rows_of(&store, name),
            want,
            "bucket of {} bytes",
            name.len()
        );
    }
    store
        .read(|view| {
            let mut long: Vec<Vec<u8>> = view.lookup_rows(long_key.as_bytes())?;
            long.sort();
            let want: Vec<Vec<u8>> = (0..names.len())
                .map(|i| format!("out{i}").into_bytes())
                .collect();
            assert_eq!(long, want, "no entry of the other long key mixes in");
            assert_eq!(
                view.lookup_rows(other_long_key.as_bytes())?,
                vec![b"other-out".to_vec()]
            );
            let short = view.lookup_rows(b"[\"short\"]")?;
            assert_eq!(short.len(), names.len());
            assert!(short.iter().all(|o| *o == long_outputs));
            // Listed by name, in name order, whatever their stored keys.
            let listed: Vec<String> = view.bucket_states()?.into_iter().map(|b| b.0).collect();
            let mut sorted = names.to_vec();
            sorted.sort();
            assert_eq!(listed, sorted);
            Ok(())
        })
        .unwrap();

    // Changing a row's lookups and deleting a row remove their long entries.
    store
        .write(2, |w| {
            w.upsert_row(1, b"r0", &[put(&names[0], "r0", "{\"v\":2}")], &[])?;
            assert!(w.delete_row(1, b"r1")?);
            Ok(())
        })
        .unwrap();
    store
        .read(|view| {
            let mut long = view.lookup_rows(long_key.as_bytes())?;
            long.sort();
            assert_eq!(
                long,
                vec![b"out2".to_vec(), b"out3".to_vec(), b"out4".to_vec()]
            );
            assert_eq!(view.lookup_rows(b"[\"short\"]")?.len(), 3);
            Ok(())
        })
        .unwrap();
    assert_eq!(
        rows_of(&store, &names[0]),
        vec![
            ("other".into(), "{}".into()),
            ("r0".into(), "{\"v\":2}".into())
        ]
    );
    assert_eq!(rows_of(&store, &names[1]), vec![]);

    // Everything reads back the same after the store is opened again.
    drop(store);
    let store = Store::open(&dir.path().join("store")).unwrap();
    assert_eq!(
        rows_of(&store, &names[4]),
        vec![("r4".into(), "{\"id\":\"r4\"}".into())]
    );
}
