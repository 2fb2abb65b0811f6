//! The snapshot pipeline's CPU cost on a real COPY dump, without PostgreSQL: an ignored
//! test for profiling (it asserts nothing about time).
//!
//! ```text
//! psql -c "COPY tasks TO STDOUT" > /tmp/tasks.copy     # a fixture primary
//! PSM_PIPELINE_COPY=/tmp/tasks.copy cargo test --release -p powersync-mdbx-replication \
//!     --lib pipeline_cost -- --ignored --nocapture
//! ```

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::{Pipeline, TableJob};
use crate::intent::{BootstrapIntent, BootstrapState};
use crate::progress::Progress;
use rules::SyncRules;
use source::ColumnMeta;
use store::Store;

// The extension's allocator, so the figures compare with the worker's (this applies to the
// whole unit-test binary).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The fixture's `tasks` columns and their type OIDs.
pub(super) const TASK_COLUMNS: [(&str, u32); 11] = [
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

/// The fixture's `tasks` columns as the snapshot reads them.
pub(super) fn task_columns() -> Vec<ColumnMeta> {
    TASK_COLUMNS
        .iter()
        .map(|(name, oid)| ColumnMeta {
            name: (*name).into(),
            type_oid: *oid,
            element_oid: None,
            typlen: if *oid == 23 { 4 } else { -1 },
            attnum: 0,
        })
        .collect()
}

/// The intent a completed snapshot commits.
pub(super) fn complete_intent() -> BootstrapIntent {
    BootstrapIntent {
        system_identifier: "1".into(),
        timeline: Some(1),
        database: "bench".into(),
        slot: "bench".into(),
        publication: "bench".into(),
        rules_hash: "-".into(),
        generation: 1,
        tables: Vec::new(),
        state: BootstrapState::Complete,
        consistent_point: Some(1),
        rows: 0,
        rebuilding: false,
    }
}

fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain integers, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Bytes this process has written with write(2) and friends (`wchar` of /proc/self/io).
fn written_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|line| line.strip_prefix("wchar: "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
#[ignore = "profiling aid: needs PSM_PIPELINE_COPY (a COPY dump of the fixture's tasks)"]
fn pipeline_cost() {
    let path = std::env::var("PSM_PIPELINE_COPY").expect("PSM_PIPELINE_COPY");
    let text = Bytes::from(std::fs::read(path).unwrap());
    let rules_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../e2e/fixture/sync-config.yaml"
    );
    let rules = Arc::new(SyncRules::parse(&std::fs::read_to_string(rules_path).unwrap()).unwrap());
    let columns = task_columns();
    let mut lines = Vec::new();
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', &text) {
        lines.push(text.slice(start..=end));
        start = end + 1;
    }
    let rows = lines.len();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("store")).unwrap());
    let job = TableJob {
        id: 1,
        schema: "public".into(),
        name: "tasks".into(),
        columns,
        identity: vec![0],
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (cpu0, wall) = (cpu_seconds(), Instant::now());
    let mut pipeline = Pipeline::start(
        rules,
        vec![job],
        store.clone(),
        Arc::new(Progress::default()),
    )
    .unwrap();
    runtime.block_on(async {
        for chunk in lines.chunks(1024) {
            assert!(pipeline.send_rows(0, chunk.to_vec()).await);
        }
        assert!(pipeline.finish(complete_intent()).await);
    });
    pipeline.join().unwrap();
    let (cpu, wall) = (cpu_seconds() - cpu0, wall.elapsed().as_secs_f64());
    println!(
        "rows {rows}: wall {wall:.3} s, CPU {cpu:.3} s, {:.3} µs/row, store used {} B ({:.1} B/row), {} MB written",
        cpu * 1e6 / rows as f64,
        store.used_bytes(),
        store.used_bytes() as f64 / rows as f64,
        written_bytes() / 1_000_000
    );
    if std::env::var_os("PSM_PIPELINE_UPDATE_ALL").is_some() {
        update_all_in_one_transaction(&store, &lines);
    }
}

/// Every row updated in one write transaction (a full-table UPDATE on the source).
fn update_all_in_one_transaction(store: &Store, lines: &[Bytes]) {
    use store::{identity_key, RowPut};
    let (cpu0, wall) = (cpu_seconds(), Instant::now());
    store
        .write(2, |w| {
            for (i, line) in lines.iter().enumerate() {
                let id = line.split(|b| *b == b'\t').next().unwrap();
                let id_text = std::str::from_utf8(id).unwrap();
                let data = format!("{{\"id\":\"{id_text}\",\"round\":{i}}}");
                let puts: Vec<RowPut<'_>> = ["1#tasks|0[]", "1#tasks_dashboard|0[]"]
                    .iter()
                    .map(|bucket| RowPut {
                        bucket,
                        object_type: "tasks",
                        object_id: id_text,
                        data: &data,
                        checksum: i as u32,
                    })
                    .collect();
                w.upsert_row(1, &identity_key([Some(id)]), &puts, &[])?;
            }
            Ok(())
        })
        .unwrap();
    println!(
        "updated {} rows in one transaction: wall {:.3} s, CPU {:.3} s, store used {} B",
        lines.len(),
        wall.elapsed().as_secs_f64(),
        cpu_seconds() - cpu0,
        store.used_bytes()
    );
}
