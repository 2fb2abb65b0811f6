//! Edition-dependent behaviour ("compatibility options", `docs/spec/protocol.md` §7.1).
//!
//! Each quirk the official service fixed in a later edition is one flag here, so the
//! evaluator asks about behaviour, never about edition numbers.

/// Which quirks are fixed. Defaults come from the edition; explicit YAML booleans override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compatibility {
    /// The `config: edition` (1–3).
    pub edition: u8,
    /// Timestamps as `YYYY-MM-DDTHH:MM:SS.ffffff[Z]` instead of PostgreSQL's text.
    pub timestamps_iso8601: bool,
    /// Bucket names carry the version prefix (always true for our storage; kept for
    /// reporting).
    pub versioned_bucket_ids: bool,
    /// `->>`/`->` take the key literally unless it starts with `$.` (edition 1 splits on `.`).
    pub fixed_json_extract: bool,
    /// Domains, composites and ranges decoded (we keep their text form either way; see docs).
    pub custom_postgres_types: bool,
}

impl Compatibility {
    /// The defaults of an edition: every quirk fixed in edition 2 is on from edition 2.
    pub fn for_edition(edition: u8) -> Self {
        let fixed = edition >= 2;
        Compatibility {
            edition,
            timestamps_iso8601: fixed,
            versioned_bucket_ids: fixed,
            fixed_json_extract: fixed,
            custom_postgres_types: fixed,
        }
    }
}

impl Default for Compatibility {
    fn default() -> Self {
        Compatibility::for_edition(1)
    }
}
