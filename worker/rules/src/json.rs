//! JSON text helpers: writing row `data` strings and bucket names without building a JSON
//! tree, and reading JSON text for `->`, `->>` and `json_extract`.
//!
//! Numbers are written by [`js_number`], as JavaScript writes them, because the official
//! service (and therefore every existing client and checksum) does.

use std::borrow::Cow;
use std::fmt::Write as _;

pub use super::js_number::js_number;
use super::js_number::push_js_number;
use super::value::Value;

/// Append `s` as a JSON string literal: `"`, `\` and control characters escaped, non-ASCII
/// and `/` left as they are (what `JSON.stringify` does).
pub fn write_json_string(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    if any_needs_escape(s.as_bytes()) {
        write_escaped(out, s);
    } else {
        out.push_str(s);
    }
    out.push('"');
}

/// Bytes checked at once: a fixed-size check compiles to a few vector instructions.
const CHUNK: usize = 16;

/// Whether any byte of `bytes` must be escaped; checked in whole chunks (the tail padded
/// with a byte that needs none), since almost no string has one.
fn any_needs_escape(bytes: &[u8]) -> bool {
    let chunk_needs =
        |chunk: &[u8; CHUNK]| chunk.iter().fold(false, |any, &b| any | needs_escape(b));
    let (chunks, rest) = bytes.as_chunks::<CHUNK>();
    if chunks.iter().any(chunk_needs) {
        return true;
    }
    let mut tail = [b' '; CHUNK];
    if let Some(prefix) = tail.get_mut(..rest.len()) {
        prefix.copy_from_slice(rest);
    }
    chunk_needs(&tail)
}

/// `s` with its escapes, unquoted. Only ASCII needs escaping, so every cut is at a
/// character boundary.
fn write_escaped(out: &mut String, s: &str) {
    let mut start = 0;
    for (j, &b) in s.as_bytes().iter().enumerate() {
        if needs_escape(b) {
            out.push_str(s.get(start..j).unwrap_or_default());
            push_escaped(out, b);
            start = j + 1;
        }
    }
    out.push_str(s.get(start..).unwrap_or_default());
}

fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

fn push_escaped(out: &mut String, b: u8) {
    match b {
        b'"' => out.push_str("\\\""),
        b'\\' => out.push_str("\\\\"),
        b'\n' => out.push_str("\\n"),
        b'\r' => out.push_str("\\r"),
        b'\t' => out.push_str("\\t"),
        0x08 => out.push_str("\\b"),
        0x0c => out.push_str("\\f"),
        _ => {
            let _ = write!(out, "\\u{:04x}", b);
        }
    }
}

/// Append a value as it appears in a row's `data` JSON. Returns `false` for blobs, which the
/// caller omits from the row (the key is dropped, as in the official service).
pub fn write_data_value(out: &mut String, v: &Value<'_>) -> bool {
    match v {
        Value::Null => out.push_str("null"),
        Value::Integer(i) => out.push_str(itoa::Buffer::new().format(*i)),
        Value::Real(f) => write_real(out, *f),
        Value::Text(t) => write_json_string(out, t),
        Value::Blob(_) => return false,
    }
    true
}

/// REAL in row data: integral values keep a `.0` so clients still see a REAL; NaN and
/// infinities (invalid JSON) become `null`.
fn write_real(out: &mut String, f: f64) {
    if f.is_finite() {
        push_jsonbig_number(out, f);
    } else {
        out.push_str("null");
    }
}

/// A number as the official service's JSON writer (`JSONBig`) writes it: an integral one
/// below 1e21 with `.0`; NaN and infinities as JavaScript prints them.
pub(crate) fn push_jsonbig_number(out: &mut String, f: f64) {
    push_js_number(out, f);
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e21 {
        out.push_str(".0");
    }
}

/// Append a value the way bucket names and lookup keys serialize it
/// ("JSONBucketNameSerialize"): REAL `3.0` and INTEGER `3` give the same text so a data
/// row and a parameter row always agree. Returns `false` for blobs, which never match.
pub fn write_key_value(out: &mut String, v: &Value<'_>) -> bool {
    match v {
        Value::Null => out.push_str("null"),
        Value::Integer(i) => out.push_str(itoa::Buffer::new().format(*i)),
        Value::Real(f) if f.is_finite() => push_js_number(out, *f),
        Value::Real(_) => out.push_str("null"),
        Value::Text(t) => write_json_string(out, t),
        Value::Blob(_) => return false,
    }
    true
}

/// Convert a parsed JSON value to a SQLite value the way `->>`/`json_extract` do:
/// strings → TEXT, integers → INTEGER, other numbers → REAL, booleans → 1/0, objects and
/// arrays → their JSON text.
pub fn json_to_value(v: &serde_json::Value) -> Value<'static> {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Integer(i64::from(*b)),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Integer(i)
            } else {
                Value::Real(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::Text(Cow::Owned(s.clone())),
        other => Value::Text(Cow::Owned(other.to_string())),
    }
}

/// Convert a SQLite value to JSON text, as `->` returns it and as `request.jwt()` renders.
pub fn value_to_json_text(v: &Value<'_>) -> Option<String> {
    let mut out = String::new();
    match v {
        Value::Text(t) => write_json_string(&mut out, t),
        other => {
            if !write_key_value(&mut out, other) {
                return None;
            }
        }
    }
    Some(out)
}

/// One step of a JSON path.
#[derive(Debug, Clone, PartialEq)]
pub enum PathStep {
    /// An object member.
    Key(String),
    /// An array element.
    Index(usize),
}

/// Parse a `json_extract` style path (`$`, `$.a.b`, `$.a[0]`, `$."a b"`).
/// `None` for malformed paths (which yield NULL, as in SQLite).
pub fn parse_dollar_path(path: &str) -> Option<Vec<PathStep>> {
    let rest = path.strip_prefix('$')?;
    let mut steps = Vec::new();
    let mut chars = rest.char_indices().peekable();
    let b = rest;
    while let Some((i, c)) = chars.next() {
        match c {
            '.' => {
                if b[i + 1..].starts_with('"') {
                    let start = i + 2;
                    let end = b[start..].find('"')? + start;
                    steps.push(PathStep::Key(b[start..end].to_string()));
                    while let Some((j, _)) = chars.peek() {
                        if *j <= end {
                            chars.next();
                        } else {
                            break;
                        }
                    }
                } else {
                    let start = i + 1;
                    let end = b[start..]
                        .find(['.', '['])
                        .map(|e| e + start)
                        .unwrap_or(b.len());
                    steps.push(PathStep::Key(b[start..end].to_string()));
                    while let Some((j, _)) = chars.peek() {
                        if *j < end {
                            chars.next();
                        } else {
                            break;
                        }
                    }
                }
            }
            '[' => {
                let start = i + 1;
                let end = b[start..].find(']')? + start;
                let idx: usize = b[start..end].trim().parse().ok()?;
                steps.push(PathStep::Index(idx));
                while let Some((j, _)) = chars.peek() {
                    if *j <= end {
                        chars.next();
                    } else {
                        break;
                    }
                }
            }
            _ => return None,
        }
    }
    Some(steps)
}

/// Follow `steps` in a parsed JSON document.
pub fn follow<'j>(
    mut v: &'j serde_json::Value,
    steps: &[PathStep],
) -> Option<&'j serde_json::Value> {
    for s in steps {
        v = match (s, v) {
            (PathStep::Key(k), serde_json::Value::Object(m)) => m.get(k)?,
            // JavaScript indexing: `arr["0"]` is the first element.
            (PathStep::Key(k), serde_json::Value::Array(a)) => a.get(k.parse::<usize>().ok()?)?,
            (PathStep::Index(i), serde_json::Value::Array(a)) => a.get(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollar_paths() {
        assert_eq!(
            parse_dollar_path("$.a[1].b"),
            Some(vec![
                PathStep::Key("a".into()),
                PathStep::Index(1),
                PathStep::Key("b".into())
            ])
        );
        assert_eq!(parse_dollar_path("$"), Some(vec![]));
        assert_eq!(parse_dollar_path("a.b"), None);
    }

    /// Escapes land where they belong wherever they fall in the 16-byte chunks, and the
    /// text equals what serde_json (and so `JSON.stringify`) writes.
    #[test]
    fn json_strings_escape_like_json_stringify() {
        let specials = [
            "\"", "\\", "\n", "\r", "\t", "\u{8}", "\u{c}", "\u{1}", "\u{1f}",
        ];
        let fillers = ["", "a", "/é€😀", "0123456789abcdef", "x\u{7f}y"];
        for len in 0..40 {
            for special in specials {
                for filler in fillers {
                    let text: String = filler.repeat(len % 3) + &"p".repeat(len) + special + filler;
                    let mut out = String::new();
                    write_json_string(&mut out, &text);
                    assert_eq!(out, serde_json::to_string(&text).unwrap(), "{text:?}");
                }
            }
        }
    }
}
