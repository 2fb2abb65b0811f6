//! Storage laws as properties: for random row changes across buckets (some of them
//! written after a fork of the history, `store::forks`), a client at any
//! earlier position that downloads the ops after it up to the current checkpoint ends
//! with exactly the current rows and the announced checksum and count; one that downloads
//! a page per read view while commits and compactions go on between its pages ends a
//! checkpoint it completes with exactly that checkpoint's rows and checksums.
use std::collections::BTreeMap;

use store::{OpKind, OpRead, RowPut, Store, StoreError, StoredAs};

const BUCKETS: [&str; 5] = ["b0", "b1", "b2[\"x\"]", "b3", "b4"];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a client holds per bucket.
#[derive(Clone, Default)]
struct Client {
    after: BTreeMap<&'static str, u64>,
    checksum: BTreeMap<&'static str, u32>,
    rows: BTreeMap<&'static str, BTreeMap<String, String>>,
}

impl Client {
    /// Downloads everything after its positions up to the store's checkpoint, in pages.
    fn sync(&mut self, store: &Store, truth: &BTreeMap<&'static str, BTreeMap<String, String>>) {
        store
            .read(|view| {
                let cp = view.checkpoint()?.op_id;
                for bucket in BUCKETS {
                    let Some(state) = view.bucket(bucket)? else {
                        continue;
                    };
                    let mut after = *self.after.get(bucket).unwrap_or(&0);
                    loop {
                        let page = view.ops(state.id, after, cp, 3)?;
                        assert!(page.max_target <= cp, "a single read view is consistent");
                        for op in &page.ops {
                            assert!(op.op_id > after && op.op_id <= cp);
                            self.apply(bucket, op);
                            after = op.op_id;
                        }
                        if !page.has_more {
                            break;
                        }
                    }
                    self.after.insert(bucket, cp);
                    assert_eq!(
                        self.checksum.get(bucket).copied().unwrap_or(0),
                        state.checksum,
                        "checksum of {bucket}"
                    );
                    let empty = BTreeMap::new();
                    assert_eq!(
                        self.rows.get(bucket).unwrap_or(&empty),
                        truth.get(bucket).unwrap_or(&empty),
                        "rows of {bucket}"
                    );
                    // Count: every op ever added and still stored.
                    let all = view.ops(state.id, 0, cp, usize::MAX)?;
                    assert_eq!(all.ops.len() as u64, state.count, "count of {bucket}");
                }
                Ok(())
            })
            .unwrap();
    }
}

impl Client {
    /// Applies one downloaded op of `bucket` to the rows and checksum held.
    fn apply(&mut self, bucket: &'static str, op: &OpRead) {
        let sum = self.checksum.entry(bucket).or_default();
        *sum = sum.wrapping_add(op.checksum);
        let rows = self.rows.entry(bucket).or_default();
        match op.kind {
            OpKind::Put => {
                let o = op.object.as_ref().unwrap();
                rows.insert(o.object_id.clone(), o.data.clone().unwrap());
            }
            OpKind::Remove => {
                rows.remove(&op.object.as_ref().unwrap().object_id);
            }
            OpKind::Move => assert!(op.object.is_none()),
            OpKind::Clear => {
                // Everything before it is replaced: start over.
                assert!(op.object.is_none());
                rows.clear();
                *sum = op.checksum;
            }
        }
    }
}

/// The checkpoint a [`Roaming`] client downloads to, as announced: its op id, each
/// bucket's checksum and the rows it holds then.
struct Target {
    cp: u64,
    checksums: BTreeMap<&'static str, u32>,
    truth: BTreeMap<&'static str, BTreeMap<String, String>>,
    /// The bucket being paged (an index into `BUCKETS`).
    bucket: usize,
    /// A page showed a MOVE/CLEAR target above `cp`: this checkpoint does not complete.
    invalidated: bool,
}

/// A client downloading as a stream does (`service::paging`): one page per read view, each
/// view newer than the checkpoint's, with commits and compactions between the pages. A
/// checkpoint whose pages showed newer changes is left for the next one (positions kept);
/// one completed must add up exactly.
struct Roaming {
    client: Client,
    target: Option<Target>,
    /// Ops per page.
    page: usize,
    completed: u64,
}

impl Roaming {
    fn new(page: usize) -> Self {
        Self {
            client: Client::default(),
            target: None,
            page,
            completed: 0,
        }
    }

    /// Reads one page (a new checkpoint is taken when none is being downloaded).
    fn step(&mut self, store: &Store, truth: &BTreeMap<&'static str, BTreeMap<String, String>>) {
        if self.target.is_none() {
            self.target = Some(
                store
                    .read(|view| {
                        let mut checksums = BTreeMap::new();
                        for bucket in BUCKETS {
                            let sum = view.bucket(bucket)?.map_or(0, |s| s.checksum);
                            checksums.insert(bucket, sum);
                        }
                        Ok(Target {
                            cp: view.checkpoint()?.op_id,
                            checksums,
                            truth: truth.clone(),
                            bucket: 0,
                            invalidated: false,
                        })
                    })
                    .unwrap(),
            );
            return;
        }
        let target = self.target.as_mut().unwrap();
        let bucket = BUCKETS[target.bucket];
        let after = *self.client.after.get(bucket).unwrap_or(&0);
        let page = store
            .read(|view| match view.bucket(bucket)? {
                Some(state) => Ok(Some(view.ops(state.id, after, target.cp, self.page)?)),
                None => Ok(None),
            })
            .unwrap();
        let mut has_more = false;
        if let Some(page) = page {
            for op in &page.ops {
                assert!(op.op_id > after && op.op_id <= target.cp);
                self.client.apply(bucket, op);
                self.client.after.insert(bucket, op.op_id);
            }
            target.invalidated |= page.max_target > target.cp;
            has_more = page.has_more;
        }
        if has_more {
            return;
        }
        target.bucket += 1;
        if target.bucket < BUCKETS.len() {
            return;
        }
        let target = self.target.take().unwrap();
        if target.invalidated {
            return;
        }
        for bucket in BUCKETS {
            assert_eq!(
                self.client.checksum.get(bucket).copied().unwrap_or(0),
                target.checksums[bucket],
                "checksum of {bucket} at checkpoint {}, downloaded across read views",
                target.cp
            );
            let empty = BTreeMap::new();
            assert_eq!(
                self.client.rows.get(bucket).unwrap_or(&empty),
                target.truth.get(bucket).unwrap_or(&empty),
                "rows of {bucket} at checkpoint {}, downloaded across read views",
                target.cp
            );
        }
        self.completed += 1;
    }
}

fn checksum_of(data: &str) -> u32 {
    data.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// How many commits of how many row changes, over how many rows.
struct Shape {
    commits: u64,
    max_changes: u64,
    rows: u64,
}

/// Few rows changed often: most ops are superseded within a few commits.
const SMALL: Shape = Shape {
    commits: 60,
    max_changes: 5,
    rows: 16,
};

/// Runs one random history; returns the largest number of ops a bucket holds at the end.
fn run(seed: u64, shape: &Shape) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let mut rng = Rng(seed);
    // row → (buckets, data)
    let mut model: BTreeMap<u64, (Vec<&'static str>, String)> = BTreeMap::new();
    let mut clients: Vec<Client> = vec![Client::default()];
    // Pages small against a commit's changes, so checkpoints change under a download.
    let page = 3 * shape.max_changes as usize;
    let mut roaming: Vec<Roaming> = vec![Roaming::new(page)];
    let mut last_cp = 0;
    let mut compacted = 0;
    let last_commit = shape.commits - 1;
    for commit in 0..shape.commits {
        let lsn = 100 + commit;
        if commit == shape.commits / 2 {
            // Halfway, the writes go through the map (where the file system allows it, as
            // for a stream after its snapshot): nothing a client sees changes.
            store.write_through_map().unwrap();
        }
        // Now and then a write of this replica alone: its ops come after a fork.
        let forking = rng.below(6) == 0;
        let (_, cp) = store
            .write(lsn, |w| {
                if forking {
                    w.diverge();
                }
                for _ in 0..=rng.below(shape.max_changes - 1) {
                    let row = rng.below(shape.rows);
                    let identity = row.to_be_bytes();
                    if rng.below(5) == 0 {
                        let was = model.remove(&row).is_some();
                        assert_eq!(w.delete_row(1, &identity)?, was);
                    } else {
                        let buckets: Vec<&'static str> = BUCKETS
                            .iter()
                            .copied()
                            .filter(|_| rng.below(3) == 0)
                            .collect();
                        let data = format!("{{\"id\":\"r{row}\",\"v\":{}}}", rng.below(1000));
                        let object_id = format!("r{row}");
                        let puts: Vec<RowPut<'_>> = buckets
                            .iter()
                            .map(|b| RowPut {
                                bucket: b,
                                object_type: "items",
                                object_id: &object_id,
                                data: &data,
                                checksum: checksum_of(&data),
                            })
                            .collect();
                        w.upsert_row(1, &identity, &puts, &[])?;
                        if buckets.is_empty() {
                            model.remove(&row);
                        } else {
                            model.insert(row, (buckets, data));
                        }
                    }
                }
                Ok(())
            })
            .unwrap();
        // Now and then, CLEAR-compact every bucket (clients stay wherever they are).
        if rng.below(4) == 0 {
            let ids: Vec<u32> = store
                .read(|v| {
                    Ok(BUCKETS
                        .iter()
                        .filter_map(|b| v.bucket(b).ok().flatten().map(|s| s.id))
                        .collect())
                })
                .unwrap();
            let (removed, _) = store
                .write(lsn, |w| {
                    let mut removed = 0;
                    for id in &ids {
                        removed += w.compact_bucket(*id)?;
                    }
                    Ok(removed)
                })
                .unwrap();
            compacted += removed;
        }
        assert!(cp.op_id >= last_cp, "checkpoints never go back");
        assert_eq!(cp.lsn, lsn);
        last_cp = cp.op_id;
        let mut truth: BTreeMap<&'static str, BTreeMap<String, String>> = BTreeMap::new();
        for (row, (buckets, data)) in &model {
            for b in buckets {
                truth
                    .entry(b)
                    .or_default()
                    .insert(format!("r{row}"), data.clone());
            }
        }
        // Some clients sync at this checkpoint, some stay behind; a new client joins.
        for client in clients.iter_mut() {
            if rng.below(3) != 0 {
                client.sync(&store, &truth);
            }
        }
        for client in roaming.iter_mut() {
            for _ in 0..=rng.below(3) {
                client.step(&store, &truth);
            }
        }
        if commit % 7 == 0 {
            clients.push(Client::default());
            roaming.push(Roaming::new(page));
        }
        if commit == last_commit {
            for client in clients.iter_mut() {
                client.sync(&store, &truth);
            }
            let mut fresh = Client::default();
            fresh.sync(&store, &truth);
        }
    }
    assert!(compacted > 0, "compaction never ran on seed {seed}");
    let completed: u64 = roaming.iter().map(|c| c.completed).sum();
    assert!(
        completed > 0,
        "seed {seed}: no download across read views completed a checkpoint"
    );
    let largest = store
        .read(|v| {
            let mut largest = 0;
            for b in BUCKETS {
                largest = largest.max(v.bucket(b)?.map_or(0, |s| s.count));
            }
            Ok(largest)
        })
        .unwrap();
    drop(store);
    // Reopened, the store serves the same state.
    let store = Store::open(&dir.path().join("store")).unwrap();
    assert_eq!(store.read(|v| v.checkpoint()).unwrap().op_id, last_cp);
    largest
}

#[test]
fn every_position_syncs_to_the_current_checkpoint() {
    for seed in [1, 7, 42, 1234, 99991, 0x5eed_f00d] {
        run(seed, &SMALL);
    }
}

/// Buckets of thousands of ops, so ops are superseded in earlier blocks of a bucket and
/// compaction folds prefixes that end inside a block (a block holds 169 ops).
#[test]
fn every_position_syncs_across_op_blocks() {
    let large = Shape {
        commits: 120,
        max_changes: 60,
        rows: 400,
    };
    for seed in [3, 2024] {
        let ops = run(seed, &large);
        assert!(
            ops > 3 * 169,
            "seed {seed}: the largest bucket holds only {ops} ops"
        );
    }
}

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
