//! Byte encodings of the store's keys and values. Decoding never panics: bytes read back
//! from disk that do not parse are [`Corrupt`].

/// Stored bytes that do not decode: the store is damaged or was written by other code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored {what} does not decode")]
pub struct Corrupt {
    /// Which record.
    pub what: &'static str,
}

/// Appends length-prefixed fields.
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: Vec::with_capacity(capacity),
        }
    }

    /// A writer that appends to `buf`.
    pub fn over(buf: Vec<u8>) -> Self {
        Self { buf }
    }

    /// LEB128 unsigned integer.
    pub fn varint(&mut self, mut value: u64) -> &mut Self {
        while value >= 0x80 {
            self.buf.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.buf.push(value as u8);
        self
    }

    /// Length-prefixed bytes.
    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.varint(value.len() as u64);
        self.buf.extend_from_slice(value);
        self
    }

    /// Bytes without a length prefix.
    pub fn raw(&mut self, value: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(value);
        self
    }

    /// Length-prefixed UTF-8.
    pub fn str(&mut self, value: &str) -> &mut Self {
        self.bytes(value.as_bytes())
    }

    /// The encoded bytes.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads what [`Writer`] wrote.
pub struct Reader<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Reads `bytes`, naming the record `what` in errors.
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { rest: bytes, what }
    }

    fn corrupt(&self) -> Corrupt {
        Corrupt { what: self.what }
    }

    /// A LEB128 unsigned integer.
    pub fn varint(&mut self) -> Result<u64, Corrupt> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.rest.split_first().ok_or_else(|| self.corrupt())?;
            self.rest = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.corrupt())
    }

    /// Length-prefixed bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8], Corrupt> {
        let len = usize::try_from(self.varint()?).map_err(|_| self.corrupt())?;
        if len > self.rest.len() {
            return Err(self.corrupt());
        }
        let (value, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(value)
    }

    /// Length-prefixed UTF-8.
    pub fn str(&mut self) -> Result<&'a str, Corrupt> {
        let bytes = self.bytes()?;
        std::str::from_utf8(bytes).map_err(|_| self.corrupt())
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// True when everything was read.
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// Reads a fixed-size array from `bytes` at `offset`.
pub fn fixed<const N: usize>(
    bytes: &[u8],
    offset: usize,
    what: &'static str,
) -> Result<[u8; N], Corrupt> {
    bytes
        .get(offset..offset + N)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(Corrupt { what })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut w = Writer::default();
        w.varint(0)
            .varint(300)
            .varint(u64::MAX)
            .str("grüße")
            .bytes(b"");
        let bytes = w.finish();
        let mut r = Reader::new(&bytes, "test");
        assert_eq!(r.varint().unwrap(), 0);
        assert_eq!(r.varint().unwrap(), 300);
        assert_eq!(r.varint().unwrap(), u64::MAX);
        assert_eq!(r.str().unwrap(), "grüße");
        assert_eq!(r.bytes().unwrap(), b"");
        assert!(r.is_empty());
        for cut in 0..bytes.len() - 1 {
            let mut r = Reader::new(&bytes[..cut], "test");
            let ok = r
                .varint()
                .and_then(|_| r.varint())
                .and_then(|_| r.varint())
                .and_then(|_| r.str().map(|_| ()));
            assert!(ok.is_err(), "cut at {cut}");
        }
        assert!(Reader::new(&[0xff; 11], "t").varint().is_err());
        assert!(Reader::new(&[5, b'a'], "t").bytes().is_err());
    }
}
