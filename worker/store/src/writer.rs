//! The write side: one read-write transaction applies row changes as ops and commits
//! them together with the bucket accumulators, the counters and the checkpoint.
//!
//! Superseding happens at write time: when a row's membership in a bucket is replaced
//! (a new PUT) or ended (a REMOVE), its previous PUT becomes a MOVE whose target is the
//! new op. PUT records therefore always point at a row's current data, which each row
//! record stores once however many buckets it is in.
//!
//! The transaction's life (begin, counters, buffered ops, finish) is in `txn`, what a row
//! writes besides its record in `puts`; its work is spread by job: row records (`rows`),
//! bucket state and ops (`buckets`), CLEAR compaction (`compaction`), parameter lookups
//! (`lookups`), packing records and sampling them for the dictionary (`packing`),
//! comparing rows for a table's re-copy (`recopy`).

mod buckets;
mod compaction;
mod expiry;
mod lookups;
pub(super) mod packing;
mod puts;
mod recopy;
mod rows;
mod txn;

pub use puts::{LookupPut, RowPut, Stash};
pub(crate) use recopy::compare_stored;
pub use recopy::StoredAs;
pub(crate) use rows::{Outputs, RowWrite};
pub use txn::WriteTxn;
pub(super) use txn::{Finished, DATA_META_KEYS, KEY_CHECKPOINT};
