//! A raw `/sync/stream` connection (NDJSON over chunked HTTP/1.1, no compression), read
//! on a thread of its own: every line arrives parsed on a channel, so a test can watch
//! what several replicas announce while it changes the primary.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// One open stream. Closed (the socket shut down) when dropped.
pub struct SyncStreamReader {
    lines: mpsc::Receiver<Value>,
    socket: TcpStream,
}

impl SyncStreamReader {
    /// Opens `POST /sync/stream` on 127.0.0.1:`port` with `token` and an empty request
    /// (no buckets held); panics when the replica does not answer 200.
    pub fn open(port: u16, token: &str) -> Self {
        let body = r#"{"buckets":[],"include_checksum":true,"raw_data":true}"#;
        let mut socket = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("the sync server on port {port}: {e}"));
        write!(
            socket,
            "POST /sync/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Token {token}\r\n\
             Accept: application/x-ndjson\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("the request is sent");
        // A replica that stops answering fails the reader after the run's stall limit
        // (a live stream sends a keepalive every 20 s or so).
        socket
            .set_read_timeout(Some(crate::wait::Patience::of_run().stall))
            .expect("a read timeout");
        let mut reader = BufReader::new(socket.try_clone().expect("the socket clones"));
        let mut status = String::new();
        reader.read_line(&mut status).expect("a status line");
        assert!(status.contains(" 200 "), "the stream was refused: {status}");
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).expect("headers");
            if header.trim().is_empty() {
                break;
            }
        }
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut pending = Vec::new();
            while let Some(chunk) = read_chunk(&mut reader) {
                pending.extend_from_slice(&chunk);
                while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let Ok(value) = serde_json::from_slice::<Value>(&line) else {
                        return;
                    };
                    if tx.send(value).is_err() {
                        return;
                    }
                }
            }
        });
        Self { lines, socket }
    }

    /// The next line, waiting at most `timeout`; `None` when none came (or the stream
    /// ended).
    pub fn next_line(&self, timeout: Duration) -> Option<Value> {
        self.lines.recv_timeout(timeout).ok()
    }
}

impl Drop for SyncStreamReader {
    fn drop(&mut self) {
        let _ = self.socket.shutdown(Shutdown::Both);
    }
}

/// One chunk of a chunked body; `None` at its end or when the connection ends.
fn read_chunk(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut size = String::new();
    reader.read_line(&mut size).ok()?;
    let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
    if size == 0 {
        return None;
    }
    let mut chunk = vec![0u8; size + 2];
    reader.read_exact(&mut chunk).ok()?;
    chunk.truncate(size);
    Some(chunk)
}
