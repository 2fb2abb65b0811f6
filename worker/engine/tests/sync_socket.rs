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
    let mut out = header(0, 0x01, 0x100);
    out.extend_from_slice(&0x0001_0000u32.to_be_bytes());
    out.extend_from_slice(&20_000u32.to_be_bytes());
    out.extend_from_slice(&90_000u32.to_be_bytes());
    for _ in 0..2 {
        out.push(16);
        out.extend_from_slice(b"application/json");
    }
    with_metadata(out, &format!(r#"{{"token":"Token {token}"}}"#), "")
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

/// A WebSocket holds a stream's place from its upgrade on: sockets that never send their
/// SETUP count against `api.parameters.max_concurrent_connections`, and the next upgrade
/// is refused with 429 instead of piling up.
#[test]
fn upgraded_sockets_count_against_the_stream_limit() {
    let rig = EngineRig::start_with(
        SCHEMA,
        RULES,
        "psm_ws_limit_test",
        "api:\n  parameters:\n    max_concurrent_connections: 2\n",
        None,
    );
    let port = rig.port;
    let runtime = runtime();
    runtime.block_on(async {
        let _idle = [connect(port).await, connect(port).await];
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let refused = match tokio_tungstenite::client_async(
            format!("ws://127.0.0.1:{port}/sync/stream"),
            tcp,
        )
        .await
        {
            Ok(_) => panic!("a third socket is accepted"),
            Err(e) => e,
        };
        match refused {
            tokio_tungstenite::tungstenite::Error::Http(response) => {
                assert_eq!(response.status(), 429);
            }
            other => panic!("refused with {other}"),
        }
    });
}
