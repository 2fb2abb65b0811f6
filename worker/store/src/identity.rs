//! Row identities as store keys.

use super::codec::Writer;

/// Identity keys longer than this are stored as a hash (MDBX keys are limited to about
/// half a page; a REPLICA IDENTITY FULL row can be far larger).
const MAX_PLAIN_IDENTITY: usize = 480;

/// The replica identity of a row as a key: each identity column's text, length-prefixed
/// (NULL distinct from empty). Longer than `MAX_PLAIN_IDENTITY`, it becomes `0xFF` +
/// SHA-256 of that encoding (33 bytes; a plain key starting with `0xFF` is longer than 128).
pub fn identity_key<'a>(values: impl IntoIterator<Item = Option<&'a [u8]>>) -> Vec<u8> {
    let mut w = Writer::with_capacity(32);
    for value in values {
        match value {
            None => w.varint(0),
            Some(bytes) => w.varint(bytes.len() as u64 + 1).raw(bytes),
        };
    }
    let plain = w.finish();
    if plain.len() <= MAX_PLAIN_IDENTITY {
        return plain;
    }
    use sha2::Digest;
    let mut hashed = Vec::with_capacity(33);
    hashed.push(0xFF);
    hashed.extend_from_slice(&sha2::Sha256::digest(&plain));
    hashed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_unambiguous() {
        assert_ne!(identity_key([None]), identity_key([Some(&b""[..])]));
        assert_ne!(
            identity_key([Some(&b"a"[..]), Some(&b"bc"[..])]),
            identity_key([Some(&b"ab"[..]), Some(&b"c"[..])])
        );
    }
}
