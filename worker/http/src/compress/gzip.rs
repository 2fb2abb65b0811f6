//! The gzip member a response sends: its header with the first chunk, each chunk raw
//! deflate from this thread's reset compressor ended by a sync flush, and the last block
//! and trailer at the end.

use std::cell::RefCell;
use std::io;

use super::remembered::{fitted, remembered, Remembered};

/// The gzip member's header (RFC 1952 2.3): deflate, no flags, no time, `XFL` 4 (the
/// fastest level), OS unknown.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255];
/// An empty last deflate block (fixed Huffman codes: `BFINAL`, `BTYPE` 01, end of block),
/// from the byte boundary the sync flush left.
const DEFLATE_END: [u8; 2] = [0x03, 0x00];

thread_local! {
    /// This thread's last small chunk of raw deflate.
    static LAST_DEFLATE: RefCell<Remembered> = RefCell::default();
    /// This thread's raw deflate compressor, made at its first chunk.
    static DEFLATE: RefCell<Option<flate2::Compress>> = const { RefCell::new(None) };
}

/// The gzip member a response sends: its trailer's CRC-32 and length so far.
pub struct GzipMember {
    /// CRC-32 and length (mod 2^32) of the bytes compressed so far.
    pub(super) crc: flate2::Crc,
    /// The header was sent.
    pub(super) started: bool,
}

impl GzipMember {
    pub(super) fn chunk(&mut self, chunk: &[u8]) -> io::Result<Vec<u8>> {
        let deflated = remembered(&LAST_DEFLATE, chunk, |chunk| {
            // Room for incompressible data: stored blocks add 5 bytes per 64 KiB.
            let mut out = Vec::with_capacity(chunk.len() + chunk.len() / 1024 + 64);
            DEFLATE.with(|deflate| {
                let mut deflate = deflate.borrow_mut();
                let deflate = deflate.get_or_insert_with(|| {
                    flate2::Compress::new(flate2::Compression::fast(), false)
                });
                // Afresh: the chunk refers to nothing before it.
                deflate.reset();
                deflate_flushed(deflate, chunk, &mut out)
            })?;
            Ok(fitted(out))
        })?;
        self.crc.update(chunk);
        if self.started {
            return Ok(deflated);
        }
        self.started = true;
        Ok([&GZIP_HEADER[..], &deflated].concat())
    }

    pub(super) fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(GZIP_HEADER.len() + DEFLATE_END.len() + 8);
        if !self.started {
            out.extend_from_slice(&GZIP_HEADER);
        }
        out.extend_from_slice(&DEFLATE_END);
        out.extend_from_slice(&self.crc.sum().to_le_bytes());
        out.extend_from_slice(&self.crc.amount().to_le_bytes());
        out
    }
}

/// `input` as raw deflate appended to `out`, ended by a sync flush.
fn deflate_flushed(
    deflate: &mut flate2::Compress,
    mut input: &[u8],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    loop {
        if out.len() == out.capacity() {
            out.reserve(out.capacity() / 2 + 64);
        }
        let (read, written) = (deflate.total_in(), out.len());
        deflate
            .compress_vec(input, out, flate2::FlushCompress::Sync)
            .map_err(io::Error::other)?;
        input = &input[(deflate.total_in() - read) as usize..];
        // Done once the input is in and the flush left room: it wrote all it had.
        if input.is_empty() && out.len() < out.capacity() {
            return Ok(());
        }
        if deflate.total_in() == read && out.len() == written && out.len() < out.capacity() {
            return Err(io::Error::other("deflate made no progress"));
        }
    }
}
