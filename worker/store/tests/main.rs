//! The integration tests of this crate, one test binary (`cargo test -p powersync-mdbx-store`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_store as store;

mod changes;
mod damaged;
mod held;
mod laws;
mod long_keys;
mod support;
mod transfer;
