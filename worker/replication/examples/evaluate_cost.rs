//! Thread CPU per row of the snapshot evaluator's work on fixture-shaped rows, without
//! PostgreSQL or MDBX writes: COPY text decode, rules evaluation, identity key, the
//! prepared row and its compression, in chunks of 1,024 as the pipeline does. Measured with
//! the thread's CPU clock, so other load on the machine inflates it little.
//!
//! `cargo run --release -p powersync-mdbx-replication --example evaluate_cost -- [rows]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::COLUMNS;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use powersync_mdbx_replication::StoreInput;
use rules::SyncRules;
use source::CopyFields;
use store::{identity_key, PreparedRow, Store};

fn thread_cpu_ns() -> u128 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
}

fn main() {
    let rows = common::rows_arg(200_000);
    let rules_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../e2e/fixture/sync-config.yaml"
    );
    let rules = SyncRules::parse(&std::fs::read_to_string(rules_path).unwrap()).unwrap();
    let plan = rules.plan_for("public", "tasks").unwrap();
    let binding = plan.bind(COLUMNS.iter().map(|(n, _)| *n));
    let lines = common::copy_lines(rows);
    let types = common::types();
    let mut decoder = CopyFields::new(COLUMNS.len());

    // A store with a trained dictionary, as after the snapshot's first batch.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let mut stages = [0u128; 2];
    for pass in 0..2 {
        let codec = store.row_codec();
        let mut packer = codec.packer();
        let mut chunk: Vec<PreparedRow> = Vec::with_capacity(1024);
        stages = [0; 2];
        for line in &lines {
            let t0 = thread_cpu_ns();
            let fields = decoder.decode(line.as_bytes()).unwrap();
            let columns = common::source_columns(&fields, &types);
            let row = common::tasks_row(&columns);
            let eval = plan.evaluate_bound(&binding, &row).unwrap();
            let t1 = thread_cpu_ns();
            let identity = identity_key([fields.get(0)]);
            let input = StoreInput::of(&eval);
            let prepared = PreparedRow::new(
                1,
                &identity,
                &input.memberships,
                input.lookups,
                Vec::new(),
                &mut packer,
            );
            chunk.push(prepared.unwrap());
            let t2 = thread_cpu_ns();
            if chunk.len() == 1024 {
                if pass == 0 {
                    // Train the dictionary from the first chunk, as the writer would.
                    store
                        .write(0, |w| {
                            chunk.drain(..).try_for_each(|r| w.insert_prepared(r))
                        })
                        .unwrap();
                    if store.row_codec().is_stale(&store) {
                        break;
                    }
                }
                chunk.clear();
            }
            stages[0] += t1 - t0;
            stages[1] += t2 - t1;
        }
    }
    let per = |ns: u128| ns as f64 / rows as f64 / 1000.0;
    println!(
        "rows {rows}: decode+evaluate {:.2} µs/row, prepare and pack {:.2} µs/row, total {:.2} µs/row (thread CPU)",
        per(stages[0]),
        per(stages[1]),
        per(stages.iter().sum())
    );
}
