//! The integration tests of this crate, one test binary (`cargo test -p powersync-mdbx-rules`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_rules as rules;

mod access;
mod errors;
mod eval;
mod fuzz;
mod golden;
mod naming;
mod oracle;
mod params;
mod support;
mod warnings;
