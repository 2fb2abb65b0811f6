//! Measures the store's per-row cost of the stream's bulk changes on fixture-shaped rows,
//! without PostgreSQL: a snapshot of `rows` task rows, then one transaction each that
//! updates, deletes, inserts and truncates every row, as the applier writes them (rows
//! evaluated beforehand, durable commit, then the compactions it made due in a durable
//! write of their own).
//!
//! `cargo run --release -p powersync-mdbx-replication --example bulk_cost -- [rows] [dir]`
//! (`BULK_COST_SMALL_TX=n`: first n single-row transactions, as the benchmark's
//! 2,000 per second before its bulk changes)
//!
//! `dir` (default: a temporary directory under `/tmp`) should be on ext4 or XFS for the
//! store to write through its map, as the worker's does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::COLUMNS;

use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use powersync_mdbx_replication::StoreInput;
use rules::{RowEvaluation, SyncRules};
use source::CopyFields;
use store::{identity_key, Store};

/// The applier's compaction threshold (`apply::COMPACT_AFTER_OPS`).
const COMPACT_AFTER_OPS: u64 = 1024;

fn main() {
    let rows = common::rows_arg(1_000_000);
    let root = match std::env::args().nth(2) {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let (inserted, updated) = evaluated(rows);

    let store = Store::open(&root.path().join("store")).unwrap();
    for chunk in inserted.chunks(8192) {
        store
            .write_unsynced(0, |w| {
                for (identity, e) in chunk {
                    w.insert_row(1, identity, &StoreInput::of(e).memberships, &[])?;
                }
                Ok(())
            })
            .unwrap();
    }
    let map = store.write_through_map().unwrap();
    println!(
        "rows {rows}, writes through the map: {map}, store used {} bytes",
        store.used_bytes()
    );

    let mut lsn = 1;
    small_transactions(&store, &updated, &mut lsn);
    let mut timed = |name: &str, change: &dyn Fn(&mut store::WriteTxn) -> u64| {
        lsn += 1;
        let from = monotonic();
        let started = Instant::now();
        let ((changed, applied), _) = store
            .write(lsn, |w| {
                let changed = change(w);
                let applied = started.elapsed();
                w.compact_due(COMPACT_AFTER_OPS)?;
                Ok((changed, applied))
            })
            .unwrap();
        let committed = started.elapsed();
        // The compactions it made due, in a write of their own, as the applier runs them.
        store.write(lsn, |_| Ok(())).unwrap();
        let took = started.elapsed();
        let per = |d: Duration| d.as_nanos() as f64 / changed.max(1) as f64 / 1000.0;
        println!(
            "{name:>8}: {changed} rows in {:.3} s, {:.2} µs/row (changes {:.2}, commit {:.2}, then compaction {:.2}); store used {} bytes; monotonic {from:.6},{:.6}",
            took.as_secs_f64(),
            per(took),
            per(applied),
            per(committed - applied),
            per(took - committed),
            store.used_bytes(),
            monotonic()
        );
    };
    let upsert = |evaluated: &[(Vec<u8>, RowEvaluation)], w: &mut store::WriteTxn| {
        for (identity, e) in evaluated {
            w.upsert_row(1, identity, &StoreInput::of(e).memberships, &[])
                .unwrap();
        }
        evaluated.len() as u64
    };
    timed("update", &|w| upsert(&updated, w));
    timed("delete", &|w| {
        for (identity, _) in &updated {
            assert!(w.delete_row(1, identity).unwrap());
        }
        updated.len() as u64
    });
    timed("insert", &|w| upsert(&inserted, w));
    timed("truncate", &|w| w.truncate_table(1).unwrap());
}

/// A row's identity and its evaluation by the rules.
type Evaluated = Vec<(Vec<u8>, RowEvaluation)>;

/// `rows` fixture rows evaluated as inserted, and as updated (each task marked done).
fn evaluated(rows: usize) -> (Evaluated, Evaluated) {
    let rules_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../e2e/fixture/sync-config.yaml"
    );
    let rules = SyncRules::parse(&std::fs::read_to_string(rules_path).unwrap()).unwrap();
    let plan = rules.plan_for("public", "tasks").unwrap();
    let types = common::types();
    let evaluate = |lines: &[String]| -> Vec<(Vec<u8>, RowEvaluation)> {
        let mut decoder = CopyFields::new(COLUMNS.len());
        lines
            .iter()
            .map(|line| {
                let fields = decoder.decode(line.as_bytes()).unwrap();
                let columns = common::source_columns(&fields, &types);
                let row = common::tasks_row(&columns);
                (identity_key([fields.get(0)]), plan.evaluate(&row).unwrap())
            })
            .collect()
    };
    let lines = common::copy_lines(rows);
    let inserted = evaluate(&lines);
    let updated = evaluate(
        &lines
            .iter()
            .map(|l| l.replacen("\ttodo\t", "\tdone\t", 1))
            .collect::<Vec<_>>(),
    );
    (inserted, updated)
}

/// As the benchmark does before its bulk changes: `BULK_COST_SMALL_TX` single-row
/// transactions (one durable commit each, from LSN `lsn` on) over rows of `updated`.
fn small_transactions(store: &Store, updated: &[(Vec<u8>, RowEvaluation)], lsn: &mut u64) {
    // As the benchmark does before its bulk changes: single-row transactions (one
    // durable commit each) spread over the table, which leave the store's free pages
    // scattered for the bulk changes to reuse.
    let small: usize = std::env::var("BULK_COST_SMALL_TX").map_or(0, |n| {
        n.parse()
            .expect("BULK_COST_SMALL_TX is a number of transactions")
    });
    if small > 0 {
        let started = Instant::now();
        let mut each = Vec::with_capacity(small);
        for i in 0..small {
            let (identity, e) = &updated[i.wrapping_mul(7_919) % updated.len()];
            *lsn += 1;
            let one = Instant::now();
            store
                .write(*lsn, |w| {
                    w.upsert_row(1, identity, &StoreInput::of(e).memberships, &[])?;
                    w.compact_due(COMPACT_AFTER_OPS).map(drop)
                })
                .unwrap();
            each.push(one.elapsed());
        }
        each.sort();
        let at = |q: f64| each[((each.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
        println!(
            "{small} single-row transactions: {:.1} µs each; p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            started.elapsed().as_secs_f64() * 1e6 / small as f64,
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
}

/// CLOCK_MONOTONIC in seconds (what `perf record -k CLOCK_MONOTONIC` stamps samples with,
/// for `perf report --time` of one phase).
fn monotonic() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}
