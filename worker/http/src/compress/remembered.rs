//! The compressed chunks handed out: a thread's last small chunk remembered with its
//! compressed form (see the parent module's documentation), and each fitted to its size.

use std::cell::RefCell;
use std::io;

/// Chunks up to this size are remembered (see the module's documentation).
const REMEMBERED_CHUNK_BYTES: usize = 4 << 10;

/// A thread's last small chunk of one coding and its compressed form.
#[derive(Default)]
pub(super) struct Remembered {
    input: Vec<u8>,
    output: Vec<u8>,
}

/// `input` compressed by `compress`, or the compressed form this thread remembers for it
/// (`last`): a chunk compressed afresh compresses the same every time.
pub(super) fn remembered(
    last: &'static std::thread::LocalKey<RefCell<Remembered>>,
    input: &[u8],
    compress: impl FnOnce(&[u8]) -> io::Result<Vec<u8>>,
) -> io::Result<Vec<u8>> {
    if input.is_empty() || input.len() > REMEMBERED_CHUNK_BYTES {
        return compress(input);
    }
    last.with(|last| {
        let mut last = last.borrow_mut();
        if last.input == input {
            return Ok(last.output.clone());
        }
        let output = compress(input)?;
        last.input.clear();
        last.input.extend_from_slice(input);
        last.output.clear();
        last.output.extend_from_slice(&output);
        Ok(output)
    })
}

/// `compressed` without the spare capacity it was given: a chunk waits in the
/// connection's queue toward a client that stops reading, and a compressed chunk is often
/// a small part of the capacity made for it.
pub(super) fn fitted(mut compressed: Vec<u8>) -> Vec<u8> {
    compressed.shrink_to_fit();
    compressed
}
