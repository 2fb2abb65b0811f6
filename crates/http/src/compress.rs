//! Response compression for `/sync/stream`, negotiated from `Accept-Encoding` as the
//! official service does (zstd preferred, then gzip). Each chunk is flushed through the
//! compressor (`ZSTD_e_flush` / `Z_SYNC_FLUSH`) so the client can decode every line as
//! soon as it is sent.

use std::io::Write;

use hyper::header::HeaderValue;

use super::accept::quality;

/// zstd level: fast, most of the gain on JSON lines.
const ZSTD_LEVEL: i32 = 3;

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
            Self::Zstd => Compressor::Zstd(Box::new(zstd::stream::write::Encoder::new(
                Vec::new(),
                ZSTD_LEVEL,
            )?)),
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
                Ok(std::mem::take(encoder.get_mut()))
            }
            Self::Gzip(encoder) => {
                encoder.write_all(&chunk)?;
                encoder.flush()?;
                Ok(std::mem::take(encoder.get_mut()))
            }
        }
    }
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
