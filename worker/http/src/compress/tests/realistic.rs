//! Sizes on a realistic stream: chunks compressed on their own against one compressor
//! spanning the response.

use super::super::zstd_frames::{ZSTD_CHAIN_LOG, ZSTD_HASH_LOG, ZSTD_LEVEL, ZSTD_WINDOW_LOG};
use super::super::Coding;
use std::io::Write;

/// splitmix64: reproducible values without a randomness source.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A PUT of task `n` in the shape of the benchmark's rows (`e2e/fixture/vectors`).
fn task(n: u64, op_id: u64, status: &str) -> store::OpRead {
    let id = format!("task-org-001-0001-{n:04}");
    let hash = format!("{:016x}{:016x}", mix(n), mix(n + (1 << 32)));
    // One literal per line (`concat!`), so no line holds half a string.
    let data = format!(
        concat!(
            "{{\"id\":\"{id}\",\"org_id\":\"org-001\",\"project_id\":\"project-org-001-0001\",",
            "\"title\":\"Task 1.{n}\",\"status\":\"{status}\",\"priority\":{},",
            "\"assignee_id\":\"user-org-001-{:04}\",\"story_points\":{},",
            "\"updated_at\":\"2026-01-01T00:{:02}:{:02}.000000Z\",\"summary\":\"{hash}{hash}{hash}\"}}",
        ),
        n % 4,
        mix(n) % 20,
        n % 8,
        op_id / 60 % 60,
        op_id % 60,
        id = id,
        n = n,
        status = status,
        hash = hash,
    );
    let subkey = mix(n ^ 0xabcd);
    store::OpRead {
        op_id,
        kind: store::OpKind::Put,
        checksum: mix(op_id) as u32,
        object: Some(store::ObjectRead {
            object_type: "tasks".into(),
            object_id: id,
            subkey: format!(
                "9a2a5224-abe9-4020-aae8-3a7233d52385/{:08x}-{:04x}-5{:03x}-8{:03x}-{:012x}",
                subkey >> 32,
                subkey >> 16 & 0xffff,
                subkey & 0xfff,
                subkey >> 20 & 0xfff,
                mix(subkey) >> 16
            ),
            data: Some(data),
        }),
    }
}

/// The chunks a stream sends, as `Stream` sends them, for a user of one project of
/// 1,000 tasks: the first download (a checkpoint, data lines closed at 16 KiB of rows
/// in chunks of 64 KiB, its completion), then an idle hour: a keepalive every 20 s and
/// a task changed every 2 minutes (the `checkpoint_diff`, then its data and
/// completion).
fn realistic(encoding: service::Encoding) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    use service::{BucketChecksum, CheckpointDiffLine, CheckpointLine, DataLine, SyncLine};
    const TASKS: u64 = 1_000;
    let bucket = "1#tasks_by_auth_project|0[\"project-org-001-0001\"]";
    let checksum = |count: u64, op_id: u64| BucketChecksum {
        bucket: bucket.into(),
        checksum: mix(op_id) as u32,
        count,
        priority: 3,
        subscriptions: Vec::new(),
    };
    let encode = |lines: &[SyncLine]| {
        let mut out = Vec::new();
        for line in lines {
            line.encode(encoding, &mut out);
        }
        out
    };
    let mut download = vec![encode(&[SyncLine::Checkpoint(CheckpointLine {
        last_op_id: 2 * TASKS,
        write_checkpoint: None,
        buckets: vec![checksum(TASKS, 2 * TASKS)],
        streams: vec![service::StreamDescription {
            name: "tasks_by_auth_project".into(),
            is_default: false,
            errors: Vec::new(),
        }],
    })])];
    let (mut chunk, mut ops, mut rows, mut after) = (Vec::new(), Vec::new(), 0, 0);
    for n in 1..=TASKS {
        let op = task(n, 2 * n, "todo");
        rows += op.data_len();
        ops.push(op);
        if rows >= 16 << 10 || n == TASKS {
            let next_after = 2 * n;
            SyncLine::Data(DataLine {
                bucket: bucket.into(),
                after,
                next_after,
                has_more: n < TASKS,
                ops: std::mem::take(&mut ops),
            })
            .encode(encoding, &mut chunk);
            (rows, after) = (0, next_after);
        }
        if chunk.len() >= 64 << 10 {
            download.push(std::mem::take(&mut chunk));
        }
    }
    SyncLine::CheckpointComplete {
        last_op_id: 2 * TASKS,
    }
    .encode(encoding, &mut chunk);
    download.push(chunk);
    let mut idle = Vec::new();
    let mut op_id = 2 * TASKS;
    for tick in 1..=180u64 {
        idle.push(encode(&[SyncLine::TokenExpiresIn(3600 - 20 * tick as i32)]));
        if tick % 6 == 0 {
            let last = op_id;
            op_id += 1 + mix(tick) % 50;
            let count = TASKS + tick / 6;
            idle.push(encode(&[SyncLine::CheckpointDiff(CheckpointDiffLine {
                last_op_id: op_id,
                write_checkpoint: None,
                updated_buckets: vec![checksum(count, op_id)],
                removed_buckets: Vec::new(),
            })]));
            idle.push(encode(&[
                SyncLine::Data(DataLine {
                    bucket: bucket.into(),
                    after: last,
                    next_after: op_id,
                    has_more: false,
                    ops: vec![task(mix(tick) % TASKS + 1, op_id, "done")],
                }),
                SyncLine::CheckpointComplete { last_op_id: op_id },
            ]));
        }
    }
    (download, idle)
}

/// One compressor spanning the response, flushed per chunk: what responses had before
/// (zstd `ZSTD_e_flush`, gzip `Z_SYNC_FLUSH`), the reference for sizes.
enum Spanning {
    Zstd(Box<zstd::stream::write::Encoder<'static, Vec<u8>>>),
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
}

impl Spanning {
    fn new(coding: Coding) -> Self {
        use zstd::zstd_safe::CParameter;
        match coding {
            Coding::Zstd => {
                let mut encoder =
                    zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL).unwrap();
                encoder.window_log(ZSTD_WINDOW_LOG).unwrap();
                encoder
                    .set_parameter(CParameter::HashLog(ZSTD_HASH_LOG))
                    .unwrap();
                encoder
                    .set_parameter(CParameter::ChainLog(ZSTD_CHAIN_LOG))
                    .unwrap();
                Self::Zstd(Box::new(encoder))
            }
            _ => Self::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::fast(),
            )),
        }
    }

    fn chunk(&mut self, chunk: &[u8]) -> usize {
        let out = match self {
            Self::Zstd(e) => {
                e.write_all(chunk).unwrap();
                e.flush().unwrap();
                std::mem::take(e.get_mut())
            }
            Self::Gzip(e) => {
                e.write_all(chunk).unwrap();
                e.flush().unwrap();
                std::mem::take(e.get_mut())
            }
        };
        out.len()
    }
}

/// Chunks compressed on their own against one compressor spanning the response,
/// measured on the realistic stream (`cargo test -p powersync-mdbx-http
/// --lib realistic -- --nocapture` prints the sizes).
#[test]
fn realistic_stream_sizes_against_one_spanning_compressor() {
    for encoding in [service::Encoding::Ndjson, service::Encoding::Bson] {
        let (download, idle) = realistic(encoding);
        for coding in [Coding::Zstd, Coding::Gzip] {
            let mut spanning = Spanning::new(coding);
            let mut compressor = coding.compressor();
            for (phase, chunks) in [("download", &download), ("idle hour", &idle)] {
                let plain: usize = chunks.iter().map(Vec::len).sum();
                let (mut before, mut now) = (0, 0);
                for chunk in chunks {
                    before += spanning.chunk(chunk);
                    now += compressor.chunk(chunk.clone()).unwrap().len();
                }
                eprintln!(
                    "{encoding:?} {coding:?} {phase}: {} chunks, {plain} bytes of lines; \
                     spanning {before}, per chunk {now} bytes ({:+.1} %)",
                    chunks.len(),
                    (now as f64 / before as f64 - 1.0) * 100.0
                );
                // The download's large chunks lose nothing to speak of; the idle
                // hour's small lines lose the repeats of earlier lines, and still
                // take less than without compression.
                match phase {
                    "download" => assert!(now * 100 <= before * 105, "{phase}: {now}"),
                    _ => assert!(now < plain, "{phase}: {now}"),
                }
            }
        }
    }
}
