//! Live test: 10,000 concurrent `/sync/stream` connections on one sync replica (the real
//! extension). Each gets its first checkpoint; then one commit on the primary fans out to
//! every stream. Prints the fan-out time and the worker's memory; asserts that every
//! stream was served and saw the change (timings are reported, not asserted).
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use testkit::{
    free_port, global_bucket_config, wait_for_future, Cluster, ClusterKind, PgInstall, TestDir,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Streams held open at once (the process limit here is 20,000 descriptors);
/// `PSM_MANY_STREAMS` changes it for measurements (docs/benchmark.md).
fn streams() -> usize {
    std::env::var("PSM_MANY_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}
const SECRET: &[u8] = b"many-streams-secret-of-32-bytes!";
const AUDIENCE: &str = "powersync-mdbx-test";

/// A token of user `n` (each stream its own user: one user may hold at most 1,000).
fn token(n: usize) -> String {
    testkit::hs256_token(SECRET, AUDIENCE, &format!("u{n}"), 600)
}

/// Opens a stream and reads until its first `checkpoint_complete`; returns the socket
/// and what was read.
async fn open(port: u16, request: &str) -> Option<(tokio::net::TcpStream, Vec<u8>)> {
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    socket.write_all(request.as_bytes()).await.ok()?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !contains(&seen, b"checkpoint_complete") {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    Some((socket, seen))
}

/// Reads until a second `checkpoint_complete` (the one after the change).
async fn until_next_complete(mut socket: tokio::net::TcpStream, before: usize) -> bool {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if count(&seen, b"checkpoint_complete") > before {
            return true;
        }
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    count(haystack, needle) > 0
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

fn rss_kib(pid: i64, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap_or(0)
}

#[test]
fn ten_thousand_streams_are_served_and_all_see_a_change() {
    let streams = streams();
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(
        "CREATE TABLE notes (id text PRIMARY KEY, body text); \
         CREATE PUBLICATION powersync FOR TABLE notes; \
         INSERT INTO notes SELECT 'n' || g, 'note ' || g FROM generate_series(1, 100) g;",
    );
    let http_port = free_port();
    let config = global_bucket_config(
        &primary.uri("postgres"),
        "SELECT * FROM notes",
        SECRET,
        AUDIENCE,
        http_port,
    );
    let replica = Cluster::start_sync_replica(&install, &dir, &config, &[]);
    let status = replica.wait_worker_phase("streaming");
    let worker = status["worker_pid"].as_i64().unwrap();
    let body = r#"{"buckets":[],"include_checksum":true,"raw_data":true}"#;
    let request = |n: usize| {
        format!(
            "POST /sync/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Token {}\r\n\
             Accept: application/x-ndjson\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            token(n),
            body.len()
        )
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let started = Instant::now();
        let mut opening = tokio::task::JoinSet::new();
        // At most this many connections being set up at once (the listen backlog is
        // finite); an open stream no longer counts against it.
        let connecting = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
        for n in 0..streams {
            let request = request(n);
            let connecting = connecting.clone();
            opening.spawn(async move {
                let _permit = connecting.acquire_owned().await.ok()?;
                open(http_port, &request).await
            });
        }
        // Waits while streams keep opening (progress: how many did).
        let opened = AtomicUsize::new(0);
        let sockets = wait_for_future(
            "every stream's first checkpoint",
            || opened.load(Relaxed),
            async {
                let mut sockets = Vec::with_capacity(streams);
                while let Some(done) = opening.join_next().await {
                    opened.fetch_add(1, Relaxed);
                    if let Some((socket, seen)) = done.unwrap() {
                        assert!(
                            seen.starts_with(b"HTTP/1.1 200"),
                            "{}",
                            String::from_utf8_lossy(&seen)
                        );
                        sockets.push(socket);
                    }
                }
                sockets
            },
        )
        .await;
        let opened_in = started.elapsed();
        assert_eq!(
            sockets.len(),
            streams,
            "every stream got its first checkpoint"
        );
        let anon = rss_kib(worker, "RssAnon:");

        // One change fans out to every stream.
        let mut waiting = tokio::task::JoinSet::new();
        for socket in sockets {
            waiting.spawn(until_next_complete(socket, 0));
        }
        let committed = Instant::now();
        primary.sql("UPDATE notes SET body = 'changed' WHERE id = 'n1'");
        let answered = AtomicUsize::new(0);
        let saw = wait_for_future(
            "every stream's next checkpoint",
            || answered.load(Relaxed),
            async {
                let mut saw = 0;
                while let Some(done) = waiting.join_next().await {
                    answered.fetch_add(1, Relaxed);
                    if done.unwrap() {
                        saw += 1;
                    }
                }
                saw
            },
        )
        .await;
        let fan_out = committed.elapsed();
        println!(
            "{streams} streams: all opened with their first checkpoint in {:.2} s; one commit \
             reached all of them in {:.2} s; worker RssAnon {} MiB with the streams open",
            opened_in.as_secs_f64(),
            fan_out.as_secs_f64(),
            anon / 1024
        );
        assert_eq!(saw, streams, "every stream saw the change");
    });
}
