//! Counters and gauges for `GET /metrics`: plain atomics that the hot paths bump with a
//! relaxed add, read when Prometheus scrapes (the text encoding is in `http::metrics_text`).
//!
//! The values live beside what they count, one instance per engine: the stream's in
//! `replication::StreamProgress`, the HTTP ones in `service::SyncService`,
//! open reads in `store::Store` (this crate depends on none of them). An engine restart
//! starts them at zero again, which Prometheus treats as a counter reset.
#![warn(missing_docs)]

mod counts;
mod histogram;
mod pending;
mod reads;

pub use counts::{LabelCounts, StatusCounts};
pub use histogram::{Histogram, HistogramSnapshot, PUBLISH_SECONDS_BUCKETS};
pub use pending::PendingCommits;
pub use reads::{ReadGuard, ReadTracker};
