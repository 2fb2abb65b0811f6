//! The integration tests of this crate, one test binary (`cargo test -p powersync-mdbx-cli`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_cli as cli;

mod rules_cmd;
