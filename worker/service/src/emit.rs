//! One writer for both wire encodings: NDJSON (`{...}\n`) and BSON (length-prefixed
//! documents back to back). Lines are written field by field straight into a reusable
//! buffer, without building a JSON or BSON tree per op.

/// BSON element type bytes.
const BSON_STRING: u8 = 0x02;
const BSON_DOCUMENT: u8 = 0x03;
const BSON_ARRAY: u8 = 0x04;
const BSON_BOOL: u8 = 0x08;
const BSON_NULL: u8 = 0x0A;
const BSON_INT32: u8 = 0x10;
const BSON_INT64: u8 = 0x12;

/// How lines are framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `application/x-ndjson`: one JSON object and `\n` per line.
    Ndjson,
    /// NDJSON for a client that did not ask for `raw_data: true` (older clients): a PUT's
    /// `data` is the row's JSON object itself rather than a string holding it, as the
    /// official service sends it to them.
    NdjsonNestedData,
    /// `application/vnd.powersync.bson-stream`: BSON documents back to back.
    Bson,
}

impl Encoding {
    /// The exact `Content-Type` (the JS SDK compares it byte for byte: no parameters).
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Ndjson | Self::NdjsonNestedData => "application/x-ndjson",
            Self::Bson => "application/vnd.powersync.bson-stream",
        }
    }
}

/// A key of the element being written: a field name, or the next array element.
#[derive(Clone, Copy)]
pub(super) enum Key<'a> {
    Name(&'a str),
    Elem,
}

struct Frame {
    /// BSON: where the document's length goes.
    start: usize,
    /// Elements written so far (JSON commas, BSON array keys).
    count: u32,
}

/// Writes one line (one top-level document).
pub(super) struct Emitter<'o> {
    out: &'o mut Vec<u8>,
    bson: bool,
    /// [`Encoding::NdjsonNestedData`].
    pub(super) nested_data: bool,
    frames: Vec<Frame>,
}

impl<'o> Emitter<'o> {
    /// Starts the line's top-level object.
    pub fn begin(out: &'o mut Vec<u8>, encoding: Encoding) -> Self {
        let mut e = Self {
            out,
            bson: encoding == Encoding::Bson,
            nested_data: encoding == Encoding::NdjsonNestedData,
            frames: Vec::with_capacity(4),
        };
        e.open_frame(b'{');
        e
    }

    /// Ends the line (and, in NDJSON, writes its newline).
    pub fn end(mut self) {
        self.close_frame(b'}');
        if !self.bson {
            self.out.push(b'\n');
        }
    }

    fn open_frame(&mut self, json: u8) {
        let start = self.out.len();
        if self.bson {
            self.out.extend_from_slice(&[0; 4]);
        } else {
            self.out.push(json);
        }
        self.frames.push(Frame { start, count: 0 });
    }

    fn close_frame(&mut self, json: u8) {
        let Some(frame) = self.frames.pop() else {
            return;
        };
        if self.bson {
            self.out.push(0);
            let len = (self.out.len() - frame.start) as i32;
            self.out[frame.start..frame.start + 4].copy_from_slice(&len.to_le_bytes());
        } else {
            self.out.push(json);
        }
    }

    /// `json`, a JSON value's text this service wrote (a row's data), as the element
    /// itself: NDJSON only (a BSON line carries it as a string).
    pub fn raw_json(&mut self, key: Key<'_>, json: &str) {
        if self.bson {
            self.str(key, json);
            return;
        }
        self.key(key, BSON_STRING);
        self.out.extend_from_slice(json.as_bytes());
    }

    /// The element header: JSON comma and `"name":`, BSON type byte and key.
    fn key(&mut self, key: Key<'_>, bson_type: u8) {
        let Some(frame) = self.frames.last_mut() else {
            return;
        };
        let index = frame.count;
        frame.count += 1;
        if self.bson {
            self.out.push(bson_type);
            match key {
                Key::Name(n) => self.out.extend_from_slice(n.as_bytes()),
                Key::Elem => self
                    .out
                    .extend_from_slice(itoa::Buffer::new().format(index).as_bytes()),
            }
            self.out.push(0);
        } else {
            if index > 0 {
                self.out.push(b',');
            }
            if let Key::Name(n) = key {
                json_string(self.out, n);
                self.out.push(b':');
            }
        }
    }

    /// Opens a nested object.
    pub fn object(&mut self, key: Key<'_>) {
        self.key(key, BSON_DOCUMENT);
        self.open_frame(b'{');
    }

    /// Closes the innermost object.
    pub fn end_object(&mut self) {
        self.close_frame(b'}');
    }

    /// Opens a nested array.
    pub fn array(&mut self, key: Key<'_>) {
        self.key(key, BSON_ARRAY);
        self.open_frame(b'[');
    }

    /// Closes the innermost array.
    pub fn end_array(&mut self) {
        self.close_frame(b']');
    }

    /// A string.
    pub fn str(&mut self, key: Key<'_>, value: &str) {
        self.key(key, BSON_STRING);
        if self.bson {
            self.out
                .extend_from_slice(&(value.len() as i32 + 1).to_le_bytes());
            self.out.extend_from_slice(value.as_bytes());
            self.out.push(0);
        } else {
            json_string(self.out, value);
        }
    }

    /// An op id or position: a decimal string in both encodings (the client parses i64).
    pub fn op_id(&mut self, key: Key<'_>, value: u64) {
        self.str(key, itoa::Buffer::new().format(value));
    }

    /// An integer: a JSON number, BSON int64.
    pub fn int64(&mut self, key: Key<'_>, value: i64) {
        self.key(key, BSON_INT64);
        if self.bson {
            self.out.extend_from_slice(&value.to_le_bytes());
        } else {
            self.out
                .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        }
    }

    /// A small integer: a JSON number, BSON int32.
    pub fn int32(&mut self, key: Key<'_>, value: i32) {
        self.key(key, BSON_INT32);
        if self.bson {
            self.out.extend_from_slice(&value.to_le_bytes());
        } else {
            self.out
                .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        }
    }

    /// A boolean.
    pub fn bool(&mut self, key: Key<'_>, value: bool) {
        self.key(key, BSON_BOOL);
        if self.bson {
            self.out.push(u8::from(value));
        } else {
            self.out
                .extend_from_slice(if value { b"true" } else { b"false" });
        }
    }

    /// A null.
    #[allow(dead_code)]
    pub fn null(&mut self, key: Key<'_>) {
        self.key(key, BSON_NULL);
        if !self.bson {
            self.out.extend_from_slice(b"null");
        }
    }
}

/// JSON string with the escapes RFC 8259 requires (and nothing else, so `data` stays as
/// compact as the row JSON).
pub(super) fn json_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        if escape.is_empty() {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 15)],
            ]);
        } else {
            out.extend_from_slice(escape);
        }
        run = i + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_round_trip_through_serde() {
        for s in [
            "",
            "plain",
            "q\"b\\s",
            "ctl\u{1}\u{1f}\n\r\t",
            "ünï\u{2028}😀",
            "{\"id\":\"a\"}",
        ] {
            let mut out = Vec::new();
            json_string(&mut out, s);
            let back: String = serde_json::from_slice(&out).unwrap();
            assert_eq!(back, s);
        }
    }
}
