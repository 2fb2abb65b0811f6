//! Decoder for `COPY ... TO STDOUT` in text format: one line per row, fields separated by
//! tabs, `\N` for NULL, backslash escapes. A raw tab or newline never occurs inside a
//! field (COPY escapes them), so splitting needs no escape state; only fields holding a
//! backslash are unescaped (into a scratch buffer), the rest are borrowed.

/// A row line that is not valid COPY text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyTextError {
    /// The line has a different number of fields than the table has columns.
    #[error("COPY row has {found} fields, expected {expected}")]
    FieldCount {
        /// Columns expected.
        expected: usize,
        /// Fields found.
        found: usize,
    },
    /// An escape sequence COPY does not produce, or a value that is not UTF-8.
    #[error("COPY row field {field}: {problem}")]
    Malformed {
        /// Zero-based field index.
        field: usize,
        /// What is wrong.
        problem: &'static str,
    },
}

/// Reusable decoder for rows of one table (`columns` fields per row).
pub struct CopyFields {
    columns: usize,
    /// Byte ranges into either the line (`borrowed`) or `scratch`.
    spans: Vec<Span>,
    scratch: Vec<u8>,
}

#[derive(Clone, Copy)]
enum Span {
    Null,
    Line(usize, usize),
    Scratch(usize, usize),
}

impl CopyFields {
    /// A decoder for rows with `columns` fields.
    pub fn new(columns: usize) -> Self {
        Self {
            columns,
            spans: Vec::with_capacity(columns),
            scratch: Vec::new(),
        }
    }

    /// Decodes one line (without its trailing newline) into a view of its fields.
    pub fn decode<'a>(&'a mut self, line: &'a [u8]) -> Result<Fields<'a>, CopyTextError> {
        self.spans.clear();
        self.scratch.clear();
        let mut start = 0;
        let mut tabs = memchr::memchr_iter(b'\t', line);
        // Most lines have no escape at all: one search for the line, not one per field.
        let escapes = memchr::memchr(b'\\', line).is_some();
        loop {
            let end = tabs.next().unwrap_or(line.len());
            let raw = line.get(start..end).unwrap_or_default();
            let field = self.spans.len();
            let span = if raw == b"\\N" {
                Span::Null
            } else if escapes && memchr::memchr(b'\\', raw).is_some() {
                let from = self.scratch.len();
                unescape(raw, &mut self.scratch)
                    .map_err(|problem| CopyTextError::Malformed { field, problem })?;
                // Escapes can make any byte: check the unescaped value by itself.
                let unescaped = self.scratch.get(from..).unwrap_or_default();
                if std::str::from_utf8(unescaped).is_err() {
                    return Err(not_utf8(field));
                }
                Span::Scratch(from, self.scratch.len())
            } else {
                Span::Line(start, end)
            };
            self.spans.push(span);
            if end == line.len() {
                break;
            }
            start = end + 1;
        }
        if self.spans.len() != self.columns {
            return Err(CopyTextError::FieldCount {
                expected: self.columns,
                found: self.spans.len(),
            });
        }
        // One check for the whole line: valid UTF-8 split at ASCII tabs gives valid
        // fields. Only when it fails are the fields checked one by one, to name the bad one.
        // (simdutf8 checks a line of mostly ASCII several times faster than `std`.)
        if simdutf8::basic::from_utf8(line).is_err() {
            for (field, span) in self.spans.iter().enumerate() {
                if let Span::Line(a, b) = *span {
                    if std::str::from_utf8(line.get(a..b).unwrap_or_default()).is_err() {
                        return Err(not_utf8(field));
                    }
                }
            }
        }
        Ok(Fields {
            spans: &self.spans,
            line,
            scratch: &self.scratch,
        })
    }
}

fn not_utf8(field: usize) -> CopyTextError {
    CopyTextError::Malformed {
        field,
        problem: "not valid UTF-8",
    }
}

/// The fields of one decoded row: borrowed from the line, or from the decoder's scratch
/// buffer for fields that held escapes. Every field is valid UTF-8.
pub struct Fields<'a> {
    spans: &'a [Span],
    line: &'a [u8],
    scratch: &'a [u8],
}

impl<'a> Fields<'a> {
    /// Number of fields.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True for a row without fields.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Field `index`: `None` for SQL NULL (or an index out of range).
    pub fn get(&self, index: usize) -> Option<&'a [u8]> {
        match *self.spans.get(index)? {
            Span::Null => None,
            Span::Line(a, b) => self.line.get(a..b),
            Span::Scratch(a, b) => self.scratch.get(a..b),
        }
    }

    /// [`Self::get`] as text, without checking it again.
    pub fn get_str(&self, index: usize) -> Option<&'a str> {
        // SAFETY: `CopyFields::decode` checked every field: the line as a whole (a valid
        // line split at ASCII tabs gives valid fields) and each unescaped field by itself.
        self.get(index)
            .map(|bytes| unsafe { std::str::from_utf8_unchecked(bytes) })
    }
}

/// Appends the unescaped form of `raw` to `out`.
fn unescape(raw: &[u8], out: &mut Vec<u8>) -> Result<(), &'static str> {
    let mut bytes = raw.iter().copied().peekable();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let Some(code) = bytes.next() else {
            return Err("backslash at end of field");
        };
        match code {
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(0x0b),
            b'0'..=b'7' => {
                let mut value = u32::from(code - b'0');
                for _ in 0..2 {
                    match bytes.peek() {
                        Some(d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            bytes.next();
                        }
                        _ => break,
                    }
                }
                out.push(u8::try_from(value).map_err(|_| "octal escape above \\377")?);
            }
            b'x' => {
                let mut value = 0u8;
                let mut digits = 0;
                while digits < 2 {
                    match bytes.peek().and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            value = value * 16 + d as u8;
                            bytes.next();
                            digits += 1;
                        }
                        None => break,
                    }
                }
                if digits == 0 {
                    return Err("\\x without hex digits");
                }
                out.push(value);
            }
            other => out.push(other),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(columns: usize, line: &[u8]) -> Result<Vec<Option<String>>, CopyTextError> {
        let mut decoder = CopyFields::new(columns);
        let fields = decoder.decode(line)?;
        Ok((0..fields.len())
            .map(|i| {
                let text = fields
                    .get(i)
                    .map(|b| String::from_utf8(b.to_vec()).unwrap());
                assert_eq!(fields.get_str(i), text.as_deref());
                text
            })
            .collect())
    }

    #[test]
    fn plain_null_empty_and_escaped_fields() {
        let got = fields(5, b"t-1\t\\N\t\ta\\tb\\nc\\\\d\tx\\101\\x41").unwrap();
        assert_eq!(
            got,
            vec![
                Some("t-1".into()),
                None,
                Some(String::new()),
                Some("a\tb\nc\\d".into()),
                Some("xAA".into())
            ]
        );
        assert_eq!(
            fields(1, "grüße".as_bytes()).unwrap(),
            vec![Some("grüße".into())]
        );
        // Escapes in one field of a line do not change how the others are read.
        assert_eq!(
            fields(3, "ß\tplain\t\\N".as_bytes()).unwrap(),
            vec![Some("ß".into()), Some("plain".into()), None]
        );
        assert_eq!(
            fields(2, b"a\\\\b\tc").unwrap(),
            vec![Some("a\\b".into()), Some("c".into())]
        );
    }

    #[test]
    fn malformed_rows_are_errors_not_panics() {
        assert_eq!(
            fields(2, b"a").unwrap_err(),
            CopyTextError::FieldCount {
                expected: 2,
                found: 1
            }
        );
        assert!(matches!(
            fields(1, b"a\\"),
            Err(CopyTextError::Malformed { field: 0, .. })
        ));
        assert!(matches!(
            fields(1, b"\\777"),
            Err(CopyTextError::Malformed { .. })
        ));
        assert!(matches!(
            fields(1, b"\\xZ"),
            Err(CopyTextError::Malformed { .. })
        ));
        assert!(matches!(
            fields(1, b"\xff"),
            Err(CopyTextError::Malformed { .. })
        ));
        for seed in 0..2000u32 {
            let line: Vec<u8> = (0..(seed % 23))
                .map(|i| b"\\\tNx0a7\xc3"[((seed * 31 + i * 7) % 8) as usize])
                .collect();
            let _ = fields((seed % 4) as usize, &line);
        }
    }
}
