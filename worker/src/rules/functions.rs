//! Scalar SQL functions of the supported subset, with SQLite semantics.
//!
//! The list is closed on purpose: an unknown function is a compile error naming the
//! supported ones, never a silent NULL.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::expr::{bool_value, Env, Expr};
use super::json::{follow, json_to_value, parse_dollar_path};
use super::value::Value;

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
    /// `json_keys(json[, '$.path'])`: the object's keys as a JSON array text.
    JsonKeys,
}

/// Names accepted by the compiler, with their argument counts (min, max).
pub const FUNCTIONS: &[(&str, Func, usize, usize)] = &[
    ("upper", Func::Upper, 1, 1),
    ("lower", Func::Lower, 1, 1),
    ("length", Func::Length, 1, 1),
    ("substring", Func::Substring, 2, 3),
    ("substr", Func::Substring, 2, 3),
    ("hex", Func::Hex, 1, 1),
    ("base64", Func::Base64, 1, 1),
    ("ifnull", Func::IfNull, 2, 2),
    ("iif", Func::Iif, 3, 3),
    ("typeof", Func::TypeOf, 1, 1),
    ("json_extract", Func::JsonExtract, 2, 2),
    ("json_array_length", Func::JsonArrayLength, 1, 2),
    ("json_valid", Func::JsonValid, 1, 1),
    ("instr", Func::Instr, 2, 2),
    ("json_keys", Func::JsonKeys, 1, 2),
];

/// Look up a function by its lower-case name.
pub fn lookup(name: &str) -> Option<(Func, usize, usize)> {
    FUNCTIONS
        .iter()
        .find(|(n, ..)| *n == name)
        .map(|(_, f, lo, hi)| (*f, *lo, *hi))
}

/// The comma-separated list of supported function names, for error hints.
pub fn supported_list() -> String {
    let mut names: Vec<&str> = FUNCTIONS.iter().map(|(n, ..)| *n).collect();
    names.dedup();
    names.join(", ")
}

fn arg<'e>(args: &'e [Expr], i: usize, env: Env<'e>) -> Value<'e> {
    args.get(i).map(|a| a.eval(env)).unwrap_or(Value::Null)
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

/// Call `f` with already-checked argument count.
pub fn call<'e>(f: Func, args: &'e [Expr], env: Env<'e>) -> Value<'e> {
    match f {
        Func::Upper | Func::Lower => {
            let v = arg(args, 0, env);
            match v.to_text() {
                None => Value::Null,
                Some(t) => Value::Text(Cow::Owned(if f == Func::Upper {
                    t.to_uppercase()
                } else {
                    t.to_lowercase()
                })),
            }
        }
        Func::Length => match arg(args, 0, env) {
            Value::Null => Value::Null,
            Value::Blob(b) => Value::Integer(b.len() as i64),
            other => Value::Integer(other.to_text().unwrap_or_default().chars().count() as i64),
        },
        Func::Substring => {
            let v = arg(args, 0, env);
            let start = arg(args, 1, env);
            let len = if args.len() > 2 {
                Some(arg(args, 2, env))
            } else {
                None
            };
            substring(&v, &start, len.as_ref())
        }
        Func::Hex => {
            let v = arg(args, 0, env);
            let mut out = String::new();
            if let Some(b) = bytes_of(&v) {
                for byte in b.iter() {
                    let _ = write!(out, "{byte:02X}");
                }
            }
            Value::Text(Cow::Owned(out))
        }
        Func::Base64 => {
            let v = arg(args, 0, env);
            Value::Text(Cow::Owned(
                bytes_of(&v).map(|b| base64(&b)).unwrap_or_default(),
            ))
        }
        Func::IfNull => {
            let a = arg(args, 0, env);
            if a.is_null() {
                arg(args, 1, env)
            } else {
                a
            }
        }
        Func::Iif => {
            if arg(args, 0, env).is_truthy() {
                arg(args, 1, env)
            } else {
                arg(args, 2, env)
            }
        }
        Func::TypeOf => Value::text(arg(args, 0, env).type_name()),
        Func::Instr => {
            let (hay, needle) = (arg(args, 0, env), arg(args, 1, env));
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
            let doc = arg(args, 0, env);
            let path = if args.len() > 1 {
                arg(args, 1, env)
            } else {
                Value::text("$")
            };
            let (Value::Text(doc), Value::Text(path)) = (doc, path) else {
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
        Func::JsonValid => match arg(args, 0, env) {
            Value::Text(t) => bool_value(serde_json::from_str::<serde_json::Value>(&t).is_ok()),
            Value::Null => Value::Null,
            _ => bool_value(false),
        },
    }
}

fn as_int(v: &Value<'_>) -> Option<i64> {
    match super::expr::to_number(v) {
        Value::Integer(i) => Some(i),
        Value::Real(f) => Some(f as i64),
        _ => None,
    }
}

/// SQLite `substr`: 1-based; a negative start counts from the end; a negative length takes
/// characters before the start.
fn substring<'e>(v: &Value<'e>, start: &Value<'_>, len: Option<&Value<'_>>) -> Value<'e> {
    if v.is_null() || start.is_null() || len.is_some_and(|l| l.is_null()) {
        return Value::Null;
    }
    let (Some(mut p1), mut p2) = (as_int(start), len.map(as_int)) else {
        return Value::Null;
    };
    let chars: Vec<char>;
    let bytes: &[u8];
    let is_blob = matches!(v, Value::Blob(_));
    let text = v.to_text().unwrap_or_default();
    if let Value::Blob(b) = v {
        bytes = b.as_ref();
        chars = Vec::new();
    } else {
        bytes = &[];
        chars = text.chars().collect();
    }
    let total = if is_blob { bytes.len() } else { chars.len() } as i64;
    let mut neg = false;
    let mut n = match p2.take() {
        Some(Some(l)) => {
            if l < 0 {
                neg = true;
                l.saturating_neg()
            } else {
                l
            }
        }
        Some(None) => return Value::Null,
        None => i64::MAX / 2,
    };
    if p1 < 0 {
        p1 += total;
        if p1 < 0 {
            n += p1;
            if n < 0 {
                n = 0;
            }
            p1 = 0;
        }
    } else if p1 > 0 {
        p1 -= 1;
    } else if n > 0 {
        n -= 1;
    }
    if neg {
        p1 -= n;
        if p1 < 0 {
            n += p1;
            p1 = 0;
        }
    }
    if p1.saturating_add(n) > total {
        n = (total - p1).max(0);
    }
    let (a, b) = (
        p1.clamp(0, total) as usize,
        (p1 + n).clamp(0, total) as usize,
    );
    if is_blob {
        Value::Blob(Cow::Owned(bytes.get(a..b).unwrap_or_default().to_vec()))
    } else {
        Value::Text(Cow::Owned(
            chars.get(a..b).unwrap_or_default().iter().collect(),
        ))
    }
}

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
