//! Dates and times: PostgreSQL ISO text → the edition's format, timestamptz shifted to UTC.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::options::Compatibility;

/// `fraction` padded or cut to `digits` (e.g. `10:00:00.5` → `10:00:00.500000`).
pub(super) fn pad_fraction(s: &str, digits: usize) -> String {
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

/// BC dates and years past 9999 have no fixed-width form; they are passed through as
/// PostgreSQL printed them rather than stopping replication.
fn exotic(s: &str) -> bool {
    s.ends_with(" BC")
        || s.as_bytes()
            .get(..5)
            .is_some_and(|p| p.iter().all(u8::is_ascii_digit))
}

pub(super) fn timestamp<'a>(s: &'a str, compat: &Compatibility) -> Cow<'a, str> {
    if exotic(s) {
        return Cow::Borrowed(s);
    }
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
pub(super) fn timestamptz(s: &str, compat: &Compatibility) -> Result<String, String> {
    let iso = compat.timestamps_iso8601;
    match s {
        "infinity" if iso => return Ok("9999-12-31T23:59:59.000000Z".into()),
        "infinity" => return Ok("9999-12-31 23:59:59Z".into()),
        "-infinity" if iso => return Ok("0000-01-01T00:00:00.000000Z".into()),
        "-infinity" => return Ok("0000-01-01 00:00:00Z".into()),
        _ if exotic(s) => return Ok(s.to_string()),
        _ => {}
    }
    let bad = || format!("`{s}` is not a timestamptz in ISO DateStyle");
    let b = s.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        b.get(r).and_then(decimal).ok_or_else(bad)
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let rest = s.get(19..).ok_or_else(bad)?;
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
            offset += decimal(p.as_bytes()).ok_or_else(bad)? * mult;
        }
    }
    let mut out = String::with_capacity(32);
    let sep = if iso { 'T' } else { ' ' };
    if offset == 0 {
        // Already UTC (a session in UTC, the usual case): the fields stay as they are.
        out.push_str(s.get(..10).ok_or_else(bad)?);
        out.push(sep);
        out.push_str(s.get(11..19).ok_or_else(bad)?);
    } else {
        let days = days_from_civil(y, mo, d);
        let secs = days * 86400 + h * 3600 + mi * 60 + sec - sign * offset;
        let (days, tod) = (secs.div_euclid(86400), secs.rem_euclid(86400));
        let (y, mo, d) = civil_from_days(days);
        let _ = write!(
            out,
            "{y:04}-{mo:02}-{d:02}{sep}{:02}:{:02}:{:02}",
            tod / 3600,
            (tod / 60) % 60,
            tod % 60
        );
    }
    if iso {
        // Microseconds: PostgreSQL prints at most six digits.
        if !frac.bytes().all(|d| d.is_ascii_digit()) {
            return Err(bad());
        }
        out.push('.');
        let f = frac.get(..frac.len().min(6)).unwrap_or_default();
        out.push_str(f);
        out.push_str("000000".get(f.len()..).unwrap_or_default());
    } else if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out.push('Z');
    Ok(out)
}

/// The value of a field of ASCII digits (at most 18, so it cannot overflow); `None` when
/// it is empty or holds anything else.
fn decimal(digits: &[u8]) -> Option<i64> {
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
}

/// Days from 1970-01-01 to the proleptic Gregorian date `y-m-d`.
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// The proleptic Gregorian date `(y, m, d)` `z` days after 1970-01-01.
pub(crate) fn civil_from_days(z: i64) -> (i64, i64, i64) {
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

    /// A value already in UTC is copied field by field; it must read exactly like the
    /// same instant given with another offset (which is converted).
    #[test]
    fn utc_values_equal_converted_ones() {
        for iso in [false, true] {
            let compat = Compatibility {
                timestamps_iso8601: iso,
                ..Compatibility::default()
            };
            for (utc, other) in [
                ("2026-01-01 00:00:00+00", "2026-01-01 02:30:00+02:30"),
                ("2024-02-29 23:59:59.5+00", "2024-03-01 00:59:59.5+01"),
                (
                    "1999-12-31 12:00:00.123456+00",
                    "1999-12-31 07:00:00.123456-05",
                ),
            ] {
                let fast = timestamptz(utc, &compat).unwrap();
                assert_eq!(fast, timestamptz(other, &compat).unwrap(), "{utc}");
                assert!(fast.ends_with('Z') && fast.contains(if iso { 'T' } else { ' ' }));
            }
        }
    }
}
