//! One scalar column's text → value: booleans, numbers, dates and times, `pg_lsn`; any
//! other type stays text. Arrays convert each element through here (`array`).

use std::borrow::Cow;

use crate::options::Compatibility;
use crate::value::Value;

use super::datetime::{pad_fraction, timestamp, timestamptz};
use super::pg_type::oid;

pub(super) fn convert_scalar<'a>(
    oid: u32,
    s: &'a str,
    compat: &Compatibility,
) -> Result<Value<'a>, String> {
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

fn pg_lsn(s: &str) -> Result<String, String> {
    let (hi, lo) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not a pg_lsn"))?;
    let hi = u32::from_str_radix(hi, 16).map_err(|_| format!("`{s}` is not a pg_lsn"))?;
    let lo = u32::from_str_radix(lo, 16).map_err(|_| format!("`{s}` is not a pg_lsn"))?;
    Ok(format!("{hi:08X}/{lo:08X}"))
}
