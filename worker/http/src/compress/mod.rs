//! Response compression for `/sync/stream`, negotiated from `Accept-Encoding` as the
//! official service does (zstd preferred, then gzip). Every chunk is compressed and
//! flushed whole, so the client decodes each line as soon as it is sent.
//!
//! No compression state is held between chunks: streams are idle almost all the time (a
//! line every few seconds or minutes), and 10,000 of them cannot each keep a compressor
//! of a few hundred KiB. Each chunk is compressed with its thread's context (one per
//! thread and coding, reused, no lock: compression runs on the runtime's threads and on
//! the service's reader threads), which starts afresh for it, so the chunk refers to nothing sent
//! before:
//! - zstd: each chunk is one whole frame (`ZSTD_e_end`); a zstd body may be several
//!   frames back to back (RFC 8878 3.1).
//! - gzip: one gzip member spans the response (clients may decode only the first): its
//!   header goes with the first chunk, then each chunk is raw deflate from a reset
//!   compressor ended by a sync flush (byte-aligned, not the last block), which is valid
//!   deflate since a block need not refer back. The stream keeps the CRC-32 and length
//!   of what it sent, and [`Compressor::finish`] gives the last block and the trailer.
//!
//! A chunk compressed afresh compresses the same whatever stream sends it, and a commit
//! that many streams hold sends each of them the same small chunk (its checkpoint line,
//! data and completion), one after another on each thread: each thread remembers its last
//! small chunk and its compressed form, per coding, and a chunk equal to it is not
//! compressed again (a reset of the contexts alone costs microseconds per chunk).

use std::cell::RefCell;
use std::io;

use hyper::header::HeaderValue;

use super::accept::quality;

/// zstd level: the fastest, most of the gain on JSON lines.
const ZSTD_LEVEL: i32 = 1;
/// zstd window (16 KiB) and match tables, chosen for memory: a frame asks its decoder for
/// at most a 16 KiB window (the chunk's size when smaller; a `Content-Encoding: zstd`
/// decoder may refuse more than 8 MB), a thread's context holds about 120 KiB (level 3's
/// defaults: a 2 MiB window, several MiB), and JSON lines compress as well.
const ZSTD_WINDOW_LOG: u32 = 14;
const ZSTD_HASH_LOG: u32 = 13;
const ZSTD_CHAIN_LOG: u32 = 12;

/// An empty zstd frame (single segment, content size 0, one empty last raw block): the
/// body of a response that sent no frame.
const ZSTD_EMPTY_FRAME: [u8; 9] = [0x28, 0xb5, 0x2f, 0xfd, 0x20, 0, 1, 0, 0];
/// The gzip member's header (RFC 1952 2.3): deflate, no flags, no time, `XFL` 4 (the
/// fastest level), OS unknown.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255];
/// An empty last deflate block (fixed Huffman codes: `BFINAL`, `BTYPE` 01, end of block),
/// from the byte boundary the sync flush left.
const DEFLATE_END: [u8; 2] = [0x03, 0x00];

/// Chunks up to this size are remembered (see the module's documentation).
const REMEMBERED_CHUNK_BYTES: usize = 4 << 10;

/// A thread's last small chunk of one coding and its compressed form.
#[derive(Default)]
struct Remembered {
    input: Vec<u8>,
    output: Vec<u8>,
}

thread_local! {
    /// This thread's last small zstd frame.
    static LAST_ZSTD: RefCell<Remembered> = RefCell::default();
    /// This thread's last small chunk of raw deflate.
    static LAST_DEFLATE: RefCell<Remembered> = RefCell::default();
    /// This thread's zstd context, made at its first frame.
    static ZSTD: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    /// This thread's raw deflate compressor, made at its first chunk.
    static DEFLATE: RefCell<Option<flate2::Compress>> = const { RefCell::new(None) };
}

/// The negotiated content coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// No compression.
    Identity,
    /// `Content-Encoding: zstd`.
    Zstd,
    /// `Content-Encoding: gzip`.
    Gzip,
}

impl Coding {
    /// zstd or gzip when `Accept-Encoding` allows them (q > 0), zstd first.
    pub fn negotiate(accept: Option<&HeaderValue>) -> Self {
        let allowed = |coding| quality(accept, coding).is_some_and(|q| q > 0.0);
        if allowed("zstd") {
            Self::Zstd
        } else if allowed("gzip") {
            Self::Gzip
        } else {
            Self::Identity
        }
    }

    /// The `Content-Encoding` value, if any.
    pub fn header(self) -> Option<HeaderValue> {
        match self {
            Self::Identity => None,
            Self::Zstd => Some(HeaderValue::from_static("zstd")),
            Self::Gzip => Some(HeaderValue::from_static("gzip")),
        }
    }

    /// The compression state of one response (a few bytes: the contexts are the threads').
    pub fn compressor(self) -> Compressor {
        match self {
            Self::Identity => Compressor::Identity,
            Self::Zstd => Compressor::Zstd { framed: false },
            Self::Gzip => Compressor::Gzip(GzipMember {
                crc: flate2::Crc::new(),
                started: false,
            }),
        }
    }
}

/// What one response keeps of its compression between chunks.
pub enum Compressor {
    /// Bytes pass through.
    Identity,
    /// A zstd frame per chunk.
    Zstd {
        /// A frame was sent.
        framed: bool,
    },
    /// A gzip member spanning the response.
    Gzip(GzipMember),
}

/// The gzip member a response sends: its trailer's CRC-32 and length so far.
pub struct GzipMember {
    /// CRC-32 and length (mod 2^32) of the bytes compressed so far.
    crc: flate2::Crc,
    /// The header was sent.
    started: bool,
}

impl Compressor {
    /// Compresses `chunk` and flushes, returning the bytes to send now: everything they
    /// hold decodes once they arrive.
    pub fn chunk(&mut self, chunk: Vec<u8>) -> io::Result<Vec<u8>> {
        match self {
            Self::Identity => Ok(fitted(chunk)),
            Self::Zstd { framed } => {
                let frame = zstd_frame(&chunk)?;
                *framed = true;
                Ok(frame)
            }
            Self::Gzip(member) => member.chunk(&chunk),
        }
    }

    /// The bytes that end the response: the gzip member's last block and trailer (and its
    /// header if no chunk was sent: an empty member); nothing for zstd, whose frames are
    /// whole (an empty frame if none was sent), or without compression.
    pub fn finish(self) -> Vec<u8> {
        match self {
            Self::Identity | Self::Zstd { framed: true } => Vec::new(),
            Self::Zstd { framed: false } => ZSTD_EMPTY_FRAME.to_vec(),
            Self::Gzip(member) => member.finish(),
        }
    }
}

impl GzipMember {
    fn chunk(&mut self, chunk: &[u8]) -> io::Result<Vec<u8>> {
        let deflated = remembered(&LAST_DEFLATE, chunk, |chunk| {
            // Room for incompressible data: stored blocks add 5 bytes per 64 KiB.
            let mut out = Vec::with_capacity(chunk.len() + chunk.len() / 1024 + 64);
            DEFLATE.with(|deflate| {
                let mut deflate = deflate.borrow_mut();
                let deflate = deflate.get_or_insert_with(|| {
                    flate2::Compress::new(flate2::Compression::fast(), false)
                });
                // Afresh: the chunk refers to nothing before it.
                deflate.reset();
                deflate_flushed(deflate, chunk, &mut out)
            })?;
            Ok(fitted(out))
        })?;
        self.crc.update(chunk);
        if self.started {
            return Ok(deflated);
        }
        self.started = true;
        Ok([&GZIP_HEADER[..], &deflated].concat())
    }

    fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(GZIP_HEADER.len() + DEFLATE_END.len() + 8);
        if !self.started {
            out.extend_from_slice(&GZIP_HEADER);
        }
        out.extend_from_slice(&DEFLATE_END);
        out.extend_from_slice(&self.crc.sum().to_le_bytes());
        out.extend_from_slice(&self.crc.amount().to_le_bytes());
        out
    }
}

/// `input` as raw deflate appended to `out`, ended by a sync flush.
fn deflate_flushed(
    deflate: &mut flate2::Compress,
    mut input: &[u8],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    loop {
        if out.len() == out.capacity() {
            out.reserve(out.capacity() / 2 + 64);
        }
        let (read, written) = (deflate.total_in(), out.len());
        deflate
            .compress_vec(input, out, flate2::FlushCompress::Sync)
            .map_err(io::Error::other)?;
        input = &input[(deflate.total_in() - read) as usize..];
        // Done once the input is in and the flush left room: it wrote all it had.
        if input.is_empty() && out.len() < out.capacity() {
            return Ok(());
        }
        if deflate.total_in() == read && out.len() == written && out.len() < out.capacity() {
            return Err(io::Error::other("deflate made no progress"));
        }
    }
}

/// `data` as one whole zstd frame, compressed with this thread's context.
fn zstd_frame(data: &[u8]) -> io::Result<Vec<u8>> {
    remembered(&LAST_ZSTD, data, |data| {
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
        ZSTD.with(|context| {
            let mut slot = context.borrow_mut();
            let context = match &mut *slot {
                Some(context) => context,
                empty => empty.insert(zstd_context()?),
            };
            context.compress_to_buffer(data, &mut out)
        })?;
        Ok(fitted(out))
    })
}

/// `input` compressed by `compress`, or the compressed form this thread remembers for it
/// (`last`): a chunk compressed afresh compresses the same every time.
fn remembered(
    last: &'static std::thread::LocalKey<RefCell<Remembered>>,
    input: &[u8],
    compress: impl FnOnce(&[u8]) -> io::Result<Vec<u8>>,
) -> io::Result<Vec<u8>> {
    if input.is_empty() || input.len() > REMEMBERED_CHUNK_BYTES {
        return compress(input);
    }
    last.with(|last| {
        let mut last = last.borrow_mut();
        if last.input == input {
            return Ok(last.output.clone());
        }
        let output = compress(input)?;
        last.input.clear();
        last.input.extend_from_slice(input);
        last.output.clear();
        last.output.extend_from_slice(&output);
        Ok(output)
    })
}

/// A zstd context with the response parameters. Its parameters stay across frames.
fn zstd_context() -> io::Result<zstd::bulk::Compressor<'static>> {
    use zstd::zstd_safe::CParameter;
    let mut context = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    context.set_parameter(CParameter::WindowLog(ZSTD_WINDOW_LOG))?;
    context.set_parameter(CParameter::HashLog(ZSTD_HASH_LOG))?;
    context.set_parameter(CParameter::ChainLog(ZSTD_CHAIN_LOG))?;
    Ok(context)
}

/// `compressed` without the spare capacity it was given: a chunk waits in the
/// connection's queue toward a client that stops reading, and a compressed chunk is often
/// a small part of the capacity made for it.
fn fitted(mut compressed: Vec<u8>) -> Vec<u8> {
    compressed.shrink_to_fit();
    compressed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn negotiation_prefers_zstd_and_respects_q_zero() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(Coding::negotiate(Some(&v("gzip, zstd"))), Coding::Zstd);
        assert_eq!(
            Coding::negotiate(Some(&v("gzip, deflate, br"))),
            Coding::Gzip
        );
        assert_eq!(Coding::negotiate(Some(&v("zstd;q=0, gzip"))), Coding::Gzip);
        assert_eq!(Coding::negotiate(Some(&v("identity"))), Coding::Identity);
        assert_eq!(Coding::negotiate(None), Coding::Identity);
    }

    /// Heap bytes in use (the C allocator's counters, every arena: zstd allocates there).
    fn heap_in_use() -> usize {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let info = unsafe { libc::mallinfo2() };
        info.uordblks + info.hblkhd
    }

    /// Whether this is the run that measures: the heap counters are the process's, and
    /// the other tests of this binary allocate meanwhile, so a test that reads them runs
    /// again in a process of its own (the same binary, only `test` in it) and passes
    /// if that run passes. True in that process; false in the one that started it, after
    /// the run passed.
    fn measuring_alone(test: &str) -> bool {
        const ALONE: &str = "PSM_TEST_MEASURING_ALONE";
        if std::env::var_os(ALONE).is_some() {
            return true;
        }
        let exe = std::env::current_exe().expect("the test binary's path");
        let run = std::process::Command::new(&exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ALONE, "1")
            .output()
            .unwrap_or_else(|e| panic!("running {} for {test}: {e}", exe.display()));
        let (out, err) = (
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr),
        );
        eprint!("{err}");
        assert!(
            run.status.success() && out.contains("1 passed"),
            "{test} in a process of its own failed ({}):\n{out}{err}",
            run.status
        );
        false
    }

    /// A chunk of `lines` JSON lines, their size varying with `i`.
    fn lines(i: usize, lines: usize) -> Vec<u8> {
        let line = format!(
            "{{\"op_id\":\"{i}\",\"object_id\":\"{:x}\",\"data\":\"{}\"}}\n",
            i * 7919,
            "lorem ipsum ".repeat(i % 50)
        );
        line.repeat(lines).into_bytes()
    }

    /// An idle compressor, whatever it compressed, holds no memory besides itself (the
    /// few bytes measured, which a stream holds inline): 10,000 streams hold
    /// 10,000 of them (`docs/operations.md` 4.5). The contexts belong to the threads.
    #[test]
    fn an_idle_compressor_holds_no_memory() {
        const COMPRESSORS: usize = 1_000;
        const BOUND: usize = 1024;
        if !measuring_alone("compress::tests::an_idle_compressor_holds_no_memory") {
            return;
        }
        for coding in [Coding::Zstd, Coding::Gzip] {
            // This thread's context, made once.
            drop(coding.compressor().chunk(lines(1, 100)).unwrap());
            let each = {
                let before = heap_in_use();
                let mut held = Vec::with_capacity(COMPRESSORS);
                for _ in 0..COMPRESSORS {
                    let mut compressor = coding.compressor();
                    for i in 0..20 {
                        drop(compressor.chunk(lines(i, 1 + i % 7 * 30)).unwrap());
                    }
                    held.push(compressor);
                }
                let each = heap_in_use().saturating_sub(before) / COMPRESSORS;
                drop(held);
                each
            };
            eprintln!("{coding:?}: {each} bytes of heap per idle compressor");
            assert!(
                each <= BOUND,
                "{coding:?}: {each} bytes per idle compressor, over {BOUND}"
            );
        }
    }

    /// The window a zstd frame asks its decoder for (RFC 8878 3.1.1.1).
    fn zstd_window(frame: &[u8]) -> u64 {
        assert_eq!(frame[..4], [0x28, 0xb5, 0x2f, 0xfd], "a zstd frame");
        let descriptor = frame[4];
        if descriptor & 0x20 == 0 {
            let window = frame[5];
            let base = 1u64 << (10 + (window >> 3));
            return base + base / 8 * u64::from(window & 7);
        }
        // Single segment: the window is the content size.
        let at = 5 + [0, 1, 2, 4][usize::from(descriptor & 3)];
        let field = |n: usize| {
            let mut bytes = [0u8; 8];
            bytes[..n].copy_from_slice(&frame[at..at + n]);
            u64::from_le_bytes(bytes)
        };
        match descriptor >> 6 {
            0 => field(1),
            1 => field(2) + 256,
            2 => field(4),
            _ => field(8),
        }
    }

    /// Every zstd chunk is one whole frame (a decoder needs nothing before or after it),
    /// and asks for at most the 16 KiB window, far below the 8 MB a `Content-Encoding:
    /// zstd` decoder may cap it at (RFC 9659).
    #[test]
    fn every_zstd_chunk_is_a_whole_frame_with_a_small_window() {
        let mut compressor = Coding::Zstd.compressor();
        for (i, count) in [1, 3, 40, 200, 600, 1].into_iter().enumerate() {
            let chunk = lines(i * 11, count);
            let frame = compressor.chunk(chunk.clone()).unwrap();
            assert_eq!(
                zstd::zstd_safe::find_frame_compressed_size(&frame),
                Ok(frame.len()),
                "a {} byte chunk",
                chunk.len()
            );
            let window = zstd_window(&frame);
            assert!(window <= 1 << ZSTD_WINDOW_LOG, "{window} bytes");
            assert!(window <= 8 << 20);
            assert_eq!(zstd::decode_all(frame.as_slice()).unwrap(), chunk);
        }
    }

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
        let data = format!(
            "{{\"id\":\"{id}\",\"org_id\":\"org-001\",\"project_id\":\"project-org-001-0001\",\
             \"title\":\"Task 1.{n}\",\"status\":\"{status}\",\"priority\":{},\
             \"assignee_id\":\"user-org-001-{:04}\",\"story_points\":{},\
             \"updated_at\":\"2026-01-01T00:{:02}:{:02}.000000Z\",\"summary\":\"{hash}{hash}{hash}\"}}",
            n % 4,
            mix(n) % 20,
            n % 8,
            op_id / 60 % 60,
            op_id % 60,
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

    /// A whole response, chunks then [`Compressor::finish`], decodes completely: one
    /// gzip member with its trailer (length and CRC-32 checked), zstd frames back to back.
    /// A response that sent nothing is an empty member.
    #[test]
    fn a_finished_response_decodes_whole() {
        for coding in [Coding::Zstd, Coding::Gzip] {
            for chunks in [0, 1, 12] {
                let mut compressor = coding.compressor();
                let (mut body, mut plain) = (Vec::new(), Vec::new());
                for i in 0..chunks {
                    let chunk = lines(i * 5, 1 + i * 50);
                    plain.extend_from_slice(&chunk);
                    body.extend(compressor.chunk(chunk).unwrap());
                }
                body.extend(compressor.finish());
                let mut decoded = Vec::new();
                match coding {
                    Coding::Zstd => {
                        zstd::stream::read::Decoder::new(body.as_slice())
                            .unwrap()
                            .read_to_end(&mut decoded)
                            .unwrap();
                    }
                    _ => {
                        let mut member = flate2::read::GzDecoder::new(body.as_slice());
                        member.read_to_end(&mut decoded).unwrap();
                        // Nothing after the one member.
                        let mut rest = Vec::new();
                        member.into_inner().read_to_end(&mut rest).unwrap();
                        assert!(rest.is_empty(), "{} bytes after the member", rest.len());
                    }
                };
                assert!(decoded == plain, "{coding:?}, {chunks} chunks");
            }
        }
    }

    /// What a thread's contexts hold, made at its first chunk (`docs/operations.md` 4.5):
    /// they are per thread (the runtime's and the readers'), not per stream.
    #[test]
    fn a_threads_contexts_hold_a_bounded_amount_of_memory() {
        if !measuring_alone("compress::tests::a_threads_contexts_hold_a_bounded_amount_of_memory") {
            return;
        }
        for (coding, bound_kib) in [(Coding::Zstd, 256), (Coding::Gzip, 384)] {
            // Measured on a fresh thread (its contexts are made at its first chunk).
            let held = std::thread::spawn(move || {
                let chunk = lines(7, 2_000);
                let before = heap_in_use();
                let compressed = coding.compressor().chunk(chunk.clone()).unwrap();
                heap_in_use().saturating_sub(before + compressed.capacity()) / 1024
            })
            .join()
            .unwrap();
            eprintln!("{coding:?}: {held} KiB of contexts per thread");
            assert!(
                held <= bound_kib,
                "{coding:?}: {held} KiB, over {bound_kib}"
            );
        }
    }

    /// A finished zstd or gzip `body`, decoded.
    fn whole_body(coding: Coding, body: &[u8]) -> Vec<u8> {
        let mut decoded = Vec::new();
        if coding == Coding::Zstd {
            zstd::stream::read::Decoder::new(body)
                .and_then(|mut d| d.read_to_end(&mut decoded))
                .unwrap();
        } else {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut decoded)
                .unwrap();
        }
        decoded
    }

    /// A chunk the thread remembers is the same chunk in every stream that sends it: each
    /// stream's body still decodes to exactly its own lines.
    #[test]
    fn a_remembered_chunk_decodes_in_every_stream_that_sends_it() {
        let shared = lines(3, 4);
        let own = lines(9, 2);
        for coding in [Coding::Zstd, Coding::Gzip] {
            let (mut a, mut b) = (coding.compressor(), coding.compressor());
            let mut a_sent = a.chunk(shared.clone()).unwrap();
            let b_first = b.chunk(shared.clone()).unwrap();
            assert_eq!(
                a_sent, b_first,
                "{coding:?}: the same first chunk, the same bytes"
            );
            let mut b_sent = b_first;
            b_sent.extend(b.chunk(own.clone()).unwrap());
            b_sent.extend(b.chunk(shared.clone()).unwrap());
            a_sent.extend(a.chunk(shared.clone()).unwrap());
            a_sent.extend(a.finish());
            b_sent.extend(b.finish());
            for (sent, want) in [
                (a_sent, [&shared[..], &shared[..]].concat()),
                (b_sent, [&shared[..], &own[..], &shared[..]].concat()),
            ] {
                assert_eq!(whole_body(coding, &sent), want, "{coding:?}");
            }
        }
    }

    #[test]
    fn every_flushed_chunk_decodes_on_its_own_prefix() {
        for coding in [Coding::Zstd, Coding::Gzip] {
            let mut compressor = coding.compressor();
            let mut sent = Vec::new();
            let mut lines = String::new();
            for i in 0..50 {
                let line = format!("{{\"token_expires_in\":{i}}}\n");
                lines.push_str(&line);
                sent.extend(compressor.chunk(line.into_bytes()).unwrap());
                // What was sent so far decodes to every line so far.
                let mut decoded = Vec::new();
                match coding {
                    Coding::Zstd => {
                        let mut d = zstd::stream::read::Decoder::new(sent.as_slice()).unwrap();
                        let _ = d.read_to_end(&mut decoded);
                    }
                    _ => {
                        let mut d = flate2::read::GzDecoder::new(sent.as_slice());
                        let _ = d.read_to_end(&mut decoded);
                    }
                }
                assert_eq!(String::from_utf8(decoded).unwrap(), lines, "{coding:?}");
            }
        }
    }
}
