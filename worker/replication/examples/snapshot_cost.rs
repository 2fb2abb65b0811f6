//! Measures the per-row cost of the snapshot's CPU stages on fixture-shaped rows, without
//! PostgreSQL: COPY text decode, rules evaluation, and the store insert.
//!
//! `cargo run --release -p powersync-mdbx-replication --example snapshot_cost -- [rows]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::COLUMNS;

use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use powersync_mdbx_replication::StoreInput;
use rules::SyncRules;
use source::CopyFields;
use store::{identity_key, Store};

fn main() {
    let rows = common::rows_arg(200_000);
    let rules_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../e2e/fixture/sync-config.yaml"
    );
    let rules = SyncRules::parse(&std::fs::read_to_string(rules_path).unwrap()).unwrap();
    let plan = rules.plan_for("public", "tasks").unwrap();
    let lines = common::copy_lines(rows);
    let types = common::types();
    let mut decoder = CopyFields::new(COLUMNS.len());

    let started = Instant::now();
    let mut evaluated = Vec::with_capacity(rows);
    let mut decode_ns = 0u128;
    for line in &lines {
        let t0 = Instant::now();
        let fields = decoder.decode(line.as_bytes()).unwrap();
        decode_ns += t0.elapsed().as_nanos();
        let columns = common::source_columns(&fields, &types);
        let row = common::tasks_row(&columns);
        let identity = identity_key([fields.get(0)]);
        evaluated.push((identity, plan.evaluate(&row).unwrap()));
    }
    let eval = started.elapsed();

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let started = Instant::now();
    for chunk in evaluated.chunks(8192) {
        store
            .write(0, |w| {
                for (identity, e) in chunk {
                    let input = StoreInput::of(e);
                    w.insert_row(1, identity, &input.memberships, &[])?;
                }
                Ok(())
            })
            .unwrap();
    }
    let write = started.elapsed();
    let per = |d: std::time::Duration| d.as_nanos() as f64 / rows as f64 / 1000.0;
    println!(
        "rows {rows}: decode {:.2} µs/row, decode+evaluate {:.2} µs/row, store insert {:.2} µs/row, store used {} bytes ({:.0} B/row)",
        decode_ns as f64 / rows as f64 / 1000.0,
        per(eval),
        per(write),
        store.used_bytes(),
        store.used_bytes() as f64 / rows as f64
    );
    for (name, entries, bytes) in store.table_sizes().unwrap() {
        println!(
            "  {name:>12}: {entries:>9} entries {bytes:>11} bytes {:>6.1} B/row",
            bytes as f64 / rows as f64
        );
    }
}
