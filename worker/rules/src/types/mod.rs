//! PostgreSQL text values → SQLite-style values (`docs/spec/protocol.md` §7.7), for both edition
//! families.
//!
//! Replication and snapshots deliver text; this module decides, per type OID, whether a
//! column becomes INTEGER, REAL, TEXT or BLOB and how timestamps and arrays are written, so
//! that `data` strings match the official service byte for byte.

use std::borrow::Cow;

use super::options::Compatibility;
use super::value::Value;

mod array;
pub(crate) mod datetime;
mod pg_type;
mod scalar;

use array::array_to_json;
pub use pg_type::{builtin_array_element, oid, type_from_name, PgType};
use scalar::convert_scalar;

/// Convert one column's text representation. Errors say what was wrong with the text, so
/// the replication source can stop with a precise message instead of syncing a wrong value.
pub fn convert<'a>(ty: PgType, s: &'a str, compat: &Compatibility) -> Result<Value<'a>, String> {
    if ty.oid == oid::BYTEA {
        return decode_bytea(s.as_bytes()).map(|b| Value::Blob(Cow::Owned(b)));
    }
    if let Some(elem) = ty.element {
        return array_to_json(s, elem, compat).map(|j| Value::Text(Cow::Owned(j)));
    }
    convert_scalar(ty.oid, s, compat)
}

/// The SQLite type a column of type `ty` syncs as, the choice [`convert`] makes for every
/// value of it: `integer`, `real`, `blob` or `text` (arrays, JSON, dates and every other
/// type are text).
pub fn sqlite_type(ty: PgType) -> &'static str {
    if ty.element.is_some() {
        return "text";
    }
    match ty.oid {
        oid::BOOL | oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => "integer",
        oid::FLOAT4 | oid::FLOAT8 => "real",
        oid::BYTEA => "blob",
        _ => "text",
    }
}

fn decode_bytea(text: &[u8]) -> Result<Vec<u8>, String> {
    if let Some(hex) = text.strip_prefix(b"\\x") {
        if hex.len() % 2 != 0 {
            return Err("bytea hex text has an odd number of digits".into());
        }
        hex.chunks(2)
            .map(|p| {
                let hi = (p[0] as char).to_digit(16);
                let lo = (p[1] as char).to_digit(16);
                match (hi, lo) {
                    (Some(h), Some(l)) => Ok((h * 16 + l) as u8),
                    _ => Err("bytea hex text has a non-hex digit".to_string()),
                }
            })
            .collect()
    } else {
        // Escape format: `\\` and `\ooo` octal escapes.
        let mut out = Vec::with_capacity(text.len());
        let mut i = 0;
        while i < text.len() {
            if text[i] == b'\\' {
                if text.get(i + 1) == Some(&b'\\') {
                    out.push(b'\\');
                    i += 2;
                    continue;
                }
                let oct = text
                    .get(i + 1..i + 4)
                    .and_then(|o| std::str::from_utf8(o).ok())
                    .and_then(|o| u8::from_str_radix(o, 8).ok())
                    .ok_or("bytea escape text has a bad escape")?;
                out.push(oct);
                i += 4;
            } else {
                out.push(text[i]);
                i += 1;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sqlite_type` names the variant `convert` makes of a value of each type.
    #[test]
    fn the_sqlite_type_is_what_conversion_makes() {
        let samples = [
            ("bool", "t"),
            ("int2", "7"),
            ("int4", "7"),
            ("int8", "7"),
            ("oid", "7"),
            ("float4", "1.5"),
            ("float8", "1.5"),
            ("bytea", "\\x00ff"),
            ("numeric", "1.5"),
            ("text", "x"),
            ("uuid", "6e4c7a52-6bd0-4c8a-9e3e-1c0b3b7ad0a1"),
            ("jsonb", "{}"),
            ("timestamptz", "2024-01-01 00:00:00+00"),
            ("int4[]", "{1,2}"),
            ("bool[]", "{t}"),
        ];
        for (name, text) in samples {
            let ty = PgType::from_name(name).unwrap();
            let made = match convert(ty, text, &Compatibility::default()).unwrap() {
                Value::Integer(_) => "integer",
                Value::Real(_) => "real",
                Value::Blob(_) => "blob",
                Value::Text(_) => "text",
                Value::Null => "null",
            };
            assert_eq!(sqlite_type(ty), made, "{name}");
        }
    }
}
