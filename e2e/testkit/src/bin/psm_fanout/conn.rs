//! One `/sync/stream` connection: connected from a chosen loopback source address, the
//! request written, the response head read, then every line of the body classified. What
//! a scenario needs is sent as an [`Event`], stamped with the time the read that carried
//! the line returned.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::OwnedSemaphorePermit;

use crate::body::{markers, Decoder, Framing, Lines};

/// What a connection reports.
#[derive(Debug)]
pub enum Event {
    /// A `checkpoint_complete` line; `markers` are the commit markers that `data` lines
    /// carried since the previous one (only when markers are looked for).
    Complete {
        stream: usize,
        at: Instant,
        markers: Vec<u64>,
    },
    /// The server answered with another status than 200.
    Refused {
        stream: usize,
        status: u16,
        body: String,
    },
    /// The connection failed or ended; `opened` when it had completed a checkpoint.
    Ended {
        stream: usize,
        opened: bool,
        reason: String,
    },
}

/// What every connection of a run shares.
#[derive(Debug, Clone)]
pub struct Target {
    /// The sync service's address.
    pub addr: SocketAddr,
    /// `Accept-Encoding`, if any (`zstd`, `gzip`).
    pub accept_encoding: Option<String>,
    /// The prefix of commit markers to look for in `data` lines (`None`: none).
    pub marker_prefix: Option<Vec<u8>>,
}

/// The request body: no local buckets, checksums, rows as JSON strings.
const REQUEST_BODY: &str = r#"{"buckets":[],"include_checksum":true,"raw_data":true}"#;
/// The most a response head may take.
const MAX_HEAD: usize = 64 << 10;
/// How long a refused connection's body is read for its sample.
const REFUSAL_READ: Duration = Duration::from_secs(5);

/// The HTTP/1.1 request of one stream with `token`.
pub fn request(target: &Target, token: &str) -> Vec<u8> {
    let encoding = target
        .accept_encoding
        .as_deref()
        .map(|e| format!("Accept-Encoding: {e}\r\n"))
        .unwrap_or_default();
    format!(
        "POST /sync/stream HTTP/1.1\r\nHost: {}\r\nAuthorization: Token {token}\r\n\
         Accept: application/x-ndjson\r\nContent-Type: application/json\r\n{encoding}\
         Content-Length: {}\r\n\r\n{REQUEST_BODY}",
        target.addr,
        REQUEST_BODY.len()
    )
    .into_bytes()
}

/// Runs stream `stream` from `source` until the server or the scenario ends it; `permit`
/// (a place among the connections being set up) is released at its first checkpoint.
pub async fn run(
    stream: usize,
    source: IpAddr,
    target: &Target,
    request: Vec<u8>,
    permit: OwnedSemaphorePermit,
    events: UnboundedSender<Event>,
) {
    let mut permit = Some(permit);
    let mut opened = false;
    let result = serve(stream, source, target, &request, &events, || {
        permit.take();
        opened = true;
    })
    .await;
    let reason = match result {
        // Its event was the refusal.
        Ok(Served::Refused) => return,
        Ok(Served::Ended) => "the response ended".to_owned(),
        Err(reason) => reason,
    };
    let _ = events.send(Event::Ended {
        stream,
        opened,
        reason,
    });
}

async fn connect(source: IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    let tcp = socket.connect(addr).await?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// How a connection ended when it did not fail.
enum Served {
    /// Another status than 200, sent as [`Event::Refused`].
    Refused,
    /// The server ended the response.
    Ended,
}

/// The connection's life, until the server refuses or ends the response (or it fails).
async fn serve(
    stream: usize,
    source: IpAddr,
    target: &Target,
    request: &[u8],
    events: &UnboundedSender<Event>,
    mut on_first_complete: impl FnMut(),
) -> Result<Served, String> {
    let mut tcp = connect(source, target.addr)
        .await
        .map_err(|e| format!("connect from {source}: {e}"))?;
    tcp.write_all(request)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = vec![0u8; 8 << 10];
    let mut head = Vec::new();
    let (response, rest) = loop {
        let n = tcp
            .read(&mut buf)
            .await
            .map_err(|e| format!("read the head: {e}"))?;
        if n == 0 {
            return Err("closed before the response head".into());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let response = Head::parse(&head[..end])?;
            break (response, head.split_off(end + 4));
        }
        if head.len() > MAX_HEAD {
            return Err("response head too long".into());
        }
    };
    let mut framing = response.framing();
    if response.status != 200 {
        let body = refusal_body(&mut tcp, &mut framing, &rest).await;
        let _ = events.send(Event::Refused {
            stream,
            status: response.status,
            body,
        });
        return Ok(Served::Refused);
    }
    let mut decoder =
        Decoder::for_coding(response.content_encoding.as_deref()).map_err(|e| e.to_string())?;
    if target.accept_encoding.is_some() != response.content_encoding.is_some() {
        return Err(format!(
            "asked for {:?}, the response's Content-Encoding is {:?}",
            target.accept_encoding, response.content_encoding
        ));
    }
    let mut lines = Lines::default();
    let (mut framed, mut decoded) = (Vec::new(), Vec::new());
    let mut found = Vec::new();
    let mut pending = rest;
    let mut first = true;
    loop {
        let at = Instant::now();
        framed.clear();
        decoded.clear();
        framing
            .feed(&pending, &mut framed)
            .and_then(|()| decoder.feed(&framed, &mut decoded))
            .map_err(|e| e.to_string())?;
        lines.feed(&decoded, |line| {
            if line.starts_with(b"{\"checkpoint_complete\"") {
                let _ = events.send(Event::Complete {
                    stream,
                    at,
                    markers: std::mem::take(&mut found),
                });
                if first {
                    first = false;
                    on_first_complete();
                }
            } else if let Some(prefix) = &target.marker_prefix {
                if line.starts_with(b"{\"data\"") {
                    markers(line, prefix, &mut found);
                }
            }
        });
        if framing.is_done() {
            return Ok(Served::Ended);
        }
        let n = tcp.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("closed inside the response".into());
        }
        pending.clear();
        pending.extend_from_slice(&buf[..n]);
    }
}

/// A refusal's body (its JSON error), as text, read for at most [`REFUSAL_READ`].
async fn refusal_body(tcp: &mut TcpStream, framing: &mut Framing, rest: &[u8]) -> String {
    let mut body = Vec::new();
    let _ = framing.feed(rest, &mut body);
    let mut buf = [0u8; 4096];
    let read = async {
        while !framing.is_done() && body.len() < 4096 {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if framing.feed(&buf[..n], &mut body).is_err() {
                        break;
                    }
                }
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_READ, read).await;
    String::from_utf8_lossy(&body).into_owned()
}

/// The parts of a response head that decide how its body is read.
struct Head {
    status: u16,
    chunked: bool,
    content_length: Option<u64>,
    content_encoding: Option<String>,
}

impl Head {
    fn parse(head: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(head).map_err(|_| "response head not UTF-8")?;
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
            .and_then(|s| s.get(..3))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("status line {status_line:?}"))?;
        let mut parsed = Self {
            status,
            chunked: false,
            content_length: None,
            content_encoding: None,
        };
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "transfer-encoding" => {
                    parsed.chunked = value.to_ascii_lowercase().contains("chunked");
                }
                "content-length" => parsed.content_length = value.parse().ok(),
                "content-encoding" => parsed.content_encoding = Some(value.to_ascii_lowercase()),
                _ => {}
            }
        }
        Ok(parsed)
    }

    fn framing(&self) -> Framing {
        match (self.chunked, self.content_length) {
            (true, _) => Framing::chunked(),
            (false, Some(length)) => Framing::Length(length),
            (false, None) => Framing::UntilClose,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_decide_the_framing_and_coding() {
        let head = Head::parse(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n\
              Transfer-Encoding: chunked\r\ncontent-encoding: zstd",
        )
        .unwrap();
        assert_eq!(head.status, 200);
        assert!(matches!(head.framing(), Framing::Chunked { .. }));
        assert_eq!(head.content_encoding.as_deref(), Some("zstd"));
        let refused = Head::parse(b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 12").unwrap();
        assert_eq!(refused.status, 429);
        assert!(matches!(refused.framing(), Framing::Length(12)));
        assert!(Head::parse(b"SSH-2.0").is_err());
    }
}
