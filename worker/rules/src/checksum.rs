//! Per-operation checksums (`docs/spec/protocol.md` §3.1): PUTs, computed where rows are evaluated,
//! and the sums of a bucket. The store computes the REMOVEs it writes.
//!
//! The client only sums the numbers it receives, but using the official formulas makes our
//! checksums comparable with the official service's, which is how we test correctness.

use sha2::{Digest, Sha256};

/// Checksum of a PUT: `u32le(sha256("put." + object_type + "." + object_id + "." + data))`.
/// The subkey is not part of it.
pub fn put_checksum(object_type: &str, object_id: &str, data: &str) -> u32 {
    let mut h = Sha256::new();
    h.update(b"put.");
    h.update(object_type.as_bytes());
    h.update(b".");
    h.update(object_id.as_bytes());
    h.update(b".");
    h.update(data.as_bytes());
    first_u32le(&h.finalize())
}

/// Bucket checksums are wrapping u32 sums of op checksums.
pub fn add_checksums(a: u32, b: u32) -> u32 {
    a.wrapping_add(b)
}

fn first_u32le(digest: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    for (dst, src) in b.iter_mut().zip(digest.iter()) {
        *dst = *src;
    }
    u32::from_le_bytes(b)
}
