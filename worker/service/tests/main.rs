//! The integration tests of this crate, one test binary (`cargo test -p powersync-mdbx-service`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_service as service;

mod session;
