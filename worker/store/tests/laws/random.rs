//! Storage laws as properties: for random row changes across buckets (some of them
//! written after a fork of the history, `store::forks`), a client at any
//! earlier position that downloads the ops after it up to the current checkpoint ends
//! with exactly the current rows and the announced checksum and count; one that downloads
//! a page per read view while commits and compactions go on between its pages ends a
//! checkpoint it completes with exactly that checkpoint's rows and checksums.
use super::client::Client;
use super::*;

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
    let mut model: Model = BTreeMap::new();
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
                random_changes(w, &mut rng, shape, &mut model)
            })
            .unwrap();
        // Now and then, CLEAR-compact every bucket (clients stay wherever they are).
        if rng.below(4) == 0 {
            compacted += compact_every_bucket(&store, lsn);
        }
        assert!(cp.op_id >= last_cp, "checkpoints never go back");
        assert_eq!(cp.lsn, lsn);
        last_cp = cp.op_id;
        let truth = truth_of(&model);
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

/// Row → (buckets, data): what the store should show.
type Model = BTreeMap<u64, (Vec<&'static str>, String)>;

/// One commit's random row changes: deletes, and upserts into random buckets (none: the
/// row leaves every bucket), mirrored in `model`.
fn random_changes(
    w: &mut store::WriteTxn<'_, '_>,
    rng: &mut Rng,
    shape: &Shape,
    model: &mut Model,
) -> Result<(), StoreError> {
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
}

/// CLEAR-compacts every bucket; returns the ops removed.
fn compact_every_bucket(store: &Store, lsn: u64) -> u64 {
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
    removed
}

/// Per bucket, the rows `model` puts there: row id → data.
fn truth_of(model: &Model) -> BTreeMap<&'static str, BTreeMap<String, String>> {
    let mut truth: BTreeMap<&'static str, BTreeMap<String, String>> = BTreeMap::new();
    for (row, (buckets, data)) in model {
        for b in buckets {
            truth
                .entry(b)
                .or_default()
                .insert(format!("r{row}"), data.clone());
        }
    }
    truth
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
