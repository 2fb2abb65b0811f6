//! A client as the laws tests model it: it downloads each bucket's ops after its position and
//! checks what it then holds against the store's rows and checksums.
use super::*;

/// What a client holds per bucket.
#[derive(Clone, Default)]
pub(super) struct Client {
    pub(super) after: BTreeMap<&'static str, u64>,
    pub(super) checksum: BTreeMap<&'static str, u32>,
    pub(super) rows: BTreeMap<&'static str, BTreeMap<String, String>>,
}

impl Client {
    /// Downloads everything after its positions up to the store's checkpoint, in pages.
    pub(super) fn sync(
        &mut self,
        store: &Store,
        truth: &BTreeMap<&'static str, BTreeMap<String, String>>,
    ) {
        store
            .read(|view| {
                let cp = view.checkpoint()?.op_id;
                for bucket in BUCKETS {
                    let Some(state) = view.bucket(bucket)? else {
                        continue;
                    };
                    let mut after = *self.after.get(bucket).unwrap_or(&0);
                    loop {
                        let page = view.ops(state.id, after, cp, 3)?;
                        assert!(page.max_target <= cp, "a single read view is consistent");
                        for op in &page.ops {
                            assert!(op.op_id > after && op.op_id <= cp);
                            self.apply(bucket, op);
                            after = op.op_id;
                        }
                        if !page.has_more {
                            break;
                        }
                    }
                    self.after.insert(bucket, cp);
                    assert_eq!(
                        self.checksum.get(bucket).copied().unwrap_or(0),
                        state.checksum,
                        "checksum of {bucket}"
                    );
                    let empty = BTreeMap::new();
                    assert_eq!(
                        self.rows.get(bucket).unwrap_or(&empty),
                        truth.get(bucket).unwrap_or(&empty),
                        "rows of {bucket}"
                    );
                    // Count: every op ever added and still stored.
                    let all = view.ops(state.id, 0, cp, usize::MAX)?;
                    assert_eq!(all.ops.len() as u64, state.count, "count of {bucket}");
                }
                Ok(())
            })
            .unwrap();
    }
}

impl Client {
    /// Applies one downloaded op of `bucket` to the rows and checksum held.
    pub(super) fn apply(&mut self, bucket: &'static str, op: &OpRead) {
        let sum = self.checksum.entry(bucket).or_default();
        *sum = sum.wrapping_add(op.checksum);
        let rows = self.rows.entry(bucket).or_default();
        match op.kind {
            OpKind::Put => {
                let o = op.object.as_ref().unwrap();
                rows.insert(o.object_id.clone(), o.data.clone().unwrap());
            }
            OpKind::Remove => {
                rows.remove(&op.object.as_ref().unwrap().object_id);
            }
            OpKind::Move => assert!(op.object.is_none()),
            OpKind::Clear => {
                // Everything before it is replaced: start over.
                assert!(op.object.is_none());
                rows.clear();
                *sum = op.checksum;
            }
        }
    }
}
