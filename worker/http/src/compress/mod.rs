//! Response compression for `/sync/stream`, negotiated from `Accept-Encoding` as the
//! official service does (zstd preferred, then gzip). Every chunk is compressed and
//! flushed whole, so the client decodes each line as soon as it is sent.
//!
//! No compression state is held between chunks: streams are idle almost all the time (a
//! line every few seconds or minutes), and 10,000 of them cannot each keep a compressor
//! of a few hundred KiB. Each chunk is compressed with its thread's context (one per
//! thread and coding, reused, no lock: compression runs on the runtime's threads and on
//! the service's reader threads), which starts afresh for it, so the chunk refers to nothing sent
//! before:
//! - zstd: each chunk is one whole frame (`ZSTD_e_end`); a zstd body may be several
//!   frames back to back (RFC 8878 3.1).
//! - gzip: one gzip member spans the response (clients may decode only the first): its
//!   header goes with the first chunk, then each chunk is raw deflate from a reset
//!   compressor ended by a sync flush (byte-aligned, not the last block), which is valid
//!   deflate since a block need not refer back. The stream keeps the CRC-32 and length
//!   of what it sent, and [`Compressor::finish`] gives the last block and the trailer.
//!
//! A chunk compressed afresh compresses the same whatever stream sends it, and a commit
//! that many streams hold sends each of them the same small chunk (its checkpoint line,
//! data and completion), one after another on each thread: each thread remembers its last
//! small chunk and its compressed form, per coding, and a chunk equal to it is not
//! compressed again (a reset of the contexts alone costs microseconds per chunk).

mod gzip;
mod remembered;
mod zstd_frames;

use std::io;

use hyper::header::HeaderValue;

use super::accept::quality;
use gzip::GzipMember;
use remembered::fitted;
use zstd_frames::{zstd_frame, ZSTD_EMPTY_FRAME};

/// The negotiated content coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// No compression.
    Identity,
    /// `Content-Encoding: zstd`.
    Zstd,
    /// `Content-Encoding: gzip`.
    Gzip,
}

impl Coding {
    /// zstd or gzip when `Accept-Encoding` allows them (q > 0), zstd first.
    pub fn negotiate(accept: Option<&HeaderValue>) -> Self {
        let allowed = |coding| quality(accept, coding).is_some_and(|q| q > 0.0);
        if allowed("zstd") {
            Self::Zstd
        } else if allowed("gzip") {
            Self::Gzip
        } else {
            Self::Identity
        }
    }

    /// The `Content-Encoding` value, if any.
    pub fn header(self) -> Option<HeaderValue> {
        match self {
            Self::Identity => None,
            Self::Zstd => Some(HeaderValue::from_static("zstd")),
            Self::Gzip => Some(HeaderValue::from_static("gzip")),
        }
    }

    /// The compression state of one response (a few bytes: the contexts are the threads').
    pub fn compressor(self) -> Compressor {
        match self {
            Self::Identity => Compressor::Identity,
            Self::Zstd => Compressor::Zstd { framed: false },
            Self::Gzip => Compressor::Gzip(GzipMember {
                crc: flate2::Crc::new(),
                started: false,
            }),
        }
    }
}

/// What one response keeps of its compression between chunks.
pub enum Compressor {
    /// Bytes pass through.
    Identity,
    /// A zstd frame per chunk.
    Zstd {
        /// A frame was sent.
        framed: bool,
    },
    /// A gzip member spanning the response.
    Gzip(GzipMember),
}

impl Compressor {
    /// The content coding's name (`None`: not compressed).
    pub fn name(&self) -> Option<&'static str> {
        match self {
            Self::Identity => None,
            Self::Zstd { .. } => Some("zstd"),
            Self::Gzip(_) => Some("gzip"),
        }
    }

    /// Compresses `chunk` and flushes, returning the bytes to send now: everything they
    /// hold decodes once they arrive.
    pub fn chunk(&mut self, chunk: Vec<u8>) -> io::Result<Vec<u8>> {
        match self {
            Self::Identity => Ok(fitted(chunk)),
            Self::Zstd { framed } => {
                let frame = zstd_frame(&chunk)?;
                *framed = true;
                Ok(frame)
            }
            Self::Gzip(member) => member.chunk(&chunk),
        }
    }

    /// The bytes that end the response: the gzip member's last block and trailer (and its
    /// header if no chunk was sent: an empty member); nothing for zstd, whose frames are
    /// whole (an empty frame if none was sent), or without compression.
    pub fn finish(self) -> Vec<u8> {
        match self {
            Self::Identity | Self::Zstd { framed: true } => Vec::new(),
            Self::Zstd { framed: false } => ZSTD_EMPTY_FRAME.to_vec(),
            Self::Gzip(member) => member.finish(),
        }
    }
}

#[cfg(test)]
mod tests;
