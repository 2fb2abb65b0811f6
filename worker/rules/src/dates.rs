//! `unixepoch()` and `datetime()` as the official evaluator has them: a date is what
//! JavaScript's `new Date(…)` makes of the value — text in ISO 8601 form (read as UTC
//! without a zone), a Julian day number, or with the `'unixepoch'` modifier seconds since
//! 1970 — and comes back as seconds (`unixepoch`) or `YYYY-MM-DD HH:MM:SS` text (`datetime`),
//! with milliseconds under `'subsec'`. JavaScript's parser also reads other date forms
//! (`2026/01/01`, month names); those are NULL here (`docs/sync-rules.md`).

use super::types::datetime::{civil_from_days, days_from_civil};
use super::value::Value;

/// Milliseconds in a day.
const DAY_MS: f64 = 86_400_000.0;

/// The largest distance from 1970 a JavaScript date may have (`TimeClip`).
const MAX_MS: f64 = 8.64e15;

/// The modifiers after the value: `'unixepoch'` (numbers are seconds since 1970, not Julian
/// days) and `'subsec'`/`'subsecond'` (milliseconds in the result); `None` for any other.
fn modifiers(a: &Value<'_>, b: &Value<'_>) -> Option<(bool, bool)> {
    fn text<'v>(v: &'v Value<'_>) -> Option<&'v str> {
        match v {
            Value::Text(t) => Some(t.as_ref()),
            _ => None,
        }
    }
    let subsec = |w: Option<&str>| matches!(w, Some("subsec" | "subsecond"));
    if a.is_null() {
        return Some((false, false));
    }
    match text(a) {
        Some("unixepoch") if b.is_null() => Some((true, false)),
        Some("unixepoch") if subsec(text(b)) => Some((true, true)),
        w if subsec(w) => Some((false, true)),
        _ => None,
    }
}

/// `unixepoch(value[, modifier[, modifier]])`.
pub(crate) fn unixepoch(value: &Value<'_>, a: &Value<'_>, b: &Value<'_>) -> Value<'static> {
    let Some((epoch, subsec)) = modifiers(a, b) else {
        return Value::Null;
    };
    match to_date(value, epoch) {
        None => Value::Null,
        Some(ms) if subsec => Value::Real(ms / 1000.0),
        Some(ms) => Value::Integer((ms / 1000.0).floor() as i64),
    }
}

/// `datetime(value[, modifier[, modifier]])`.
pub(crate) fn datetime(value: &Value<'_>, a: &Value<'_>, b: &Value<'_>) -> Value<'static> {
    let Some((epoch, subsec)) = modifiers(a, b) else {
        return Value::Null;
    };
    let Some(ms) = to_date(value, epoch) else {
        return Value::Null;
    };
    let ms = ms as i64;
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    // `toISOString`'s year, with a negative one's leading zeros dropped, as the official
    // evaluator writes it.
    let year = if (0..=9999).contains(&y) {
        format!("{y:04}")
    } else if y > 9999 {
        format!("+{y:06}")
    } else {
        format!("-{}", -y)
    };
    let (h, min, s, milli) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    let mut out = format!("{year}-{m:02}-{d:02} {h:02}:{min:02}:{s:02}");
    if subsec {
        out.push_str(&format!(".{milli:03}"));
    }
    Value::Text(out.into())
}

/// The date `value` stands for, in milliseconds since 1970 (`None`: not a date).
fn to_date(value: &Value<'_>, unixepoch: bool) -> Option<f64> {
    let ms = match value {
        Value::Text(t) => text_date(t)?,
        Value::Integer(i) => number_date(*i as f64, unixepoch),
        Value::Real(f) => number_date(*f, unixepoch),
        _ => return None,
    };
    // `new Date(ms)`: a finite time within its range, truncated to whole milliseconds.
    (ms.is_finite() && ms.abs() <= MAX_MS).then(|| ms.trunc())
}

fn number_date(n: f64, unixepoch: bool) -> f64 {
    if unixepoch {
        n * 1000.0
    } else {
        (n - 2_440_587.5) * DAY_MS
    }
}

/// Text as the official evaluator reads it: a Julian day number, or a date and time
/// (UTC unless it names a zone).
fn text_date(t: &str) -> Option<f64> {
    let zoned = t.contains(['Z', 'z']) || has_offset_at_end(t);
    let julian = !t.is_empty()
        && t.split_once('.')
            .map_or(t, |(whole, _)| whole)
            .bytes()
            .all(|b| b.is_ascii_digit())
        && t.split_once('.')
            .is_none_or(|(_, frac)| frac.bytes().all(|b| b.is_ascii_digit()))
        && t.as_bytes()[0].is_ascii_digit();
    if !zoned && julian {
        return Some(number_date(t.parse::<f64>().ok()?, false));
    }
    iso_date(t, !zoned)
}

/// `±HH:MM` at the end.
fn has_offset_at_end(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() >= 6 && {
        let tail = &b[b.len() - 6..];
        matches!(tail[0], b'+' | b'-')
            && tail[1..3].iter().all(u8::is_ascii_digit)
            && tail[3] == b':'
            && tail[4..].iter().all(u8::is_ascii_digit)
    }
}

/// `YYYY-M[M]-D[D][(T| )HH:MM[:SS[.fff…]]][ ][Z|z|±HH[:]MM]`; `utc`: no zone written.
fn iso_date(t: &str, utc: bool) -> Option<f64> {
    let mut p = Cursor {
        s: t.as_bytes(),
        i: 0,
    };
    let sign = match p.peek() {
        Some(b'+') => {
            p.i += 1;
            1
        }
        Some(b'-') => {
            p.i += 1;
            -1
        }
        _ => 1,
    };
    let year = sign * p.digits(4, 6)?;
    p.expect(b'-')?;
    let month = p.digits(1, 2)?;
    p.expect(b'-')?;
    let day = p.digits(1, 2)?;
    // JavaScript's parser takes any day up to 31 and rolls it over (`2026-02-30` is 2 March).
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let mut ms = 0i64;
    if matches!(p.peek(), Some(b'T' | b't' | b' '))
        && p.s.get(p.i + 1).is_some_and(u8::is_ascii_digit)
    {
        p.i += 1;
        let h = p.digits(2, 2)?;
        p.expect(b':')?;
        let min = p.digits(2, 2)?;
        let (mut s, mut milli) = (0, 0);
        if p.peek() == Some(b':') {
            p.i += 1;
            s = p.digits(2, 2)?;
            if p.peek() == Some(b'.') {
                p.i += 1;
                let start = p.i;
                while p.peek().is_some_and(|b| b.is_ascii_digit()) {
                    p.i += 1;
                }
                let frac = &t[start..p.i];
                if frac.is_empty() {
                    return None;
                }
                milli = format!("{frac:0<3}")[..3].parse::<i64>().ok()?;
            }
        }
        let valid = (h < 24 && min < 60 && s < 60) || (h == 24 && min == 0 && s == 0 && milli == 0);
        if !valid {
            return None;
        }
        ms = ((h * 60 + min) * 60 + s) * 1000 + milli;
    }
    while p.peek() == Some(b' ') {
        p.i += 1;
    }
    let offset_min = match p.peek() {
        Some(b'Z' | b'z') => {
            p.i += 1;
            0
        }
        Some(c @ (b'+' | b'-')) => {
            p.i += 1;
            let h = p.digits(2, 2)?;
            if p.peek() == Some(b':') {
                p.i += 1;
            }
            let m = p.digits(2, 2)?;
            if h > 23 || m > 59 {
                return None;
            }
            let o = h * 60 + m;
            if c == b'+' {
                o
            } else {
                -o
            }
        }
        None if utc => 0,
        _ => return None,
    };
    if p.i != p.s.len() {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some((days * 86_400_000 + ms - offset_min * 60_000) as f64)
}

/// A position in the text being read.
struct Cursor<'s> {
    s: &'s [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        (self.peek() == Some(b)).then(|| self.i += 1)
    }

    /// `min`..=`max` digits as a number.
    fn digits(&mut self, min: usize, max: usize) -> Option<i64> {
        let start = self.i;
        while self.i - start < max && self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
        let n = self.i - start;
        if n < min {
            return None;
        }
        std::str::from_utf8(&self.s[start..self.i])
            .ok()?
            .parse()
            .ok()
    }
}
