//! A `/sync/stream` response body as it arrives in reads of any size: the HTTP/1.1 framing
//! (chunked, a length, or until the connection closes), then the content coding (zstd,
//! gzip, none) decoded as one stream, then the NDJSON lines. Nothing assumes that a read,
//! a chunk or a compressed flush ends on a line, a chunk or a frame boundary.

use std::io::Write;

/// A response body that broke its framing or its coding.
#[derive(Debug)]
pub struct BodyError(pub String);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn error(what: impl Into<String>) -> BodyError {
    BodyError(what.into())
}

/// Where the chunked decoder is in its grammar (RFC 9112 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// Hex digits of the next chunk's size.
    Size,
    /// After the size: an extension (`;name=value`) up to the line's end.
    Extension,
    /// The `\n` of the size line.
    SizeLf,
    /// Chunk data, this many bytes left.
    Data(u64),
    /// The `\r` after a chunk's data.
    DataCr,
    /// The `\n` after a chunk's data.
    DataLf,
    /// After the last (empty) chunk: trailer lines until an empty one; true while the
    /// current line is empty so far.
    Trailer(bool),
    /// The body ended.
    Done,
}

/// The HTTP/1.1 framing of the body.
#[derive(Debug)]
pub enum Framing {
    /// `Transfer-Encoding: chunked`.
    Chunked { state: ChunkState, size: u64 },
    /// `Content-Length`: this many bytes left.
    Length(u64),
    /// Neither: the body runs until the connection closes.
    UntilClose,
}

impl Framing {
    /// Chunked transfer coding, at the start of the body.
    pub fn chunked() -> Self {
        Self::Chunked {
            state: ChunkState::Size,
            size: 0,
        }
    }

    /// True once the framing says the body is complete.
    pub fn is_done(&self) -> bool {
        matches!(
            self,
            Self::Chunked {
                state: ChunkState::Done,
                ..
            } | Self::Length(0)
        )
    }

    /// Appends the body bytes that `input` carries to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), BodyError> {
        match self {
            Self::UntilClose => {
                out.extend_from_slice(input);
                Ok(())
            }
            Self::Length(left) => {
                let take = input
                    .len()
                    .min(usize::try_from(*left).unwrap_or(usize::MAX));
                out.extend_from_slice(&input[..take]);
                *left -= take as u64;
                Ok(())
            }
            Self::Chunked { state, size } => {
                while let Some((&byte, rest)) = input.split_first() {
                    match *state {
                        ChunkState::Data(left) => {
                            let take = input.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                            out.extend_from_slice(&input[..take]);
                            input = &input[take..];
                            let left = left - take as u64;
                            *state = if left == 0 {
                                ChunkState::DataCr
                            } else {
                                ChunkState::Data(left)
                            };
                            continue;
                        }
                        ChunkState::Size => match byte {
                            b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                                let digit =
                                    u64::from((byte as char).to_digit(16).unwrap_or_default());
                                *size = size
                                    .checked_mul(16)
                                    .and_then(|s| s.checked_add(digit))
                                    .ok_or_else(|| error("chunk size overflows"))?;
                            }
                            b';' | b' ' | b'\t' => *state = ChunkState::Extension,
                            b'\r' => *state = ChunkState::SizeLf,
                            _ => return Err(error(format!("byte {byte:#x} in a chunk size"))),
                        },
                        ChunkState::Extension => {
                            if byte == b'\r' {
                                *state = ChunkState::SizeLf;
                            }
                        }
                        ChunkState::SizeLf => {
                            if byte != b'\n' {
                                return Err(error("chunk size line without LF"));
                            }
                            *state = if *size == 0 {
                                ChunkState::Trailer(true)
                            } else {
                                ChunkState::Data(*size)
                            };
                            *size = 0;
                        }
                        ChunkState::DataCr => {
                            if byte != b'\r' {
                                return Err(error("chunk data longer than its size"));
                            }
                            *state = ChunkState::DataLf;
                        }
                        ChunkState::DataLf => {
                            if byte != b'\n' {
                                return Err(error("chunk data without CRLF"));
                            }
                            *state = ChunkState::Size;
                        }
                        ChunkState::Trailer(empty) => match byte {
                            b'\n' if empty => *state = ChunkState::Done,
                            b'\n' => *state = ChunkState::Trailer(true),
                            b'\r' => {}
                            _ => *state = ChunkState::Trailer(false),
                        },
                        ChunkState::Done => return Err(error("bytes after the last chunk")),
                    }
                    input = rest;
                }
                Ok(())
            }
        }
    }
}

/// The response's `Content-Encoding`, decoded as one stream over the whole body.
pub enum Decoder {
    /// No coding.
    Identity,
    /// zstd: one or more frames back to back, each possibly flushed many times.
    Zstd(Box<zstd::stream::raw::Decoder<'static>>),
    /// gzip: one or more members, each a deflate stream flushed at chunk ends.
    Gzip(Box<flate2::write::MultiGzDecoder<Vec<u8>>>),
}

impl Decoder {
    /// The decoder for a `Content-Encoding` value (`None`: no header).
    pub fn for_coding(coding: Option<&str>) -> Result<Self, BodyError> {
        match coding.map(str::trim) {
            None | Some("identity") => Ok(Self::Identity),
            Some("zstd") => zstd::stream::raw::Decoder::new()
                .map(|d| Self::Zstd(Box::new(d)))
                .map_err(|e| error(format!("zstd decoder: {e}"))),
            Some("gzip") => Ok(Self::Gzip(Box::new(flate2::write::MultiGzDecoder::new(
                Vec::new(),
            )))),
            Some(other) => Err(error(format!("unknown Content-Encoding {other}"))),
        }
    }

    /// Decodes `input` (any part of the coded body) and appends what it yields to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), BodyError> {
        match self {
            Self::Identity => out.extend_from_slice(input),
            Self::Zstd(decoder) => {
                use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
                let mut src = InBuffer::around(input);
                let mut buf = [0u8; 16 << 10];
                loop {
                    let mut dst = OutBuffer::around(&mut buf[..]);
                    decoder
                        .run(&mut src, &mut dst)
                        .map_err(|e| error(format!("zstd: {e}")))?;
                    let (produced, full) = (dst.pos(), dst.pos() == dst.capacity());
                    out.extend_from_slice(&buf[..produced]);
                    // A full output buffer may hide more output of the input consumed.
                    if src.pos() == input.len() && !full {
                        break;
                    }
                }
            }
            Self::Gzip(decoder) => {
                decoder
                    .write_all(input)
                    .and_then(|()| decoder.flush())
                    .map_err(|e| error(format!("gzip: {e}")))?;
                out.append(decoder.get_mut());
            }
        }
        Ok(())
    }
}

/// Splits decoded bytes into lines, keeping a partial line until its end arrives.
#[derive(Default)]
pub struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    /// Appends `bytes` and calls `each` with every line they complete (without `\n`).
    pub fn feed(&mut self, bytes: &[u8], mut each: impl FnMut(&[u8])) {
        let mut rest = bytes;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            if self.partial.is_empty() {
                each(&rest[..end]);
            } else {
                self.partial.extend_from_slice(&rest[..end]);
                each(&self.partial);
                self.partial.clear();
            }
            rest = &rest[end + 1..];
        }
        self.partial.extend_from_slice(rest);
        if self.partial.is_empty() && self.partial.capacity() > 64 << 10 {
            // A long line once does not keep its buffer for the connection's life.
            self.partial = Vec::new();
        }
    }
}

/// The markers `<prefix><digits>` that `line` holds, as numbers.
pub fn markers(line: &[u8], prefix: &[u8], found: &mut Vec<u64>) {
    let mut at = 0;
    while let Some(offset) = line[at..]
        .windows(prefix.len())
        .position(|window| window == prefix)
    {
        let digits = &line[at + offset + prefix.len()..];
        let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
        if let Some(n) = std::str::from_utf8(&digits[..len])
            .ok()
            .and_then(|d| d.parse().ok())
        {
            found.push(n);
        }
        at += offset + prefix.len() + len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(body: &[u8]) -> Result<Vec<u8>, BodyError> {
        let mut framing = Framing::chunked();
        let mut out = Vec::new();
        framing.feed(body, &mut out)?;
        assert!(framing.is_done());
        Ok(out)
    }

    #[test]
    fn chunked_bodies_decode_wherever_the_reads_split() {
        let body = b"5;ext=1\r\nhello\r\nA\r\n, world!!!\r\n0\r\nx-trailer: 1\r\n\r\n";
        assert_eq!(chunked(body).unwrap(), b"hello, world!!!");
        for split in 0..=body.len() {
            let mut framing = Framing::chunked();
            let mut out = Vec::new();
            let (a, b) = body.split_at(split);
            framing.feed(a, &mut out).unwrap();
            framing.feed(b, &mut out).unwrap();
            assert_eq!(out, b"hello, world!!!", "split at {split}");
            assert!(framing.is_done());
        }
        let byte_by_byte = {
            let mut framing = Framing::chunked();
            let mut out = Vec::new();
            for b in body {
                framing.feed(std::slice::from_ref(b), &mut out).unwrap();
            }
            out
        };
        assert_eq!(byte_by_byte, b"hello, world!!!");
    }

    #[test]
    fn broken_chunked_framing_is_an_error() {
        assert!(chunked(b"z\r\n").is_err());
        assert!(chunked(b"3\r\nabcd\r\n").is_err());
        assert!(chunked(b"ffffffffffffffffff\r\n").is_err());
    }

    #[test]
    fn a_length_framed_body_stops_at_its_length() {
        let mut framing = Framing::Length(3);
        let mut out = Vec::new();
        framing.feed(b"ab", &mut out).unwrap();
        framing.feed(b"cdef", &mut out).unwrap();
        assert_eq!(out, b"abc");
        assert!(framing.is_done());
    }

    /// What the server sends: lines compressed and flushed chunk by chunk.
    fn zstd_flushed(chunks: &[&[u8]]) -> Vec<u8> {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        for chunk in chunks {
            encoder.write_all(chunk).unwrap();
            encoder.flush().unwrap();
        }
        encoder.finish().unwrap()
    }

    fn gzip_flushed(chunks: &[&[u8]]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for chunk in chunks {
            encoder.write_all(chunk).unwrap();
            encoder.flush().unwrap();
        }
        encoder.finish().unwrap()
    }

    fn decode_in_pieces(coding: &str, body: &[u8], want: &[u8]) {
        for split in 0..=body.len() {
            let mut decoder = Decoder::for_coding(Some(coding)).unwrap();
            let mut out = Vec::new();
            let (a, b) = body.split_at(split);
            decoder.feed(a, &mut out).unwrap();
            decoder.feed(b, &mut out).unwrap();
            assert_eq!(out, want, "{coding}, split at {split}");
        }
    }

    #[test]
    fn zstd_frames_back_to_back_decode_as_one_stream() {
        let first = zstd_flushed(&[b"{\"a\":1}\n", b"{\"b\":2}\n"]);
        let second = zstd_flushed(&[b"{\"c\":3}\n"]);
        let body = [first, second].concat();
        decode_in_pieces("zstd", &body, b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n");
    }

    #[test]
    fn a_zstd_frame_larger_than_the_output_buffer_is_all_decoded() {
        let big: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let body = zstd_flushed(&[&big]);
        let mut decoder = Decoder::for_coding(Some("zstd")).unwrap();
        let mut out = Vec::new();
        decoder.feed(&body, &mut out).unwrap();
        assert_eq!(out, big);
    }

    #[test]
    fn gzip_members_with_flushes_decode_as_one_stream() {
        let first = gzip_flushed(&[b"{\"a\":1}\n", b"{\"b\":2}\n"]);
        let second = gzip_flushed(&[b"{\"c\":3}\n"]);
        let body = [first, second].concat();
        decode_in_pieces("gzip", &body, b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n");
    }

    #[test]
    fn each_flush_is_decodable_before_the_stream_ends() {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut decoder = Decoder::for_coding(Some("gzip")).unwrap();
        let mut out = Vec::new();
        for line in [&b"{\"a\":1}\n"[..], b"{\"b\":2}\n"] {
            encoder.write_all(line).unwrap();
            encoder.flush().unwrap();
            decoder
                .feed(&std::mem::take(encoder.get_mut()), &mut out)
                .unwrap();
            assert!(out.ends_with(line));
        }
    }

    #[test]
    fn lines_are_whole_whatever_the_pieces() {
        let body = b"{\"a\":1}\n{\"b\":22}\n{\"c\"";
        for split in 0..=body.len() {
            let mut lines = Lines::default();
            let mut seen: Vec<Vec<u8>> = Vec::new();
            let (a, b) = body.split_at(split);
            lines.feed(a, |l| seen.push(l.to_vec()));
            lines.feed(b, |l| seen.push(l.to_vec()));
            assert_eq!(seen, [&b"{\"a\":1}"[..], b"{\"b\":22}"], "split at {split}");
            lines.feed(b":3}\n", |l| seen.push(l.to_vec()));
            assert_eq!(seen[2], b"{\"c\":3}");
        }
    }

    #[test]
    fn markers_are_found_in_escaped_rows() {
        let line = br#"{"data":{"data":"{\"body\":\"fanout-17\"}","x":"fanout-3x","y":"fanout-"}}"#;
        let mut found = Vec::new();
        markers(line, b"fanout-", &mut found);
        assert_eq!(found, [17, 3]);
    }
}
