//! The HTTP server's limits against clients that hold connections: half-sent headers and
//! idle kept-alive connections are closed after the header timeout, connections over the
//! cap are answered 503 and closed, and the official `api.parameters` limits apply to
//! sync streams (429 past `max_concurrent_connections`, no bucket set past
//! `max_buckets_per_connection`).
use crate::engine_rig;
use crate::sync_client;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use engine_rig::{token, EngineRig};
use http::HttpLimits;
use serde_json::json;
use sync_client::post;
use testkit::{wait_until, Patience};

const SCHEMA: &str = "
CREATE TABLE lists (id text PRIMARY KEY, owner_id text NOT NULL);
CREATE PUBLICATION powersync FOR TABLE lists;
INSERT INTO lists VALUES ('l1', 'u1'), ('l2', 'u1');
";

const RULES: &str = "
bucket_definitions:
  by_list:
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT * FROM lists WHERE id = bucket.list_id
";

const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
const BODY_TIMEOUT: Duration = Duration::from_secs(2);

fn start(slot: &str, extra_yaml: &str, limits: HttpLimits) -> EngineRig {
    EngineRig::start_with(SCHEMA, RULES, slot, extra_yaml, Some(limits))
}

/// Limits with the short header timeout and `max_connections`.
fn limits(max_connections: usize) -> HttpLimits {
    HttpLimits {
        header_read_timeout: HEADER_TIMEOUT,
        max_connections,
        write_timeout: WRITE_TIMEOUT,
        body_read_timeout: BODY_TIMEOUT,
    }
}

/// Opens a stream of everything `user` may see (NDJSON); returns the status and the body.
fn open_stream(rig: &EngineRig, user: &str) -> (u16, sync_client::Lines) {
    open_stream_for(rig, user, 600)
}

/// [`open_stream`] with a token of `lifetime` seconds.
fn open_stream_for(rig: &EngineRig, user: &str, lifetime: i64) -> (u16, sync_client::Lines) {
    let body = json!({"buckets": [], "include_checksum": true, "raw_data": true}).to_string();
    post(
        rig.port,
        Some(&token(user, lifetime)),
        "application/x-ndjson",
        &body,
    )
}

/// The rest of a refused answer, read to its end.
fn answer_of(mut refused: sync_client::Lines) -> String {
    let mut answer = String::new();
    refused.reader.read_to_string(&mut answer).unwrap();
    answer
}

fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Patience::of_run().stall))
        .unwrap();
    stream
}

/// True once the server closed `stream` (a read returns end of file or a reset).
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    stream.set_nonblocking(false).unwrap();
    closed
}

/// The whole answer on a connection the server closes after it.
fn read_answer(stream: &mut TcpStream) -> String {
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn half_sent_headers_and_idle_connections_are_closed_after_the_header_timeout() {
    let rig = start("psm_limits_timeout", "", limits(10_000));
    let started = Instant::now();
    let mut holders: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = connect(rig.port);
            s.write_all(b"POST /sync/stream HTTP/1.1\r\nHost: x\r\nContent-Le")
                .unwrap();
            s
        })
        .collect();
    // A kept-alive connection that was served once and then says nothing.
    let mut idle = connect(rig.port);
    idle.write_all(b"GET /probes/liveness HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    holders.push(idle);

    wait_until(
        "the server closed every connection that stopped sending",
        || {
            holders.retain_mut(|s| !closed_by_server(s));
            holders.is_empty().then_some(())
        },
    );
    let took = started.elapsed();
    assert!(
        took >= HEADER_TIMEOUT,
        "closed after {took:?}, before the header timeout of {HEADER_TIMEOUT:?}"
    );
    // The server still serves.
    let mut probe = connect(rig.port);
    probe
        .write_all(b"GET /probes/liveness HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert!(read_answer(&mut probe).starts_with("HTTP/1.1 200"));
}

#[test]
fn a_connection_over_the_cap_is_answered_503_and_closed() {
    // A header timeout long enough that the held connections stay while the test runs.
    let rig = start(
        "psm_limits_cap",
        "",
        HttpLimits {
            header_read_timeout: Patience::of_run().stall,
            max_connections: 4,
            write_timeout: WRITE_TIMEOUT,
            body_read_timeout: BODY_TIMEOUT,
        },
    );
    // Four connections that are mid-request (the header timeout has not passed).
    let holders: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = connect(rig.port);
            s.write_all(b"GET /probes/liveness HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    let mut over = connect(rig.port);
    let answer = read_answer(&mut over);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("PSM_H1504"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 5"),
        "{answer}"
    );
    // Once the held connections are gone, new ones are served again.
    drop(holders);
    wait_until("a new connection served once the others closed", || {
        let mut probe = connect(rig.port);
        probe
            .write_all(b"GET /probes/liveness HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        read_answer(&mut probe)
            .starts_with("HTTP/1.1 200")
            .then_some(())
    });
}

#[test]
fn api_parameters_limit_streams_and_buckets() {
    let api = "api:\n  parameters:\n    max_concurrent_connections: 2\n    max_buckets_per_connection: 1\n";
    let rig = start("psm_limits_api", api, limits(10_000));

    // u2 owns no list: no bucket, within the limit of one; its stream stays open.
    let (status, mut first) = open_stream(&rig, "u2");
    assert_eq!(status, 200);
    first.until_complete();
    // u1 owns two lists: two buckets, over the limit of one. The stream ends without a
    // checkpoint (PSYNC_S2305 in the server log).
    let (status, mut over_buckets) = open_stream(&rig, "u1");
    assert_eq!(status, 200);
    assert_eq!(
        over_buckets.next(),
        None,
        "no checkpoint over the bucket limit"
    );

    let (status, mut second) = open_stream(&rig, "u2");
    assert_eq!(status, 200);
    second.until_complete();
    // Two streams are open: a third is refused.
    let (status, refused) = open_stream(&rig, "u2");
    assert_eq!(status, 429);
    let answer = answer_of(refused);
    assert!(answer.contains("PSM_H1429"), "{answer}");
}

/// 300 rows of 100 KB each in one bucket: far more than the socket buffers between the
/// server and a client that does not read.
const BIG_SCHEMA: &str = "
CREATE TABLE big (id text PRIMARY KEY, body text NOT NULL);
CREATE PUBLICATION powersync FOR TABLE big;
INSERT INTO big SELECT 'b' || g, repeat(md5(g::text), 3125) FROM generate_series(1, 300) g;
";

const BIG_RULES: &str = "
bucket_definitions:
  everything:
    data:
      - SELECT * FROM big
";

/// `powersync_mdbx_sync_streams_open` from `GET /metrics`.
fn streams_open(port: u16) -> Option<u64> {
    let mut probe = connect(port);
    probe
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    read_answer(&mut probe)
        .lines()
        .find_map(|l| l.strip_prefix("powersync_mdbx_sync_streams_open "))?
        .trim()
        .parse()
        .ok()
}

/// Opens a stream of everything for `user` with a token of `lifetime` seconds and reads
/// nothing of its body; the caller holds the connection.
fn open_and_stop_reading(rig: &EngineRig, lifetime: i64) -> sync_client::Lines {
    let (status, lines) = open_stream_for(rig, "reader", lifetime);
    assert_eq!(status, 200);
    wait_until("the stream is open", || {
        (streams_open(rig.port)? == 1).then_some(())
    });
    lines
}

#[test]
fn a_client_that_stops_reading_is_cut_off_after_the_write_timeout() {
    let rig = EngineRig::start_with(
        BIG_SCHEMA,
        BIG_RULES,
        "psm_limits_slow",
        "",
        Some(limits(10_000)),
    );
    let started = Instant::now();
    let held = open_and_stop_reading(&rig, 600);
    wait_until(
        "the stream of the client that stopped reading ended",
        || (streams_open(rig.port)? == 0).then_some(()),
    );
    assert!(
        started.elapsed() >= WRITE_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    drop(held);
}

#[test]
fn a_token_expiring_while_a_send_is_blocked_ends_the_stream() {
    // A write timeout longer than the test: only the token can end the stream.
    let rig = EngineRig::start_with(
        BIG_SCHEMA,
        BIG_RULES,
        "psm_limits_expiry",
        "",
        Some(HttpLimits {
            header_read_timeout: HEADER_TIMEOUT,
            max_connections: 10_000,
            write_timeout: Duration::from_secs(3600),
            body_read_timeout: BODY_TIMEOUT,
        }),
    );
    let held = open_and_stop_reading(&rig, 5);
    wait_until("the stream whose token expired ended", || {
        (streams_open(rig.port)? == 0).then_some(())
    });
    drop(held);
}

/// A stream request of `user` whose head announces a body of 1,000 bytes that never
/// comes: the connection, to hold.
fn stream_head_without_body(rig: &EngineRig, user: &str) -> TcpStream {
    let mut s = connect(rig.port);
    let head = format!(
        "POST /sync/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Token {}\r\n\
         Accept: application/x-ndjson\r\nContent-Type: application/json\r\n\
         Content-Length: 1000\r\n\r\n",
        token(user, 600)
    );
    s.write_all(head.as_bytes()).unwrap();
    s
}

#[test]
fn one_user_holds_at_most_its_limit_of_streams_before_sending_a_body() {
    let api = "api:\n  parameters:\n    max_concurrent_connections_per_user: 2\n";
    let rig = start("psm_limits_user", api, limits(10_000));
    let mut held: Vec<_> = (0..2)
        .map(|_| {
            let (status, lines) = open_stream(&rig, "u2");
            assert_eq!(status, 200);
            lines
        })
        .collect();
    // The third is refused from its head alone, well before the body's deadline.
    let mut third = stream_head_without_body(&rig, "u2");
    third.set_read_timeout(Some(BODY_TIMEOUT / 2)).unwrap();
    let answer = read_response(&mut third);
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("PSM_H1430"), "{answer}");
    // Another user is not affected, and a stream that ends makes room again.
    assert_eq!(open_stream(&rig, "u1").0, 200);
    drop(held.pop());
    wait_until("room for one more stream of the user", || {
        let (status, lines) = open_stream(&rig, "u2");
        (status == 200).then_some(lines)
    });
}

/// One response read whole (its head, then as many body bytes as `Content-Length` says),
/// on a connection the server may keep open; what came when the read times out.
fn read_response(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if seen.len() >= end + 4 + length {
                return text;
            }
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return text,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn a_checkpoint_request_is_authenticated_before_its_body_is_read() {
    let rig = start("psm_limits_auth_first", "", limits(10_000));
    let mut s = connect(rig.port);
    s.write_all(
        b"POST /sync/checkpoint-request HTTP/1.1\r\nHost: x\r\n\
          Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
    )
    .unwrap();
    // Refused from its head, before the body's deadline.
    s.set_read_timeout(Some(BODY_TIMEOUT / 2)).unwrap();
    let answer = read_response(&mut s);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("PSYNC_S2106"), "{answer}");
}

#[test]
fn a_body_that_does_not_arrive_in_time_is_answered_408_and_closed() {
    let rig = start("psm_limits_body", "", limits(10_000));
    let checkpoint_head = format!(
        "POST /sync/checkpoint-request HTTP/1.1\r\nHost: x\r\nAuthorization: Token {}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"client_id\":",
        token("u1", 600)
    );
    let started = Instant::now();
    let mut checkpoint = connect(rig.port);
    checkpoint.write_all(checkpoint_head.as_bytes()).unwrap();
    let mut stream = stream_head_without_body(&rig, "u1");
    for held in [&mut stream, &mut checkpoint] {
        let answer = read_response(held);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("PSM_H1408"), "{answer}");
        assert!(
            started.elapsed() >= BODY_TIMEOUT - Duration::from_millis(100),
            "{:?}",
            started.elapsed()
        );
        let mut more = [0u8; 1];
        match held.read(&mut more) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("the connection stays open after the 408: {other:?}"),
        }
    }
    // No stream was left registered by the one that never sent its body.
    assert_eq!(streams_open(rig.port), Some(0));
}

#[test]
fn parameter_query_results_are_limited() {
    let api = "api:\n  parameters:\n    max_parameter_query_results: 1\n";
    let rig = start("psm_limits_params", api, limits(10_000));
    // u1's parameter query returns two rows (its two lists): over the limit of one, so
    // the stream ends without a checkpoint (PSYNC_S2305 in the server log).
    let (status, mut over) = open_stream(&rig, "u1");
    assert_eq!(status, 200);
    assert_eq!(
        over.next(),
        None,
        "no checkpoint past the parameter result limit"
    );
    // u2's returns none: served.
    let (status, mut within) = open_stream(&rig, "u2");
    assert_eq!(status, 200);
    within.until_complete();
}

#[test]
fn clients_that_send_nothing_or_a_body_do_not_hold_the_metrics_port() {
    let metrics_port = testkit::free_port();
    let telemetry = format!("telemetry:\n  prometheus_port: {metrics_port}\n");
    let rig = start("psm_limits_metrics", &telemetry, limits(10_000));
    wait_until("the metrics port listens", || {
        TcpStream::connect(("127.0.0.1", metrics_port)).ok()
    });
    let started = Instant::now();
    // Twice as many holders as the port once served at a time: nothing sent, half a head,
    // and a whole head announcing a body that never comes.
    let mut holders: Vec<TcpStream> = (0..16)
        .map(|i| {
            let mut s = connect(metrics_port);
            let sent: &[u8] = match i % 3 {
                0 => b"",
                1 => b"GET /metrics HTTP/1.1\r\nHo",
                _ => b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n",
            };
            s.write_all(sent).unwrap();
            s
        })
        .collect();
    // A scrape is answered at once beside them.
    let mut scrape = connect(metrics_port);
    scrape
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    scrape
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let answer = read_response(&mut scrape);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    // Every holder is closed within the port's header timeout; the one with a body is
    // answered without it being read.
    wait_until("the metrics port closed every holder", || {
        holders.retain_mut(|s| !closed_by_server(s));
        holders.is_empty().then_some(())
    });
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );
    drop(rig);
}
