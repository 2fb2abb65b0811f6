//! The live tests: real PostgreSQL clusters, the extension, the official SDK; one test
//! binary (`cargo test -p powersync-mdbx-testkit`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_testkit as testkit;

mod e2e_sdk;
mod fleet;
mod many_streams;
mod packaging;
mod sql_functions;
mod stalled_streams;
mod stream_faults;
mod stream_tls;
mod worker_lifecycle;
