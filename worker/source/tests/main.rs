//! The integration tests of this crate, one test binary (`cargo test -p powersync-mdbx-source`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_source as source;

mod silent_primary;
mod stalled_copy;
mod validate;
