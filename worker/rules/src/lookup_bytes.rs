//! The byte form of a lookup entry's outputs. The store keeps them as opaque bytes beside
//! the entry's key ([`crate::LookupKey::encode`]); only the rules read them back.
//!
//! Layout: a LEB128 count, then each value as a LEB128 tag (0 NULL, 1 integer, 2 real,
//! 3 text, 4 blob) and its payload: 8 little-endian bytes for numbers, a LEB128 length and
//! the bytes for text and blobs.

use std::borrow::Cow;

use crate::value::{OwnedValue, Value};

/// Encodes a lookup entry's output values.
pub fn encode_lookup_outputs(values: &[OwnedValue]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 * values.len());
    leb128(&mut out, values.len() as u64);
    for value in values {
        match value {
            Value::Null => leb128(&mut out, 0),
            Value::Integer(i) => {
                leb128(&mut out, 1);
                out.extend_from_slice(&i.to_le_bytes());
            }
            Value::Real(f) => {
                leb128(&mut out, 2);
                out.extend_from_slice(&f.to_le_bytes());
            }
            Value::Text(t) => prefixed(&mut out, 3, t.as_bytes()),
            Value::Blob(b) => prefixed(&mut out, 4, b),
        }
    }
    out
}

/// Decodes what [`encode_lookup_outputs`] wrote; `None` for bytes it did not write.
pub fn decode_lookup_outputs(bytes: &[u8]) -> Option<Vec<OwnedValue>> {
    let mut rest = bytes;
    let n = read_leb128(&mut rest)?;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(match read_leb128(&mut rest)? {
            0 => Value::Null,
            1 => Value::Integer(i64::from_le_bytes(take_array(&mut rest)?)),
            2 => Value::Real(f64::from_le_bytes(take_array(&mut rest)?)),
            3 => {
                let text = std::str::from_utf8(take_prefixed(&mut rest)?).ok()?;
                Value::Text(Cow::Owned(text.to_owned()))
            }
            4 => Value::Blob(Cow::Owned(take_prefixed(&mut rest)?.to_vec())),
            _ => return None,
        });
    }
    rest.is_empty().then_some(out)
}

fn leb128(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn prefixed(out: &mut Vec<u8>, tag: u64, bytes: &[u8]) {
    leb128(out, tag);
    leb128(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn read_leb128(rest: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, tail) = rest.split_first()?;
        *rest = tail;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn take_array<const N: usize>(rest: &mut &[u8]) -> Option<[u8; N]> {
    let (head, tail) = rest.split_at_checked(N)?;
    *rest = tail;
    head.try_into().ok()
}

fn take_prefixed<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = usize::try_from(read_leb128(rest)?).ok()?;
    let (head, tail) = rest.split_at_checked(len)?;
    *rest = tail;
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_round_trip() {
        let values = vec![
            Value::Null,
            Value::Integer(-5),
            Value::Real(1.5),
            Value::text("x"),
            Value::Blob(Cow::Owned(vec![0, 1])),
            Value::text("long ".repeat(100)),
        ];
        let bytes = encode_lookup_outputs(&values);
        assert_eq!(decode_lookup_outputs(&bytes).unwrap(), values);
        assert!(decode_lookup_outputs(&[1, 9]).is_none());
        assert!(decode_lookup_outputs(&[bytes.as_slice(), &[0]].concat()).is_none());
    }

    /// The layout the stores written before this module existed hold: it must not change.
    #[test]
    fn layout_is_stable() {
        let values = vec![Value::Integer(1), Value::text("ab"), Value::Null];
        let mut want = vec![3u8, 1];
        want.extend_from_slice(&1i64.to_le_bytes());
        want.extend_from_slice(&[3, 2, b'a', b'b', 0]);
        assert_eq!(encode_lookup_outputs(&values), want);
    }
}
