//! Thread CPU per row of the snapshot evaluator's work on fixture-shaped rows, without
//! PostgreSQL or MDBX writes: COPY text decode, rules evaluation, identity key, the
//! prepared row and its compression, in chunks of 1,024 as the pipeline does. Measured with
//! the thread's CPU clock, so other load on the machine inflates it little.
//!
//! `cargo run --release -p powersync-mdbx-worker --example evaluate_cost -- [rows]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use powersync_mdbx_worker::rules::{PgType, SourceColumn, SourceRow, SyncRules};
use powersync_mdbx_worker::source::CopyFields;
use powersync_mdbx_worker::store::{identity_key, PreparedRow, Store};

const COLUMNS: [(&str, u32); 11] = [
    ("id", 25),
    ("org_id", 25),
    ("project_id", 25),
    ("owner_id", 25),
    ("title", 25),
    ("status", 25),
    ("priority", 23),
    ("assignee_id", 25),
    ("story_points", 23),
    ("updated_at", 1184),
    ("summary", 25),
];

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
    let rows: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let rules_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixture/sync-config.yaml");
    let rules = SyncRules::parse(&std::fs::read_to_string(rules_path).unwrap()).unwrap();
    let plan = rules.plan_for("public", "tasks").unwrap();
    let binding = plan.bind(COLUMNS.iter().map(|(n, _)| *n));
    let lines: Vec<String> = (0..rows)
        .map(|i| {
            let (p, t) = (i / 1000 + 1, i % 1000 + 1);
            format!(
                "task-org-001-{p:04}-{t:04}\torg-001\tproject-org-001-{p:04}\tuser-org-001-0001\tTask {p}.{t}\ttodo\t{}\tuser-org-001-{:04}\t{}\t2026-01-01 00:00:00+00\t{}",
                (t - 1) % 5 + 1, (p + t) % 1024 + 1, (t - 1) % 8 + 1, format!("{:032x}", i * 7919).repeat(3)
            )
        })
        .collect();
    let types: Vec<PgType> = COLUMNS.iter().map(|(_, oid)| PgType::from_oid(*oid)).collect();
    let mut decoder = CopyFields::new(COLUMNS.len());

    // A store with a trained dictionary, as after the snapshot's first batch.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let mut stages = [0u128; 3];
    for pass in 0..2 {
        let codec = store.row_codec();
        let mut packer = codec.packer();
        let mut chunk: Vec<PreparedRow> = Vec::with_capacity(1024);
        stages = [0; 3];
        for line in &lines {
            let t0 = thread_cpu_ns();
            let fields = decoder.decode(line.as_bytes()).unwrap();
            let columns: Vec<SourceColumn<'_>> = COLUMNS
                .iter()
                .zip(&types)
                .enumerate()
                .map(|(i, ((name, _), t))| SourceColumn {
                    name,
                    pg_type: *t,
                    value: fields.get(i),
                })
                .collect();
            let row = SourceRow {
                schema: "public",
                table: "tasks",
                columns: &columns,
            };
            let eval = plan.evaluate_bound(&binding, &row).unwrap();
            let t1 = thread_cpu_ns();
            let identity = identity_key([fields.get(0)]);
            chunk.push(PreparedRow::new(1, identity, eval.buckets, Vec::new(), Vec::new()).unwrap());
            let t2 = thread_cpu_ns();
            if chunk.len() == 1024 {
                packer.pack(&mut chunk);
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
            let t3 = thread_cpu_ns();
            stages[0] += t1 - t0;
            stages[1] += t2 - t1;
            stages[2] += t3 - t2;
        }
    }
    let per = |ns: u128| ns as f64 / rows as f64 / 1000.0;
    println!(
        "rows {rows}: decode+evaluate {:.2} µs/row, prepare {:.2} µs/row, pack {:.2} µs/row, total {:.2} µs/row (thread CPU)",
        per(stages[0]),
        per(stages[1]),
        per(stages[2]),
        per(stages.iter().sum())
    );
}
