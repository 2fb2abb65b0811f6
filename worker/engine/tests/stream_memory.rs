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

/// The body of an ordinary stream request.
const PLAIN_BODY: &str = r#"{"buckets":[],"include_checksum":true,"raw_data":true}"#;

/// Opens a stream of everything for `user` with the request `body` and reads it until its
/// first `checkpoint_complete`; the connection stays open and unread after that.
fn open_idle_stream(port: u16, user: &str, body: &str) -> TcpStream {
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

/// What each stream of `STREAMS` idle ones opened with `body(i)` adds to the live heap,
/// and the allocation sizes that make most of it.
fn heap_per_stream(port: u16, body: impl Fn(usize) -> String) -> (i64, String) {
    let before = settled();
    let streams: Vec<TcpStream> = (0..STREAMS)
        .map(|i| open_idle_stream(port, &format!("u{i}"), &body(i)))
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
    drop(streams);
    (per_stream, largest.join(", "))
}

/// One test at a time: the allocator's counts are the whole process's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn schema() -> String {
    format!(
        "CREATE TABLE notes (id text PRIMARY KEY, owner text, body text);
         CREATE PUBLICATION powersync FOR TABLE notes;
         INSERT INTO notes SELECT 'g' || g, NULL, 'global note ' || g FROM generate_series(1, 100) g;
         INSERT INTO notes SELECT 'u' || g, 'u' || g, 'note of u' || g FROM generate_series(0, {}) g;",
        STREAMS - 1
    )
}

#[test]
fn an_idle_stream_keeps_little_on_the_heap() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rig = EngineRig::start_with(&schema(), RULES, "psm_stream_memory", "", None);
    let (per_stream, largest) = heap_per_stream(rig.port, |_| PLAIN_BODY.to_owned());
    println!("{per_stream} bytes per idle stream; per stream: {largest}");
    assert!(
        per_stream <= MAX_BYTES_PER_STREAM,
        "an idle stream keeps {per_stream} bytes live (at most {MAX_BYTES_PER_STREAM}); \
         per stream, the largest by size: {largest}"
    );
}

/// `{"p":[0,0,…]}` as long as fits in `bytes` of JSON text: the most values, each as
/// small as JSON writes one, that a request may carry.
fn zeros_object(bytes: usize) -> serde_json::Value {
    let zeros = (bytes - r#"{"p":[]}"#.len()).div_ceil(2);
    serde_json::json!({ "p": vec![0; zeros] })
}

/// A request as large as every limit lets it be: a `client_id`, `parameters` and
/// `streams.subscriptions` (the most of them, each with parameters) of the largest
/// accepted size, and bucket positions (which a stream keeps only until its first
/// checkpoint) up to the largest body.
fn largest_request(i: usize) -> String {
    let parameters = zeros_object(service::MAX_PARAMETERS_BYTES - 1);
    assert!(parameters.to_string().len() <= service::MAX_PARAMETERS_BYTES);
    let subscription = |bytes: usize| {
        serde_json::json!({
            "stream": format!("s{i}"),
            "parameters": zeros_object(bytes),
        })
    };
    let mut each = service::MAX_SUBSCRIPTIONS_BYTES / service::MAX_SUBSCRIPTIONS;
    let subscriptions = loop {
        let all: Vec<_> = (0..service::MAX_SUBSCRIPTIONS)
            .map(|_| subscription(each))
            .collect();
        if serde_json::Value::from(all.clone()).to_string().len()
            <= service::MAX_SUBSCRIPTIONS_BYTES
        {
            break all;
        }
        each -= 1;
    };
    let mut request = serde_json::json!({
        "buckets": [],
        "include_checksum": true,
        "raw_data": true,
        "client_id": "c".repeat(service::MAX_CLIENT_ID_BYTES),
        "parameters": parameters,
        "streams": { "include_defaults": true, "subscriptions": subscriptions },
    });
    let room = service::MAX_BODY_BYTES - request.to_string().len();
    let position = |name: String| serde_json::json!({ "name": name, "after": "0" });
    let each = room / service::MAX_BUCKET_POSITIONS;
    let overhead = position(String::new()).to_string().len() + 1;
    request["buckets"] = (0..service::MAX_BUCKET_POSITIONS)
        .map(|b| position(format!("{b:0>width$}", width = each - overhead)))
        .collect();
    let body = request.to_string();
    assert!(body.len() <= service::MAX_BODY_BYTES, "{}", body.len());
    body
}

/// The connection buffer hyper's read buffer grows to while a large body is read
/// (`CONNECTION_BUFFER_BYTES` in `worker/http/src/server.rs`); it keeps that size.
const CONNECTION_BUFFER_BYTES: i64 = 64 << 10;

/// What a stream keeps of its request (its parameters, subscriptions and `client_id`) is
/// capped and kept as text, and its bucket positions only until its first checkpoint: a
/// stream opened with the largest accepted request keeps at most that text and hyper's
/// grown read buffer more than an idle stream's bound. 95.7 KiB measured (debug); 511 KiB
/// before the request was kept as text, with the parameters alone at their cap.
#[test]
fn a_stream_with_the_largest_accepted_request_keeps_little_more() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rig = EngineRig::start_with(&schema(), RULES, "psm_stream_memory_large", "", None);
    let (per_stream, largest) = heap_per_stream(rig.port, largest_request);
    let kept = (service::MAX_PARAMETERS_BYTES
        + service::MAX_SUBSCRIPTIONS_BYTES
        + service::MAX_CLIENT_ID_BYTES) as i64;
    let bound = MAX_BYTES_PER_STREAM + kept + CONNECTION_BUFFER_BYTES;
    println!("{per_stream} bytes per stream with the largest request; per stream: {largest}");
    assert!(
        per_stream <= bound,
        "a stream with the largest accepted request keeps {per_stream} bytes live (at most \
         {bound}); per stream, the largest by size: {largest}"
    );
}
