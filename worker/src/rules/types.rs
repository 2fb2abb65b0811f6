//! PostgreSQL text values → SQLite-style values (spec §7.7), for both edition families.
//!
//! Replication and snapshots deliver text; this module decides, per type OID, whether a
//! column becomes INTEGER, REAL, TEXT or BLOB and how timestamps and arrays are written, so
//! that `data` strings match the official service byte for byte.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::json::{write_data_value, write_json_string};
use super::options::Compatibility;
use super::row::PgType;
use super::value::Value;

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
pub fn convert<'a>(
    ty: PgType,
    text: &'a [u8],
    compat: &Compatibility,
) -> Result<Value<'a>, String> {
    if ty.oid == oid::BYTEA {
        return decode_bytea(text).map(|b| Value::Blob(Cow::Owned(b)));
    }
    let s = std::str::from_utf8(text).map_err(|_| "value is not valid UTF-8".to_string())?;
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

/// `fraction` padded or cut to `digits` (e.g. `10:00:00.5` → `10:00:00.500000`).
fn pad_fraction(s: &str, digits: usize) -> String {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let mut out = String::with_capacity(whole.len() + 1 + digits);
    out.push_str(whole);
    out.push('.');
    let f: String = frac.chars().take(digits).collect();
    out.push_str(&f);
    for _ in f.len()..digits {
        out.push('0');
    }
    out
}

fn timestamp<'a>(s: &'a str, compat: &Compatibility) -> Cow<'a, str> {
    match (s, compat.timestamps_iso8601) {
        ("infinity", false) => Cow::Borrowed("9999-12-31 23:59:59"),
        ("-infinity", false) => Cow::Borrowed("0000-01-01 00:00:00"),
        ("infinity", true) => Cow::Borrowed("9999-12-31T23:59:59.000000"),
        ("-infinity", true) => Cow::Borrowed("0000-01-01T00:00:00.000000"),
        (_, false) => Cow::Borrowed(s),
        (_, true) => Cow::Owned(pad_fraction(&s.replacen(' ', "T", 1), 6)),
    }
}

/// `YYYY-MM-DD HH:MM:SS[.f]±HH[:MM[:SS]]` → UTC with `Z`, in the edition's format.
fn timestamptz(s: &str, compat: &Compatibility) -> Result<String, String> {
    let iso = compat.timestamps_iso8601;
    match s {
        "infinity" if iso => return Ok("9999-12-31T23:59:59.000000Z".into()),
        "infinity" => return Ok("9999-12-31 23:59:59Z".into()),
        "-infinity" if iso => return Ok("0000-01-01T00:00:00.000000Z".into()),
        "-infinity" => return Ok("0000-01-01 00:00:00Z".into()),
        _ => {}
    }
    let bad = || format!("`{s}` is not a timestamptz in ISO DateStyle");
    let b = s.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        s.get(r).and_then(|t| t.parse::<i64>().ok()).ok_or_else(bad)
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let rest = &s[19..];
    let (frac, tz) = match rest.strip_prefix('.') {
        Some(r) => {
            let end = r.find(['+', '-']).unwrap_or(r.len());
            (&r[..end], &r[end..])
        }
        None => ("", rest),
    };
    let sign = match tz.as_bytes().first() {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return Err(bad()),
    };
    let mut parts = tz[1..].split(':');
    let mut offset = 0i64;
    for mult in [3600, 60, 1] {
        if let Some(p) = parts.next() {
            offset += p.parse::<i64>().map_err(|_| bad())? * mult;
        }
    }
    let days = days_from_civil(y, mo, d);
    let secs = days * 86400 + h * 3600 + mi * 60 + sec - sign * offset;
    let (days, tod) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, mo, d) = civil_from_days(days);
    let mut out = String::with_capacity(32);
    let sep = if iso { 'T' } else { ' ' };
    let _ = write!(
        out,
        "{y:04}-{mo:02}-{d:02}{sep}{:02}:{:02}:{:02}",
        tod / 3600,
        (tod / 60) % 60,
        tod % 60
    );
    if iso {
        out.push('.');
        let f: String = frac.chars().take(6).collect();
        out.push_str(&f);
        for _ in f.len()..6 {
            out.push('0');
        }
    } else if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out.push('Z');
    Ok(out)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn pg_lsn(s: &str) -> Result<String, String> {
    let (hi, lo) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not a pg_lsn"))?;
    let hi = u32::from_str_radix(hi, 16).map_err(|_| format!("`{s}` is not a pg_lsn"))?;
    let lo = u32::from_str_radix(lo, 16).map_err(|_| format!("`{s}` is not a pg_lsn"))?;
    Ok(format!("{hi:08X}/{lo:08X}"))
}

/// PostgreSQL array text (`{1,2,"a b",NULL,{3}}`) → JSON array text with elements converted
/// by their type (bool → 1/0, numeric → string, json embedded raw, NULL → null).
fn array_to_json(s: &str, elem: u32, compat: &Compatibility) -> Result<String, String> {
    // Skip an explicit dimension decoration such as `[1:2]=`.
    let body = match s.find('=') {
        Some(i) if s.starts_with('[') => &s[i + 1..],
        _ => s,
    };
    let mut out = String::with_capacity(body.len() + 8);
    let mut p = ArrayParser {
        s: body.as_bytes(),
        src: body,
        i: 0,
    };
    p.parse_level(&mut out, elem, compat, 1)?;
    if p.i != p.s.len() {
        return Err(format!("`{s}` has text after the array"));
    }
    Ok(out)
}

/// PostgreSQL's MAXDIM.
const MAX_ARRAY_DEPTH: usize = 6;

struct ArrayParser<'s> {
    s: &'s [u8],
    src: &'s str,
    i: usize,
}

impl ArrayParser<'_> {
    fn parse_level(
        &mut self,
        out: &mut String,
        elem: u32,
        compat: &Compatibility,
        depth: usize,
    ) -> Result<(), String> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(format!(
                "`{}` nests arrays deeper than PostgreSQL allows",
                self.src
            ));
        }
        if self.s.get(self.i) != Some(&b'{') {
            return Err(format!("`{}` is not an array literal", self.src));
        }
        self.i += 1;
        out.push('[');
        if self.s.get(self.i) == Some(&b'}') {
            self.i += 1;
            out.push(']');
            return Ok(());
        }
        loop {
            match self.s.get(self.i) {
                Some(b'{') => self.parse_level(out, elem, compat, depth + 1)?,
                Some(b'"') => {
                    self.i += 1;
                    let mut v = String::new();
                    loop {
                        match self.s.get(self.i) {
                            None => return Err(format!("`{}` has an open quote", self.src)),
                            Some(b'"') => {
                                self.i += 1;
                                break;
                            }
                            Some(b'\\') => {
                                let start = self.i + 1;
                                let ch = self
                                    .src
                                    .get(start..)
                                    .and_then(|r| r.chars().next())
                                    .ok_or_else(|| format!("`{}` ends in an escape", self.src))?;
                                v.push(ch);
                                self.i = start + ch.len_utf8();
                            }
                            Some(_) => {
                                let ch = self
                                    .src
                                    .get(self.i..)
                                    .and_then(|r| r.chars().next())
                                    .ok_or_else(|| format!("`{}` is not UTF-8", self.src))?;
                                v.push(ch);
                                self.i += ch.len_utf8();
                            }
                        }
                    }
                    write_element(out, &v, elem, compat)?;
                }
                Some(_) => {
                    let start = self.i;
                    while let Some(c) = self.s.get(self.i) {
                        if *c == b',' || *c == b'}' {
                            break;
                        }
                        self.i += 1;
                    }
                    let raw = self.src.get(start..self.i).unwrap_or("").trim();
                    if raw.eq_ignore_ascii_case("NULL") {
                        out.push_str("null");
                    } else {
                        write_element(out, raw, elem, compat)?;
                    }
                }
                None => return Err(format!("`{}` ends inside the array", self.src)),
            }
            match self.s.get(self.i) {
                Some(b',') => {
                    self.i += 1;
                    out.push(',');
                }
                Some(b'}') => {
                    self.i += 1;
                    out.push(']');
                    return Ok(());
                }
                _ => return Err(format!("`{}` is not a valid array literal", self.src)),
            }
        }
    }
}

fn write_element(
    out: &mut String,
    raw: &str,
    elem: u32,
    compat: &Compatibility,
) -> Result<(), String> {
    if elem == oid::JSON || elem == oid::JSONB {
        // Embedded raw, as the official service does; validate so the result stays JSON.
        serde_json::from_str::<serde_json::Value>(raw)
            .map_err(|_| format!("array element `{raw}` is not JSON"))?;
        out.push_str(raw);
        return Ok(());
    }
    if elem == oid::BYTEA {
        out.push_str("null");
        return Ok(());
    }
    let v = convert_scalar(elem, raw, compat)?;
    if !write_data_value(out, &v) {
        write_json_string(out, raw);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_roundtrip() {
        for d in [-800000, -1, 0, 1, 19000, 2932896] {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
    }
}
