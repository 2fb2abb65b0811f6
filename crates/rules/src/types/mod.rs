//! PostgreSQL text values → SQLite-style values (spec §7.7), for both edition families.
//!
//! Replication and snapshots deliver text; this module decides, per type OID, whether a
//! column becomes INTEGER, REAL, TEXT or BLOB and how timestamps and arrays are written, so
//! that `data` strings match the official service byte for byte.

use std::borrow::Cow;

use super::options::Compatibility;
use super::row::PgType;
use super::value::Value;

mod array;
mod datetime;

use array::array_to_json;
use datetime::{pad_fraction, timestamp, timestamptz};

/// Built-in type OIDs used by the conversion.
pub mod oid {
    #![allow(missing_docs)]
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const CHAR: u32 = 18;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const XML: u32 = 142;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const MONEY: u32 = 790;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const INTERVAL: u32 = 1186;
    pub const TIMETZ: u32 = 1266;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const PG_LSN: u32 = 3220;
    pub const JSONB: u32 = 3802;
}

/// (array OID, element OID, element name) for built-in types.
const ARRAYS: &[(u32, u32, &str)] = &[
    (1000, oid::BOOL, "bool"),
    (1001, oid::BYTEA, "bytea"),
    (1002, oid::CHAR, "char"),
    (1003, oid::NAME, "name"),
    (1005, oid::INT2, "int2"),
    (1007, oid::INT4, "int4"),
    (1009, oid::TEXT, "text"),
    (1014, oid::BPCHAR, "bpchar"),
    (1015, oid::VARCHAR, "varchar"),
    (1016, oid::INT8, "int8"),
    (1021, oid::FLOAT4, "float4"),
    (1022, oid::FLOAT8, "float8"),
    (1028, oid::OID, "oid"),
    (199, oid::JSON, "json"),
    (3807, oid::JSONB, "jsonb"),
    (1182, oid::DATE, "date"),
    (1183, oid::TIME, "time"),
    (1115, oid::TIMESTAMP, "timestamp"),
    (1185, oid::TIMESTAMPTZ, "timestamptz"),
    (1187, oid::INTERVAL, "interval"),
    (1231, oid::NUMERIC, "numeric"),
    (2951, oid::UUID, "uuid"),
    (1270, oid::TIMETZ, "timetz"),
    (791, oid::MONEY, "money"),
    (3221, oid::PG_LSN, "pg_lsn"),
];

const NAMES: &[(&str, u32)] = &[
    ("bool", oid::BOOL),
    ("boolean", oid::BOOL),
    ("bytea", oid::BYTEA),
    ("char", oid::CHAR),
    ("name", oid::NAME),
    ("int8", oid::INT8),
    ("bigint", oid::INT8),
    ("int2", oid::INT2),
    ("smallint", oid::INT2),
    ("int4", oid::INT4),
    ("int", oid::INT4),
    ("integer", oid::INT4),
    ("text", oid::TEXT),
    ("oid", oid::OID),
    ("json", oid::JSON),
    ("xml", oid::XML),
    ("float4", oid::FLOAT4),
    ("real", oid::FLOAT4),
    ("float8", oid::FLOAT8),
    ("double precision", oid::FLOAT8),
    ("money", oid::MONEY),
    ("bpchar", oid::BPCHAR),
    ("varchar", oid::VARCHAR),
    ("character varying", oid::VARCHAR),
    ("date", oid::DATE),
    ("time", oid::TIME),
    ("timestamp", oid::TIMESTAMP),
    ("timestamptz", oid::TIMESTAMPTZ),
    ("timestamp with time zone", oid::TIMESTAMPTZ),
    ("timestamp without time zone", oid::TIMESTAMP),
    ("time without time zone", oid::TIME),
    ("time with time zone", oid::TIMETZ),
    ("character", oid::BPCHAR),
    ("interval", oid::INTERVAL),
    ("timetz", oid::TIMETZ),
    ("numeric", oid::NUMERIC),
    ("decimal", oid::NUMERIC),
    ("uuid", oid::UUID),
    ("pg_lsn", oid::PG_LSN),
    ("jsonb", oid::JSONB),
];

/// The element type of a built-in array type.
pub fn builtin_array_element(array_oid: u32) -> Option<u32> {
    ARRAYS
        .iter()
        .find(|(a, _, _)| *a == array_oid)
        .map(|(_, e, _)| *e)
}

/// Parse a type name (`int8`, `text[]`, `_int4`); `None` when unknown.
pub fn type_from_name(name: &str) -> Option<PgType> {
    let n = name.trim().to_ascii_lowercase();
    let (base, is_array) = if let Some(b) = n.strip_suffix("[]") {
        (b.to_string(), true)
    } else if let Some(b) = n.strip_prefix('_') {
        (b.to_string(), true)
    } else {
        (n, false)
    };
    let elem = NAMES.iter().find(|(k, _)| *k == base).map(|(_, o)| *o)?;
    if !is_array {
        return Some(PgType::from_oid(elem));
    }
    let arr = ARRAYS
        .iter()
        .find(|(_, e, _)| *e == elem)
        .map(|(a, _, _)| *a)?;
    Some(PgType {
        oid: arr,
        element: Some(elem),
    })
}

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

fn convert_scalar<'a>(oid: u32, s: &'a str, compat: &Compatibility) -> Result<Value<'a>, String> {
    Ok(match oid {
        oid::BOOL => match s {
            "t" | "true" => Value::Integer(1),
            "f" | "false" => Value::Integer(0),
            _ => return Err(format!("`{s}` is not a boolean")),
        },
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => Value::Integer(
            s.parse::<i64>()
                .map_err(|_| format!("`{s}` is not a 64-bit integer"))?,
        ),
        oid::FLOAT4 | oid::FLOAT8 => Value::Real(parse_float(s)?),
        oid::DATE => match s {
            "infinity" => Value::text("9999-12-31"),
            "-infinity" => Value::text("0000-01-01"),
            _ => Value::text(s),
        },
        oid::TIME if compat.timestamps_iso8601 => Value::Text(Cow::Owned(pad_fraction(s, 6))),
        oid::TIMESTAMP => Value::Text(timestamp(s, compat)),
        oid::TIMESTAMPTZ => Value::Text(Cow::Owned(timestamptz(s, compat)?)),
        oid::PG_LSN => Value::Text(Cow::Owned(pg_lsn(s)?)),
        _ => Value::text(s),
    })
}

fn parse_float(s: &str) -> Result<f64, String> {
    match s {
        "NaN" => Ok(f64::NAN),
        "Infinity" => Ok(f64::INFINITY),
        "-Infinity" => Ok(f64::NEG_INFINITY),
        _ => s
            .parse::<f64>()
            .map_err(|_| format!("`{s}` is not a number")),
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

fn pg_lsn(s: &str) -> Result<String, String> {
    let (hi, lo) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not a pg_lsn"))?;
    let hi = u32::from_str_radix(hi, 16).map_err(|_| format!("`{s}` is not a pg_lsn"))?;
    let lo = u32::from_str_radix(lo, 16).map_err(|_| format!("`{s}` is not a pg_lsn"))?;
    Ok(format!("{hi:08X}/{lo:08X}"))
}
