//! SQLite-style values: what a PostgreSQL column becomes before rules evaluate it.
//!
//! The official service evaluates rules over SQLite values (NULL, INTEGER, REAL, TEXT, BLOB);
//! copying that model keeps comparison, truthiness and JSON output identical. Text and blobs
//! borrow from the source row where possible so the hot path does not copy column data.

use std::borrow::Cow;
use std::cmp::Ordering;

use super::js_number::js_number;

/// One SQLite-style value, borrowed from the source row when possible.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// SQL NULL.
    Null,
    /// A 64-bit integer (also booleans, as 1/0).
    Integer(i64),
    /// A double; NaN and infinities never reach JSON output (they become `null`).
    Real(f64),
    /// UTF-8 text (also JSON text, numeric, timestamps, arrays).
    Text(Cow<'a, str>),
    /// Binary data; dropped from row JSON unless converted with `hex()`/`base64()`.
    Blob(Cow<'a, [u8]>),
}

/// An owned value, used for lookup keys, bucket parameters and request data.
pub type OwnedValue = Value<'static>;

impl<'a> Value<'a> {
    /// Text value from anything string-like.
    pub fn text(s: impl Into<Cow<'a, str>>) -> Self {
        Value::Text(s.into())
    }

    /// Detach from the source row.
    pub fn into_owned(self) -> OwnedValue {
        match self {
            Value::Null => Value::Null,
            Value::Integer(i) => Value::Integer(i),
            Value::Real(f) => Value::Real(f),
            Value::Text(t) => Value::Text(Cow::Owned(t.into_owned())),
            Value::Blob(b) => Value::Blob(Cow::Owned(b.into_owned())),
        }
    }

    /// A cheap copy that borrows from `self`.
    pub fn borrowed(&self) -> Value<'_> {
        match self {
            Value::Null => Value::Null,
            Value::Integer(i) => Value::Integer(*i),
            Value::Real(f) => Value::Real(*f),
            Value::Text(t) => Value::Text(Cow::Borrowed(t.as_ref())),
            Value::Blob(b) => Value::Blob(Cow::Borrowed(b.as_ref())),
        }
    }

    /// True for SQL NULL.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The SQLite type name (`typeof()`).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Integer(_) => "integer",
            Value::Real(_) => "real",
            Value::Text(_) => "text",
            Value::Blob(_) => "blob",
        }
    }

    /// Truthiness as the official evaluator computes it (`sqliteBool`): non-zero numbers are
    /// true (NaN is false); text is true when JavaScript's `parseInt` gives a non-zero
    /// number (`"12abc"` true, `"0.5"` and `"abc"` false); NULL and blobs are false.
    pub fn is_truthy(&self) -> bool {
        match self {
            Value::Null | Value::Blob(_) => false,
            Value::Integer(i) => *i != 0,
            Value::Real(f) => *f != 0.0 && !f.is_nan(),
            Value::Text(t) => js_parse_int_nonzero(t),
        }
    }

    /// The value as text the way SQLite/the official service prints it (`CAST(x AS TEXT)`),
    /// or `None` for NULL.
    pub fn to_text(&self) -> Option<Cow<'_, str>> {
        match self {
            Value::Null => None,
            Value::Integer(i) => Some(Cow::Owned(i.to_string())),
            Value::Real(f) => Some(Cow::Owned(js_number(*f))),
            Value::Text(t) => Some(Cow::Borrowed(t.as_ref())),
            Value::Blob(b) => Some(String::from_utf8_lossy(b)),
        }
    }
}

/// The numeric value of the longest numeric prefix of `s` (SQLite's text → number rule),
/// ignoring leading spaces. `None` when there is no numeric prefix.
pub(crate) fn numeric_prefix(s: &str) -> Option<Value<'static>> {
    let t = s.trim_start();
    let bytes = t.as_bytes();
    let mut end = 0;
    if end < bytes.len() && (bytes[end] == b'+' || bytes[end] == b'-') {
        end += 1;
    }
    let digits_start = end;
    while end < bytes.len() && bytes[end].is_ascii_digit() {
        end += 1;
    }
    let mut is_real = false;
    let mut had_digits = end > digits_start;
    if end < bytes.len() && bytes[end] == b'.' {
        let mut e = end + 1;
        while e < bytes.len() && bytes[e].is_ascii_digit() {
            e += 1;
        }
        if e > end + 1 || had_digits {
            had_digits = had_digits || e > end + 1;
            is_real = true;
            end = e;
        }
    }
    if !had_digits {
        return None;
    }
    if end < bytes.len() && (bytes[end] == b'e' || bytes[end] == b'E') {
        let mut e = end + 1;
        if e < bytes.len() && (bytes[e] == b'+' || bytes[e] == b'-') {
            e += 1;
        }
        let exp_start = e;
        while e < bytes.len() && bytes[e].is_ascii_digit() {
            e += 1;
        }
        if e > exp_start {
            is_real = true;
            end = e;
        }
    }
    let num = t.get(..end)?;
    if !is_real {
        if let Ok(i) = num.parse::<i64>() {
            return Some(Value::Integer(i));
        }
    }
    num.parse::<f64>().ok().map(Value::Real)
}

/// Whether JavaScript's `parseInt(s)` (radix inferred) is a non-zero number.
fn js_parse_int_nonzero(s: &str) -> bool {
    let t = s.trim_start();
    let t = t.strip_prefix(['+', '-']).unwrap_or(t);
    let (digits, radix): (&str, u32) = match t.get(..2) {
        Some("0x") | Some("0X") => (&t[2..], 16),
        _ => (t, 10),
    };
    let run: Vec<u32> = digits.chars().map_while(|c| c.to_digit(radix)).collect();
    run.iter().any(|d| *d != 0)
}

/// The length of an optional sign (`+`/`-`) at the start of `b`.
fn sign_len(b: &[u8]) -> usize {
    usize::from(matches!(b.first(), Some(b'+' | b'-')))
}

/// The official evaluator's text → number rule (`parseNumeric`, 0.38): a signed decimal
/// prefix (`^\s*[+-]?(\d+(\.\d*)?|\.\d+)(e[+-]?\d+)?`); INTEGER unless it has a fraction
/// or exponent; 0 when there is no such prefix.
pub(crate) fn js_parse_numeric(s: &str) -> Value<'static> {
    let t = s.trim_start();
    let b = t.as_bytes();
    let sign = sign_len(b);
    let digits = |from: usize| {
        b[from.min(b.len())..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count()
    };
    let int_digits = digits(sign);
    let mut end = sign + int_digits;
    let mut is_real = false;
    if int_digits > 0 {
        if b.get(end) == Some(&b'.') {
            is_real = true;
            end += 1 + digits(end + 1);
        }
    } else if b.get(end) == Some(&b'.') && digits(end + 1) > 0 {
        is_real = true;
        end += 1 + digits(end + 1);
    } else {
        return Value::Integer(0);
    }
    if matches!(b.get(end), Some(b'e') | Some(b'E')) {
        let e = end + 1 + sign_len(&b[(end + 1).min(b.len())..]);
        let exponent = digits(e);
        if exponent > 0 {
            is_real = true;
            end = e + exponent;
        }
    }
    if !is_real {
        if let Ok(i) = t[..end].parse::<i64>() {
            return Value::Integer(i);
        }
    }
    // JavaScript's parseFloat reads `1.`, `.5` and `+2` as Rust's parser does.
    let text = t[..end].trim_start_matches('+');
    text.parse::<f64>()
        .map(Value::Real)
        .unwrap_or(Value::Integer(0))
}

/// The official evaluator's text → integer rule (`parseBigInt`, 0.38): leading digits
/// with an optional sign, 0 when there are none.
pub(crate) fn js_parse_bigint(s: &str) -> Value<'static> {
    let t = s.trim_start();
    let sign = sign_len(t.as_bytes());
    let n = sign + t[sign..].bytes().take_while(u8::is_ascii_digit).count();
    if n == sign {
        return Value::Integer(0);
    }
    let text = t[..n].trim_start_matches('+');
    match text.parse::<i64>() {
        Ok(i) => Value::Integer(i),
        Err(_) => text
            .parse::<f64>()
            .map(Value::Real)
            .unwrap_or(Value::Integer(0)),
    }
}

/// SQLite ordering: NULL is incomparable; numbers < text < blob; numbers compare by value.
pub fn compare(x: &Value<'_>, y: &Value<'_>) -> Option<Ordering> {
    fn class(v: &Value<'_>) -> u8 {
        match v {
            Value::Null => 0,
            Value::Integer(_) | Value::Real(_) => 1,
            Value::Text(_) => 2,
            Value::Blob(_) => 3,
        }
    }
    match (x, y) {
        (Value::Null, _) | (_, Value::Null) => None,
        (Value::Integer(a), Value::Integer(b)) => Some(a.cmp(b)),
        (Value::Integer(a), Value::Real(b)) => (*a as f64).partial_cmp(b),
        (Value::Real(a), Value::Integer(b)) => a.partial_cmp(&(*b as f64)),
        (Value::Real(a), Value::Real(b)) => a.partial_cmp(b),
        (Value::Text(a), Value::Text(b)) => Some(a.as_bytes().cmp(b.as_bytes())),
        (Value::Blob(a), Value::Blob(b)) => Some(a.as_ref().cmp(b.as_ref())),
        _ => Some(class(x).cmp(&class(y))),
    }
}
