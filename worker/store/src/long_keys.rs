//! Keys and lookup values of any length.
//!
//! libmdbx limits a key, and each value of a DUPSORT table, to about half a page (with the
//! store's 4 KiB pages: [`max_key`], [`max_dup_value`]). Bucket names and lookup keys come
//! from user data and can be longer. Such a key is stored as `0xFF` followed by its
//! SHA-256 (plain keys are UTF-8 text, which never holds the byte `0xFF`), and the full
//! key is kept where the reader checks it:
//!
//! - `buckets`: the name is in `bucket_names` under the bucket's id; a read compares it,
//!   so two names with one hash can never share accumulators (`PSM_S1008`).
//! - `lookups`: an entry with a hashed key, or with outputs too long for a DUPSORT value,
//!   stores only the row id; the full key and outputs are in the row's record, which the
//!   reader loads and compares, so an entry of another key with the same hash is skipped.
//!
//! Keys and values within the limits are stored exactly as before this module existed, so
//! stores written earlier read unchanged.

use std::borrow::Cow;
use std::sync::LazyLock;

use sha2::{Digest, Sha256};

use crate::op_blocks::PAGE_BYTES;

/// The first byte of a hashed key.
const HASHED: u8 = 0xFF;

/// The size limits of the store's pages, as libmdbx computes them.
struct Limits {
    key: usize,
    dup_key: usize,
    dup_value: usize,
}

static LIMITS: LazyLock<Limits> = LazyLock::new(|| {
    let page = PAGE_BYTES as isize;
    let limit = |value: isize| usize::try_from(value).unwrap_or(0);
    // SAFETY: pure functions of their arguments (libmdbx's `MDBX_NOTHROW_CONST_FUNCTION`).
    unsafe {
        Limits {
            key: limit(mdbx_sys::mdbx_limits_keysize_max(
                page,
                mdbx_sys::MDBX_DB_DEFAULTS,
            )),
            dup_key: limit(mdbx_sys::mdbx_limits_keysize_max(
                page,
                mdbx_sys::MDBX_DUPSORT,
            )),
            dup_value: limit(mdbx_sys::mdbx_limits_valsize_max(
                page,
                mdbx_sys::MDBX_DUPSORT,
            )),
        }
    }
});

/// The longest key a plain table takes (bucket names up to it are stored as they are).
pub fn max_key() -> usize {
    LIMITS.key
}

/// The longest value a DUPSORT table takes (lookup values up to it are stored whole).
pub fn max_dup_value() -> usize {
    LIMITS.dup_value
}

/// `key` as a plain table stores it: itself, or hashed when longer than [`max_key`].
pub(crate) fn stored_key(key: &[u8]) -> Cow<'_, [u8]> {
    stored(key, LIMITS.key)
}

/// `key` as the DUPSORT `lookups` table stores it.
pub(crate) fn stored_dup_key(key: &[u8]) -> Cow<'_, [u8]> {
    stored(key, LIMITS.dup_key)
}

fn stored(key: &[u8], limit: usize) -> Cow<'_, [u8]> {
    if key.len() <= limit {
        return Cow::Borrowed(key);
    }
    let mut hashed = Vec::with_capacity(33);
    hashed.push(HASHED);
    hashed.extend_from_slice(&Sha256::digest(key));
    Cow::Owned(hashed)
}

/// Bytes of the row id at the front of every lookup value.
pub(crate) const ROW_ID_BYTES: usize = 8;

/// A lookup entry `(key, value)` (value: row id, then outputs) as the `lookups` table
/// stores it: the key hashed when too long; the value cut to its row id when the key is
/// hashed or the value too long (the row's record keeps both whole).
pub(crate) fn stored_lookup<'a>(key: &'a [u8], value: &'a [u8]) -> (Cow<'a, [u8]>, &'a [u8]) {
    let stored_key = stored_dup_key(key);
    let whole = !is_hashed(&stored_key) && value.len() <= LIMITS.dup_value;
    let value = if whole {
        value
    } else {
        value.get(..ROW_ID_BYTES).unwrap_or(value)
    };
    (stored_key, value)
}

/// True for a stored key that is a hash (its full key lives elsewhere).
pub(crate) fn is_hashed(stored: &[u8]) -> bool {
    stored.first() == Some(&HASHED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_stay_plain_and_long_ones_are_hashed_apart() {
        assert!(max_key() > 1000 && max_key() < PAGE_BYTES);
        assert!(max_dup_value() > 1000 && max_dup_value() < PAGE_BYTES);
        let short = "1#by_list[\"l1\"]".as_bytes();
        assert_eq!(stored_key(short), short);
        assert!(!is_hashed(&stored_key(short)));
        let at_limit = vec![b'a'; max_key()];
        assert_eq!(stored_key(&at_limit), at_limit.as_slice());
        let long_a = vec![b'a'; max_key() + 1];
        let long_b = vec![b'b'; max_key() + 1];
        let (a, b) = (stored_key(&long_a), stored_key(&long_b));
        assert!(is_hashed(&a) && is_hashed(&b));
        assert_eq!(a.len(), 33);
        assert_ne!(a, b);
        assert_eq!(stored_key(&long_a), a, "the same key hashes the same");
    }

    #[test]
    fn lookup_values_are_cut_to_the_row_id_when_they_cannot_be_stored_whole() {
        let value = [7u8; 8]
            .iter()
            .chain(b"outputs")
            .copied()
            .collect::<Vec<u8>>();
        let (key, stored) = stored_lookup(b"[\"k\"]", &value);
        assert_eq!((&*key, stored), (&b"[\"k\"]"[..], value.as_slice()));
        let long_key = vec![b'k'; max_key() + 1];
        let (key, stored) = stored_lookup(&long_key, &value);
        assert!(is_hashed(&key));
        assert_eq!(stored, &[7u8; 8]);
        let long_value = [7u8; 8]
            .iter()
            .chain(&vec![b'o'; max_dup_value()])
            .copied()
            .collect::<Vec<u8>>();
        let (key, stored) = stored_lookup(b"k", &long_value);
        assert_eq!((&*key, stored), (&b"k"[..], &[7u8; 8][..]));
    }
}
