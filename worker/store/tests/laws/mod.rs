//! Storage laws: what clients download adds up to the store's rows and checksums however
//! changes, forks and compactions interleave (`random`), compaction folds what writes
//! superseded (`compaction`), records keep one copy of data and compress (`records`), and a
//! re-copy's merge writes ops only where a row's output changed (`merge`). `client` models a
//! client downloading ops.
use std::collections::BTreeMap;

use store::{OpKind, OpRead, RowPut, Store, StoreError, StoredAs};

const BUCKETS: [&str; 5] = ["b0", "b1", "b2[\"x\"]", "b3", "b4"];

fn checksum_of(data: &str) -> u32 {
    data.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

mod client;
mod compaction;
mod merge;
mod random;
mod records;
