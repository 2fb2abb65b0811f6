//! Bucket naming (`docs/spec/protocol.md` §7.6): `<prefix>` + the JSON array of bucket parameter
//! values.
//!
//! The data side (values from a row) and the parameter side (values from a token or a
//! lookup) both go through [`bucket_name`], so equal values always give byte-identical names,
//! and both build their parameter tuples with `bucket_values` and `cross_product`.

use sha2::{Digest, Sha256};

use super::fingerprint::Fingerprint;
use super::json::write_key_value;
use super::value::Value;

/// How bucket names are prefixed.
///
/// The prefix must change whenever a bucket's op history starts over (a new store, a
/// changed definition), otherwise clients holding old positions get checksum mismatches,
/// and should stay while the history goes on, so that clients keep what they hold. The
/// engine picks the variant from the store it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketVersion {
    /// `<tag>#<definition>[...]`: the tag is 12 hex digits of SHA-256 over the store's
    /// history id (this value) and the definition's [fingerprint](crate::fingerprint), so
    /// a bucket keeps its name while its definition and its store's history stay, and
    /// needs no counter.
    Derived(u64),
    /// `<generation>#<definition>[...]` (official storage v2 and `versioned_bucket_ids`):
    /// stores built before names were derived keep it.
    Versioned(u64),
    /// `<definition>[...]` (official storage v1, edition 1 only). Only for tests and tooling
    /// that compare with old captures; do not serve it.
    Unversioned,
}

impl Default for BucketVersion {
    fn default() -> Self {
        BucketVersion::Versioned(1)
    }
}

impl BucketVersion {
    /// The name prefix for a definition or stream source (`"1#by_user"`, `"1#tasks|0"`)
    /// whose definition has `fingerprint`.
    pub fn prefix(&self, source: &str, fingerprint: &Fingerprint) -> String {
        match self {
            BucketVersion::Derived(history) => {
                let mut hash = Sha256::new();
                hash.update(b"powersync_mdbx bucket\0");
                hash.update(history.to_be_bytes());
                hash.update(fingerprint.0);
                let tag = hash.finalize();
                let mut out = String::with_capacity(TAG_BYTES * 2 + 1 + source.len());
                for b in &tag[..TAG_BYTES] {
                    out.push_str(&format!("{b:02x}"));
                }
                out.push('#');
                out.push_str(source);
                out
            }
            BucketVersion::Versioned(g) => format!("{g}#{source}"),
            BucketVersion::Unversioned => source.to_string(),
        }
    }
}

/// Bytes of the derived tag (12 hex digits: two definitions of one name under one history
/// share a tag with a chance of 2^-48).
const TAG_BYTES: usize = 6;

/// Build `<prefix>[v1,v2,...]`. `None` when a value is a blob (blobs never match a bucket).
pub fn bucket_name(prefix: &str, values: &[Value<'_>]) -> Option<String> {
    let mut out = String::with_capacity(prefix.len() + 2 + values.len() * 16);
    out.push_str(prefix);
    out.push('[');
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if !write_key_value(&mut out, v) {
            return None;
        }
    }
    out.push(']');
    Some(out)
}

/// The values a bucket parameter can take: NULL and blobs never name a bucket.
pub(crate) fn bucket_values<'a>(values: impl IntoIterator<Item = Value<'a>>) -> Vec<Value<'a>> {
    values
        .into_iter()
        .filter(|v| !matches!(v, Value::Null | Value::Blob(_)))
        .collect()
}

/// Every tuple extended by every value (one more bucket parameter).
pub(crate) fn cross_product<T: Clone>(tuples: &[Vec<T>], values: &[T]) -> Vec<Vec<T>> {
    let mut next = Vec::with_capacity(tuples.len() * values.len());
    for t in tuples {
        for v in values {
            let mut extended = Vec::with_capacity(t.len() + 1);
            extended.extend_from_slice(t);
            extended.push(v.clone());
            next.push(extended);
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_spec_examples() {
        let none = Fingerprint([0; 32]);
        let p = BucketVersion::Unversioned.prefix("pair", &none);
        assert_eq!(
            bucket_name(&p, &[Value::text("a"), Value::Integer(1)]).as_deref(),
            Some("pair[\"a\",1]")
        );
        assert_eq!(
            bucket_name(&BucketVersion::Versioned(1).prefix("global", &none), &[]).as_deref(),
            Some("1#global[]")
        );
        assert_eq!(bucket_name("x", &[Value::Null]).as_deref(), Some("x[null]"));
        assert_eq!(
            bucket_name("by_org", &[Value::Real(42.0)]).as_deref(),
            Some("by_org[42]")
        );
        assert_eq!(bucket_name("b", &[Value::Blob(vec![1u8].into())]), None);
    }

    #[test]
    fn derived_names_change_with_the_history_and_the_definition_only() {
        let (a, b) = (Fingerprint([1; 32]), Fingerprint([2; 32]));
        let p = BucketVersion::Derived(7).prefix("tasks|0", &a);
        let (tag, source) = p.split_once('#').unwrap();
        assert_eq!(source, "tasks|0");
        assert!(tag.len() == 12 && tag.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(p, BucketVersion::Derived(7).prefix("tasks|0", &a));
        assert_ne!(p, BucketVersion::Derived(8).prefix("tasks|0", &a));
        assert_ne!(p, BucketVersion::Derived(7).prefix("tasks|0", &b));
    }
}
