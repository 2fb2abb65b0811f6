//! The checksum of the REMOVE ops the store writes when a row leaves a bucket
//! (`docs/spec/protocol.md` §3.1). PUT checksums come with the row's memberships
//! ([`crate::RowPut::checksum`]): the rules compute them where they evaluate the row.

use sha2::{Digest, Sha256};

/// Checksum of a REMOVE: `u32le(sha256("delete." + subkey))`; the subkey is the same one the
/// PUT it removes was sent with.
pub fn remove_checksum(subkey: &str) -> u32 {
    let digest = Sha256::new()
        .chain_update(b"delete.")
        .chain_update(subkey.as_bytes())
        .finalize();
    let mut first = [0u8; 4];
    first.copy_from_slice(digest.get(..4).unwrap_or(&[0; 4]));
    u32::from_le_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of `docs/spec/protocol.md` §3.5.
    #[test]
    fn spec_remove_checksum() {
        assert_eq!(
            remove_checksum("todos/0a6b5a3e-6a43-4f3c-9f0e-3a5b0c1d2e3f"),
            123688221
        );
    }
}
