//! PostgreSQL array text (`{1,2,"a b",NULL,{3}}`) → JSON array text.

use crate::json::{write_data_value, write_json_string};
use crate::options::Compatibility;

use super::pg_type::oid;
use super::scalar::convert_scalar;

/// PostgreSQL array text (`{1,2,"a b",NULL,{3}}`) → JSON array text with elements converted
/// by their type (bool → 1/0, numeric → string, json embedded raw, NULL → null).
pub(super) fn array_to_json(s: &str, elem: u32, compat: &Compatibility) -> Result<String, String> {
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
