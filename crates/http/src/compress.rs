//! Response compression for `/sync/stream`, negotiated from `Accept-Encoding` as the
//! official service does (zstd preferred, then gzip). Each chunk is flushed through the
//! compressor (`ZSTD_e_flush` / `Z_SYNC_FLUSH`) so the client can decode every line as
//! soon as it is sent.

use std::io::Write;

use hyper::header::HeaderValue;

use super::accept::quality;

/// zstd level: the fastest, most of the gain on JSON lines.
const ZSTD_LEVEL: i32 = 1;
/// zstd window (16 KiB) and match tables, chosen for memory: level 3's defaults hold
/// 3.5 MiB per response (a 2 MiB window, 128 KiB blocks), which 10,000 streams cannot
/// afford; with these a compressor holds about 200 KiB (measured by
/// `a_compressor_holds_a_bounded_amount_of_memory`), and JSON lines compress as well.
const ZSTD_WINDOW_LOG: u32 = 14;
const ZSTD_HASH_LOG: u32 = 13;
const ZSTD_CHAIN_LOG: u32 = 12;

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

    /// A compressor for one response.
    pub fn compressor(self) -> std::io::Result<Compressor> {
        Ok(match self {
            Self::Identity => Compressor::Identity,
            Self::Zstd => {
                use zstd::zstd_safe::CParameter;
                let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL)?;
                encoder.window_log(ZSTD_WINDOW_LOG)?;
                encoder.set_parameter(CParameter::HashLog(ZSTD_HASH_LOG))?;
                encoder.set_parameter(CParameter::ChainLog(ZSTD_CHAIN_LOG))?;
                Compressor::Zstd(Box::new(encoder))
            }
            Self::Gzip => Compressor::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::fast(),
            )),
        })
    }
}

/// The state of one response's compression stream.
pub enum Compressor {
    /// Bytes pass through.
    Identity,
    /// A zstd frame spanning the response.
    Zstd(Box<zstd::stream::write::Encoder<'static, Vec<u8>>>),
    /// A gzip member spanning the response.
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
}

impl Compressor {
    /// Compresses `chunk` and flushes, returning the bytes to send now.
    pub fn chunk(&mut self, chunk: Vec<u8>) -> std::io::Result<Vec<u8>> {
        match self {
            Self::Identity => Ok(chunk),
            Self::Zstd(encoder) => {
                encoder.write_all(&chunk)?;
                encoder.flush()?;
                Ok(fitted(std::mem::take(encoder.get_mut())))
            }
            Self::Gzip(encoder) => {
                encoder.write_all(&chunk)?;
                encoder.flush()?;
                Ok(fitted(std::mem::take(encoder.get_mut())))
            }
        }
    }
}

/// `compressed` without the spare capacity it grew: a chunk waits in the connection's
/// queue toward a client that stops reading, and a compressed chunk is often a small part
/// of the capacity its writes grew.
fn fitted(mut compressed: Vec<u8>) -> Vec<u8> {
    compressed.shrink_to_fit();
    compressed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn negotiation_prefers_zstd_and_respects_q_zero() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(Coding::negotiate(Some(&v("gzip, zstd"))), Coding::Zstd);
        assert_eq!(
            Coding::negotiate(Some(&v("gzip, deflate, br"))),
            Coding::Gzip
        );
        assert_eq!(Coding::negotiate(Some(&v("zstd;q=0, gzip"))), Coding::Gzip);
        assert_eq!(Coding::negotiate(Some(&v("identity"))), Coding::Identity);
        assert_eq!(Coding::negotiate(None), Coding::Identity);
    }

    /// Heap bytes in use (the C allocator's counters: zstd allocates there).
    fn heap_in_use() -> usize {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let info = unsafe { libc::mallinfo2() };
        info.uordblks + info.hblkhd
    }

    /// Each compressor holds a bounded amount of memory however much it compressed:
    /// 10,000 streams hold 10,000 of them (`docs/operations.md` 4.5).
    #[test]
    fn a_compressor_holds_a_bounded_amount_of_memory() {
        const COMPRESSORS: usize = 40;
        const BOUND_KIB: usize = 400;
        for coding in [Coding::Zstd, Coding::Gzip] {
            let before = heap_in_use();
            let mut held = Vec::new();
            for _ in 0..COMPRESSORS {
                let mut compressor = coding.compressor().unwrap();
                for i in 0..200 {
                    let line = format!(
                        "{{\"op_id\":\"{i}\",\"object_id\":\"{:x}\",\"data\":\"{}\"}}\n",
                        i * 7919,
                        "lorem ipsum ".repeat(i % 50)
                    );
                    compressor.chunk(line.repeat(20).into_bytes()).unwrap();
                }
                held.push(compressor);
            }
            let each = heap_in_use().saturating_sub(before) / COMPRESSORS / 1024;
            assert!(
                each <= BOUND_KIB,
                "{coding:?}: {each} KiB per compressor, over {BOUND_KIB} KiB"
            );
        }
    }

    #[test]
    fn every_flushed_chunk_decodes_on_its_own_prefix() {
        for coding in [Coding::Zstd, Coding::Gzip] {
            let mut compressor = coding.compressor().unwrap();
            let mut sent = Vec::new();
            let mut lines = String::new();
            for i in 0..50 {
                let line = format!("{{\"token_expires_in\":{i}}}\n");
                lines.push_str(&line);
                sent.extend(compressor.chunk(line.into_bytes()).unwrap());
                // What was sent so far decodes to every line so far.
                let mut decoded = Vec::new();
                match coding {
                    Coding::Zstd => {
                        let mut d = zstd::stream::read::Decoder::new(sent.as_slice()).unwrap();
                        let _ = d.read_to_end(&mut decoded);
                    }
                    _ => {
                        let mut d = flate2::read::GzDecoder::new(sent.as_slice());
                        let _ = d.read_to_end(&mut decoded);
                    }
                }
                assert_eq!(String::from_utf8(decoded).unwrap(), lines, "{coding:?}");
            }
        }
    }
}
