//! Row records compressed with a zstd dictionary trained on the store's own first
//! records. Fixture rows shrink from ~340 to ~50–90 bytes of data for under a microsecond
//! each; records written before the dictionary exists stay raw (a one-byte header says
//! which).

use std::borrow::Cow;

use zstd::dict::{DecoderDictionary, EncoderDictionary};

use super::codec::{Corrupt, Reader, Writer};

/// Records collected before a dictionary is trained.
pub(super) const TRAINING_SAMPLES: usize = 2048;
/// Dictionary size.
const DICTIONARY_BYTES: usize = 16 * 1024;
/// zstd level: 1 compresses nearly as well as 3 on these records, faster.
const LEVEL: i32 = 1;

thread_local! {
    /// One decompression context per thread: creating one per record cost more than
    /// decompressing the record.
    static DECOMPRESSOR: std::cell::RefCell<zstd::zstd_safe::DCtx<'static>> =
        std::cell::RefCell::new(zstd::zstd_safe::DCtx::create());
}

const RAW: u8 = 0;
const ZSTD_DICT: u8 = 1;
const WHAT: &str = "compressed row record";

/// Packs encoded records into their stored form: compressed with the codec's
/// dictionary when that is smaller, raw otherwise (and always while there is none).
pub(super) struct Packer<'c> {
    compressor: Option<zstd::bulk::Compressor<'c>>,
    /// The compressed frame before its header is put in front (reused).
    scratch: Vec<u8>,
}

impl Packer<'_> {
    /// A packer that stores records raw.
    #[cfg(test)]
    pub fn raw() -> Packer<'static> {
        Packer {
            compressor: None,
            scratch: Vec::new(),
        }
    }

    /// True when it compresses.
    pub fn compresses(&self) -> bool {
        self.compressor.is_some()
    }

    /// The stored form of an encoded record.
    pub fn pack(&mut self, raw: &[u8]) -> Vec<u8> {
        if let Some(compressor) = self.compressor.as_mut() {
            self.scratch.clear();
            self.scratch
                .reserve(zstd::zstd_safe::compress_bound(raw.len()));
            let compressed = compressor.compress_to_buffer(raw, &mut self.scratch);
            if compressed.is_ok() && self.scratch.len() + 4 < raw.len() {
                let mut w = Writer::with_capacity(self.scratch.len() + 6);
                w.raw(&[ZSTD_DICT])
                    .varint(raw.len() as u64)
                    .raw(&self.scratch);
                return w.finish();
            }
        }
        let mut out = Vec::with_capacity(raw.len() + 1);
        out.push(RAW);
        out.extend_from_slice(raw);
        out
    }
}

/// How records are written and read.
pub(super) struct RecordCodec {
    dictionary: Option<(EncoderDictionary<'static>, DecoderDictionary<'static>)>,
}

impl RecordCodec {
    /// A codec that stores records raw (no dictionary yet).
    pub fn raw() -> Self {
        Self { dictionary: None }
    }

    /// A codec that compresses with `dictionary`.
    pub fn with_dictionary(dictionary: &[u8]) -> Self {
        Self {
            dictionary: Some((
                EncoderDictionary::copy(dictionary, LEVEL),
                DecoderDictionary::copy(dictionary),
            )),
        }
    }

    /// True when records are compressed.
    pub fn has_dictionary(&self) -> bool {
        self.dictionary.is_some()
    }

    /// A packer for one write transaction or one evaluator thread.
    pub fn packer(&self) -> Packer<'_> {
        let compressor = self.dictionary.as_ref().and_then(|(encoder, _)| {
            let mut c = zstd::bulk::Compressor::with_prepared_dictionary(encoder).ok()?;
            // The header carries the length; the frame needs neither checksum nor ids.
            c.include_checksum(false).ok()?;
            c.include_contentsize(false).ok()?;
            c.include_dictid(false).ok()?;
            Some(c)
        });
        Packer {
            compressor,
            scratch: Vec::new(),
        }
    }

    /// The raw bytes of a stored form that is not compressed, `None` when it is.
    pub fn raw_part(stored: &[u8]) -> Option<&[u8]> {
        match stored.split_first() {
            Some((&RAW, raw)) => Some(raw),
            _ => None,
        }
    }

    /// The encoded record from its stored form.
    pub fn unpack<'a>(&self, stored: &'a [u8]) -> Result<Cow<'a, [u8]>, Corrupt> {
        let corrupt = Corrupt { what: WHAT };
        match stored.split_first() {
            Some((&RAW, raw)) => Ok(Cow::Borrowed(raw)),
            Some((&ZSTD_DICT, rest)) => {
                let (_, decoder) = self.dictionary.as_ref().ok_or(corrupt.clone())?;
                let mut r = Reader::new(rest, WHAT);
                let len = usize::try_from(r.varint()?).map_err(|_| corrupt.clone())?;
                let frame = &rest[rest.len() - r.remaining()..];
                let mut raw = Vec::with_capacity(len);
                let written = DECOMPRESSOR.with(|d| {
                    d.borrow_mut()
                        .decompress_using_ddict(&mut raw, frame, decoder.as_ddict())
                });
                if written != Ok(len) {
                    return Err(corrupt);
                }
                Ok(Cow::Owned(raw))
            }
            _ => Err(corrupt),
        }
    }

    /// Trains a dictionary from encoded records.
    pub fn train(samples: &[Vec<u8>]) -> Option<Vec<u8>> {
        zstd::dict::from_samples(samples, DICTIONARY_BYTES).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_and_unpacks_with_and_without_a_dictionary() {
        let samples: Vec<Vec<u8>> = (0..3000)
            .map(|i| format!("{{\"id\":\"task-{i:06}\",\"title\":\"Task {i}\",\"status\":\"todo\",\"n\":{}}}", i * 31).into_bytes())
            .collect();
        let raw = RecordCodec::raw();
        assert_eq!(
            raw.unpack(&Packer::raw().pack(&samples[0]))
                .unwrap()
                .as_ref(),
            samples[0].as_slice()
        );
        let dict = RecordCodec::train(&samples).unwrap();
        let codec = RecordCodec::with_dictionary(&dict);
        let packed = codec.packer().pack(&samples[7]);
        assert!(
            packed.len() < samples[7].len() / 2,
            "{} vs {}",
            packed.len(),
            samples[7].len()
        );
        assert_eq!(
            codec.unpack(&packed).unwrap().as_ref(),
            samples[7].as_slice()
        );
        // Raw records stay readable after the dictionary arrives; damage is an error.
        assert_eq!(
            codec.unpack(&Packer::raw().pack(b"x")).unwrap().as_ref(),
            b"x"
        );
        assert!(raw.unpack(&packed).is_err());
        assert!(codec.unpack(&packed[..packed.len() - 3]).is_err());
        assert!(codec.unpack(&[9, 1, 2]).is_err());
    }
}
