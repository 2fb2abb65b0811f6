//! Encodings of row identities and lookup outputs (rules values) as store bytes.

use std::borrow::Cow;

use super::codec::{Corrupt, Reader, Writer};
use crate::rules::{OwnedValue, Value};

/// Identity keys longer than this are stored as a hash (MDBX keys are limited to about
/// half a page; a REPLICA IDENTITY FULL row can be far larger).
const MAX_PLAIN_IDENTITY: usize = 480;

/// The replica identity of a row as a key: each identity column's text, length-prefixed
/// (NULL distinct from empty). Longer than [`MAX_PLAIN_IDENTITY`], it becomes `0xFF` +
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

/// Encodes lookup outputs.
pub fn encode_values(values: &[OwnedValue]) -> Vec<u8> {
    let mut w = Writer::with_capacity(16 * values.len());
    w.varint(values.len() as u64);
    for value in values {
        match value {
            Value::Null => w.varint(0),
            Value::Integer(i) => w.varint(1).raw(&i.to_le_bytes()),
            Value::Real(f) => w.varint(2).raw(&f.to_le_bytes()),
            Value::Text(t) => w.varint(3).str(t),
            Value::Blob(b) => w.varint(4).bytes(b),
        };
    }
    w.finish()
}

/// Decodes what [`encode_values`] wrote.
pub fn decode_values(bytes: &[u8]) -> Result<Vec<OwnedValue>, Corrupt> {
    let what = "lookup values";
    let mut r = Reader::new(bytes, what);
    let n = r.varint()?;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(match r.varint()? {
            0 => Value::Null,
            1 => Value::Integer(i64::from_le_bytes(r.array()?)),
            2 => Value::Real(f64::from_le_bytes(r.array()?)),
            3 => Value::Text(Cow::Owned(r.str()?.to_owned())),
            4 => Value::Blob(Cow::Owned(r.bytes()?.to_vec())),
            _ => return Err(Corrupt { what }),
        });
    }
    if !r.is_empty() {
        return Err(Corrupt { what });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let values = vec![
            Value::Null,
            Value::Integer(-5),
            Value::Real(1.5),
            Value::text("x"),
            Value::Blob(Cow::Owned(vec![0, 1])),
        ];
        assert_eq!(decode_values(&encode_values(&values)).unwrap(), values);
        assert!(decode_values(&[1, 9]).is_err());
        assert_ne!(identity_key([None]), identity_key([Some(&b""[..])]));
        assert_ne!(
            identity_key([Some(&b"a"[..]), Some(&b"bc"[..])]),
            identity_key([Some(&b"ab"[..]), Some(&b"c"[..])])
        );
    }
}
