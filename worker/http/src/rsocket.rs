//! The RSocket frames (protocol 1.0) the official SDKs exchange with the sync service over
//! a WebSocket: one frame per binary WebSocket message, so without the length prefix of
//! RSocket over TCP. Only what a sync stream uses is read: SETUP, REQUEST_STREAM,
//! REQUEST_N, CANCEL, KEEPALIVE and ERROR; written: PAYLOAD, ERROR and KEEPALIVE.

/// Frame types.
const SETUP: u8 = 0x01;
const KEEPALIVE: u8 = 0x03;
const REQUEST_STREAM: u8 = 0x06;
const REQUEST_N: u8 = 0x08;
const CANCEL: u8 = 0x09;
const PAYLOAD: u8 = 0x0A;
const ERROR: u8 = 0x0B;

/// Flags (the low 10 bits of the type-and-flags half word).
const FLAG_METADATA: u16 = 0x100;
const FLAG_RESPOND: u16 = 0x80;
const FLAG_RESUME: u16 = 0x80;
const FLAG_FOLLOWS: u16 = 0x80;
const FLAG_COMPLETE: u16 = 0x40;
const FLAG_NEXT: u16 = 0x20;

/// Error codes.
pub const INVALID_SETUP: u32 = 0x0000_0001;
pub const REJECTED_SETUP: u32 = 0x0000_0003;
pub const APPLICATION_ERROR: u32 = 0x0000_0201;
pub const INVALID: u32 = 0x0000_0204;

/// A frame a client sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// The connection's SETUP: its keepalive period and its metadata (JSON here: the
    /// token and the user agent).
    Setup {
        keepalive_ms: u32,
        metadata: Vec<u8>,
    },
    /// A stream asked for, with its first credit, metadata (`{"path": ...}`) and data (the
    /// sync request).
    RequestStream {
        stream: u32,
        credit: u32,
        metadata: Vec<u8>,
        data: Vec<u8>,
    },
    /// More credit for a stream.
    RequestN { stream: u32, credit: u32 },
    /// The client ends a stream.
    Cancel { stream: u32 },
    /// A keepalive; `respond` asks for one back.
    Keepalive { respond: bool },
    /// The client reports an error (on stream 0: the connection).
    Error { stream: u32, message: String },
    /// A frame a sync stream does not use (metadata push, fire-and-forget, ...).
    Other,
}

/// A frame that cannot be read; the connection ends with [`INVALID`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFrame(pub String);

/// Reads one frame.
pub fn read(frame: &[u8]) -> Result<Inbound, BadFrame> {
    let mut r = Reader {
        bytes: frame,
        at: 0,
    };
    let stream = r.u32()? & 0x7FFF_FFFF;
    let type_and_flags = r.u16()?;
    let kind = (type_and_flags >> 10) as u8;
    let flags = type_and_flags & 0x3FF;
    Ok(match kind {
        SETUP => {
            let _version = r.u32()?;
            let keepalive_ms = r.u32()?;
            let _lifetime_ms = r.u32()?;
            if flags & FLAG_RESUME != 0 {
                let len = r.u16()? as usize;
                r.take(len)?;
            }
            let metadata_mime = r.u8()? as usize;
            r.take(metadata_mime)?;
            let data_mime = r.u8()? as usize;
            r.take(data_mime)?;
            let (metadata, _data) = r.payload(flags)?;
            Inbound::Setup {
                keepalive_ms,
                metadata,
            }
        }
        REQUEST_STREAM => {
            let credit = r.u32()?;
            let (metadata, data) = r.payload(flags)?;
            Inbound::RequestStream {
                stream,
                credit,
                metadata,
                data,
            }
        }
        REQUEST_N => Inbound::RequestN {
            stream,
            credit: r.u32()?,
        },
        CANCEL => Inbound::Cancel { stream },
        KEEPALIVE => Inbound::Keepalive {
            respond: flags & FLAG_RESPOND != 0,
        },
        ERROR => {
            let _code = r.u32()?;
            Inbound::Error {
                stream,
                message: String::from_utf8_lossy(r.rest()).into_owned(),
            }
        }
        _ => Inbound::Other,
    })
}

/// A PAYLOAD frame: `data` as the stream's next item (no metadata).
pub fn payload_next(stream: u32, data: &[u8]) -> Vec<u8> {
    let mut out = header(stream, PAYLOAD, FLAG_NEXT);
    out.extend_from_slice(data);
    out
}

/// The PAYLOAD frame that completes a stream.
pub fn payload_complete(stream: u32) -> Vec<u8> {
    header(stream, PAYLOAD, FLAG_COMPLETE)
}

/// An ERROR frame (stream 0: the connection).
pub fn error(stream: u32, code: u32, message: &str) -> Vec<u8> {
    let mut out = header(stream, ERROR, 0);
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out
}

/// A KEEPALIVE frame; `respond` asks the client for one back.
pub fn keepalive(respond: bool) -> Vec<u8> {
    let mut out = header(0, KEEPALIVE, if respond { FLAG_RESPOND } else { 0 });
    out.extend_from_slice(&0u64.to_be_bytes());
    out
}

fn header(stream: u32, kind: u8, flags: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&(stream & 0x7FFF_FFFF).to_be_bytes());
    out.extend_from_slice(&((u16::from(kind) << 10) | flags).to_be_bytes());
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], BadFrame> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| BadFrame(format!("a frame ends before its field of {n} bytes")))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, BadFrame> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, BadFrame> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, BadFrame> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn rest(&mut self) -> &[u8] {
        let rest = &self.bytes[self.at..];
        self.at = self.bytes.len();
        rest
    }

    /// Metadata (24-bit length first, when flagged) and data (the rest).
    fn payload(&mut self, flags: u16) -> Result<(Vec<u8>, Vec<u8>), BadFrame> {
        if flags & FLAG_FOLLOWS != 0 {
            return Err(BadFrame(
                "fragmented frames (FOLLOWS) are not accepted".into(),
            ));
        }
        let metadata = if flags & FLAG_METADATA != 0 {
            let b = self.take(3)?;
            let len = (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]);
            self.take(len)?.to_vec()
        } else {
            Vec::new()
        };
        Ok((metadata, self.rest().to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames as rsocket-js writes them.
    fn frame(stream: u32, kind: u8, flags: u16, body: &[u8]) -> Vec<u8> {
        let mut out = header(stream, kind, flags);
        out.extend_from_slice(body);
        out
    }

    fn with_metadata(metadata: &[u8], data: &[u8]) -> Vec<u8> {
        let len = metadata.len() as u32;
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.extend_from_slice(metadata);
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn the_frames_of_a_sync_stream_are_read() {
        let mime = b"application/json";
        let mut setup = Vec::new();
        setup.extend_from_slice(&0x0001_0000u32.to_be_bytes());
        setup.extend_from_slice(&20_000u32.to_be_bytes());
        setup.extend_from_slice(&90_000u32.to_be_bytes());
        for _ in 0..2 {
            setup.push(mime.len() as u8);
            setup.extend_from_slice(mime);
        }
        setup.extend_from_slice(&with_metadata(br#"{"token":"Token x"}"#, b""));
        assert_eq!(
            read(&frame(0, SETUP, FLAG_METADATA, &setup)).unwrap(),
            Inbound::Setup {
                keepalive_ms: 20_000,
                metadata: br#"{"token":"Token x"}"#.to_vec()
            }
        );
        let mut request = 10u32.to_be_bytes().to_vec();
        request.extend_from_slice(&with_metadata(br#"{"path":"/sync/stream"}"#, b"{}"));
        assert_eq!(
            read(&frame(1, REQUEST_STREAM, FLAG_METADATA, &request)).unwrap(),
            Inbound::RequestStream {
                stream: 1,
                credit: 10,
                metadata: br#"{"path":"/sync/stream"}"#.to_vec(),
                data: b"{}".to_vec()
            }
        );
        assert_eq!(
            read(&frame(1, REQUEST_N, 0, &5u32.to_be_bytes())).unwrap(),
            Inbound::RequestN {
                stream: 1,
                credit: 5
            }
        );
        assert_eq!(
            read(&frame(1, CANCEL, 0, b"")).unwrap(),
            Inbound::Cancel { stream: 1 }
        );
        assert_eq!(
            read(&keepalive(true)).unwrap(),
            Inbound::Keepalive { respond: true }
        );
        assert_eq!(
            read(&error(3, APPLICATION_ERROR, "PSYNC_S2101 bad")).unwrap(),
            Inbound::Error {
                stream: 3,
                message: "PSYNC_S2101 bad".into()
            }
        );
    }

    #[test]
    fn damaged_frames_are_refused_and_payloads_written() {
        assert!(read(&[0, 0]).is_err());
        assert!(read(&frame(1, REQUEST_N, 0, &[0, 1])).is_err());
        // Metadata longer than the frame.
        let mut request = 1u32.to_be_bytes().to_vec();
        request.extend_from_slice(&[0xFF, 0xFF, 0xFF, b'x']);
        assert!(read(&frame(1, REQUEST_STREAM, FLAG_METADATA, &request)).is_err());
        assert!(read(&frame(1, REQUEST_STREAM, FLAG_FOLLOWS, &request)).is_err());
        let next = payload_next(7, b"doc");
        assert_eq!(&next[..4], &7u32.to_be_bytes());
        assert_eq!(
            u16::from_be_bytes([next[4], next[5]]) >> 10,
            u16::from(PAYLOAD)
        );
        assert_eq!(&next[6..], b"doc");
        let done = payload_complete(7);
        assert_eq!(
            u16::from_be_bytes([done[4], done[5]]) & FLAG_COMPLETE,
            FLAG_COMPLETE
        );
    }
}
