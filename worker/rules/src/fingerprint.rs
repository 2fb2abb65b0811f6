//! What a bucket definition or stream makes of rows, as one hash: two definitions with equal
//! fingerprints put the same rows into the same buckets and write the same lookups.
//!
//! The fingerprint covers the name, every query and CTE the definition can read, and the
//! edition options (which change conversions). It leaves out what only announces buckets
//! (`priority`, `auto_subscribe`), so changing those renames nothing. Texts are hashed as
//! written: reformatting a query counts as a change (a re-download, never a wrong bucket).

use sha2::{Digest, Sha256};

use super::options::Compatibility;
use super::yaml::{RawDefinition, RawStream};

/// SHA-256 of a definition's or stream's content (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

/// A hash input of length-prefixed parts, so no two part lists give one byte string.
struct Parts(Sha256);

impl Parts {
    fn new(kind: &str, compat: Compatibility) -> Self {
        let mut parts = Parts(Sha256::new());
        parts.add(kind);
        let Compatibility {
            edition,
            timestamps_iso8601,
            versioned_bucket_ids,
            fixed_json_extract,
            custom_postgres_types,
        } = compat;
        parts.0.update([
            edition,
            timestamps_iso8601 as u8,
            versioned_bucket_ids as u8,
            fixed_json_extract as u8,
            custom_postgres_types as u8,
        ]);
        parts
    }

    fn add(&mut self, part: &str) {
        self.0.update((part.len() as u64).to_be_bytes());
        self.0.update(part.as_bytes());
    }

    fn list<'a>(&mut self, parts: impl ExactSizeIterator<Item = &'a str>) {
        self.0.update((parts.len() as u64).to_be_bytes());
        for p in parts {
            self.add(p);
        }
    }

    fn done(self) -> Fingerprint {
        Fingerprint(self.0.finalize().into())
    }
}

/// The fingerprint of a `bucket_definitions` entry.
pub(crate) fn of_definition(def: &RawDefinition, compat: Compatibility) -> Fingerprint {
    let mut parts = Parts::new("definition", compat);
    parts.add(&def.name);
    parts.list(def.parameters.iter().map(String::as_str));
    parts.list(def.data.iter().map(String::as_str));
    parts.done()
}

/// The fingerprint of a stream; `global_with` are the file's CTEs (all of them: a stream
/// may read any).
pub(crate) fn of_stream(
    s: &RawStream,
    global_with: &[(String, String)],
    compat: Compatibility,
) -> Fingerprint {
    let mut parts = Parts::new("stream", compat);
    parts.add(&s.name);
    parts.list(s.queries.iter().map(String::as_str));
    for with in [&s.with[..], global_with] {
        parts.list(
            with.iter()
                .flat_map(|(n, q)| [n.as_str(), q.as_str()])
                .collect::<Vec<_>>()
                .into_iter(),
        );
    }
    parts.done()
}

/// The fingerprint of the file's CTEs (`with:`), which streams share: the name their
/// lookups are stored under.
pub(crate) fn of_global_with(
    global_with: &[(String, String)],
    compat: Compatibility,
) -> Fingerprint {
    let mut parts = Parts::new("with", compat);
    parts.list(
        global_with
            .iter()
            .flat_map(|(n, q)| [n.as_str(), q.as_str()])
            .collect::<Vec<_>>()
            .into_iter(),
    );
    parts.done()
}
