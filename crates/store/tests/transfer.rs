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
                let data = format!(
                    "{{\"id\":\"r{row}\",\"round\":{round},\"title\":\"task {row} of a project \
                     with a long enough title to compress\"}}"
                );
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
    store.export_data(&mut copy).unwrap();
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

#[test]
fn a_copy_continues_the_same_history() {
    let dir = tempfile::tempdir().unwrap();
    let a = peer(dir.path());
    let copy = exported(&a);
    let b = Store::open(&dir.path().join("seeded")).unwrap();
    let installed = b
        .import_data::<StoreError>(&mut copy.as_slice(), |meta| {
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
    assert!(seen(&a).history.is_some());
    assert_eq!(seen(&b), seen(&a));
    // The copy keeps its own identity and the record `finish` wrote.
    assert_ne!(b.identity().store_id, a.identity().store_id);
    let record = b.read(|v| v.stage_record("bootstrap")).unwrap();
    assert_eq!(record.as_deref(), Some(b"{\"slot\":\"seeded\"}".as_slice()));
    // The same writes on both: the same op ids, checksums and compaction.
    for round in 4..7 {
        write_round(&a, round, 3000);
        write_round(&b, round, 3000);
        assert_eq!(seen(&b), seen(&a), "after round {round}");
    }
    // Reopened, the copy reads its records with the dictionary it came with.
    drop(b);
    let b = Store::open(&dir.path().join("seeded")).unwrap();
    assert_eq!(seen(&b), seen(&a));
}

#[test]
fn a_copy_cut_short_installs_nothing_that_looks_complete() {
    let dir = tempfile::tempdir().unwrap();
    let a = peer(dir.path());
    let copy = exported(&a);
    let b = Store::open(&dir.path().join("seeded")).unwrap();
    let cut = &copy[..copy.len() * 2 / 3];
    let error = b
        .import_data::<StoreError>(&mut &cut[..], |_| Ok(()))
        .unwrap_err();
    assert!(
        matches!(error, StoreError::BadCopy { .. }) && error.to_string().contains("ended before"),
        "{error}"
    );
    assert_eq!(
        b.read(|v| v.checkpoint()).unwrap(),
        store::Checkpoint::default()
    );
    assert_eq!(b.read(|v| v.stage_record("bootstrap")).unwrap(), None);
    // Cleared, the store takes the whole copy.
    b.clear_data().unwrap();
    b.import_data::<StoreError>(&mut copy.as_slice(), |_| Ok(()))
        .unwrap();
    assert_eq!(seen(&b), seen(&a));
}

#[test]
fn a_copy_goes_only_into_an_empty_store_of_the_same_format() {
    let dir = tempfile::tempdir().unwrap();
    let a = peer(dir.path());
    let copy = exported(&a);
    let error = a
        .import_data::<StoreError>(&mut copy.as_slice(), |_| Ok(()))
        .unwrap_err();
    assert!(error.to_string().contains("already holds data"), "{error}");
    let mut other_format = copy.clone();
    // The format string follows the magic and its length: change its last character.
    let format_end = 8 + 4 + u32::from_le_bytes(copy[8..12].try_into().unwrap()) as usize;
    other_format[format_end - 1] = b'9';
    let b = Store::open(&dir.path().join("seeded")).unwrap();
    let error = b
        .import_data::<StoreError>(&mut other_format.as_slice(), |_| Ok(()))
        .unwrap_err();
    assert!(error.to_string().contains("of format"), "{error}");
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
    let b = Store::open(&dir.path().join("seeded")).unwrap();
    b.import_data::<StoreError>(&mut copy.as_slice(), |_| Ok(()))
        .unwrap();
    assert_eq!(
        b.read(|v| v.forks()).unwrap(),
        a.read(|v| v.forks()).unwrap()
    );
    write_round(&a, 9, 500);
    write_round(&b, 9, 500);
    assert_eq!(seen(&b), seen(&a));
}
