//! Row records compressed with LZ4 against a dictionary made of the store's own first
//! records. Fixture rows shrink from ~375 to ~95 bytes in about 0.2 µs each (zstd with a
//! trained dictionary made ~70 bytes but spent ~0.7 µs, most of it setting up each frame);
//! records written before the dictionary exists stay raw (a one-byte header says which).

use std::borrow::Cow;
use std::ffi::{c_char, c_int};
use std::ptr::NonNull;
use std::sync::Arc;

use lz4_sys::LZ4StreamEncode;

use super::codec::{Corrupt, Reader, Writer};

/// Records collected before the dictionary is made.
pub(super) const TRAINING_SAMPLES: usize = 2048;
/// Dictionary size: LZ4 reaches back at most 64 KiB.
const DICTIONARY_BYTES: usize = 64 * 1024;
/// LZ4 acceleration: on fixture rows 4 is about a third faster than 1 for 1 % more bytes.
const ACCELERATION: c_int = 4;

const RAW: u8 = 0;
/// LZ4 block against the dictionary (format 3 used 1 for zstd frames).
const LZ4_DICT: u8 = 2;
const WHAT: &str = "compressed row record";

// The stable streaming API of LZ4 1.10 (`lz4.h`), compiled and linked by `lz4-sys`, which
// binds only part of it.
extern "C" {
    fn LZ4_loadDict(stream: *mut LZ4StreamEncode, dictionary: *const c_char, size: c_int) -> c_int;
    fn LZ4_resetStream_fast(stream: *mut LZ4StreamEncode);
    fn LZ4_attach_dictionary(working: *mut LZ4StreamEncode, dictionary: *const LZ4StreamEncode);
    fn LZ4_compress_fast_continue(
        stream: *mut LZ4StreamEncode,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
    fn LZ4_decompress_safe_usingDict(
        src: *const c_char,
        dst: *mut c_char,
        compressed_size: c_int,
        dst_capacity: c_int,
        dictionary: *const c_char,
        dictionary_size: c_int,
    ) -> c_int;
}

/// An LZ4 compression state, owned.
struct Lz4Stream(NonNull<LZ4StreamEncode>);

impl Lz4Stream {
    fn new() -> Self {
        // SAFETY: allocates and initialises a state; null only when out of memory.
        let state = unsafe { lz4_sys::LZ4_createStream() };
        Self(NonNull::new(state).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; 16 * 1024]>())
        }))
    }
}

// SAFETY: an LZ4 state is plain memory that only its owner touches; it has no tie to the
// thread that made it.
unsafe impl Send for Lz4Stream {}

impl Drop for Lz4Stream {
    fn drop(&mut self) {
        // SAFETY: the state was made by LZ4_createStream and is freed once.
        unsafe { lz4_sys::LZ4_freeStream(self.0.as_ptr()) };
    }
}

/// The dictionary's bytes and the LZ4 state that indexes them.
struct Dictionary {
    /// Points into `bytes` (declared first, so it is dropped first).
    indexed: Lz4Stream,
    /// Boxed and never changed: the indexed state's pointers stay valid.
    bytes: Box<[u8]>,
}

// SAFETY: once loaded, the indexed state is only read: packers attach it to their own
// states (LZ4_attach_dictionary takes it as const), and nothing frees it while a packer
// borrows the codec.
unsafe impl Send for Dictionary {}
// SAFETY: as for Send: shared references only read the indexed state.
unsafe impl Sync for Dictionary {}

impl Dictionary {
    fn new(bytes: &[u8]) -> Self {
        let bytes: Box<[u8]> = bytes[bytes.len().saturating_sub(DICTIONARY_BYTES)..].into();
        let indexed = Lz4Stream::new();
        // SAFETY: `bytes` (at most 64 KiB) outlives `indexed` and does not move (boxed).
        unsafe {
            LZ4_loadDict(
                indexed.0.as_ptr(),
                bytes.as_ptr().cast(),
                bytes.len() as c_int,
            )
        };
        Self { indexed, bytes }
    }
}

/// Packs encoded records into their stored form: compressed against the codec's
/// dictionary when that is smaller, raw otherwise (and always while there is none).
pub(super) struct Packer<'c> {
    compressor: Option<(&'c Dictionary, Lz4Stream)>,
}

impl Packer<'_> {
    /// A packer that stores records raw.
    #[cfg(test)]
    pub fn raw() -> Packer<'static> {
        Packer { compressor: None }
    }

    /// True when it compresses.
    pub fn compresses(&self) -> bool {
        self.compressor.is_some()
    }

    /// The stored form of an encoded record.
    pub fn pack(&mut self, raw: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.pack_into(raw, &mut out);
        out
    }

    /// Appends the stored form of an encoded record to `out`.
    pub fn pack_into(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        match &mut self.compressor {
            Some((dictionary, working)) => compress_into(dictionary, working, raw, out),
            None => stored_raw(out, raw),
        }
    }
}

/// A packer that holds its codec: one a task keeps across waits, whatever the store's
/// codec becomes meanwhile.
pub(super) struct SharedPacker {
    codec: Arc<RecordCodec>,
    working: Lz4Stream,
}

impl SharedPacker {
    pub fn new(codec: Arc<RecordCodec>) -> Self {
        Self {
            codec,
            working: Lz4Stream::new(),
        }
    }

    /// The codec it packs with.
    pub fn codec(&self) -> &Arc<RecordCodec> {
        &self.codec
    }

    /// Appends the stored form of an encoded record to `out`.
    pub fn pack_into(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        match &self.codec.dictionary {
            Some(dictionary) => compress_into(dictionary, &mut self.working, raw, out),
            None => stored_raw(out, raw),
        }
    }
}

/// Appends `raw` compressed against `dictionary` with the state `working`, or raw when
/// that is not smaller.
fn compress_into(dictionary: &Dictionary, working: &mut Lz4Stream, raw: &[u8], out: &mut Vec<u8>) {
    let Ok(len) = c_int::try_from(raw.len()) else {
        return stored_raw(out, raw);
    };
    let base = out.len();
    // Header, raw length (at most 5 bytes), then the block: room for the raw form too.
    let bound = len.saturating_add(len / 255 + 16);
    out.reserve(6 + bound as usize);
    let mut head = Writer::over(std::mem::take(out));
    head.raw(&[LZ4_DICT]).varint(raw.len() as u64);
    *out = head.finish();
    let start = out.len();
    // SAFETY: `working` is the caller's own state, reset and attached to the dictionary's
    // read-only state before each block; the block is written into the spare capacity
    // reserved above (at most `bound` bytes, LZ4's bound).
    let written = unsafe {
        LZ4_resetStream_fast(working.0.as_ptr());
        LZ4_attach_dictionary(working.0.as_ptr(), dictionary.indexed.0.as_ptr());
        LZ4_compress_fast_continue(
            working.0.as_ptr(),
            raw.as_ptr().cast(),
            out.as_mut_ptr().add(start).cast(),
            len,
            bound,
            ACCELERATION,
        )
    };
    let packed_len = start - base + usize::try_from(written).unwrap_or(usize::MAX);
    if written > 0 && packed_len + 4 < raw.len() {
        // SAFETY: LZ4 initialised `written` bytes after `start`.
        unsafe { out.set_len(base + packed_len) };
        return;
    }
    // Not worth it: the raw form, in the same allocation.
    out.truncate(base);
    stored_raw(out, raw);
}

/// Appends the raw stored form of `raw` to `out`.
fn stored_raw(out: &mut Vec<u8>, raw: &[u8]) {
    out.reserve(raw.len() + 1);
    out.push(RAW);
    out.extend_from_slice(raw);
}

/// How records are written and read.
pub(super) struct RecordCodec {
    dictionary: Option<Dictionary>,
}

impl RecordCodec {
    /// A codec that stores records raw (no dictionary yet).
    pub fn raw() -> Self {
        Self { dictionary: None }
    }

    /// A codec that compresses against `dictionary` (its last 64 KiB).
    pub fn with_dictionary(dictionary: &[u8]) -> Self {
        Self {
            dictionary: Some(Dictionary::new(dictionary)),
        }
    }

    /// True when records are compressed.
    pub fn has_dictionary(&self) -> bool {
        self.dictionary.is_some()
    }

    /// A packer for one write transaction or one evaluator thread.
    pub fn packer(&self) -> Packer<'_> {
        Packer {
            compressor: self.dictionary.as_ref().map(|d| (d, Lz4Stream::new())),
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
            Some((&LZ4_DICT, rest)) => {
                let dictionary = self.dictionary.as_ref().ok_or(corrupt.clone())?;
                let mut r = Reader::new(rest, WHAT);
                let len = c_int::try_from(r.varint()?).map_err(|_| corrupt.clone())?;
                let block = &rest[rest.len() - r.remaining()..];
                let block_len = c_int::try_from(block.len()).map_err(|_| corrupt.clone())?;
                // LZ4 expands at most 255 to 1: a larger length is damage, not a reason to
                // allocate it.
                if len < 0 || len as usize > block.len().saturating_mul(255) + 16 {
                    return Err(corrupt);
                }
                let mut raw = Vec::<u8>::with_capacity(len as usize);
                // SAFETY: LZ4's safe decoder never reads past `block` nor writes past
                // `len` bytes of `raw`'s capacity; it returns the bytes it wrote.
                let written = unsafe {
                    LZ4_decompress_safe_usingDict(
                        block.as_ptr().cast(),
                        raw.as_mut_ptr().cast(),
                        block_len,
                        len,
                        dictionary.bytes.as_ptr().cast(),
                        dictionary.bytes.len() as c_int,
                    )
                };
                if written != len {
                    return Err(corrupt);
                }
                // SAFETY: all `len` bytes were written.
                unsafe { raw.set_len(len as usize) };
                Ok(Cow::Owned(raw))
            }
            _ => Err(corrupt),
        }
    }

    /// The dictionary made from encoded records: the last 64 KiB of them, most recent
    /// last (LZ4 finds matches anywhere in it). `None` when there are no samples.
    pub fn train(samples: &[Vec<u8>]) -> Option<Vec<u8>> {
        let mut dictionary = Vec::with_capacity(DICTIONARY_BYTES);
        for sample in samples.iter().rev() {
            if dictionary.len() >= DICTIONARY_BYTES {
                break;
            }
            let take = sample.len().min(DICTIONARY_BYTES - dictionary.len());
            // Collected back to front, reversed below.
            dictionary.extend(sample[sample.len() - take..].iter().rev());
        }
        dictionary.reverse();
        (!dictionary.is_empty()).then_some(dictionary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Vec<u8>> {
        (0..3000)
            .map(|i| format!("{{\"id\":\"task-{i:06}\",\"title\":\"Task {i}\",\"status\":\"todo\",\"n\":{}}}", i * 31).into_bytes())
            .collect()
    }

    #[test]
    fn packs_and_unpacks_with_and_without_a_dictionary() {
        let samples = samples();
        let raw = RecordCodec::raw();
        assert_eq!(
            raw.unpack(&Packer::raw().pack(&samples[0]))
                .unwrap()
                .as_ref(),
            samples[0].as_slice()
        );
        let dict = RecordCodec::train(&samples[..2048]).unwrap();
        let codec = RecordCodec::with_dictionary(&dict);
        let mut packer = codec.packer();
        let (mut packed_bytes, mut raw_bytes) = (0, 0);
        for sample in &samples {
            let packed = packer.pack(sample);
            assert_eq!(packed[0], LZ4_DICT);
            assert_eq!(codec.unpack(&packed).unwrap().as_ref(), sample.as_slice());
            (packed_bytes, raw_bytes) = (packed_bytes + packed.len(), raw_bytes + sample.len());
        }
        assert!(
            packed_bytes * 3 < raw_bytes * 2,
            "{packed_bytes} of {raw_bytes}"
        );
        // Too short to gain anything: stored raw, and readable.
        let packed = packer.pack(b"xy");
        assert_eq!(packed, b"\0xy");
        assert_eq!(codec.unpack(&packed).unwrap().as_ref(), b"xy");
        // Raw records stay readable after the dictionary arrives; damage is an error.
        let packed = packer.pack(&samples[7]);
        assert!(raw.unpack(&packed).is_err());
        for cut in 0..packed.len() {
            assert!(codec.unpack(&packed[..cut]).is_err(), "cut {cut}");
        }
        let mut wrong_length = packed.clone();
        wrong_length[1] ^= 1;
        assert!(codec.unpack(&wrong_length).is_err());
        assert!(codec
            .unpack(&[LZ4_DICT, 0xff, 0xff, 0xff, 0xff, 0x07, 0])
            .is_err());
        assert!(codec.unpack(&[9, 1, 2]).is_err());
    }

    #[test]
    fn the_dictionary_is_the_last_64_kib_of_the_samples_in_order() {
        let samples = samples();
        let dict = RecordCodec::train(&samples).unwrap();
        let all = samples.concat();
        assert_eq!(dict.len(), DICTIONARY_BYTES);
        assert_eq!(dict.as_slice(), &all[all.len() - DICTIONARY_BYTES..]);
        let few = RecordCodec::train(&samples[..3]).unwrap();
        assert_eq!(few, samples[..3].concat());
        assert!(RecordCodec::train(&[]).is_none());
    }

    #[test]
    fn packers_on_several_threads_share_one_dictionary() {
        let samples = samples();
        let codec = RecordCodec::with_dictionary(&RecordCodec::train(&samples).unwrap());
        std::thread::scope(|scope| {
            for part in samples.chunks(1000) {
                let codec = &codec;
                scope.spawn(move || {
                    let mut packer = codec.packer();
                    for sample in part {
                        let packed = packer.pack(sample);
                        assert_eq!(codec.unpack(&packed).unwrap().as_ref(), sample.as_slice());
                    }
                });
            }
        });
    }
}
