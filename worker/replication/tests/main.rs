//! The integration tests of this crate, one test binary (`cargo test -p powersync-mdbx-replication`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_replication as replication;

mod bootstrap;
mod failover_slot;
mod history;
mod observer;
mod slot_invalidation;
mod stalled_primary;
mod streaming;
mod streaming_tls;
