//! A raw HTTP/1.1 `/sync/stream` client for the in-process engine tests: the chunked
//! NDJSON reader and a client model that checks checksums at every completion.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use testkit::Waiting;

use serde_json::Value;

use super::engine_rig::post_sync_stream;

/// An open `/sync/stream` response (chunked), read line by line.
pub struct Lines {
    pub reader: BufReader<TcpStream>,
    pub pending: Vec<u8>,
    pub content_type: String,
}

pub fn post(port: u16, token: Option<&str>, accept: &str, body: &str) -> (u16, Lines) {
    post_with(port, token, accept, "", body)
}

pub fn post_with(
    port: u16,
    token: Option<&str>,
    accept: &str,
    extra_headers: &str,
    body: &str,
) -> (u16, Lines) {
    let (status, content_type, reader) = post_sync_stream(port, token, accept, extra_headers, body);
    (
        status,
        Lines {
            reader,
            pending: Vec::new(),
            content_type,
        },
    )
}

impl Lines {
    /// Reads one chunk of the chunked body into `pending`.
    pub fn fill(&mut self) -> bool {
        let mut size = String::new();
        if self.reader.read_line(&mut size).unwrap_or(0) == 0 {
            return false;
        }
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return false;
        }
        let mut chunk = vec![0; size + 2];
        self.reader.read_exact(&mut chunk).unwrap();
        chunk.truncate(size);
        self.pending.extend_from_slice(&chunk);
        true
    }

    pub fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            if !self.fill() {
                return None;
            }
        }
    }

    pub fn next_bson_len(&mut self) -> Option<usize> {
        while self.pending.len() < 4 {
            if !self.fill() {
                return None;
            }
        }
        Some(u32::from_le_bytes(self.pending[..4].try_into().unwrap()) as usize)
    }

    /// Lines up to and including the next `checkpoint_complete`.
    pub fn until_complete(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        // Every line is progress; a silent stream fails on the socket's read timeout.
        let mut waiting = Waiting::new("a checkpoint_complete line");
        while let Some(line) = self.next() {
            waiting.progress(out.len());
            let done = line.get("checkpoint_complete").is_some();
            out.push(line);
            if done {
                return out;
            }
        }
        panic!("the stream ended before checkpoint_complete: {out:?}");
    }
}

/// A client model (`docs/spec/protocol.md` §3.4): per bucket, the ops received; at
/// checkpoint_complete the sums must equal the announced checksums.
#[derive(Default)]
pub struct Client {
    pub announced: BTreeMap<String, u32>,
    pub ops: BTreeMap<String, Vec<Value>>,
    pub last_op_id: u64,
    pub write_checkpoint: Option<String>,
}

impl Client {
    pub fn apply(&mut self, lines: &[Value]) {
        for line in lines {
            if let Some(cp) = line.get("checkpoint") {
                self.announced.clear();
                for b in cp["buckets"].as_array().unwrap() {
                    self.announced.insert(
                        b["bucket"].as_str().unwrap().into(),
                        checksum(&b["checksum"]),
                    );
                }
                self.last_op_id = cp["last_op_id"].as_str().unwrap().parse().unwrap();
                self.write_checkpoint = cp["write_checkpoint"].as_str().map(str::to_owned);
            } else if let Some(diff) = line.get("checkpoint_diff") {
                for b in diff["updated_buckets"].as_array().unwrap() {
                    self.announced.insert(
                        b["bucket"].as_str().unwrap().into(),
                        checksum(&b["checksum"]),
                    );
                }
                for b in diff["removed_buckets"].as_array().unwrap() {
                    self.announced.remove(b.as_str().unwrap());
                    self.ops.remove(b.as_str().unwrap());
                }
                self.last_op_id = diff["last_op_id"].as_str().unwrap().parse().unwrap();
                self.write_checkpoint = diff["write_checkpoint"].as_str().map(str::to_owned);
            } else if let Some(data) = line.get("data") {
                let bucket = data["bucket"].as_str().unwrap().to_owned();
                for op in data["data"].as_array().unwrap() {
                    let id: u64 = op["op_id"].as_str().unwrap().parse().unwrap();
                    assert!(id <= self.last_op_id, "op {id} beyond the checkpoint");
                    self.ops.entry(bucket.clone()).or_default().push(op.clone());
                }
            } else if line.get("checkpoint_complete").is_some() {
                for (bucket, expected) in &self.announced {
                    let sum = self.ops.get(bucket).map_or(0u32, |ops| {
                        ops.iter()
                            .fold(0u32, |s, op| s.wrapping_add(checksum(&op["checksum"])))
                    });
                    assert_eq!(sum, *expected, "checksum of {bucket}");
                }
            }
        }
    }

    /// The full name of the announced bucket named `untagged` after its tag (`by_list["l1"]`
    /// for `<tag>#by_list["l1"]`), if announced.
    pub fn named(&self, untagged: &str) -> Option<String> {
        self.announced
            .keys()
            .find(|b| b.split_once('#').is_some_and(|(_, rest)| rest == untagged))
            .cloned()
    }

    pub fn rows(&self, bucket: &str) -> BTreeMap<String, String> {
        let mut rows = BTreeMap::new();
        for op in self.ops.get(bucket).into_iter().flatten() {
            let id = op["object_id"].as_str().unwrap_or_default().to_owned();
            match op["op"].as_str().unwrap() {
                "PUT" => {
                    rows.insert(id, op["data"].as_str().unwrap().to_owned());
                }
                "REMOVE" => {
                    rows.remove(&id);
                }
                _ => {}
            }
        }
        rows
    }
}

pub fn checksum(v: &Value) -> u32 {
    v.as_i64().unwrap() as u32
}

/// Opens a stream of everything `user` may see (NDJSON) and reads it to its first
/// `checkpoint_complete`; returns how long that took, the client model and the stream,
/// still open.
pub fn first_checkpoint(port: u16, user: &str) -> (std::time::Duration, Client, Lines) {
    let started = std::time::Instant::now();
    let body = serde_json::json!({"buckets": [], "include_checksum": true, "raw_data": true});
    let token = super::engine_rig::token(user, 600);
    let (status, mut lines) = post(
        port,
        Some(&token),
        "application/x-ndjson",
        &body.to_string(),
    );
    assert_eq!(status, 200, "the stream is served");
    let mut client = Client::default();
    client.apply(&lines.until_complete());
    (started.elapsed(), client, lines)
}

/// The rows of the bucket named `untagged` after its tag, as `client` holds them.
pub fn rows_of(client: &Client, untagged: &str) -> BTreeMap<String, String> {
    let bucket = client
        .named(untagged)
        .unwrap_or_else(|| panic!("{untagged} is announced"));
    client.rows(&bucket)
}
