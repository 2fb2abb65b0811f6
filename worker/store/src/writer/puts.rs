//! What a row writes besides its record: the bucket memberships and lookup entries it
//! produces, and the source values it keeps for unchanged-TOAST updates.

/// One bucket membership a row produces: the bucket and the output it shows there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPut<'a> {
    /// Bucket name.
    pub bucket: &'a str,
    /// Output table name.
    pub object_type: &'a str,
    /// Row id text.
    pub object_id: &'a str,
    /// The exact data JSON.
    pub data: &'a str,
    /// PUT checksum.
    pub checksum: u32,
}

/// One parameter-lookup entry a row produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupPut<'a> {
    /// Encoded lookup key.
    pub key: &'a [u8],
    /// Encoded outputs.
    pub outputs: &'a [u8],
}

/// Source values a row keeps for later "unchanged TOAST" updates: `(column, text)`.
pub type Stash = Vec<(String, Vec<u8>)>;
