//! Scalar SQL functions of the supported subset, with SQLite semantics.
//!
//! The list is closed on purpose: an unknown function is a compile error naming the
//! supported ones, never a silent NULL.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::Write as _;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::cast::{bool_value, cast, CastType};
use super::json::{follow, json_to_value, parse_dollar_path};
use super::value::{compare, Value};
use super::{dates, geometry};

/// A supported scalar function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    /// `upper(x)`
    Upper,
    /// `lower(x)`
    Lower,
    /// `length(x)`: characters of text, bytes of a blob.
    Length,
    /// `substring(x, start[, len])` / `substr`: 1-based, SQLite rules for negatives.
    Substring,
    /// `hex(x)`: upper-case hex of the bytes (`''` for NULL).
    Hex,
    /// `base64(x)`: standard base64 of the bytes (`''` for NULL).
    Base64,
    /// `ifnull(a, b)`
    IfNull,
    /// `iif(cond, a, b)`
    Iif,
    /// `uuid_blob(text)`: the 16 bytes of an RFC 4122 UUID (versions 1–8, nil, max).
    UuidBlob,
    /// `st_asgeojson(geometry)`: see `geometry`.
    StAsGeoJson,
    /// `st_astext(geometry)`: see `geometry`.
    StAsText,
    /// `st_x(point)`: see `geometry`.
    StX,
    /// `st_y(point)`: see `geometry`.
    StY,
    /// `unixepoch(value[, modifier[, modifier]])`: see `dates`.
    UnixEpoch,
    /// `datetime(value[, modifier[, modifier]])`: see `dates`.
    Datetime,
    /// `x BETWEEN low AND high` at edition 3 (no name: the compiler makes it), arguments
    /// `[x, low, high]`: NULL when either comparison is, else whether both hold.
    Between,
    /// `CASE operand WHEN … THEN … [ELSE …] END` at edition 3 (no name: the compiler makes
    /// it), arguments `[operand, else, when₁, then₁, when₂, then₂, …]`: the operand is
    /// evaluated once.
    CaseOf,
    /// `typeof(x)`
    TypeOf,
    /// `json_extract(json, '$.path')`
    JsonExtract,
    /// `json_array_length(json[, '$.path'])`
    JsonArrayLength,
    /// `json_valid(x)`
    JsonValid,
    /// `instr(x, y)`: 1-based character position of `y` in `x`, 0 when absent.
    Instr,
    /// `json_keys(json)`: the object's keys as a JSON array text.
    JsonKeys,
}

/// Names accepted by the compiler: argument counts (min, max) and the last edition that
/// knows the name (the edition-3 compiler lacks `json_valid` and the `substr` spelling).
pub const FUNCTIONS: &[(&str, Func, usize, usize, u8)] = &[
    ("upper", Func::Upper, 1, 1, 3),
    ("lower", Func::Lower, 1, 1, 3),
    ("length", Func::Length, 1, 1, 3),
    ("substring", Func::Substring, 2, 3, 3),
    ("substr", Func::Substring, 2, 3, 2),
    ("hex", Func::Hex, 1, 1, 3),
    ("base64", Func::Base64, 1, 1, 3),
    ("ifnull", Func::IfNull, 2, 2, 3),
    ("iif", Func::Iif, 3, 3, 3),
    ("typeof", Func::TypeOf, 1, 1, 3),
    ("json_extract", Func::JsonExtract, 2, 2, 3),
    ("json_array_length", Func::JsonArrayLength, 1, 2, 3),
    ("json_valid", Func::JsonValid, 1, 1, 2),
    ("instr", Func::Instr, 2, 2, 3),
    ("json_keys", Func::JsonKeys, 1, 1, 3),
    ("uuid_blob", Func::UuidBlob, 1, 1, 3),
    ("st_asgeojson", Func::StAsGeoJson, 1, 1, 3),
    ("st_astext", Func::StAsText, 1, 1, 3),
    ("st_x", Func::StX, 1, 1, 3),
    ("st_y", Func::StY, 1, 1, 3),
    ("unixepoch", Func::UnixEpoch, 1, 3, 3),
    ("datetime", Func::Datetime, 1, 3, 3),
];

/// What the compiler makes of a function name at an edition.
pub enum Lookup {
    /// Known: the function and its argument counts (min, max).
    Known(Func, usize, usize),
    /// Known only up to this edition.
    UntilEdition(u8),
    /// Not a function of the subset.
    Unknown,
}

/// Look up a lower-case function name for a config of `edition`.
pub fn lookup(name: &str, edition: u8) -> Lookup {
    match FUNCTIONS.iter().find(|(n, ..)| *n == name) {
        Some((_, f, lo, hi, last)) if edition <= *last => Lookup::Known(*f, *lo, *hi),
        Some((.., last)) => Lookup::UntilEdition(*last),
        None => Lookup::Unknown,
    }
}

/// The comma-separated list of supported function names, for error hints.
pub fn supported_list() -> String {
    let mut names: Vec<&str> = FUNCTIONS.iter().map(|(n, ..)| *n).collect();
    names.dedup();
    names.join(", ")
}

/// The arguments of one call, as [`call`] reads them: each is evaluated when read, so
/// `iif` and `ifnull` evaluate only the branch they return.
pub trait FunctionArgs<'e> {
    /// How many arguments the call has.
    fn count(&self) -> usize;
    /// Argument `i` (0-based); NULL past the last.
    fn value(&self, i: usize) -> Value<'e>;
}

fn bytes_of<'v>(v: &'v Value<'_>) -> Option<Cow<'v, [u8]>> {
    match v {
        Value::Null => None,
        Value::Blob(b) => Some(Cow::Borrowed(b.as_ref())),
        Value::Text(t) => Some(Cow::Borrowed(t.as_bytes())),
        other => Some(Cow::Owned(
            other.to_text().unwrap_or_default().as_bytes().to_vec(),
        )),
    }
}

/// [`Func::UuidBlob`]: the official evaluator validates like the `uuid` package (an RFC
/// 4122 variant and a version 1–8, or the nil or max UUID) and fails the row otherwise;
/// here such text gives NULL (`docs/sync-rules.md`, known differences).
fn uuid_blob(v: &Value<'_>) -> Value<'static> {
    let Some(text) = v.to_text() else {
        return Value::Null;
    };
    let t = text.to_ascii_lowercase();
    let b = t.as_bytes();
    let shaped = b.len() == 36
        && [8, 13, 18, 23].iter().all(|&i| b[i] == b'-')
        && b.iter()
            .enumerate()
            .all(|(i, c)| [8, 13, 18, 23].contains(&i) || c.is_ascii_hexdigit());
    let special =
        t == "00000000-0000-0000-0000-000000000000" || t == "ffffffff-ffff-ffff-ffff-ffffffffffff";
    let versioned = shaped && (b'1'..=b'8').contains(&b[14]) && b"89ab".contains(&b[19]);
    if !(special || versioned) {
        return Value::Null;
    }
    let hex: String = t.chars().filter(|c| *c != '-').collect();
    let bytes = (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect::<Vec<u8>>();
    Value::Blob(Cow::Owned(bytes))
}

/// [`Func::Between`].
fn between<'e>(args: &impl FunctionArgs<'e>) -> Value<'e> {
    let x = args.value(0);
    let above = compare(&x, &args.value(1)).map(|o| o != Ordering::Less);
    let below = compare(&x, &args.value(2)).map(|o| o != Ordering::Greater);
    match (above, below) {
        (Some(a), Some(b)) => Value::Integer(i64::from(a && b)),
        _ => Value::Null,
    }
}

/// [`Func::CaseOf`].
fn case_of<'e>(args: &impl FunctionArgs<'e>) -> Value<'e> {
    let operand = args.value(0);
    let mut arm = 2;
    while arm + 1 < args.count() {
        if compare(&operand, &args.value(arm)) == Some(Ordering::Equal) {
            return args.value(arm + 1);
        }
        arm += 2;
    }
    args.value(1)
}

/// Call `f` with already-checked argument count.
pub fn call<'e>(f: Func, args: &impl FunctionArgs<'e>) -> Value<'e> {
    match f {
        Func::Upper | Func::Lower => {
            let v = args.value(0);
            match v.to_text() {
                None => Value::Null,
                Some(t) => Value::Text(Cow::Owned(if f == Func::Upper {
                    t.to_uppercase()
                } else {
                    t.to_lowercase()
                })),
            }
        }
        // JavaScript string length (UTF-16 units), as the official evaluator counts.
        Func::Length => match args.value(0) {
            Value::Null => Value::Null,
            Value::Blob(b) => Value::Integer(b.len() as i64),
            other => {
                Value::Integer(other.to_text().unwrap_or_default().encode_utf16().count() as i64)
            }
        },
        Func::Substring => {
            let v = args.value(0);
            let start = args.value(1);
            let len = if args.count() > 2 {
                Some(args.value(2))
            } else {
                None
            };
            substring(&v, &start, len.as_ref())
        }
        Func::Hex => {
            let v = args.value(0);
            let mut out = String::new();
            if let Some(b) = bytes_of(&v) {
                for byte in b.iter() {
                    let _ = write!(out, "{byte:02X}");
                }
            }
            Value::Text(Cow::Owned(out))
        }
        Func::Base64 => {
            let v = args.value(0);
            Value::Text(Cow::Owned(
                bytes_of(&v).map(|b| STANDARD.encode(b)).unwrap_or_default(),
            ))
        }
        Func::IfNull => {
            let a = args.value(0);
            if a.is_null() {
                args.value(1)
            } else {
                a
            }
        }
        Func::Iif => {
            if args.value(0).is_truthy() {
                args.value(1)
            } else {
                args.value(2)
            }
        }
        Func::UuidBlob => uuid_blob(&args.value(0)),
        Func::StAsGeoJson => geometry::as_geojson(&args.value(0)),
        Func::StAsText => geometry::as_text(&args.value(0)),
        Func::StX => geometry::point_coordinate(&args.value(0), false),
        Func::StY => geometry::point_coordinate(&args.value(0), true),
        Func::UnixEpoch => dates::unixepoch(&args.value(0), &args.value(1), &args.value(2)),
        Func::Datetime => dates::datetime(&args.value(0), &args.value(1), &args.value(2)),
        Func::Between => between(args),
        Func::CaseOf => case_of(args),
        Func::TypeOf => Value::text(args.value(0).type_name()),
        Func::Instr => {
            let (hay, needle) = (args.value(0), args.value(1));
            match (hay.to_text(), needle.to_text()) {
                (Some(h), Some(n)) => Value::Integer(
                    h.find(n.as_ref())
                        .map(|i| h[..i].chars().count() as i64 + 1)
                        .unwrap_or(0),
                ),
                _ => Value::Null,
            }
        }
        Func::JsonExtract | Func::JsonArrayLength | Func::JsonKeys => {
            let doc = args.value(0);
            let path = if args.count() > 1 {
                args.value(1)
            } else {
                Value::text("$")
            };
            let (Some(doc), Some(path)) = (doc.to_text(), path.to_text()) else {
                return Value::Null;
            };
            let (Some(steps), Ok(parsed)) = (
                parse_dollar_path(&path),
                serde_json::from_str::<serde_json::Value>(&doc),
            ) else {
                return Value::Null;
            };
            match (f, follow(&parsed, &steps)) {
                (_, None) => Value::Null,
                (Func::JsonExtract, Some(found)) => json_to_value(found),
                (Func::JsonKeys, Some(serde_json::Value::Object(m))) => {
                    let keys: Vec<&String> = m.keys().collect();
                    Value::Text(Cow::Owned(serde_json::to_string(&keys).unwrap_or_default()))
                }
                (Func::JsonKeys, Some(_)) => Value::Null,
                (_, Some(serde_json::Value::Array(a))) => Value::Integer(a.len() as i64),
                (_, Some(_)) => Value::Integer(0),
            }
        }
        Func::JsonValid => {
            let v = args.value(0);
            let text = v.to_text();
            bool_value(text.is_some_and(|t| serde_json::from_str::<serde_json::Value>(&t).is_ok()))
        }
    }
}

/// `substring(x, start[, len])` exactly as the official evaluator computes it: text (blobs
/// are decoded), 1-based `start`, a negative start counts from the end, start 0 shortens the
/// length by one, a negative length takes characters before the start; positions are
/// JavaScript UTF-16 units.
fn substring<'e>(v: &Value<'e>, start: &Value<'_>, len: Option<&Value<'_>>) -> Value<'e> {
    let Some(text) = v.to_text() else {
        return Value::Null;
    };
    let Value::Integer(start) = cast(start.borrowed(), CastType::Integer) else {
        return Value::Null;
    };
    let units: Vec<u16> = text.encode_utf16().collect();
    let n = units.len() as i64;
    let mut length = match len {
        None => n + 1,
        Some(Value::Null) => return Value::Null,
        Some(l) => match cast(l.borrowed(), CastType::Integer) {
            Value::Integer(i) => i,
            _ => return Value::Null,
        },
    };
    let begin = if start < 0 {
        (n + start).max(0)
    } else if start == 0 {
        length -= 1;
        0
    } else {
        start - 1
    };
    let (a, b) = if length < 0 {
        (begin.saturating_add(length), begin)
    } else {
        (begin, begin.saturating_add(length))
    };
    // JavaScript `String.prototype.substring`: clamp to [0, n], swap when reversed.
    let (a, b) = (a.clamp(0, n) as usize, b.clamp(0, n) as usize);
    let (a, b) = if a > b { (b, a) } else { (a, b) };
    Value::Text(Cow::Owned(String::from_utf16_lossy(
        units.get(a..b).unwrap_or_default(),
    )))
}
