//! Directory discipline and identity of the store.
use super::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

#[test]
fn creates_a_private_directory_and_keeps_its_identity() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("store");
    let first = Store::open(&dir).unwrap();
    assert!(first.was_created());
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let id = first.identity().clone();
    assert_eq!(id.format, FORMAT);
    assert_eq!(id.store_id.len(), 32);
    drop(first);

    let again = Store::open(&dir).unwrap();
    assert!(!again.was_created());
    assert_eq!(again.identity(), &id);
    assert!(again.file_bytes() > 0);
}

#[test]
fn refuses_foreign_content() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(dir.join("PG_VERSION"), "16").unwrap();
    let err = Store::open(&dir).err().unwrap();
    assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
    assert!(err.to_string().contains("PG_VERSION"), "{err}");
    assert!(err.needs_operator());

    let file = root.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    assert!(matches!(
        Store::open(&file),
        Err(StoreError::Foreign { .. })
    ));
}

#[test]
fn refuses_an_mdbx_environment_it_did_not_write() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    write_foreign_mdbx(&dir);
    let err = Store::open(&dir).err().unwrap();
    assert!(
        err.to_string().contains("without powersync_mdbx metadata"),
        "{err}"
    );
}

/// Rewrites the store's recorded format, as a store written by another build would have it.
fn set_format(dir: &Path, format: &[u8]) {
    let db = libmdbx::Database::<libmdbx::NoWriteMap>::open_with_options(
        dir,
        libmdbx::DatabaseOptions {
            max_tables: Some(16),
            ..Default::default()
        },
    )
    .unwrap();
    let txn = db.begin_rw_txn().unwrap();
    let t = txn.open_table(Some("meta")).unwrap();
    txn.put(&t, b"format", format, libmdbx::WriteFlags::UPSERT)
        .unwrap();
    txn.commit().unwrap();
}

#[test]
fn refuses_another_format_and_shared_directories() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("store");
    drop(Store::open(&dir).unwrap());
    set_format(&dir, b"powersync_mdbx/store/0");
    let err = Store::open(&dir).err().unwrap();
    assert!(matches!(err, StoreError::Incompatible { .. }), "{err}");
    assert!(err.to_string().contains("powersync_mdbx.reset()"), "{err}");

    assert_eq!(
        remove_store_files(&dir).unwrap(),
        vec!["mdbx.dat", "mdbx.lck"]
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = Store::open(&dir).err().unwrap();
    assert!(err.to_string().contains("group or world access"), "{err}");
}

#[test]
fn the_generation_survives_a_reset_and_counts_up() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("store");
    assert_eq!(next_generation(&dir).unwrap(), 1, "no directory yet");
    drop(Store::open(&dir).unwrap());
    assert_eq!(next_generation(&dir).unwrap(), 1);
    assert_eq!(advance_generation(&dir).unwrap(), 2);
    remove_store_files(&dir).unwrap();
    // The generation file is the store directory's own: a new store opens beside it.
    drop(Store::open(&dir).unwrap());
    assert_eq!(next_generation(&dir).unwrap(), 2);
    assert_eq!(advance_generation(&dir).unwrap(), 3);
    std::fs::write(dir.join("generation"), "not a number").unwrap();
    assert!(next_generation(&dir).is_err());
}

#[test]
fn a_store_of_another_format_still_shows_its_stage_records() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("store");
    let store = Store::open(&dir).unwrap();
    store
        .put_stage_record("bootstrap", b"{\"slot\":\"s\"}")
        .unwrap();
    drop(store);
    set_format(&dir, b"powersync_mdbx/store/2");
    assert!(matches!(
        Store::open(&dir),
        Err(StoreError::Incompatible { .. })
    ));
    assert_eq!(
        stage_record_of_any_format(&dir, "bootstrap").unwrap(),
        Some(b"{\"slot\":\"s\"}".to_vec())
    );
    assert_eq!(stage_record_of_any_format(&dir, "other").unwrap(), None);
}

#[test]
fn only_a_powersync_mdbx_store_is_ours() {
    let root = tempfile::tempdir().unwrap();
    let entries = |dir: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let dir = root.path().join("absent");
    std::fs::create_dir(&dir).unwrap();
    assert_eq!(inspect_data_file(&dir, "bootstrap"), DataFile::Absent);

    // Ours, of this format and of another one, with and without the record.
    let dir = root.path().join("ours");
    let store = Store::open(&dir).unwrap();
    store.put_stage_record("bootstrap", b"{}").unwrap();
    drop(store);
    let ours = |format: &str| DataFile::Ours {
        format: format.into(),
        record: Ok(Some(b"{}".to_vec())),
    };
    assert_eq!(inspect_data_file(&dir, "bootstrap"), ours(FORMAT));
    set_format(&dir, b"powersync_mdbx/store/2");
    assert_eq!(
        inspect_data_file(&dir, "bootstrap"),
        ours("powersync_mdbx/store/2")
    );
    assert!(matches!(
        inspect_data_file(&dir, "other"),
        DataFile::Ours {
            record: Ok(None),
            ..
        }
    ));
    // Another program's metadata in a table of the same name is not ours.
    set_format(&dir, b"their_program/1");
    assert!(matches!(
        inspect_data_file(&dir, "bootstrap"),
        DataFile::NotOurs { .. }
    ));

    // An MDBX environment another program wrote.
    let dir = root.path().join("foreign");
    std::fs::create_dir(&dir).unwrap();
    write_foreign_mdbx(&dir);
    let before = entries(&dir);
    match inspect_data_file(&dir, "bootstrap") {
        DataFile::NotOurs { reason } => assert!(
            reason.contains("without powersync_mdbx metadata"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(entries(&dir), before);

    // A file that is no MDBX file, and a directory in the data file's place.
    let dir = root.path().join("bytes");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("mdbx.dat"), vec![0x42u8; 64 * 1024]).unwrap();
    match inspect_data_file(&dir, "bootstrap") {
        DataFile::NotOurs { reason } => {
            assert!(reason.contains("libmdbx cannot open it"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        entries(&dir),
        vec!["mdbx.dat"],
        "nothing was added beside it"
    );
    let dir = root.path().join("directory");
    std::fs::create_dir_all(dir.join("mdbx.dat")).unwrap();
    assert!(matches!(
        inspect_data_file(&dir, "bootstrap"),
        DataFile::NotOurs { .. }
    ));
}

#[test]
fn old_write_checkpoints_expire_once_reached_and_in_bounded_passes() {
    const AGE: u64 = 86_400;
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(&root.path().join("store")).unwrap();
    let key = |name: &str| format!("{WRITE_CHECKPOINT_PREFIX}{name}");
    store.put_stage_record("bootstrap", b"{}").unwrap();
    store
        .put_stage_records(&[
            (
                key("asked-long-ago"),
                WriteCheckpointRecord::encode(50, 1_000).to_vec(),
            ),
            (
                key("not-reached"),
                WriteCheckpointRecord::encode(500, 1_000).to_vec(),
            ),
            (
                key("recent"),
                WriteCheckpointRecord::encode(60, 80_000).to_vec(),
            ),
            // Written by a build that stored the LSN alone.
            (key("earlier-format"), 40u64.to_le_bytes().to_vec()),
            (key("garbage"), b"xyz".to_vec()),
        ])
        .unwrap();
    let expire = |now: u64| {
        let expiry = Expiry {
            now,
            max_age: AGE,
            reached_lsn: 100,
            budget: 100,
        };
        store
            .write(0, |w| w.expire_write_checkpoints(&expiry, None))
            .unwrap()
            .0
    };
    let left = || -> Vec<String> {
        store
            .read(|view| view.stage_records(WRITE_CHECKPOINT_PREFIX))
            .unwrap()
            .into_iter()
            .map(|(k, _)| k[WRITE_CHECKPOINT_PREFIX.len()..].to_owned())
            .collect()
    };

    // Younger than the age: kept; the earlier format gets the pass's time.
    let pass = expire(1_000 + AGE - 1);
    assert_eq!(
        (pass.examined, pass.expired, pass.stamped),
        (5, 1, 1),
        "{pass:?}"
    );
    assert_eq!(
        left(),
        ["asked-long-ago", "earlier-format", "not-reached", "recent"]
    );
    let stamped = store
        .read(|view| view.stage_record(&key("earlier-format")))
        .unwrap()
        .unwrap();
    assert_eq!(
        WriteCheckpointRecord::decode(&stamped),
        Some(WriteCheckpointRecord {
            lsn: 40,
            requested_at: Some(1_000 + AGE - 1),
            id: 40,
        })
    );

    // Past the age: gone, but not the one whose LSN no checkpoint has reached (a client
    // may still wait for it), nor a younger one, nor other stage records.
    let pass = expire(1_000 + AGE);
    assert_eq!(pass.expired, 1, "{pass:?}");
    assert_eq!(left(), ["earlier-format", "not-reached", "recent"]);
    expire(1_000 + 2 * AGE);
    assert_eq!(left(), ["not-reached"]);
    assert!(store
        .read(|view| view.stage_record("bootstrap"))
        .unwrap()
        .is_some());

    // Many: each pass looks at no more than its budget and says where to go on.
    let many: Vec<(String, Vec<u8>)> = (0..25)
        .map(|i| {
            (
                key(&format!("c{i:02}")),
                WriteCheckpointRecord::encode(1, 0).to_vec(),
            )
        })
        .collect();
    store.put_stage_records(&many).unwrap();
    let expiry = Expiry {
        now: AGE,
        max_age: AGE,
        reached_lsn: 100,
        budget: 10,
    };
    let mut from: Option<Vec<u8>> = None;
    let mut passes = Vec::new();
    loop {
        let pass = store
            .write(0, |w| w.expire_write_checkpoints(&expiry, from.as_deref()))
            .unwrap()
            .0;
        passes.push((pass.examined, pass.expired));
        from = pass.resume;
        if from.is_none() {
            break;
        }
    }
    assert_eq!(passes, [(10, 10), (10, 10), (6, 5)]);
    assert_eq!(left(), ["not-reached"]);
}

/// An MDBX environment in `dir` that another program wrote (one key, no metadata of ours).
fn write_foreign_mdbx(dir: &std::path::Path) {
    let db = libmdbx::Database::<libmdbx::NoWriteMap>::open(dir).unwrap();
    let txn = db.begin_rw_txn().unwrap();
    let t = txn.create_table(None, Default::default()).unwrap();
    txn.put(&t, b"k", b"v", libmdbx::WriteFlags::UPSERT)
        .unwrap();
    txn.commit().unwrap();
}

/// Writes a row into `bucket` at `lsn` and reads every object id the bucket holds.
fn write_and_list(store: &Store, lsn: u64, id: &str) -> Vec<String> {
    let put = RowPut {
        bucket: "1#everything[]",
        object_type: "notes",
        object_id: id,
        data: "{}",
        checksum: 1,
    };
    store
        .write(lsn, |w| w.upsert_row(1, id.as_bytes(), &[put], &[]))
        .unwrap();
    listed(store, |_| true)
}

/// The object ids of the ops of `1#everything[]` that `keep` keeps, in op order.
fn listed(store: &Store, keep: impl Fn(&crate::op::OpKind) -> bool) -> Vec<String> {
    store
        .read(|v| {
            let state = v.bucket("1#everything[]")?.unwrap();
            let page = v.ops(state.id, 0, u64::MAX, 1000)?;
            Ok(page
                .ops
                .into_iter()
                .filter(|op| keep(&op.kind))
                .filter_map(|op| op.object.map(|o| o.object_id))
                .collect())
        })
        .unwrap()
}

#[test]
fn the_store_writes_through_its_map_only_where_the_files_space_can_be_reserved() {
    let shm = Path::new("/dev/shm");
    assert!(
        shm.is_dir(),
        "the test needs /dev/shm (a tmpfs on Linux) to open a store on tmpfs"
    );
    let on_tmpfs = tempfile::tempdir_in(shm).unwrap();
    let on_disk = tempfile::tempdir().unwrap();
    for (root, map) in [
        (on_tmpfs.path(), false),
        (on_disk.path(), map_write::reservable(on_disk.path())),
    ] {
        let dir = root.join("store");
        let store = Store::open(&dir).unwrap();
        assert!(!store.writes_through_map(), "opened with file writes");
        assert_eq!(write_and_list(&store, 10, "a"), ["a"]);
        assert_eq!(store.write_through_map().unwrap(), map, "{}", dir.display());
        assert_eq!(store.writes_through_map(), map);
        // What was written before is there; writes and reads go on.
        assert_eq!(write_and_list(&store, 11, "b"), ["a", "b"]);
        assert_eq!(store.write_through_map().unwrap(), map, "a second call");
        drop(store);
        let store = Store::open(&dir).unwrap();
        assert_eq!(store.read(|v| v.checkpoint()).unwrap().lsn, 11);
        assert_eq!(write_and_list(&store, 12, "c"), ["a", "b", "c"]);
    }
}

/// A temporary directory on a file system the store writes through its map on.
fn reservable_tempdir() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    assert!(
        map_write::reservable(root.path()),
        "the test needs its temporary directory on ext4 or XFS ({})",
        root.path().display()
    );
    root
}

#[test]
fn the_data_files_space_is_reserved_when_it_is_written_through_the_map() {
    let root = reservable_tempdir();
    let dir = root.path().join("store");
    let store = Store::open(&dir).unwrap();
    write_and_list(&store, 10, "a");
    assert!(store.write_through_map().unwrap());
    // Every block of the file is allocated: libmdbx released those past its last page
    // as it opened the file with a writable map, and the store took them again.
    let meta = std::fs::metadata(dir.join(dir::DATA_FILE)).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.blocks() * 512 >= meta.len(),
        "{} bytes allocated of {}",
        meta.blocks() * 512,
        meta.len()
    );
}

/// A REMOVE's tombstone goes past the end of `tombstones` without a search (op ids only
/// grow); one whose key is not past the end (a larger key written by other means) is placed
/// by a search instead of failing the delete.
#[test]
fn a_tombstone_not_past_the_tables_end_is_placed_by_a_search() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(&root.path().join("store")).unwrap();
    write_and_list(&store, 10, "a");
    write_and_list(&store, 11, "b");
    store
        .write(12, |w| {
            let stray = crate::record::Tombstone::encode_parts("notes", "z", "1/99");
            w.put_tombstone(u64::MAX, &stray)?;
            w.delete_row(1, b"a").map(drop)
        })
        .unwrap();
    store
        .write(13, |w| w.delete_row(1, b"b").map(drop))
        .unwrap();
    let removed = listed(&store, |kind| *kind == crate::op::OpKind::Remove);
    assert_eq!(removed, ["a", "b"]);
}

/// A deleted row's REMOVEs show, in each bucket, the output the row showed there: a row
/// whose buckets show different outputs (the tombstone is made once per output, the bucket
/// found by id once the transaction wrote to it, by name before).
#[test]
fn each_remove_of_a_row_shows_the_output_of_its_bucket() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(&root.path().join("store")).unwrap();
    let put = |bucket, object_type, id| RowPut {
        bucket,
        object_type,
        object_id: id,
        data: "{}",
        checksum: 1,
    };
    let buckets = ["1#a[]", "1#b[]", "1#c[]"];
    let row = |id| {
        [
            put(buckets[0], "notes", id),
            put(buckets[1], "tasks", id),
            put(buckets[2], "notes", id),
        ]
    };
    store
        .write(10, |w| {
            w.upsert_row(1, b"x", &row("x"), &[])?;
            w.upsert_row(1, b"y", &row("y"), &[])
        })
        .unwrap();
    // `x` deleted first in its transaction (its buckets not written yet), `y` after it.
    store
        .write(11, |w| {
            assert!(w.delete_row(1, b"x")?);
            w.delete_row(1, b"y").map(drop)
        })
        .unwrap();
    let removes = |bucket: &str| -> Vec<(String, String, String)> {
        store
            .read(|v| {
                let state = v.bucket(bucket)?.unwrap();
                let page = v.ops(state.id, 0, u64::MAX, 1000)?;
                Ok(page
                    .ops
                    .into_iter()
                    .filter(|op| op.kind == crate::op::OpKind::Remove)
                    .filter_map(|op| op.object)
                    .map(|o| (o.object_type, o.object_id, o.subkey))
                    .collect())
            })
            .unwrap()
    };
    let shown = |object_type: &str| {
        vec![
            (object_type.to_owned(), "x".to_owned(), "1/1".to_owned()),
            (object_type.to_owned(), "y".to_owned(), "1/2".to_owned()),
        ]
    };
    assert_eq!(removes(buckets[0]), shown("notes"));
    assert_eq!(removes(buckets[1]), shown("tasks"));
    assert_eq!(removes(buckets[2]), shown("notes"));
}

#[test]
fn reads_go_on_while_a_switch_to_map_writes_reads_the_file_back() {
    use std::sync::{mpsc, Arc, Mutex};
    use std::time::Duration;
    let root = reservable_tempdir();
    let dir = root.path().join("store");
    let store = Arc::new(Store::open(&dir).unwrap());
    write_and_list(&store, 10, "a");
    let (at_read_back, reached) = mpsc::channel();
    let (go, wait) = mpsc::channel::<()>();
    let wait = Mutex::new(wait);
    *map_write::tests::BEFORE_READ_BACK.lock().unwrap() = Some((
        dir.clone(),
        Box::new(move || {
            at_read_back.send(()).ok();
            wait.lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30))
                .ok();
        }),
    ));
    let switching = {
        let store = store.clone();
        std::thread::spawn(move || store.write_through_map())
    };
    reached
        .recv_timeout(Duration::from_secs(30))
        .expect("the switch reaches its read-back");
    // The file is being read back now: a read and the status a heartbeat takes answer.
    let (answer, answered) = mpsc::channel();
    {
        let store = store.clone();
        std::thread::spawn(move || {
            let lsn = store.read(|v| v.checkpoint()).map(|c| c.lsn);
            answer.send((lsn, store.used_bytes())).ok();
        });
    }
    let seen = answered.recv_timeout(Duration::from_secs(5));
    go.send(()).unwrap();
    *map_write::tests::BEFORE_READ_BACK.lock().unwrap() = None;
    assert!(
        switching.join().unwrap().unwrap(),
        "the store writes through its map"
    );
    let (lsn, used) = seen.expect("a read waited for the file to be read back");
    assert_eq!(lsn.unwrap(), 10);
    assert!(used > 0);
}

#[test]
fn a_poisoned_store_opened_again_in_place_writes_again_and_keeps_what_it_held() {
    let root = reservable_tempdir();
    let dir = root.path().join("store");
    let store = std::sync::Arc::new(Store::open(&dir).unwrap());
    write_and_list(&store, 10, "a");
    assert!(store.write_through_map().unwrap());
    // A commit failed: writes are refused, reads go on.
    store.poisoned.store(true, Ordering::Release);
    let refused = store.write(11, |w| w.upsert_row(1, b"b", &[], &[]));
    assert!(matches!(refused, Err(StoreError::Poisoned { .. })));
    assert_eq!(listed(&store, |_| true), ["a"]);
    // Writes held when it is opened again are dropped, never published.
    store.poisoned.store(false, Ordering::Release);
    store.hold().unwrap();
    store
        .write(12, |w| {
            w.upsert_row(
                1,
                b"held",
                &[RowPut {
                    bucket: "1#everything[]",
                    object_type: "notes",
                    object_id: "held",
                    data: "{}",
                    checksum: 1,
                }],
                &[],
            )
        })
        .unwrap();
    store.poisoned.store(true, Ordering::Release);
    assert!(store.has_room_to_reopen());
    store.reopen().unwrap();
    assert!(!store.is_held());
    assert!(store.writes_through_map(), "it writes as it did");
    assert_eq!(store.read(|v| v.checkpoint()).unwrap().lsn, 10);
    assert_eq!(write_and_list(&store, 13, "c"), ["a", "c"]);
    drop(store);
    let store = Store::open(&dir).unwrap();
    assert_eq!(listed(&store, |_| true), ["a", "c"]);
}

/// What open streams see of a reopen under load (readers reading 1,000-op pages and a
/// writer committing single rows throughout, on a store of 100,000 rows): each read and
/// write waits only for the close and open, well under the second within which a client
/// must have its checkpoint again (issue 59). The times are printed.
#[test]
fn reads_and_writes_wait_only_for_the_reopen_itself() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let root = reservable_tempdir();
    let store = Arc::new(Store::open(&root.path().join("store")).unwrap());
    let ids: Vec<String> = (0..100_000).map(|i| format!("r{i:06}")).collect();
    store
        .write(1, |w| {
            for id in &ids {
                let put = RowPut {
                    bucket: "1#everything[]",
                    object_type: "notes",
                    object_id: id,
                    data: "{\"body\":\"a row of the benchmark's size\"}",
                    checksum: 1,
                };
                w.upsert_row(1, id.as_bytes(), &[put], &[])?;
            }
            Ok(())
        })
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let longest = |work: Box<dyn Fn() + Send>| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut longest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                work();
                longest = longest.max(started.elapsed());
            }
            longest
        })
    };
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let store = store.clone();
            longest(Box::new(move || {
                store
                    .read(|v| {
                        let state = v.bucket("1#everything[]")?.unwrap();
                        v.ops(state.id, 50_000, u64::MAX, 1000).map(|_| ())
                    })
                    .unwrap();
            }))
        })
        .collect();
    let writer = {
        let (store, lsn) = (store.clone(), std::sync::atomic::AtomicU64::new(2));
        longest(Box::new(move || {
            let lsn = lsn.fetch_add(1, Ordering::Relaxed);
            write_and_list_nothing(&store, lsn);
        }))
    };
    let mut reopens = Vec::new();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        store.reopen().unwrap();
        reopens.push(started.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    let read_waits: Vec<Duration> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let write_wait = writer.join().unwrap();
    println!(
        "reopen under load: reopens {reopens:?}; longest read {:?}; longest write {write_wait:?}",
        read_waits.iter().max().unwrap()
    );
    for wait in read_waits.iter().chain([&write_wait]) {
        assert!(*wait < Duration::from_secs(1), "waited {wait:?}");
    }
}

/// One single-row commit at `lsn`, as the stream makes.
fn write_and_list_nothing(store: &Store, lsn: u64) {
    let id = format!("w{lsn}");
    let put = RowPut {
        bucket: "1#everything[]",
        object_type: "notes",
        object_id: &id,
        data: "{}",
        checksum: 1,
    };
    store
        .write(lsn, |w| w.upsert_row(1, id.as_bytes(), &[put], &[]))
        .unwrap();
}
