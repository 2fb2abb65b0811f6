//! The one step from a rule evaluation to the store's input, used by the snapshot, the
//! stream and every tool that writes evaluated rows: the row's memberships borrowed from
//! the evaluation, its lookup entries encoded (the store keeps them as bytes).

use rules::{encode_lookup_outputs, RowEvaluation};
use smallvec::SmallVec;
use store::{LookupPut, RowPut};

/// What one evaluated row writes to the store.
pub struct StoreInput<'e> {
    /// One per bucket the row is in, with the output it shows there.
    pub memberships: SmallVec<[RowPut<'e>; 4]>,
    /// `(encoded key, encoded outputs)` of each lookup entry.
    pub lookups: Vec<(Vec<u8>, Vec<u8>)>,
}

impl<'e> StoreInput<'e> {
    /// The store's input for `eval`.
    pub fn of(eval: &'e RowEvaluation) -> Self {
        Self {
            memberships: eval
                .buckets
                .iter()
                .map(|b| RowPut {
                    bucket: &b.bucket,
                    object_type: &b.object_type,
                    object_id: &b.object_id,
                    data: &b.data,
                    checksum: b.checksum,
                })
                .collect(),
            lookups: eval
                .lookups
                .iter()
                .map(|l| {
                    (
                        l.key.encode().into_bytes(),
                        encode_lookup_outputs(&l.outputs),
                    )
                })
                .collect(),
        }
    }

    /// The lookup entries as the writer takes them.
    pub fn lookup_puts(&self) -> SmallVec<[LookupPut<'_>; 2]> {
        self.lookups
            .iter()
            .map(|(key, outputs)| LookupPut { key, outputs })
            .collect()
    }
}
