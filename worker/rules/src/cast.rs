//! SQLite's conversions between value kinds, as the official evaluator performs them:
//! `CAST(x AS t)`, the numbers arithmetic reads, and booleans as `1`/`0`.

use std::borrow::Cow;

use super::value::{js_parse_bigint, js_parse_numeric, numeric_prefix, Value};

/// `CAST` targets (the SQLite type names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastType {
    /// `text`
    Text,
    /// `numeric`
    Numeric,
    /// `integer`
    Integer,
    /// `real`
    Real,
    /// `blob`
    Blob,
}

/// `1` or `0`, SQLite's booleans.
pub fn bool_value(b: bool) -> Value<'static> {
    Value::Integer(i64::from(b))
}

/// A value as a number (`CAST(x AS numeric)`, used by arithmetic): text by the official
/// evaluator's signed-prefix rule (or 0), NULL stays NULL.
pub fn to_number(v: &Value<'_>) -> Value<'static> {
    match v {
        Value::Null => Value::Null,
        Value::Integer(i) => Value::Integer(*i),
        Value::Real(f) => Value::Real(*f),
        Value::Text(t) => js_parse_numeric(t),
        Value::Blob(b) => js_parse_numeric(&String::from_utf8_lossy(b)),
    }
}

/// `CAST(x AS t)` with SQLite's conversions.
pub fn cast(v: Value<'_>, t: CastType) -> Value<'_> {
    if v.is_null() {
        return Value::Null;
    }
    match t {
        CastType::Text => match v {
            Value::Text(s) => Value::Text(s),
            other => Value::Text(Cow::Owned(other.to_text().unwrap_or_default().into_owned())),
        },
        CastType::Blob => match v {
            Value::Blob(b) => Value::Blob(b),
            Value::Text(s) => Value::Blob(Cow::Owned(s.as_bytes().to_vec())),
            other => Value::Blob(Cow::Owned(
                other.to_text().unwrap_or_default().as_bytes().to_vec(),
            )),
        },
        // The official casts: integer takes leading digits of text and floors reals; real
        // parses a float prefix (0.0 when none); numeric keeps numbers as they are.
        CastType::Integer => match v {
            Value::Integer(i) => Value::Integer(i),
            Value::Real(f) => Value::Integer(f.floor() as i64),
            Value::Text(t) => js_parse_bigint(&t),
            Value::Blob(b) => js_parse_bigint(&String::from_utf8_lossy(&b)),
            Value::Null => Value::Null,
        },
        CastType::Real => match v {
            Value::Integer(i) => Value::Real(i as f64),
            Value::Real(f) => Value::Real(f),
            other => match numeric_prefix(&other.to_text().unwrap_or_default()) {
                Some(Value::Integer(i)) => Value::Real(i as f64),
                Some(Value::Real(f)) => Value::Real(f),
                _ => Value::Real(0.0),
            },
        },
        CastType::Numeric => to_number(&v),
    }
}
