//! What an idle sync stream keeps on the heap, counted by a global allocator of this test
//! binary (its own binary: one process, one allocator). Ten thousand streams per replica
//! make every kilobyte per stream count (`docs/benchmark.md`, "Fan-out").
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_engine as engine;

#[path = "engine_rig.rs"]
mod engine_rig;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::time::Duration;

use engine_rig::{token, EngineRig};
use testkit::{wait_for, Patience};

/// Live allocations by size, in steps of 64 bytes (the last step holds all larger ones).
const SIZE_STEPS: usize = 257;
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_BY_SIZE: [AtomicI64; SIZE_STEPS] = [const { AtomicI64::new(0) }; SIZE_STEPS];

fn step(size: usize) -> usize {
    size.div_ceil(64).min(SIZE_STEPS - 1)
}

/// The system allocator, counting what is live.
struct Counting;

// SAFETY: every call is forwarded to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Relaxed);
        LIVE_BY_SIZE[step(layout.size())].fetch_add(1, Relaxed);
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Relaxed);
        LIVE_BY_SIZE[step(layout.size())].fetch_sub(1, Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Relaxed);
        LIVE_BY_SIZE[step(layout.size())].fetch_sub(1, Relaxed);
        LIVE_BY_SIZE[step(new_size)].fetch_add(1, Relaxed);
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn live() -> (i64, Vec<i64>) {
    let by_size = LIVE_BY_SIZE.iter().map(|c| c.load(Relaxed)).collect();
    (LIVE_BYTES.load(Relaxed), by_size)
}

/// What is live once it changed by less than 0.5 % in 300 ms (the streams' transient work
/// done).
fn settled() -> (i64, Vec<i64>) {
    let mut last = live();
    wait_for("the heap to settle", || {
        std::thread::sleep(Duration::from_millis(300));
        let now = live();
        let settled = (now.0 - last.0).abs() * 200 <= now.0.abs();
        last = now;
        if settled {
            Ok(last.clone())
        } else {
            Err(last.0)
        }
    })
}

const STREAMS: usize = 500;
/// Live heap allowed per idle stream in this (debug) build. 21.5–23.1 KiB measured:
/// hyper's read and header buffers (8 KiB each), the connection's task, the stream (the
/// response's body: its session, wait and registrations) and the token's claims (text). Before
/// the answer's future was boxed, hyper kept it (12 KiB) beside each stream: 38 KiB; before
/// the stream became the body, a task and a queue of its own: 25.7 KiB.
const MAX_BYTES_PER_STREAM: i64 = 25 << 10;

const RULES: &str = "bucket_definitions:
  global:
    data:
      - SELECT id, body FROM notes WHERE owner IS NULL
  by_user:
    parameters: SELECT request.user_id() AS user_id
    data:
      - SELECT id, body FROM notes WHERE owner = bucket.user_id
";

/// Opens a stream of everything for `user` and reads it until its first
/// `checkpoint_complete`; the connection stays open and unread after that.
fn open_idle_stream(port: u16, user: &str) -> TcpStream {
    let body = r#"{"buckets":[],"include_checksum":true,"raw_data":true}"#;
    let mut socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket
        .set_read_timeout(Some(Patience::of_run().stall))
        .unwrap();
    // One write, as clients send a request: hyper's read buffer doubles (to 16 KiB) when
    // a head arrives in pieces, which `write!` on the socket would make depend on timing.
    let request = format!(
        "POST /sync/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Token {}\r\n\
         Accept: application/x-ndjson\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        token(user, 3600),
        body.len()
    );
    socket.write_all(request.as_bytes()).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 16 << 10];
    while !seen.windows(19).any(|w| w == b"checkpoint_complete") {
        let read = socket.read(&mut buf).unwrap();
        assert!(
            read > 0,
            "the stream of {user} ended before its first checkpoint"
        );
        seen.extend_from_slice(&buf[..read]);
    }
    socket
}

#[test]
fn an_idle_stream_keeps_little_on_the_heap() {
    let schema = format!(
        "CREATE TABLE notes (id text PRIMARY KEY, owner text, body text);
         CREATE PUBLICATION powersync FOR TABLE notes;
         INSERT INTO notes SELECT 'g' || g, NULL, 'global note ' || g FROM generate_series(1, 100) g;
         INSERT INTO notes SELECT 'u' || g, 'u' || g, 'note of u' || g FROM generate_series(0, {}) g;",
        STREAMS - 1
    );
    let rig = EngineRig::start_with(&schema, RULES, "psm_stream_memory", "", None);
    let before = settled();
    let streams: Vec<TcpStream> = (0..STREAMS)
        .map(|i| open_idle_stream(rig.port, &format!("u{i}")))
        .collect();
    let after = settled();
    let per_stream = (after.0 - before.0) / STREAMS as i64;
    let mut by_size: Vec<(usize, f64)> = (0..SIZE_STEPS)
        .map(|s| (s * 64, (after.1[s] - before.1[s]) as f64 / STREAMS as f64))
        .filter(|(_, count)| *count >= 0.5)
        .collect();
    by_size.sort_by(|a, b| (b.0 as f64 * b.1).total_cmp(&(a.0 as f64 * a.1)));
    let largest: Vec<String> = by_size
        .iter()
        .take(12)
        .map(|(size, count)| format!("{count:.2} × ≤ {size} B"))
        .collect();
    println!(
        "{per_stream} bytes per idle stream; per stream: {}",
        largest.join(", ")
    );
    assert!(
        per_stream <= MAX_BYTES_PER_STREAM,
        "an idle stream keeps {per_stream} bytes live (at most {MAX_BYTES_PER_STREAM}); \
         per stream, the largest by size: {}",
        largest.join(", ")
    );
    drop(streams);
}
