//! A minimal HTTP/1.1 client for probes (one request per connection).

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::wait::Patience;

/// Status and body of a reply.
#[derive(Debug, Clone)]
pub struct HttpReply {
    /// HTTP status code.
    pub status: u16,
    /// The body as text.
    pub body: String,
}

/// `GET path` on 127.0.0.1:`port`; `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<HttpReply> {
    request(port, "GET", path, &[], "")
}

/// `POST path` with a JSON `body` and extra `headers` (`name: value` each) on
/// 127.0.0.1:`port`; `None` when nothing answers.
pub fn http_post(port: u16, path: &str, headers: &[&str], body: &str) -> Option<HttpReply> {
    request(port, "POST", path, headers, body)
}

fn request(port: u16, method: &str, path: &str, headers: &[&str], body: &str) -> Option<HttpReply> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Patience::of_run().stall))
        .ok()?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    if method != "GET" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    write!(stream, "{head}\r\n{body}").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.get(9..12)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some(HttpReply { status, body })
}
