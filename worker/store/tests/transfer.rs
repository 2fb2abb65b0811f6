//! A store copied to another (seeding a replica from a peer): the copy holds the same ops,
//! checksums, rows, lookups and history, keeps its own identity, continues the same
//! history under the same writes, and a copy cut short or installed over data is refused
//! without leaving anything that looks complete.
use store::{BucketState, LookupPut, RowPut, Store, StoreError};

const BUCKETS: [&str; 3] = ["tag#b0", "tag#b1[\"x\"]", "tag#b2"];

fn checksum_of(data: &str) -> u32 {
    data.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Writes `round` of a fixed history: upserts of `rows` rows into buckets chosen by the
/// row and the round, a lookup per row, deletes of every seventh row; then a compaction of
/// every bucket.
fn write_round(store: &Store, round: u64, rows: u64) {
    store
        .write(100 + round, |w| {
            for row in 0..rows {
                let identity = row.to_be_bytes();
                if (row + round).is_multiple_of(7) {
                    w.delete_row(1, &identity)?;
                    continue;
                }
                let data = format!("{{\"id\":\"r{row}\",\"round\":{round},\"title\":\"task {row} of a project with a long enough title to compress\"}}");
                let object_id = format!("r{row}");
                let puts: Vec<RowPut<'_>> = BUCKETS
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !(row + round + *i as u64).is_multiple_of(3))
                    .map(|(_, b)| RowPut {
                        bucket: b,
                        object_type: "items",
                        object_id: &object_id,
                        data: &data,
                        checksum: checksum_of(&data),
                    })
                    .collect();
                let key = format!("lookup/{}", row % 10);
                let outputs = format!("[\"r{row}\"]");
                let lookups = [LookupPut {
                    key: key.as_bytes(),
                    outputs: outputs.as_bytes(),
                }];
                w.upsert_row(1, &identity, &puts, &lookups)?;
            }
            Ok(())
        })
        .unwrap();
    let ids: Vec<u32> = store
        .read(|v| {
            Ok(BUCKETS
                .iter()
                .filter_map(|b| v.bucket(b).ok().flatten().map(|s| s.id))
                .collect())
        })
        .unwrap();
    store
        .write(100 + round, |w| {
            for id in &ids {
                w.compact_bucket(*id)?;
            }
            Ok(())
        })
        .unwrap();
}

/// An op as a client sees it: id, kind, checksum, and a PUT's or REMOVE's row id and data.
type SeenOp = (u64, store::OpKind, u32, Option<(String, Option<String>)>);

/// Everything a client or a later write can see of a store.
#[derive(Debug, PartialEq)]
struct Seen {
    checkpoint: store::Checkpoint,
    history: Option<u64>,
    buckets: Vec<Option<BucketState>>,
    ops: Vec<Vec<SeenOp>>,
    lookups: Vec<Vec<Vec<u8>>>,
    entries: Vec<(&'static str, u64)>,
}

fn seen(store: &Store) -> Seen {
    let entries = store
        .table_sizes()
        .unwrap()
        .into_iter()
        .filter(|(name, _, _)| *name != "meta")
        .map(|(name, entries, _)| (name, entries))
        .collect();
    store
        .read(|view| {
            let checkpoint = view.checkpoint()?;
            let mut buckets = Vec::new();
            let mut ops = Vec::new();
            for name in BUCKETS {
                let state = view.bucket(name)?;
                let list = match &state {
                    None => Vec::new(),
                    Some(s) => view
                        .ops(s.id, 0, checkpoint.op_id, usize::MAX)?
                        .ops
                        .into_iter()
                        .map(|op| {
                            let object = op.object.map(|o| (o.object_id, o.data));
                            (op.op_id, op.kind, op.checksum, object)
                        })
                        .collect(),
                };
                buckets.push(state);
                ops.push(list);
            }
            let lookups = (0..10)
                .map(|i| view.lookup_rows(format!("lookup/{i}").as_bytes()))
                .collect::<Result<_, _>>()?;
            Ok(Seen {
                checkpoint,
                history: view.history()?,
                buckets,
                ops,
                lookups,
                entries,
            })
        })
        .unwrap()
}

fn exported(store: &Store) -> Vec<u8> {
    let mut copy = Vec::new();
    store.export_copy(&mut copy).unwrap();
    copy
}

/// A store with a trained record dictionary, compactions, deletes and lookups.
fn peer(dir: &std::path::Path) -> Store {
    let store = Store::open(&dir.join("peer")).unwrap();
    for round in 0..4 {
        write_round(&store, round, 3000);
    }
    store
        .put_stage_record("bootstrap", b"{\"slot\":\"peer\"}")
        .unwrap();
    store
}

/// Installs `copy` into a fresh store at `dir/name` and opens it again.
fn installed(dir: &std::path::Path, name: &str, copy: &[u8]) -> Store {
    let path = dir.join(name);
    Store::open(&path)
        .unwrap()
        .install_copy::<StoreError>(&mut &copy[..], |_| Ok(()))
        .unwrap();
    Store::open(&path).unwrap()
}

#[test]
fn a_copy_continues_the_same_history() {
    let dir = tempfile::tempdir().unwrap();
    let a = peer(dir.path());
    let copy = exported(&a);
    let path = dir.path().join("seeded");
    let before = Store::open(&path).unwrap();
    let own = before.identity().clone();
    let installed = before
        .install_copy::<StoreError>(&mut copy.as_slice(), |meta| {
            let record = meta.get(b"stage.bootstrap".as_slice()).cloned();
            assert_eq!(record.as_deref(), Some(b"{\"slot\":\"peer\"}".as_slice()));
            meta.insert(
                b"stage.bootstrap".to_vec(),
                b"{\"slot\":\"seeded\"}".to_vec(),
            );
            Ok(())
        })
        .unwrap();
    assert_eq!(installed, a.read(|v| v.checkpoint()).unwrap());
    let b = Store::open(&path).unwrap();
    assert!(seen(&a).history.is_some());
    assert_eq!(seen(&b), seen(&a));
    // The copy keeps the receiver's identity and the record `finish` wrote; nothing of the
    // install is left beside the store.
    assert_eq!(b.identity(), &own);
    assert_ne!(b.identity().store_id, a.identity().store_id);
    let record = b.read(|v| v.stage_record("bootstrap")).unwrap();
    assert_eq!(record.as_deref(), Some(b"{\"slot\":\"seeded\"}".as_slice()));
    let mut entries: Vec<_> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    entries.sort();
    assert_eq!(entries, ["mdbx.dat", "mdbx.lck"]);
    // The same writes on both: the same op ids, checksums and compaction.
    for round in 4..7 {
        write_round(&a, round, 3000);
        write_round(&b, round, 3000);
        assert_eq!(seen(&b), seen(&a), "after round {round}");
    }
    // Reopened, the copy reads its records with the dictionary it came with.
    drop(b);
    let b = Store::open(&path).unwrap();
    assert_eq!(seen(&b), seen(&a));
}

#[test]
fn a_copy_cut_short_installs_nothing_that_looks_complete() {
    let dir = tempfile::tempdir().unwrap();
    let a = peer(dir.path());
    let copy = exported(&a);
    let path = dir.path().join("seeded");
    for cut in [20, copy.len() / 3, copy.len() - 3] {
        let error = Store::open(&path)
            .unwrap()
            .install_copy::<StoreError>(&mut &copy[..cut], |_| Ok(()))
            .unwrap_err();
        assert!(
            matches!(
                error,
                StoreError::BadCopy {
                    cut_short: true,
                    ..
                }
            ) && error.to_string().contains("ended before"),
            "{error}"
        );
        let b = Store::open(&path).unwrap();
        assert_eq!(
            b.read(|v| v.checkpoint()).unwrap(),
            store::Checkpoint::default()
        );
        assert_eq!(b.read(|v| v.stage_record("bootstrap")).unwrap(), None);
        assert!(!path.join("incoming").exists());
    }
    // A crash during a copy leaves its incoming file; the store opens beside it, a reset
    // removes it, and the next copy replaces it.
    std::fs::create_dir(path.join("incoming")).unwrap();
    std::fs::write(path.join("incoming/mdbx.dat"), &copy[..100]).unwrap();
    let b = Store::open(&path).unwrap();
    assert_eq!(
        b.read(|v| v.checkpoint()).unwrap(),
        store::Checkpoint::default()
    );
    drop(b);
    assert!(store::remove_store_files(&path)
        .unwrap()
        .contains(&"incoming".to_owned()));
    std::fs::create_dir(path.join("incoming")).unwrap();
    std::fs::write(path.join("incoming/mdbx.dat"), &copy[..100]).unwrap();
    let b = installed(dir.path(), "seeded", &copy);
    assert_eq!(seen(&b), seen(&a));
}

#[test]
fn a_copy_with_bytes_changed_on_the_way_is_refused_before_it_is_installed() {
    let dir = tempfile::tempdir().unwrap();
    let a = peer(dir.path());
    let copy = exported(&a);
    let path = dir.path().join("seeded");
    // A byte inside a page (past the header and the first frame's head), in the middle,
    // and near the end of the file's frames: each changed in transit.
    for at in [64, copy.len() / 2, copy.len() - 64] {
        let mut damaged = copy.clone();
        damaged[at] ^= 0x10;
        let error = Store::open(&path)
            .unwrap()
            .install_copy::<StoreError>(&mut &damaged[..], |_| Ok(()))
            .unwrap_err();
        assert!(
            matches!(error, StoreError::DamagedCopy { .. }),
            "byte {at}: {error}"
        );
        let b = Store::open(&path).unwrap();
        assert_eq!(
            b.read(|v| v.checkpoint()).unwrap(),
            store::Checkpoint::default(),
            "byte {at}: {error}"
        );
        assert!(!path.join("incoming").exists());
    }
    installed(dir.path(), "whole", &copy);
}

#[test]
fn a_copy_goes_only_into_an_empty_store_of_the_same_format() {
    let dir = tempfile::tempdir().unwrap();
    let a = peer(dir.path());
    let copy = exported(&a);
    let other = tempfile::tempdir().unwrap();
    let full = peer(other.path());
    let error = full
        .install_copy::<StoreError>(&mut copy.as_slice(), |_| Ok(()))
        .unwrap_err();
    assert!(error.to_string().contains("already holds data"), "{error}");
    let mut other_format = copy.clone();
    // The format string follows the magic and its length: change its last character.
    let format_end = 8 + 4 + u32::from_le_bytes(copy[8..12].try_into().unwrap()) as usize;
    other_format[format_end - 1] = b'9';
    let path = dir.path().join("seeded");
    let error = Store::open(&path)
        .unwrap()
        .install_copy::<StoreError>(&mut other_format.as_slice(), |_| Ok(()))
        .unwrap_err();
    assert!(error.to_string().contains("of format"), "{error}");
    // A damaged frame is refused, and the store stays empty.
    let mut damaged = copy.clone();
    damaged[format_end] = 7;
    let error = Store::open(&path)
        .unwrap()
        .install_copy::<StoreError>(&mut damaged.as_slice(), |_| Ok(()))
        .unwrap_err();
    assert!(matches!(error, StoreError::DamagedCopy { .. }), "{error}");
    let b = Store::open(&path).unwrap();
    assert_eq!(
        b.read(|v| v.checkpoint()).unwrap(),
        store::Checkpoint::default()
    );
}

#[test]
fn a_write_of_one_replica_alone_forks_the_history_and_a_copy_keeps_the_fork() {
    let dir = tempfile::tempdir().unwrap();
    let a = peer(dir.path());
    let head = a.read(|v| v.checkpoint()).unwrap().op_id;
    // A diverging write that appends no op, or appends its ops only after it converged,
    // leaves the history as it was.
    let (_, checkpoint) = a
        .write(200, |w| {
            w.diverge();
            w.put_stage_record("note", b"x")
        })
        .unwrap();
    assert_eq!(checkpoint.op_id, head);
    let (_, checkpoint) = a
        .write(200, |w| {
            w.diverge();
            w.converge();
            assert!(!w.has_forked());
            w.delete_row(1, &3u64.to_be_bytes())
        })
        .unwrap();
    let head = checkpoint.op_id;
    assert!(a.read(|v| v.forks()).unwrap().list().is_empty());
    // One that appends ops forks once, before its first op.
    let (_, checkpoint) = a
        .write(201, |w| {
            w.diverge();
            w.delete_row(1, &1u64.to_be_bytes())?;
            w.delete_row(1, &2u64.to_be_bytes())
        })
        .unwrap();
    let forks = a.read(|v| v.forks()).unwrap();
    assert_eq!(forks.list().len(), 1);
    let fork = forks.list()[0];
    assert_eq!(fork.left_at, head);
    assert!(fork.resumed_at - fork.left_at >= store::forks::MIN_JUMP);
    assert!(
        checkpoint.op_id > fork.resumed_at,
        "{checkpoint:?} {fork:?}"
    );
    assert_eq!(
        forks.place(head + 1, checkpoint.op_id),
        store::Placement::Foreign
    );
    assert_eq!(forks.place(head, checkpoint.op_id), store::Placement::Own);
    // An eager fork (a deploy) jumps even without ops; the next op follows it.
    let (fork2, checkpoint2) = a.write(202, |w| w.fork_history()).unwrap();
    assert_eq!(fork2.left_at, checkpoint.op_id);
    assert_eq!(checkpoint2.op_id, fork2.resumed_at);
    // A copy continues from the same forks.
    let copy = exported(&a);
    let b = installed(dir.path(), "seeded", &copy);
    assert_eq!(
        b.read(|v| v.forks()).unwrap(),
        a.read(|v| v.forks()).unwrap()
    );
    write_round(&a, 9, 500);
    write_round(&b, 9, 500);
    assert_eq!(seen(&b), seen(&a));
}
