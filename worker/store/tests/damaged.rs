//! A data file that is damaged (meta pages overwritten, truncated) is refused at open with
//! `PSM_S1009`, for the operator; nothing is read from it.
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use store::{RowPut, Store, StoreError};

/// A store with a few hundred rows, closed.
fn written_store(dir: &Path) {
    let store = Store::open(dir).unwrap();
    store
        .write(1, |w| {
            for i in 0..300 {
                let id = format!("r{i}");
                let data = format!("{{\"id\":\"{id}\",\"pad\":\"{}\"}}", "p".repeat(200));
                let put = RowPut {
                    bucket: "1#everything[]",
                    object_type: "notes",
                    object_id: &id,
                    data: &data,
                    checksum: i,
                };
                w.upsert_row(1, id.as_bytes(), &[put], &[])?;
            }
            Ok(())
        })
        .unwrap();
}

fn assert_refused(dir: &Path, what: &str) {
    match Store::open(dir) {
        Err(e @ StoreError::Damaged { .. }) => {
            assert!(e.to_string().starts_with("PSM_S1009"), "{what}: {e}");
            assert!(e.to_string().contains("reset()"), "{what}: {e}");
            assert!(e.needs_operator(), "{what}");
        }
        Err(other) => panic!("{what}: refused, but not as damaged: {other}"),
        Ok(_) => panic!("{what}: a damaged data file was opened"),
    }
}

#[test]
fn overwritten_meta_pages_are_refused_at_open() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("store");
    written_store(&dir);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("mdbx.dat"))
        .unwrap();
    file.seek(SeekFrom::Start(0)).unwrap();
    file.write_all(&vec![0x5Au8; 3 * 4096]).unwrap();
    drop(file);
    assert_refused(&dir, "meta pages overwritten");
}

#[test]
fn a_truncated_data_file_is_refused_at_open() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("store");
    written_store(&dir);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("mdbx.dat"))
        .unwrap();
    file.set_len(6 * 4096).unwrap();
    drop(file);
    assert_refused(&dir, "truncated to six pages");
}
