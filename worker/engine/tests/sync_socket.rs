//! The sync stream over a WebSocket (RSocket frames), as the official SDKs speak it, against
//! the engine in-process: request-N credit bounds what is sent, keepalives are answered, a
//! bad token is refused at SETUP, a cancel ends the stream, an expiring token completes it.
use crate::engine_rig;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use engine_rig::{token, EngineRig, TODOS_RULES as RULES, TODOS_SCHEMA as SCHEMA};

type Socket = WebSocketStream<TcpStream>;

/// A frame header: stream id, type and flags.
fn header(stream: u32, kind: u16, flags: u16) -> Vec<u8> {
    let mut out = stream.to_be_bytes().to_vec();
    out.extend_from_slice(&((kind << 10) | flags).to_be_bytes());
    out
}

fn with_metadata(mut out: Vec<u8>, metadata: &str, data: &str) -> Vec<u8> {
    out.extend_from_slice(&(metadata.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(metadata.as_bytes());
    out.extend_from_slice(data.as_bytes());
    out
}

fn setup(token: &str) -> Vec<u8> {
    setup_frame(&format!(r#"{{"token":"Token {token}"}}"#))
}

/// A SETUP frame with `metadata` (JSON).
fn setup_frame(metadata: &str) -> Vec<u8> {
    let mut out = header(0, 0x01, 0x100);
    out.extend_from_slice(&0x0001_0000u32.to_be_bytes());
    out.extend_from_slice(&20_000u32.to_be_bytes());
    out.extend_from_slice(&90_000u32.to_be_bytes());
    for _ in 0..2 {
        out.push(16);
        out.extend_from_slice(b"application/json");
    }
    with_metadata(out, metadata, "")
}

fn request_stream(credit: u32) -> Vec<u8> {
    let mut out = header(1, 0x06, 0x100);
    out.extend_from_slice(&credit.to_be_bytes());
    with_metadata(
        out,
        r#"{"path":"/sync/stream"}"#,
        r#"{"buckets":[],"include_checksum":true,"raw_data":true,"client_id":"ws"}"#,
    )
}

fn request_n(credit: u32) -> Vec<u8> {
    let mut out = header(1, 0x08, 0);
    out.extend_from_slice(&credit.to_be_bytes());
    out
}

/// A received frame: its type, flags and body.
fn parse(frame: &[u8]) -> (u16, u16, Vec<u8>) {
    let word = u16::from_be_bytes([frame[4], frame[5]]);
    (word >> 10, word & 0x3FF, frame[6..].to_vec())
}

/// A socket whose SETUP carries `token` and whose stream asks for `credit` lines first.
async fn open_stream(port: u16, token: &str, credit: u32) -> Socket {
    let mut socket = connect(port).await;
    socket.send(Message::binary(setup(token))).await.unwrap();
    socket
        .send(Message::binary(request_stream(credit)))
        .await
        .unwrap();
    socket
}

async fn connect(port: u16) -> Socket {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (socket, response) =
        tokio_tungstenite::client_async(format!("ws://127.0.0.1:{port}/sync/stream"), tcp)
            .await
            .unwrap();
    assert_eq!(response.status(), 101);
    socket
}

/// The next frame within `wait`, `None` when none came (or the socket closed).
async fn next(socket: &mut Socket, wait: Duration) -> Option<(u16, u16, Vec<u8>)> {
    loop {
        match tokio::time::timeout(wait, socket.next()).await {
            Ok(Some(Ok(Message::Binary(frame)))) => return Some(parse(&frame)),
            Ok(Some(Ok(Message::Close(_)) | Err(_)) | None) | Err(_) => return None,
            Ok(Some(Ok(_))) => {}
        }
    }
}

const PAYLOAD: u16 = 0x0A;
const ERROR: u16 = 0x0B;
const KEEPALIVE: u16 = 0x03;

/// A runtime for one test's sockets.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn credit_bounds_what_a_websocket_stream_sends() {
    let rig = EngineRig::start(SCHEMA, RULES, "psm_ws_test");
    let port = rig.port;
    let runtime = runtime();
    runtime.block_on(async {
        let quiet = Duration::from_millis(700);
        // Waits for a frame as long as the run lets anything stall.
        let long = testkit::Patience::of_run().stall;
        // One credit: one line (the checkpoint), then nothing until more is asked for.
        let mut socket = open_stream(port, &token("u1", 600), 1).await;
        let (kind, _, first) = next(&mut socket, long).await.unwrap();
        assert_eq!(kind, PAYLOAD);
        assert!(contains(&first, b"checkpoint\0"), "a BSON checkpoint line");
        assert_eq!(next(&mut socket, quiet).await, None, "one credit, one line");
        // A keepalive asked for is answered.
        let mut keepalive = header(0, KEEPALIVE, 0x80);
        keepalive.extend_from_slice(&0u64.to_be_bytes());
        socket.send(Message::binary(keepalive)).await.unwrap();
        assert_eq!(next(&mut socket, long).await.map(|f| f.0), Some(KEEPALIVE));
        // Credit for the rest: the data, then checkpoint_complete.
        socket
            .send(Message::binary(request_n(10_000)))
            .await
            .unwrap();
        let mut lines = 1;
        loop {
            let (kind, _, body) = next(&mut socket, long).await.expect("the download");
            assert_eq!(kind, PAYLOAD);
            lines += 1;
            if contains(&body, b"checkpoint_complete\0") {
                break;
            }
        }
        assert!(lines >= 3, "{lines} lines");
        // A cancel ends the stream: the server closes the socket.
        socket
            .send(Message::binary(header(1, 0x09, 0)))
            .await
            .unwrap();
        assert_eq!(next(&mut socket, long).await, None);

        // A bad token is refused at SETUP with the token error's code.
        let mut socket = connect(port).await;
        socket
            .send(Message::binary(setup("not-a-token")))
            .await
            .unwrap();
        let (kind, _, body) = next(&mut socket, long).await.unwrap();
        assert_eq!(kind, ERROR);
        assert!(
            contains(&body, b"PSYNC_S21"),
            "{}",
            String::from_utf8_lossy(&body)
        );

        // A token about to expire: the stream completes when it does.
        let mut socket = open_stream(port, &token("u1", 2), 100_000).await;
        let completed = loop {
            match next(&mut socket, long).await {
                Some((PAYLOAD, flags, _)) if flags & 0x40 != 0 => break true,
                Some(_) => {}
                None => break false,
            }
        };
        assert!(completed, "the stream completed when its token expired");
    });
}

/// The answer to an upgrade the server refuses (it panics when the upgrade is accepted).
async fn refused_upgrade(port: u16) -> (u16, String) {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    match tokio_tungstenite::client_async(format!("ws://127.0.0.1:{port}/sync/stream"), tcp).await {
        Ok(_) => panic!("the upgrade is accepted"),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().unwrap_or_default();
            (
                response.status().as_u16(),
                String::from_utf8_lossy(body).into_owned(),
            )
        }
        Err(other) => panic!("refused with {other}"),
    }
}

/// Sockets that have not sent their SETUP wait in a pool of their own: they take no
/// stream's place (`api.parameters.max_concurrent_connections` counts authenticated
/// streams only) and are closed when their SETUP has not come within 5 s.
#[test]
fn sockets_waiting_for_setup_hold_no_stream_place_and_are_closed_after_5_s() {
    let rig = EngineRig::start_with(
        SCHEMA,
        RULES,
        "psm_ws_setup_wait",
        "api:\n  parameters:\n    max_concurrent_connections: 2\n",
        None,
    );
    let port = rig.port;
    let long = testkit::Patience::of_run().stall;
    runtime().block_on(async {
        let started = std::time::Instant::now();
        let mut idle = Vec::new();
        for _ in 0..3 {
            idle.push(connect(port).await);
        }
        // Two streams are served beside them; a third is refused at its SETUP.
        let mut streams = Vec::new();
        for _ in 0..2 {
            let mut socket = open_stream(port, &token("u1", 600), 1).await;
            assert_eq!(next(&mut socket, long).await.map(|f| f.0), Some(PAYLOAD));
            streams.push(socket);
        }
        let mut third = open_stream(port, &token("u1", 600), 1).await;
        let (kind, _, body) = next(&mut third, long).await.expect("an answer");
        assert_eq!(kind, ERROR);
        assert!(
            contains(&body, b"PSM_H1429"),
            "{}",
            String::from_utf8_lossy(&body)
        );
        // The sockets that sent nothing are closed at the SETUP deadline.
        for socket in &mut idle {
            if let Some((kind, _, body)) = next(socket, Duration::from_secs(10)).await {
                assert_eq!(kind, ERROR, "{}", String::from_utf8_lossy(&body));
            }
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(4_500) && took < Duration::from_secs(9),
            "closed after {took:?}"
        );
    });
}

/// At most [`http::MAX_SOCKETS_WAITING_FOR_SETUP`] sockets wait for their SETUP at once;
/// the next upgrade is answered 503 (`PSM_H1505`) without becoming a socket.
#[test]
fn sockets_waiting_for_setup_are_capped() {
    let rig = EngineRig::start(SCHEMA, RULES, "psm_ws_setup_cap");
    let port = rig.port;
    runtime().block_on(async {
        let mut idle = Vec::new();
        for _ in 0..http::MAX_SOCKETS_WAITING_FOR_SETUP {
            idle.push(connect(port).await);
        }
        let (status, body) = refused_upgrade(port).await;
        assert_eq!(status, 503);
        assert!(body.contains("PSM_H1505"), "{body}");
        // A socket that sent its SETUP leaves the pool: room for one more.
        let mut first = idle.swap_remove(0);
        first
            .send(Message::binary(setup(&token("u1", 600))))
            .await
            .unwrap();
        first
            .send(Message::binary(request_stream(1)))
            .await
            .unwrap();
        let long = testkit::Patience::of_run().stall;
        assert_eq!(next(&mut first, long).await.map(|f| f.0), Some(PAYLOAD));
        idle.push(connect(port).await);
    });
}

/// SETUP carries a token and a user agent: a frame larger than [`SETUP_LIMIT`] before it
/// is refused without being buffered, one of 48 KiB is served.
#[test]
fn a_setup_larger_than_its_limit_is_refused() {
    let rig = EngineRig::start(SCHEMA, RULES, "psm_ws_setup_size");
    let port = rig.port;
    let long = testkit::Patience::of_run().stall;
    runtime().block_on(async {
        for (padding, served) in [(48 << 10, true), (SETUP_LIMIT, false)] {
            let mut socket = connect(port).await;
            let agent = "a".repeat(padding);
            let frame = setup_with(&token("u1", 600), &agent);
            socket.send(Message::binary(frame)).await.unwrap();
            let _ = socket.send(Message::binary(request_stream(1))).await;
            let first = next(&mut socket, long).await;
            if served {
                assert_eq!(first.map(|f| f.0), Some(PAYLOAD));
            } else if let Some((kind, _, body)) = first {
                assert_eq!(kind, ERROR, "{}", String::from_utf8_lossy(&body));
                assert!(
                    contains(&body, b"SETUP"),
                    "{}",
                    String::from_utf8_lossy(&body)
                );
            }
        }
    });
}

/// The largest SETUP a socket may send before it is accepted (a token as large as an
/// HTTP request head may carry).
const SETUP_LIMIT: usize = 64 << 10;

/// A SETUP frame whose metadata carries `token` and the user agent `agent`.
fn setup_with(token: &str, agent: &str) -> Vec<u8> {
    setup_frame(&format!(
        r#"{{"token":"Token {token}","user_agent":"{agent}"}}"#
    ))
}

/// A socket keeps its connection's place for its whole life: with a cap of three
/// connections, three streaming sockets leave none for a fourth connection.
#[test]
fn a_websocket_holds_its_connection_place_for_its_life() {
    let rig = EngineRig::start_with(
        SCHEMA,
        RULES,
        "psm_ws_conn_cap",
        "",
        Some(http::HttpLimits {
            max_connections: 3,
            ..http::HttpLimits::for_open_files(1 << 16)
        }),
    );
    let port = rig.port;
    let long = testkit::Patience::of_run().stall;
    runtime().block_on(async {
        let mut sockets = Vec::new();
        for _ in 0..3 {
            let mut socket = open_stream(port, &token("u1", 600), 1).await;
            assert_eq!(next(&mut socket, long).await.map(|f| f.0), Some(PAYLOAD));
            sockets.push(socket);
        }
        let mut over = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = over
            .write_all(b"GET /probes/liveness HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let mut answer = String::new();
        let _ = tokio::time::timeout(long, over.read_to_string(&mut answer)).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("PSM_H1504"), "{answer}");
    });
}
